"""The EXAMPLES of the network and storage modules, run as written against the real libvirtd.

ansible-doc shows EXAMPLES to users, who paste them into their playbooks; an example that fails
is a documentation bug. Each module's EXAMPLES block is read from the module file and only what
belongs to a site is adapted: object names get this test's prefix, host paths move under a
temporary directory, addresses into free subnets, the host's bridge br0 becomes one made for the
test, and the 100G scratch volume shrinks to 1G (this machine has less disk free). The tasks
then run in order as one play and must all succeed; a check-mode run of the same play afterwards
must succeed and predict no change for the tasks that declare an end state.

Not run here: the domain, domains, domain_info, snapshot and snapshot_info examples, which need a
GPU to pass through, a bootable guest or a remote host (tests/integration/test_domain*.py,
test_snapshot.py and the vm tier cover those modules).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from conftest import ROOT
from test_resource_lists import free_subnets

pytestmark = pytest.mark.integration
URI = "qemu:///system"
MODULES = ["network", "networks", "pool", "pools", "volume", "volumes"]


def examples_of(module: str) -> str:
    tree = ast.parse((ROOT / "plugins" / "modules" / ("%s.py" % module)).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES":
            return node.value.value
    raise AssertionError("%s has no EXAMPLES" % module)


def site_rewrites(prefix: str, tmp: Path, subnets: List[str], bridge: str) -> List[Tuple[str, str]]:
    """(regex, replacement) pairs, in order: paths first, then names, addresses and sizes."""
    return [
        (r"/var/lib/libvirt/images", str(tmp / "libvirt-images")),
        (r"/var/lib/mlinfra", str(tmp / "mlinfra")),
        (r"/srv/build", str(tmp / "srv-build")),
        (r"\bmlinfra-", prefix),
        (r"\bbench-", prefix + "bench-"),
        (r"\b(name|pool): (images|vms|scratch|datacenter)\b", r"\1: %s\2" % prefix),
        (r"\b192\.168\.150\.", subnets[0] + "."),
        (r"\b10\.77\.0\.", subnets[1] + "."),
        (r"\bbridge: br0\b", "bridge: " + bridge),
        (r"\bcapacity: 100G\b", "capacity: 1G"),
    ]


def rewritten(text: str, rewrites: List[Tuple[str, str]]) -> str:
    for pattern, replacement in rewrites:
        text = re.sub(pattern, replacement, text)
    return text


def qcow2(path: Path, size: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True)


def prepare_site(module: str, prefix: str, tmp: Path) -> List[Dict]:
    """What the examples take for granted on the site: files on the host, the pools they use."""
    if module == "volume":
        qcow2(tmp / "libvirt-images" / "debian-12-base.qcow2", "64M")
        qcow2(tmp / "srv-build" / "base.qcow2", "16M")
        return [{"name": prefix + "vms", "target": str(tmp / "vms")},
                {"name": prefix + "images", "target": str(tmp / "pool-images")},
                # libvirt's default pool, where the overlay example's base image lies.
                {"name": prefix + "default", "target": str(tmp / "libvirt-images")}]
    if module == "volumes":
        qcow2(tmp / "mlinfra" / "base.qcow2", "64M")
        return [{"name": prefix + "lab", "target": str(tmp / "lab-pool")}]
    return []


def run_play(tmp: Path, tasks: List[Dict], pools: List[Dict], *extra: str) -> subprocess.CompletedProcess:
    setup = [{"name": "Pools the examples use", "mlinfra.kvm.pools": {"config": pools}}] if pools else []
    playbook = tmp / "examples.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "EXAMPLES as written", "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/mlinfra.kvm.libvirt": {"uri": URI}},
        "tasks": setup + tasks}], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_CALLBACK_FORMAT_PRETTY="0")
    return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % (ROOT / ".venv" / "bin" / "python"),
                           str(playbook), *extra], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=900, check=False)


def changed_tasks(output: str) -> List[str]:
    found, task = [], None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")]
        elif line.startswith("changed: ["):
            found.append(task)
    return found


def libvirt_names() -> set:
    import libvirt
    conn = libvirt.open(URI)
    try:
        return ({n.name() for n in conn.listAllNetworks()} | {p.name() for p in conn.listAllStoragePools()}
                | {d.name() for d in conn.listAllDomains()})
    finally:
        conn.close()


@pytest.fixture
def test_bridge():
    """A Linux bridge standing in for the site's br0, removed after the test."""
    name = "mlkvex%d" % (os.getpid() % 100000)
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


@pytest.mark.parametrize("module", MODULES)
def test_examples_run_as_written(module, libvirt_cleanup, tmp_path, test_bridge):
    rewrites = site_rewrites(libvirt_cleanup, tmp_path, free_subnets(2), test_bridge)
    text = rewritten(examples_of(module), rewrites)
    # Nothing of the site is left to touch on this machine: its paths and its bridge.
    assert not re.search(r"/var/lib|/srv/|bridge: br0", text), text
    tasks = yaml.safe_load(text)
    assert tasks and all("name" in t for t in tasks), tasks
    pools = prepare_site(module, libvirt_cleanup, tmp_path)

    before = libvirt_names()
    applied = run_play(tmp_path, tasks, pools)
    assert applied.returncode == 0, applied.stdout[-5000:] + applied.stderr[-2000:]
    assert "Traceback" not in applied.stdout + applied.stderr
    # Every object the examples made carries this test's prefix (so the clean-up finds it).
    assert [n for n in libvirt_names() - before if not n.startswith(libvirt_cleanup)] == []

    # The same play in check mode afterwards: it runs, and predicts no change except for an
    # example whose objects a later example of the play removes (overridden, deleted, absent).
    checked = run_play(tmp_path, tasks, pools, "--check")
    assert checked.returncode == 0, checked.stdout[-5000:]
    unexpected = [name for name in changed_tasks(checked.stdout) if not undone_later(tasks, name)]
    assert unexpected == [], checked.stdout[-5000:]


def undone_later(tasks: List[Dict], name: str) -> bool:
    """Whether an example after ``name`` removes objects (so re-running ``name`` makes them again)."""
    index = next((i for i, t in enumerate(tasks) if t["name"] == name), None)
    if index is None:
        return False
    removing = re.compile(r'"state": "(overridden|deleted|absent)"')
    return any(removing.search(json.dumps(t)) for t in tasks[index + 1:])
