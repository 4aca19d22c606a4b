"""mlinfra.kvm.networks / pools / volumes (resource lists) against a real libvirtd (qemu:///system).

Every state four ways where it changes something (check, apply, check again, apply again),
mixed lists (new, changed and unchanged items in one call), overridden within a scope only,
a refusal in the middle of a list that leaves everything as it was, gathered fed back.
"""
from __future__ import annotations

import random
import subprocess
from typing import Dict, List

import libvirt
import pytest

from conftest import define_disk_domain, four_ways, run_module_process
from host_network import addresses_in_use

pytestmark = pytest.mark.integration
URI = "qemu:///system"


def free_subnets(count: int) -> List[str]:
    """/24s in 10.214.x.0 that no libvirt network, host interface or route uses."""
    used = addresses_in_use(URI)
    free = [s for s in ("10.214." + str(third) for third in random.sample(range(1, 255), 120)) if s + "." not in used]
    if len(free) < count:
        pytest.fail("fewer than %d free 10.214.x.0/24 for test networks" % count)
    return free[:count]


def names(kind: str, prefix: str) -> List[str]:
    conn = libvirt.open(URI)
    try:
        objs = conn.listAllNetworks() if kind == "network" else conn.listAllStoragePools()
        return sorted(o.name() for o in objs if o.name().startswith(prefix))
    finally:
        conn.close()


def volume_names(pool: str) -> List[str]:
    conn = libvirt.open(URI)
    try:
        return sorted(v.name() for v in conn.storagePoolLookupByName(pool).listAllVolumes())
    finally:
        conn.close()


def network_xml(name: str) -> str:
    conn = libvirt.open(URI)
    try:
        return conn.networkLookupByName(name).XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    finally:
        conn.close()


@pytest.fixture
def pools(libvirt_cleanup, tmp_path) -> Dict[str, str]:
    """Two pools of this test (made with the list module itself), name -> target."""
    return {libvirt_cleanup + "p%d" % i: str(tmp_path / ("p%d" % i)) for i in range(2)}


def pool_items(pools: Dict[str, str]) -> List[Dict]:
    return [{"name": name, "target": target} for name, target in pools.items()]


def test_pools_then_volumes_four_ways_one_call_each(pools, libvirt_cleanup):
    pool_results = four_ways("pools", {"uri": URI, "config": pool_items(pools)})
    assert sorted(pool_results["apply"]["objects"]) == sorted(pools)
    assert pool_results["check"]["actions"] == pool_results["apply"]["actions"]
    assert sorted(pools)[0] + ": define" in pool_results["apply"]["actions"]
    first, second = sorted(pools)
    volumes = [{"pool": first, "name": "a.qcow2", "capacity": "64M"},
               {"pool": second, "name": "b.raw", "capacity": "32M", "format": "raw"}]
    vol_results = four_ways("volumes", {"uri": URI, "config": volumes})
    assert vol_results["apply"]["actions"] == ["%s/a.qcow2: create" % first, "%s/b.raw: create" % second]
    assert vol_results["apply_again"]["objects"]["%s/b.raw" % second]["volume"]["format"] == "raw"
    assert volume_names(first) == ["a.qcow2"] and volume_names(second) == ["b.raw"]
    # The diff names each object that changes, with the single module's before and after.
    assert vol_results["check"]["diff"]["after"]["%s/a.qcow2" % first]["state"] == "present"
    assert vol_results["check_again"]["diff"] == {"before": {}, "after": {}}


def test_mixed_network_list_new_changed_unchanged(libvirt_cleanup, run_module):
    a, b, c = free_subnets(3)
    kept = {"name": libvirt_cleanup + "kept", "mode": "isolated", "address": a + ".1", "prefix": 24}
    grown = {"name": libvirt_cleanup + "grown", "mode": "isolated", "address": b + ".1", "prefix": 24}
    assert run_module("networks", {"uri": URI, "config": [kept, grown]})["changed"]
    new = {"name": libvirt_cleanup + "new", "mode": "isolated", "address": c + ".1", "prefix": 24}
    host = {"mac": "52:54:00:10:20:30", "ip": b + ".50", "name": "w1"}
    results = four_ways("networks", {"uri": URI, "config": [kept, dict(grown, hosts=[host]), new]})
    apply = results["apply"]
    assert apply["objects"][kept["name"]]["changed"] is False
    assert apply["objects"][grown["name"]]["actions"] == ["live add DHCP host 52:54:00:10:20:30"]
    assert apply["objects"][grown["name"]]["restart_required"] is False  # hosts change live
    assert apply["objects"][new["name"]]["network"]["state"] == "active"
    assert "mac='52:54:00:10:20:30'" in network_xml(grown["name"])
    assert sorted(results["check"]["diff"]["after"]) == sorted([grown["name"], new["name"]])


def test_merged_keeps_what_an_item_leaves_out_replaced_restores_defaults(libvirt_cleanup, run_module):
    (a,) = free_subnets(1)
    name = libvirt_cleanup + "net"
    assert run_module("networks", {"uri": URI, "config": [
        {"name": name, "mode": "isolated", "address": a + ".1", "prefix": 24, "state": "present"}]})["changed"]
    # merged: the item names only autostart; mode stays isolated (the single module's default is nat).
    merged = four_ways("networks", {"uri": URI, "config": [{"name": name, "autostart": True}]})
    assert merged["apply"]["objects"][name]["network"]["mode"] == "isolated"
    assert merged["apply"]["objects"][name]["network"]["autostart"] is True
    assert merged["apply"]["objects"][name]["network"]["state"] == "inactive"  # state kept too
    # replaced: what the item leaves out goes back to the single module's defaults (mode nat,
    # state active).
    replaced = run_module("networks", {"uri": URI, "state": "replaced", "config": [
        {"name": name, "address": a + ".1", "prefix": 24}]}, check=True, diff=True)
    assert replaced["changed"] is True
    assert replaced["diff"]["before"][name]["mode"] == "isolated"
    assert replaced["diff"]["after"][name]["mode"] == "nat"


def test_overridden_removes_only_unlisted_objects_in_scope(libvirt_cleanup, tmp_path, run_module):
    a, b, c = free_subnets(3)
    scope = libvirt_cleanup + "own-"
    own = [{"name": scope + "keep", "mode": "isolated", "address": a + ".1", "prefix": 24},
           {"name": scope + "drop", "mode": "isolated", "address": b + ".1", "prefix": 24}]
    outside = {"name": libvirt_cleanup + "other", "mode": "isolated", "address": c + ".1", "prefix": 24}
    assert run_module("networks", {"uri": URI, "config": own + [outside]})["changed"]
    args = {"uri": URI, "state": "overridden", "scope": {"name_prefix": scope}, "config": own[:1]}
    results = four_ways("networks", args)
    assert results["check"]["actions"] == [scope + "drop: stop", scope + "drop: undefine"]
    assert names("network", libvirt_cleanup) == sorted([scope + "keep", outside["name"]])


def test_overridden_and_deleted_need_a_scope(run_module):
    for args in ({"state": "overridden", "config": []}, {"state": "deleted", "config": []}):
        result = run_module("networks", dict(args, uri=URI))
        assert result["failed"] and result["changed"] is False
        assert "scope" in result["msg"] and "name_prefix" in result["msg"], result["msg"]
    empty = run_module("volumes", {"uri": URI, "state": "overridden", "scope": {"name_prefix": ""}, "config": []})
    assert empty["failed"] and "would match every volume" in empty["msg"]


def test_overridden_refuses_a_volume_in_use_and_changes_nothing(pools, libvirt_cleanup, run_module):
    assert run_module("pools", {"uri": URI, "config": pool_items(pools)})["changed"]
    first = sorted(pools)[0]
    assert run_module("volumes", {"uri": URI, "config": [
        {"pool": first, "name": n, "capacity": "16M"} for n in ("keep.qcow2", "spare.qcow2", "used.qcow2")]})["changed"]
    define_disk_domain(libvirt_cleanup + "dom", [{"pool": first, "volume": "used.qcow2"}])
    args = {"uri": URI, "state": "overridden", "scope": {"name_prefix": first + "/"},
            "config": [{"pool": first, "name": "keep.qcow2", "capacity": "32M"}]}
    for check in (True, False):
        result = run_module("volumes", args, check=check)
        assert result["failed"], result
        assert result["changed"] is False
        assert "used.qcow2" in result["msg"] and libvirt_cleanup + "dom" in result["msg"], result["msg"]
    # Refused in the check pass: not even the first item (a grow) or the spare's removal happened.
    assert volume_names(first) == ["keep.qcow2", "spare.qcow2", "used.qcow2"]
    conn = libvirt.open(URI)
    try:
        assert conn.storagePoolLookupByName(first).storageVolLookupByName("keep.qcow2").info()[1] == 16 * 2**20
    finally:
        conn.close()
    forced = run_module("volumes", dict(args, force=True))
    assert forced["changed"] and not forced["failed"], forced
    assert volume_names(first) == ["keep.qcow2"]
    assert forced["objects"][first + "/used.qcow2"]["users"] == ["domain %sdom (disk)" % libvirt_cleanup]


def test_bad_item_in_the_middle_changes_nothing(pools, run_module):
    assert run_module("pools", {"uri": URI, "config": pool_items(pools)})["changed"]
    first = sorted(pools)[0]
    config = [{"pool": first, "name": "ok.qcow2", "capacity": "16M"},
              {"pool": first, "name": "bad.qcow2", "capacity": "lots"},
              {"pool": first, "name": "late.qcow2", "capacity": "16M"}]
    result = run_module("volumes", {"uri": URI, "config": config})
    assert result["failed"] and result["changed"] is False
    assert result["msg"].startswith("config[1] (%s/bad.qcow2): option capacity: value 'lots' is not a size" % first), \
        result["msg"]
    assert result["option"] == "config[1] (%s/bad.qcow2).capacity" % first
    # A refusal only libvirt's state shows (no such pool) is met in the check pass, before any change.
    config[1] = {"pool": "no-such-pool-here", "name": "x.qcow2", "capacity": "16M"}
    result = run_module("volumes", {"uri": URI, "config": config})
    assert result["failed"] and result["changed"] is False
    assert "config[1] (no-such-pool-here/x.qcow2)" in result["msg"] and "is not a libvirt storage pool" in result["msg"]
    assert volume_names(first) == []
    dup = run_module("volumes", {"uri": URI, "config": [config[0], config[0]]})
    assert dup["failed"] and "names the same volume as config[0]" in dup["msg"]


def test_gathered_fed_back_changes_nothing(pools, libvirt_cleanup, run_module):
    (a,) = free_subnets(1)
    assert run_module("pools", {"uri": URI, "config": [dict(i, autostart=True) for i in pool_items(pools)]})["changed"]
    first, second = sorted(pools)
    assert run_module("volumes", {"uri": URI, "config": [
        {"pool": first, "name": "d.qcow2", "capacity": "16M"},
        {"pool": second, "name": "e.raw", "capacity": "8M", "format": "raw"}]})["changed"]
    assert run_module("networks", {"uri": URI, "config": [{
        "name": libvirt_cleanup + "net", "address": a + ".1", "prefix": 24, "domain": "lists.test",
        "dhcp_range": {"start": a + ".100", "end": a + ".120"},
        "hosts": [{"mac": "52:54:00:aa:bb:01", "ip": a + ".10", "name": "w1"}],
        "dns_hosts": [{"ip": a + ".5", "hostnames": ["mlflow.lists.test"]}]}]})["changed"]
    for module in ("pools", "volumes", "networks"):
        scope = {"name_prefix": libvirt_cleanup}
        gathered = run_module(module, {"uri": URI, "state": "gathered", "scope": scope})
        assert gathered["changed"] is False and gathered["gathered"], gathered
        for state in ("merged", "replaced", "overridden"):
            again = run_module(module, {"uri": URI, "state": state, "scope": scope, "config": gathered["gathered"]},
                               diff=True)
            assert again["failed"] is False and again["changed"] is False, (module, state, again)
    net = run_module("networks", {"uri": URI, "state": "gathered", "scope": {"name_prefix": libvirt_cleanup}})
    assert net["gathered"][0]["hosts"] == [{"mac": "52:54:00:aa:bb:01", "ip": a + ".10", "name": "w1"}]


def test_deleted_by_scope_four_ways(pools, libvirt_cleanup):
    four_ways("pools", {"uri": URI, "config": pool_items(pools)})
    results = four_ways("pools", {"uri": URI, "state": "deleted", "config": [], "scope": {"name_prefix": libvirt_cleanup}})
    assert sorted(results["apply"]["objects"]) == sorted(pools)
    assert names("pool", libvirt_cleanup) == []


# -- a list whose networks could not all start: refused before anything is defined ------------------

def assert_list_refused(args, starts, made_before=()):
    for check in (True, False):
        result = run_module_process("networks", args, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert starts in result["msg"], result["msg"]
        assert "could not start" in result["msg"] and "Nothing was changed" in result["msg"], result["msg"]
    listed = [item["name"] for item in args["config"]]
    assert [n for n in listed if n in names("network", "")] == list(made_before), "nothing may be defined"
    return result


def test_two_overlapping_items_of_one_list_are_refused_before_either_is_made(libvirt_cleanup):
    (a,) = free_subnets(1)
    wide = {"name": libvirt_cleanup + "wide", "mode": "isolated", "address": a + ".1", "prefix": 24}
    inner = {"name": libvirt_cleanup + "inner", "mode": "isolated", "address": a + ".129", "prefix": 25}
    result = assert_list_refused({"uri": URI, "config": [wide, inner]},
                                 "config[1] (%s): option address: value '%s.128/25' overlaps %s.0/24 of active "
                                 "libvirt network %s, so network %s could not start"
                                 % (inner["name"], a, a, wide["name"], inner["name"]))
    assert result["msg"].startswith("config[1] (%s)" % inner["name"]) and result["blockers"], result
    # Defined only (state present), they may overlap: neither is started.
    both_present = [dict(wide, state="present"), dict(inner, state="present")]
    assert not run_module_process("networks", {"uri": URI, "config": both_present})["failed"]
    # An item removed earlier in the list frees its subnet for a later one.
    run_module_process("networks", {"uri": URI, "config": [dict(wide, state="active")]})
    swap = {"uri": URI, "config": [dict(wide, state="absent"), dict(inner, state="active")]}
    predicted = run_module_process("networks", swap, check=True)
    assert not predicted["failed"] and predicted["changed"], predicted
    done = run_module_process("networks", swap)
    assert not done["failed"] and done["objects"][inner["name"]]["network"]["state"] == "active", done


def test_a_list_item_on_an_existing_host_interface_leaves_the_items_before_it_unmade(libvirt_cleanup, prefix):
    a, b = free_subnets(2)
    dev = "mlkl" + prefix.split("-")[2][:6]
    subprocess.run(["ip", "link", "add", dev, "type", "bridge"], check=True)
    try:
        first = {"name": libvirt_cleanup + "first", "mode": "isolated", "address": a + ".1", "prefix": 24}
        clash = {"name": libvirt_cleanup + "clash", "mode": "isolated", "address": b + ".1", "prefix": 24,
                 "bridge": dev}
        assert_list_refused({"uri": URI, "config": [first, clash]},
                            "option bridge: value %r is already an interface of this host" % dev)
    finally:
        subprocess.run(["ip", "link", "del", dev], check=False)


def test_a_list_item_whose_start_fails_is_undefined_and_the_items_before_it_reported(libvirt_cleanup):
    """The kernel refuses a bridge named 'all', which no pre-check predicts: the item's network,
    defined by the run, is undefined again; the item before it stays made, and the failure says so."""
    a, b = free_subnets(2)
    first = {"name": libvirt_cleanup + "first", "mode": "isolated", "address": a + ".1", "prefix": 24}
    bad = {"name": libvirt_cleanup + "bad", "mode": "isolated", "address": b + ".1", "prefix": 24, "bridge": "all"}
    result = run_module_process("networks", {"uri": URI, "config": [first, bad]})
    assert result["failed"] and result["changed"] is True and result["undefined"] is True, result
    assert result["objects"][first["name"]]["changed"] is True, result
    assert "config[1] (%s)" % bad["name"] in result["msg"] and "undefined it again" in result["msg"], result["msg"]
    assert "already done, before it: %s: define, start" % first["name"] in result["msg"], result["msg"]
    assert names("network", libvirt_cleanup) == [first["name"]]
