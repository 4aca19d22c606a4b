"""The guest role's guest_state: absent through ansible-playbook against a real libvirtd: the role
removes what it made for guest_vms (domains, a running one included, their disks, seeds, console
logs, pinned host keys) and nothing else; four ways."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import libvirt
import pytest
import yaml

from conftest import ROOT, run_module_process

pytestmark = pytest.mark.integration
BIN = ROOT / ".venv" / "bin"
URI = "qemu:///system"


def play(tmp_path: Path, evars: Dict[str, Any], check: bool = False) -> Dict[str, int]:
    playbook = tmp_path / "absent.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "The guest role, absent", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Guests", "ansible.builtin.include_role": {"name": "mlinfra.kvm.guest"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
           "-e", json.dumps(evars)] + (["--check", "--diff"] if check else ["--diff"])
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    warnings = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "[WARNING]" in ln]
    if check:
        # Check mode lifts the disks' in-use guard (the domains that use them are only predicted
        # gone), and the volume module says so; nothing else may warn.
        warnings = [w for w in warnings if "force: true: deleting volume" not in w]
    assert warnings == [], proc.stdout[-4000:] + proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("localhost")][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def listing(prefix: str, pool: str) -> Dict[str, List[str]]:
    conn = libvirt.open(URI)
    try:
        return {"domains": sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(prefix)),
                "running": sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(prefix) and d.isActive()),
                "volumes": sorted(conn.storagePoolLookupByName(pool).listVolumes())}
    finally:
        conn.close()


def test_guest_absent_removes_only_the_role_s_objects_four_ways(libvirt_cleanup, tmp_path):
    pool, state_dir, secrets = libvirt_cleanup + "pool", tmp_path / "state", tmp_path / "secrets"
    (secrets / "hostkeys").mkdir(parents=True)
    state_dir.mkdir()
    vms = [{"name": libvirt_cleanup + "w1"}, {"name": libvirt_cleanup + "w2", "role": "worker"}]
    other = libvirt_cleanup + "other"
    assert run_module_process("pools", {"uri": URI, "config": [{"name": pool, "target": str(tmp_path / "pool")}]})["changed"]
    assert run_module_process("volumes", {"uri": URI, "config": [
        {"pool": pool, "name": n, "capacity": "16M"} for n in (vms[0]["name"] + ".qcow2", vms[1]["name"] + ".qcow2",
                                                               "keep.qcow2")]})["changed"]
    small = {"virt_type": "qemu", "memory": "64M", "vcpus": 1}
    made = run_module_process("domains", {"uri": URI, "config": [
        dict(small, name=vms[0]["name"], disks=[{"pool": pool, "volume": vms[0]["name"] + ".qcow2"}]),
        dict(small, name=vms[1]["name"], state="running"),  # no disk: SeaBIOS waits, nothing boots
        dict(small, name=other)]})
    assert made["changed"] and not made["failed"], made
    for vm in vms:
        for suffix in ("-seed.iso", "-console.log"):
            (state_dir / (vm["name"] + suffix)).write_text("x")
        for suffix in ("", ".pub"):
            (secrets / "hostkeys" / (vm["name"] + suffix)).write_text("key")
    evars = {"ansible_python_interpreter": str(BIN / "python"), "guest_state": "absent", "guest_vms": vms,
             "guest_uri": URI, "guest_pool": pool, "guest_state_dir": str(state_dir),
             "guest_secrets_dir": str(secrets), "guest_base_image": str(tmp_path / "no-image.qcow2")}
    assert play(tmp_path, evars, check=True)["changed"] == 4
    assert listing(libvirt_cleanup, pool)["domains"] == sorted([vms[0]["name"], vms[1]["name"], other])
    assert play(tmp_path, evars)["changed"] == 4
    assert play(tmp_path, evars, check=True)["changed"] == 0
    assert play(tmp_path, evars)["changed"] == 0
    assert listing(libvirt_cleanup, pool) == {"domains": [other], "running": [], "volumes": ["keep.qcow2"]}
    assert sorted(p.name for p in state_dir.iterdir()) == []
    assert sorted(p.name for p in (secrets / "hostkeys").iterdir()) == []
