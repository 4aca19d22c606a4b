#!/usr/bin/python3
"""The libvirt state of every domain this hypervisor's libvirt defines, for node_exporter's
textfile collector (mlinfra.kvm.monitoring).

The libvirt exporter publishes running domains only, so a VM that is defined but shut off
looked like one libvirt does not know. This reads libvirt's list of ALL domains (running or
not) and writes, atomically, one line per domain:

    mlinfra_vm_state{domain="NAME"} STATE     # virDomainState: 1 running, 3 paused, 5 shut off...
    mlinfra_vm_state_read_timestamp_seconds T # when libvirt was last read successfully

A domain missing from the file is one libvirt does not define. When libvirt cannot be read the
file keeps no state lines (never stale ones) and the timestamp stops moving, which the alert
rules read as "unknown", not as "not defined".

It runs as a loop (--interval, under systemd or `daemon --respawn`), or once (--once). A libvirt
call has no timeout of its own: a read that takes longer than --read-timeout writes the file
without state lines and exits, and the supervisor starts a fresh process.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from typing import Dict, Optional, Sequence


def read_states(uri: str) -> Dict[str, int]:
    """{domain name: virDomainState} from libvirt's list of all domains (running and not)."""
    import libvirt  # python3-libvirt (the hypervisor role installs it)
    conn = libvirt.openReadOnly(uri)
    try:
        return {dom.name(): int(dom.state()[0]) for dom in conn.listAllDomains(0)}
    finally:
        conn.close()


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(states: Optional[Dict[str, int]], read_at: Optional[float]) -> str:
    lines = ["# HELP mlinfra_vm_state libvirt state (virDomainState) of each domain this hypervisor defines, "
             "running or not: 1 running, 3 paused, 5 shut off, 6 crashed.",
             "# TYPE mlinfra_vm_state gauge"]
    lines += ['mlinfra_vm_state{domain="%s"} %d' % (escape(name), state) for name, state in sorted((states or {}).items())]
    lines += ["# HELP mlinfra_vm_state_read_timestamp_seconds When libvirt's list of domains was last read.",
              "# TYPE mlinfra_vm_state_read_timestamp_seconds gauge"]
    if read_at is not None:
        lines.append("mlinfra_vm_state_read_timestamp_seconds %.3f" % read_at)
    return "\n".join(lines) + "\n"


def write_textfile(path: str, text: str) -> None:
    """A temporary file in the same directory renamed over the target: node_exporter never reads
    half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".mlinfra_vm_state.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def hung_read(uri: str, path: str, last_read_at: Optional[float], timeout: float) -> None:
    """libvirt did not answer in time: no state lines (never stale ones), then exit, since the
    stuck call cannot be interrupted; the supervisor respawns this process."""
    print("mlinfra-vm-state: libvirt at %s did not answer within %g s; exiting to be restarted" % (uri, timeout),
          file=sys.stderr, flush=True)
    try:
        write_textfile(path, exposition(None, last_read_at))
    finally:
        os._exit(2)


def collect_once(uri: str, path: str, last_read_at: Optional[float], timeout: float = 10.0) -> Optional[float]:
    """Read libvirt and write the file; returns the time of the last successful read."""
    watchdog = threading.Timer(timeout, hung_read, args=(uri, path, last_read_at, timeout))
    watchdog.daemon = True
    watchdog.start()
    try:
        states, read_at = read_states(uri), time.time()
    except Exception as exc:  # libvirt down or refusing: say so, keep no stale states
        print("mlinfra-vm-state: cannot read libvirt at %s: %s" % (uri, exc), file=sys.stderr, flush=True)
        states, read_at = None, last_read_at
    finally:
        watchdog.cancel()
    write_textfile(path, exposition(states, read_at))
    return read_at


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--uri", default="qemu:///system", help="libvirt URI to read")
    parser.add_argument("--textfile", required=True, metavar="PATH.prom",
                        help="file in node_exporter's textfile collector directory")
    parser.add_argument("--interval", type=float, default=15.0, metavar="SECONDS", help="seconds between reads")
    parser.add_argument("--read-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="most seconds one read of libvirt may take before the process exits to be restarted")
    parser.add_argument("--once", action="store_true", help="read and write once, then exit (1 if libvirt failed)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.textfile.endswith(".prom") or not os.path.isdir(os.path.dirname(args.textfile) or "."):
        build_parser().error("--textfile must be a .prom file in an existing directory, got %r" % args.textfile)
    if args.interval <= 0:
        build_parser().error("--interval must be more than 0 seconds, got %r" % args.interval)
    if args.read_timeout <= 0:
        build_parser().error("--read-timeout must be more than 0 seconds, got %r" % args.read_timeout)
    read_at = None
    while True:
        read_at_now = collect_once(args.uri, args.textfile, read_at, args.read_timeout)
        if args.once:
            return 0 if read_at_now is not None and read_at_now != read_at else 1
        read_at = read_at_now
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
