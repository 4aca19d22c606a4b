"""Create/destroy podman containers from the lab's guest image for package-level scenarios.

The NVIDIA DKMS build under TCG takes far too long; in a container it runs at native speed
(lab-facts). The container is the guest image's root file system (lab/build/base.qcow2,
imported once per image stamp), run with host networking and sshd on a free port on
127.0.0.1, with a host key generated here and pinned in the scenario's known_hosts
(host_keys.py; never StrictHostKeyChecking=no). Ansible reaches it over SSH like a VM, so
the roles run unchanged.

Podman on Debian 12 needs runc and a containers.conf with ulimits (root lacks
CAP_SYS_RESOURCE here; crun refuses the hybrid cgroup layout): both are written to the state
directory and passed through CONTAINERS_CONF, nothing under /etc is touched.

  podman_guest.py create --state DIR --name NAME
  podman_guest.py destroy --state DIR
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "vm"))
import harness  # noqa: E402
import guest_cli  # noqa: E402  (molecule/_shared/, this script's directory)
import host_keys  # noqa: E402  (molecule/_shared/, this script's directory)

PREFIX = "mlkvmmol-"
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""


def podman(state_dir: Path, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    conf = state_dir / "containers.conf"
    if not conf.exists():
        conf.write_text(CONTAINERS_CONF)
    env = dict(os.environ, CONTAINERS_CONF=str(conf))
    return subprocess.run(["podman", *args], check=check, env=env, text=True, **kw)


def ensure_image(state_dir: Path) -> str:
    image = harness.ensure_image()
    stamp = (image.disk.parent / "base.stamp").read_text().strip()[:12] if (image.disk.parent / "base.stamp").exists() else "latest"
    name = "localhost/mlkvm-bookworm:%s" % stamp
    if podman(state_dir, "image", "exists", name, check=False).returncode == 0:
        return name
    with tempfile.TemporaryDirectory(dir=str(image.disk.parent)) as tmp:
        raw = Path(tmp) / "root.raw"
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        subprocess.run(["qemu-img", "convert", "-O", "raw", str(image.disk), str(raw)], check=True)
        subprocess.run(["mount", "-o", "loop,ro", str(raw), str(mnt)], check=True)
        try:
            tar = subprocess.Popen(["tar", "-C", str(mnt), "--exclude=./proc/*", "--exclude=./sys/*",
                                    "--exclude=./dev/*", "-c", "."], stdout=subprocess.PIPE)
            podman(state_dir, "import", "--change", "CMD /bin/bash", "-", name, stdin=tar.stdout,
                   stdout=subprocess.DEVNULL)
            if tar.wait() != 0:
                raise SystemExit("tar of the image's root file system failed")
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    return name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create(ns: argparse.Namespace) -> None:
    state_dir = Path(ns.state)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    state_file = state_dir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"containers": []}
    image = ensure_image(state_dir)
    keydir = state_dir / ns.name
    if keydir.exists():
        shutil.rmtree(keydir)
    keydir.mkdir(mode=0o700)
    key = keydir / "id_ed25519"
    public = harness.make_keypair(key, "mlkvm-molecule")
    host_key = keydir / "host_ed25519"
    host_public = harness.make_keypair(host_key, "root@%s" % ns.name)
    (keydir / "authorized_keys").write_text(public + "\n")
    port = free_port()
    known_hosts = host_keys.pin(state_dir, "[127.0.0.1]:%d" % port, host_public)
    name = "%s%s-%s" % (PREFIX, ns.name, uuid.uuid4().hex[:6])
    state["containers"].append(name)
    state_file.write_text(json.dumps(state))
    script = ("set -e; mkdir -p /run/sshd /root/.ssh; install -m 0600 /mlkvm-keys/authorized_keys "
              "/root/.ssh/authorized_keys; install -m 0600 /mlkvm-keys/host_ed25519 /etc/ssh/mlkvm_host_key; "
              "exec /usr/sbin/sshd -D -e -p %d -o ListenAddress=127.0.0.1 -h /etc/ssh/mlkvm_host_key "
              "-o PermitRootLogin=prohibit-password -o PasswordAuthentication=no" % port)
    podman(state_dir, "run", "-d", "--name", name, "--hostname", ns.name.replace("_", "-"), "--network", "host",
           "-v", "%s:/mlkvm-keys:ro" % keydir, image, "/bin/sh", "-c", script, stdout=subprocess.DEVNULL)
    guest = harness.Guest(name=name, ip="127.0.0.1", mac="", network="", uri="", workdir=keydir,
                          serial_log=keydir / "none", key=key, known_hosts=known_hosts, user="root")
    argv = guest.ssh_argv("true", connect_timeout=5)
    argv[argv.index("root@127.0.0.1"):argv.index("root@127.0.0.1")] = ["-p", str(port)]
    for _unused in range(60):
        if subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, check=False).returncode == 0:
            break
        import time
        time.sleep(1)
    else:
        logs = podman(state_dir, "logs", name, check=False, capture_output=True).stdout
        raise SystemExit("container %s: sshd did not answer on port %d\n%s" % (name, port, logs))
    print(json.dumps({"instance": ns.name, "address": "127.0.0.1", "user": "root", "port": str(port),
                      "identity_file": str(key), "known_hosts": str(known_hosts), "container": name,
                      "image": image}))


def destroy(ns: argparse.Namespace) -> None:
    state_dir = Path(ns.state)
    state_file = state_dir / "state.json"
    host_keys.forget(state_dir)
    if not state_file.exists():
        return
    for name in json.loads(state_file.read_text()).get("containers", []):
        podman(state_dir, "rm", "-f", "-t", "5", name, check=False, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL)
    state_file.unlink()


def main() -> None:
    ns = guest_cli.parse_args(__doc__.splitlines()[0])
    create(ns) if ns.cmd == "create" else destroy(ns)


if __name__ == "__main__":
    main()
