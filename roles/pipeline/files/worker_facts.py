"""What the pipeline needs to know of a worker before a distributed train; reads only.

    python3 worker_facts.py --address ADDRESS [--port PORT]

Prints one JSON object:
  python, torch      versions (importlib.metadata, without importing torch: seconds under emulation)
  gpus               NVIDIA GPUs the driver exposes (/dev/nvidiaN), the processes per node
  interface          the network interface that holds ADDRESS (null when none does)
  address            ADDRESS itself (the first worker's rendezvous firewall admits these)
  port_free          with --port: whether a TCP listener can bind the port on every address
  port_holder        when it cannot: what `ss` says listens there (empty when ss is missing)
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from importlib import metadata
from typing import Any, Dict, Optional


def torch_version() -> Optional[str]:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def gpu_count() -> int:
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", name))
    except OSError:
        return 0


def interface_of(address: str) -> Optional[str]:
    """The interface holding ADDRESS, from `ip -j addr` (iproute2)."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        out = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, check=True, timeout=30).stdout
        links = json.loads(out.decode("utf-8"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    for link in links:
        for addr in link.get("addr_info") or []:
            if addr.get("local") == address:
                return link.get("ifname")
    return None


def port_state(port: int) -> Dict[str, Any]:
    """Whether a listener can bind PORT on every address (as the c10d store does)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the store does: connections of an earlier job in TIME_WAIT do not hold the port, a
    # listener does.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return {"port_free": False, "port_holder": holder(port)}
    finally:
        sock.close()
    return {"port_free": True, "port_holder": ""}


def holder(port: int) -> str:
    ss = shutil.which("ss") or "/usr/bin/ss"
    try:
        out = subprocess.run([ss, "-Htlnp", "sport = :%d" % port], capture_output=True, check=False, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return " ".join(out.decode("utf-8", "replace").split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    facts: Dict[str, Any] = {"python": platform.python_version(), "torch": torch_version(),
                             "gpus": gpu_count(), "interface": interface_of(args.address),
                             "address": args.address}
    if args.port is not None:
        facts.update(port_state(args.port))
    print(json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    main()
