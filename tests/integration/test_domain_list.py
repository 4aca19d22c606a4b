"""mlinfra.kvm.domains (the domain resource list) against a real libvirtd (qemu:///system).

Four ways for each state that changes something (check, apply, check again, apply again): a
mixed list (new, changed, unchanged), replaced declaring whole domains, overridden within a
scope and its refusal to destroy a running domain without force, deleted by scope, gathered
fed back, and a bad item that leaves everything as it was. Domains are defined; the one that
runs has no disk (SeaBIOS waits for a boot device), so nothing here boots a guest OS.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, List

import libvirt
import pytest

from conftest import four_ways
from test_resource_lists import free_subnets

pytestmark = pytest.mark.integration
URI = "qemu:///system"


def domain_names(prefix: str) -> List[str]:
    conn = libvirt.open(URI)
    try:
        return sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(prefix))
    finally:
        conn.close()


def is_running(name: str) -> bool:
    conn = libvirt.open(URI)
    try:
        return bool(conn.lookupByName(name).isActive())
    finally:
        conn.close()


def small(name: str, **options) -> Dict:
    return dict({"name": name, "virt_type": "qemu", "memory": "64M", "vcpus": 1}, **options)


@pytest.fixture
def disk(tmp_path) -> str:
    path = str(tmp_path / "disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", path, "16M"], check=True)
    return path


def test_mixed_list_new_changed_unchanged_four_ways(libvirt_cleanup, run_module):
    kept, grown, new = (libvirt_cleanup + n for n in ("kept", "grown", "new"))
    assert run_module("domains", {"uri": URI, "config": [small(kept), small(grown)]})["changed"]
    config = [small(kept), small(grown, memory="96M", metadata={"role": "worker"}), small(new)]
    results = four_ways("domains", {"uri": URI, "config": config})
    apply = results["apply"]
    assert results["check"]["actions"] == apply["actions"] == [grown + ": redefine", new + ": define"]
    assert apply["objects"][kept]["changed"] is False
    assert apply["objects"][grown]["domain"]["memory_mib"] == 96
    assert apply["objects"][grown]["domain"]["metadata"] == {"role": "worker"}
    assert results["check"]["diff"]["before"][grown]["memory_kib"] == 64 * 1024
    assert results["check"]["diff"]["after"][grown]["memory_kib"] == 96 * 1024
    assert domain_names(libvirt_cleanup) == sorted([kept, grown, new])


def test_merged_keeps_what_an_item_leaves_out_replaced_declares_the_whole_domain(libvirt_cleanup, run_module, disk):
    name = libvirt_cleanup + "vm"
    # allowed_paths: the disk is outside every storage pool (pytest's tmp_path).
    full = small(name, disks=[{"path": disk}], metadata={"role": "worker", "team": "nlp"},
                 description="first", autostart=True, allowed_paths=[os.path.dirname(disk)])
    assert run_module("domains", {"uri": URI, "config": [full]})["changed"]
    # merged: the item names only the description; disks, metadata and autostart stay.
    merged = four_ways("domains", {"uri": URI, "config": [{"name": name, "description": "second"}]})
    summary = merged["apply"]["objects"][name]["domain"]
    assert summary["disks"][0]["path"] == disk and summary["metadata"] == {"role": "worker", "team": "nlp"}
    assert summary["autostart"] is True
    # replaced: what the item leaves out goes (no disk, no metadata, no description, autostart off).
    replaced = four_ways("domains", {"uri": URI, "state": "replaced", "config": [small(name, metadata={"role": "worker"})]})
    after = replaced["apply"]["objects"][name]["domain"]
    assert after["disks"] == [] and after["metadata"] == {"role": "worker"} and after["autostart"] is False
    assert replaced["check"]["diff"]["before"][name]["description"] == "second"
    assert replaced["check"]["diff"]["after"][name]["description"] is None
    # replaced needs the whole declaration: without memory it fails before anything changes.
    missing = run_module("domains", {"uri": URI, "state": "replaced", "config": [{"name": name, "vcpus": 1}]})
    assert missing["failed"] and missing["changed"] is False
    assert missing["msg"].startswith("option config[0] (%s).memory: value None is required with state: replaced" % name), \
        missing["msg"]


def test_overridden_removes_unlisted_domains_in_scope_never_a_running_one_without_force(libvirt_cleanup, run_module):
    scope = libvirt_cleanup + "own-"
    keep, spare, busy = scope + "keep", scope + "spare", scope + "busy"
    outside = libvirt_cleanup + "other"
    assert run_module("domains", {"uri": URI, "config": [
        small(keep), small(spare), small(busy, state="running"), small(outside)]})["changed"]
    assert is_running(busy)
    args = {"uri": URI, "state": "overridden", "scope": {"name_prefix": scope}, "config": [small(keep)]}
    for check in (True, False):
        refused = run_module("domains", args, check=check)
        assert refused["failed"] and refused["changed"] is False, refused
        assert busy in refused["msg"] and "force: true" in refused["msg"], refused["msg"]
    # Refused in the check pass: the spare (listed before the busy one) is still there.
    assert domain_names(libvirt_cleanup) == sorted([keep, spare, busy, outside])
    forced = four_ways("domains", dict(args, force=True))
    assert forced["apply"]["actions"] == [busy + ": destroy", busy + ": undefine", spare + ": undefine"]
    assert domain_names(libvirt_cleanup) == sorted([keep, outside])


def test_deleted_by_scope_and_by_name_four_ways(libvirt_cleanup, run_module):
    a, b, c = (libvirt_cleanup + n for n in ("a", "b", "c"))
    assert run_module("domains", {"uri": URI, "config": [small(a), small(b), small(c)]})["changed"]
    by_name = four_ways("domains", {"uri": URI, "state": "deleted", "config": [{"name": a}]})
    assert by_name["apply"]["actions"] == [a + ": undefine"]
    by_scope = four_ways("domains", {"uri": URI, "state": "deleted", "config": [],
                                     "scope": {"name_prefix": libvirt_cleanup}})
    assert sorted(by_scope["apply"]["objects"]) == sorted([b, c])
    assert domain_names(libvirt_cleanup) == []


def test_bad_item_in_the_middle_changes_nothing(libvirt_cleanup, run_module):
    first, bad, late = (libvirt_cleanup + n for n in ("first", "bad", "late"))
    config = [small(first), small(bad, memory="lots"), small(late)]
    result = run_module("domains", {"uri": URI, "config": config})
    assert result["failed"] and result["changed"] is False
    assert result["msg"].startswith("config[1] (%s): option memory: value 'lots' is not a size" % bad), result["msg"]
    # A refusal only the hypervisor's state shows (no such network) is met in the check pass.
    config[1] = small(bad, interfaces=[{"network": "no-such-network-here"}])
    result = run_module("domains", {"uri": URI, "config": config})
    assert result["failed"] and result["changed"] is False
    assert "config[1] (%s)" % bad in result["msg"] and "is not a libvirt network here" in result["msg"], result["msg"]
    assert domain_names(libvirt_cleanup) == []


def test_gathered_fed_back_changes_nothing(libvirt_cleanup, run_module, disk):
    (subnet,) = free_subnets(1)
    net = libvirt_cleanup + "net"
    assert run_module("networks", {"uri": URI, "config": [
        {"name": net, "mode": "isolated", "address": subnet + ".1", "prefix": 24}]})["changed"]
    rich = small(libvirt_cleanup + "rich", memory="96M", max_memory="128M", vcpus=2, max_vcpus=2,
                 cpu={"mode": "maximum", "sockets": 1, "cores": 2, "threads": 1},
                 disks=[{"path": disk, "bus": "sata"}], interfaces=[{"network": net}],
                 metadata={"role": "trainer"}, description="gathered", autostart=True, rng=False,
                 console_log="/var/log/mlkvm-test-console.log", allowed_paths=[os.path.dirname(disk)])
    running = small(libvirt_cleanup + "up", state="running")
    assert run_module("domains", {"uri": URI, "config": [rich, running]})["changed"]
    scope = {"name_prefix": libvirt_cleanup}
    gathered = run_module("domains", {"uri": URI, "state": "gathered", "scope": scope})
    assert gathered["changed"] is False and [i["name"] for i in gathered["gathered"]] == [rich["name"], running["name"]]
    item = gathered["gathered"][0]
    assert item["memory"] == "96M" and item["max_memory"] == "128M" and item["cpu"]["cores"] == 2
    assert item["disks"] == [{"path": disk, "format": "qcow2", "bus": "sata", "target": "sda", "readonly": False}]
    assert item["interfaces"][0]["network"] == net and item["autostart"] is True and item["rng"] is False
    assert gathered["gathered"][1]["state"] == "running"
    for state in ("merged", "replaced", "overridden"):
        # A gathered item lists the disk's path; allowed_paths lets its directory in, as it did above.
        config = [dict(i, allowed_paths=[os.path.dirname(disk)]) for i in gathered["gathered"]]
        again = run_module("domains", {"uri": URI, "state": state, "scope": scope, "config": config}, diff=True)
        assert again["failed"] is False and again["changed"] is False, (state, again)
