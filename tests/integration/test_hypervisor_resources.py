"""The hypervisor role's pools and networks (tasks/resources.yml, one mlinfra.kvm.pools and one
mlinfra.kvm.networks call) through ansible-playbook against a real libvirtd: four ways, then
an item with state absent removes its object and leaves the others."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict

import libvirt
import pytest
import yaml

from conftest import ROOT
from test_resource_lists import free_subnets

pytestmark = pytest.mark.integration
BIN = ROOT / ".venv" / "bin"


def play(tmp_path: Path, evars: Dict[str, Any], check: bool = False) -> Dict[str, int]:
    playbook = tmp_path / "resources.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "The hypervisor role's resources", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Pools and networks", "ansible.builtin.include_role": {
            "name": "mlinfra.kvm.hypervisor", "tasks_from": "resources"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
           "-e", json.dumps(evars)] + (["--check", "--diff"] if check else ["--diff"])
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # A module return Ansible has to rename (a "results" that is not a loop's) warns on every run.
    assert "[WARNING]" not in proc.stdout + proc.stderr, proc.stdout[-4000:] + proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("localhost")][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_role_resources_four_ways_then_an_item_removed(libvirt_cleanup, tmp_path):
    a, b = free_subnets(2)
    evars = {
        "ansible_python_interpreter": str(BIN / "python"),
        "hypervisor_uri": "qemu:///system",
        "hypervisor_pools": [{"name": libvirt_cleanup + "pool", "target": str(tmp_path / "pool"), "autostart": True}],
        "hypervisor_networks": [
            {"name": libvirt_cleanup + "nat", "address": a + ".1", "prefix": 24,
             "dhcp_range": {"start": a + ".100", "end": a + ".200"}, "autostart": True},
            {"name": libvirt_cleanup + "iso", "mode": "isolated", "address": b + ".1", "prefix": 24}],
    }
    assert play(tmp_path, evars, check=True)["changed"] == 2
    assert play(tmp_path, evars)["changed"] == 2
    assert play(tmp_path, evars, check=True)["changed"] == 0
    assert play(tmp_path, evars)["changed"] == 0
    conn = libvirt.open("qemu:///system")
    try:
        assert conn.networkLookupByName(libvirt_cleanup + "nat").autostart() == 1
        assert conn.storagePoolLookupByName(libvirt_cleanup + "pool").isActive() == 1
    finally:
        conn.close()
    evars["hypervisor_networks"][1]["state"] = "absent"
    assert play(tmp_path, evars)["changed"] == 1
    conn = libvirt.open("qemu:///system")
    try:
        left = sorted(n.name() for n in conn.listAllNetworks() if n.name().startswith(libvirt_cleanup))
    finally:
        conn.close()
    assert left == [libvirt_cleanup + "nat"]
    assert play(tmp_path, evars)["changed"] == 0
