"""Create/destroy TCG guests for the Molecule scenarios (delegated driver, managed).

Reuses tests/vm/harness.py (same image, XML, pinned host key, cloud-init seed) but keeps the
guests alive between Molecule's steps: everything it made is recorded in STATE_DIR/state.json
and removed by `destroy`, which is safe to run twice and after a half-finished `create`.

  libvirt_guest.py create --state DIR --name NAME [--nat] [--memory MiB] [--vcpus N]
  libvirt_guest.py destroy --state DIR

`create` prints one JSON object per guest: the instance_config entry Molecule wants
(instance, address, user, port, identity_file) plus known_hosts: STATE_DIR/known_hosts, the
scenario's file the pinned SSH options name (host_keys.py), holding this guest's key.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "vm"))
sys.path.insert(0, str(ROOT / "collections"))
import harness  # noqa: E402
import guest_cli  # noqa: E402  (molecule/_shared/, this script's directory)
import host_keys  # noqa: E402  (molecule/_shared/, this script's directory)

PREFIX = "mlkvmmol-"  # not mlkvmtest-: other pytest sessions sweep those at their end
URI = "qemu:///system"


def run_cloud_init(args: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "collections"))
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.cloud_init"],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": args}), capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=300, check=False)
    out = proc.stdout
    try:
        return json.loads(out[out.index("{"):])
    except ValueError:
        raise SystemExit("cloud_init module printed no JSON: %s %s" % (proc.stdout, proc.stderr))


def save(state_dir: Path, state: dict) -> None:
    tmp = state_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_dir / "state.json")


def create(ns: argparse.Namespace) -> None:
    import libvirt
    state_dir = Path(ns.state)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    state = {"domains": [], "networks": [], "workdirs": []}
    if (state_dir / "state.json").exists():
        state = json.loads((state_dir / "state.json").read_text())
    image = harness.ensure_image()
    conn = libvirt.open(URI)
    tag = uuid.uuid4().hex[:6]
    name = "%s%s-%s" % (PREFIX, ns.name, tag)
    net_name = "%snet-%s" % (PREFIX, tag)

    workdir = harness.GUEST_DIR_ROOT / name
    workdir.mkdir(mode=0o711, parents=False, exist_ok=False)
    state["workdirs"].append(str(workdir))
    save(state_dir, state)

    keydir = state_dir / ns.name
    keydir.mkdir(mode=0o700, exist_ok=True)
    key = keydir / "id_ed25519"
    for old in (key, Path(str(key) + ".pub"), keydir / "host_ed25519", keydir / "host_ed25519.pub"):
        if old.exists():
            old.unlink()
    public = harness.make_keypair(key, "mlkvm-molecule")
    host_key = keydir / "host_ed25519"
    host_public = harness.make_keypair(host_key, "root@%s" % name)

    mac = harness.random_mac()
    subnet = harness.pick_subnet(conn)
    ip = str(list(subnet.hosts())[9])
    known_hosts = host_keys.pin(state_dir, ip, host_public)

    net = conn.networkDefineXML(harness.network_xml(net_name, subnet, {mac: ip}, ns.nat))
    state["networks"].append(net_name)
    save(state_dir, state)
    net.create()

    overlay = workdir / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk), str(overlay),
                    "%dG" % ns.disk_gib], check=True)
    seed = workdir / "seed.iso"
    result = run_cloud_init({
        "dest": str(seed), "instance_id": "%s-%s" % (name, uuid.uuid4().hex[:8]),
        "meta_data": {"local-hostname": ns.name.replace("_", "-")},
        # The overlay is bigger than the base image: let cloud-init grow the root file system.
        "user_data": harness.user_data_for(public, host_key.read_text(), host_public,
                                           {"growpart": {"mode": "off"}, "resize_rootfs": True})})
    if result.get("failed") or not seed.exists():
        raise SystemExit("cloud_init module failed: %s" % result.get("msg"))
    serial_log = workdir / "console.log"
    dom = conn.defineXML(harness.domain_xml(name, image, overlay, seed, serial_log, net_name, mac,
                                            memory_mib=ns.memory, vcpus=ns.vcpus))
    state["domains"].append(name)
    save(state_dir, state)
    guest = harness.Guest(name=name, ip=ip, mac=mac, network=net_name, uri=URI, workdir=workdir,
                          serial_log=serial_log, key=key, known_hosts=known_hosts, _conn=conn)
    dom.create()
    started = time.monotonic()
    guest.wait_ready(ns.timeout)
    print(json.dumps({"instance": ns.name, "address": ip, "user": harness.GUEST_USER, "port": "22",
                      "identity_file": str(key), "known_hosts": str(known_hosts),
                      "domain": name, "boot_seconds": round(time.monotonic() - started, 1)}))


def destroy(ns: argparse.Namespace) -> None:
    state_file = Path(ns.state) / "state.json"
    host_keys.forget(Path(ns.state))
    if not state_file.exists():
        return
    import libvirt
    state = json.loads(state_file.read_text())
    conn = libvirt.open(URI)
    for name in state.get("domains", []):
        try:
            harness._remove_domain(conn.lookupByName(name))
        except libvirt.libvirtError:
            pass
    for name in state.get("networks", []):
        try:
            harness._remove_network(conn.networkLookupByName(name))
        except libvirt.libvirtError:
            pass
    for path in state.get("workdirs", []):
        shutil.rmtree(path, ignore_errors=True)
    state_file.unlink()


def create_options(create: argparse.ArgumentParser) -> None:
    create.add_argument("--nat", action="store_true")
    create.add_argument("--memory", type=int, default=2048)
    create.add_argument("--vcpus", type=int, default=2)
    create.add_argument("--disk-gib", type=int, default=8)
    create.add_argument("--timeout", type=float, default=harness.BOOT_TIMEOUT)


def main() -> None:
    ns = guest_cli.parse_args(__doc__.splitlines()[0], create_options)
    subprocess.run([str(ROOT / "scripts" / "ensure-libvirtd.sh")], check=True, stdout=subprocess.DEVNULL)
    create(ns) if ns.cmd == "create" else destroy(ns)


if __name__ == "__main__":
    main()
