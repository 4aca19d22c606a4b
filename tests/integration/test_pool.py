"""mlinfra.kvm.pool against a real libvirtd (qemu:///system)."""
from __future__ import annotations

import os

import libvirt
import pytest

from conftest import define_disk_domain, four_ways

pytestmark = pytest.mark.integration


@pytest.fixture
def pool_args(libvirt_cleanup, tmp_path):
    return {"name": libvirt_cleanup + "pool", "target": str(tmp_path / "pool"), "uri": "qemu:///system"}


def test_check_mode_changes_nothing(pool_args, run_module):
    result = run_module("pool", pool_args, check=True)
    assert result["changed"] and result["actions"] == ["define", "build", "start"]
    assert not os.path.exists(pool_args["target"]), "check mode must not build the target"
    conn = libvirt.open("qemu:///system")
    try:
        assert pool_args["name"] not in [p.name() for p in conn.listAllStoragePools()]
    finally:
        conn.close()


def test_define_build_start_four_ways(pool_args):
    results = four_ways("pool", pool_args)
    assert results["check"]["actions"] == ["define", "build", "start"]
    assert results["apply"]["actions"] == ["define", "build", "start"]
    assert os.path.isdir(pool_args["target"])
    assert results["apply"]["pool"]["state"] == "active"
    assert results["check"]["diff"]["after"]["target"] == pool_args["target"]
    assert results["apply_again"]["pool"]["target"] == pool_args["target"]
    assert "<path>%s</path>" % pool_args["target"] in results["apply"]["xml"]


def test_existing_target_directory_is_not_rebuilt(pool_args, run_module):
    os.makedirs(pool_args["target"])
    marker = os.path.join(pool_args["target"], "keep.img")
    open(marker, "w").close()
    result = run_module("pool", pool_args)
    assert result["actions"] == ["define", "start"]
    assert os.path.exists(marker)
    assert result["pool"]["volumes"] == ["keep.img"]


def test_autostart_four_ways(pool_args, run_module):
    run_module("pool", pool_args)
    results = four_ways("pool", dict(pool_args, autostart=True))
    assert results["apply"]["actions"] == ["autostart on"]
    assert results["check"]["diff"]["before"]["autostart"] is False
    assert results["check"]["diff"]["after"]["autostart"] is True
    assert results["check_again"]["diff"]["before"] == results["check_again"]["diff"]["after"]
    conn = libvirt.open("qemu:///system")
    try:
        assert conn.storagePoolLookupByName(pool_args["name"]).autostart() == 1
    finally:
        conn.close()


def test_present_does_not_start(pool_args, run_module):
    results = four_ways("pool", dict(pool_args, state="present"))
    assert results["apply"]["pool"]["state"] == "inactive"
    assert "start" not in results["apply"]["actions"]


def test_target_change_refused_without_recreate(pool_args, run_module, tmp_path):
    run_module("pool", pool_args)
    other = str(tmp_path / "elsewhere")
    result = run_module("pool", dict(pool_args, target=other))
    assert result["failed"]
    assert "recreate: true" in result["msg"] and other in result["msg"]
    assert not os.path.exists(other)
    after = run_module("pool", pool_args, check=True)
    assert after["changed"] is False, "the refused request must not have changed the pool"


def test_target_change_with_recreate_four_ways(pool_args, run_module, tmp_path):
    run_module("pool", pool_args)
    open(os.path.join(pool_args["target"], "old.qcow2"), "w").close()
    other = str(tmp_path / "elsewhere")
    results = four_ways("pool", dict(pool_args, target=other, recreate=True))
    assert results["apply"]["actions"][:3] == ["stop", "undefine", "define"]
    assert results["apply"]["pool"]["target"] == other
    assert os.path.exists(os.path.join(pool_args["target"], "old.qcow2")), "volumes stay on disk"


def test_absent_keeps_volumes_unless_purge(pool_args, run_module):
    run_module("pool", pool_args)
    vol = os.path.join(pool_args["target"], "data.raw")
    with open(vol, "wb") as handle:
        handle.write(b"x" * 1024)
    results = four_ways("pool", dict(pool_args, state="absent"))
    assert results["apply"]["actions"] == ["stop", "undefine"]
    assert os.path.exists(vol)


def test_absent_purge_deletes_volumes(pool_args, run_module):
    run_module("pool", pool_args)
    with open(os.path.join(pool_args["target"], "data.raw"), "wb") as handle:
        handle.write(b"x")
    run_module("pool", pool_args)  # refresh happens on start; make libvirt see the file
    conn = libvirt.open("qemu:///system")
    try:
        conn.storagePoolLookupByName(pool_args["name"]).refresh(0)
    finally:
        conn.close()
    results = four_ways("pool", dict(pool_args, state="absent", purge=True))
    assert results["check"]["actions"] == ["delete volume data.raw", "stop", "delete target directory", "undefine"]
    assert not os.path.exists(pool_args["target"])


def test_xml_escape_hatch_four_ways(libvirt_cleanup, tmp_path):
    name = libvirt_cleanup + "xmlpool"
    xml = "<pool type='dir'><name>%s</name><target><path>%s</path></target></pool>" % (name, tmp_path / "x")
    os.makedirs(tmp_path / "x")
    four_ways("pool", {"name": name, "xml": xml, "state": "present"})


# -- bad input: a clear error, nothing changed ----------------------------------------------------

@pytest.mark.parametrize("bad_name", ["a/b", "a<b", "it's", "a&b", "", "-lead", "with space"])
def test_bad_names_are_refused(run_module, tmp_path, bad_name):
    result = run_module("pool", {"name": bad_name, "target": str(tmp_path / "p")})
    assert result["failed"]
    assert result["msg"].startswith("option name: value %r" % bad_name)
    assert "use 1-64 letters" in result["msg"]
    assert not os.path.exists(tmp_path / "p")


def test_target_that_is_a_file_is_refused(libvirt_cleanup, run_module, tmp_path):
    path = tmp_path / "afile"
    path.write_text("not a directory")
    result = run_module("pool", {"name": libvirt_cleanup + "f", "target": str(path)})
    assert result["failed"]
    assert "option target" in result["msg"] and "regular file" in result["msg"]
    conn = libvirt.open("qemu:///system")
    try:
        assert libvirt_cleanup + "f" not in [p.name() for p in conn.listAllStoragePools()]
    finally:
        conn.close()


def test_unknown_pool_type_is_refused(run_module, tmp_path):
    result = run_module("pool", {"name": "mlkvmtest-typ", "type": "zfsx", "target": str(tmp_path)})
    assert result["failed"]
    assert "type" in result["msg"] and "zfsx" in result["msg"] and "dir, logical, netfs" in result["msg"]


def test_unreachable_uri_reports_libvirt_error(run_module, tmp_path):
    result = run_module("pool", {"name": "mlkvmtest-u", "target": str(tmp_path),
                                 "uri": "qemu+unix:///system?socket=/nonexistent/libvirt-sock"})
    assert result["failed"]
    assert "option uri" in result["msg"]
    assert result["libvirt_code"] == libvirt.VIR_ERR_SYSTEM_ERROR
    assert result["libvirt_message"]


def test_uri_from_environment(monkeypatch, run_module, tmp_path):
    monkeypatch.setenv("LIBVIRT_DEFAULT_URI", "qemu+unix:///system?socket=/nonexistent/sock2")
    result = run_module("pool", {"name": "mlkvmtest-env", "target": str(tmp_path)})
    assert result["failed"] and "/nonexistent/sock2" in result["msg"]


# -- purge: list first, refuse volumes in use by a defined domain ---------------------------------

def pool_state(name):
    conn = libvirt.open("qemu:///system")
    try:
        pool = conn.storagePoolLookupByName(name)
        return "active" if pool.isActive() else "inactive"
    finally:
        conn.close()


@pytest.fixture
def pool_with_disks(pool_args, run_module):
    run_module("pool", pool_args)
    paths = {}
    for vol in ("a.qcow2", "b.qcow2"):
        result = run_module("volume", {"name": vol, "pool": pool_args["name"], "capacity": "8M"})
        assert not result["failed"], result
        paths[vol] = result["volume"]["path"]
    return paths


@pytest.mark.parametrize("stopped", [False, True], ids=["active", "inactive"])
def test_purge_refused_while_a_domain_uses_a_volume(pool_args, pool_with_disks, run_module, stopped):
    dom = pool_args["name"] + "-dom"
    define_disk_domain(dom, [{"file": pool_with_disks["b.qcow2"]}])
    if stopped:  # an inactive pool must be refused before it is started to list its volumes
        assert not run_module("pool", dict(pool_args, state="present"))["failed"]
        conn = libvirt.open("qemu:///system")
        try:
            conn.storagePoolLookupByName(pool_args["name"]).destroy()
        finally:
            conn.close()
    for check in (True, False):
        result = run_module("pool", dict(pool_args, state="absent", purge=True), check=check, diff=True)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option purge: value True would delete volumes of pool %s" % pool_args["name"])
        assert "b.qcow2: domain %s (disk)" % dom in result["msg"] and "force: true" in result["msg"]
        assert "a.qcow2" not in result["msg"], "only the volumes in use are named"
        assert result["volumes_in_use"] == {"b.qcow2": ["domain %s (disk)" % dom]}
    assert all(os.path.exists(p) for p in pool_with_disks.values())
    assert pool_state(pool_args["name"]) == ("inactive" if stopped else "active")


def test_purge_refused_for_the_backing_image_of_a_used_overlay(pool_args, pool_with_disks, run_module, tmp_path,
                                                               libvirt_cleanup):
    other = {"name": libvirt_cleanup + "vms", "target": str(tmp_path / "vms")}
    run_module("pool", other)
    overlay = run_module("volume", {"name": "vm.qcow2", "pool": other["name"],
                                    "backing": pool_with_disks["a.qcow2"]})["volume"]["path"]
    dom = libvirt_cleanup + "ovl"
    define_disk_domain(dom, [{"file": overlay}])
    result = run_module("pool", dict(pool_args, state="absent", purge=True))
    assert result["failed"] and result["changed"] is False, result
    assert "a.qcow2: domain %s (backing image of its disk %s)" % (dom, overlay) in result["msg"]
    assert os.path.exists(pool_with_disks["a.qcow2"])


def test_purge_with_force_four_ways(pool_args, pool_with_disks, run_module):
    dom = pool_args["name"] + "-dom"
    define_disk_domain(dom, [{"file": pool_with_disks["a.qcow2"]}])
    results = four_ways("pool", dict(pool_args, state="absent", purge=True, force=True))
    for key in ("check", "apply"):  # listed before anything is deleted, the same in both
        assert results[key]["purged"] == ["a.qcow2", "b.qcow2"]
        assert results[key]["diff"]["before"]["volumes"] == ["a.qcow2", "b.qcow2"]
        assert results[key]["diff"]["after"]["volumes"] == []
    assert results["apply"]["actions"] == ["delete volume a.qcow2", "delete volume b.qcow2", "stop",
                                           "delete target directory", "undefine"]
    warnings = [w["event"]["msg"] if isinstance(w, dict) else w for w in results["apply"].get("warnings", [])]
    assert any("a.qcow2: domain %s (disk)" % dom in w for w in warnings), results["apply"]
    assert not os.path.exists(pool_args["target"])


def test_purge_of_an_inactive_pool_predicts_its_volumes(pool_args, pool_with_disks, run_module):
    conn = libvirt.open("qemu:///system")
    try:
        conn.storagePoolLookupByName(pool_args["name"]).destroy()
    finally:
        conn.close()
    results = four_ways("pool", dict(pool_args, state="absent", purge=True))
    assert results["check"]["actions"] == results["apply"]["actions"] == [
        "start (to purge volumes)", "delete volume a.qcow2", "delete volume b.qcow2", "stop",
        "delete target directory", "undefine"]
    assert results["check"]["purged"] == results["apply"]["purged"] == ["a.qcow2", "b.qcow2"]
    assert not os.path.exists(pool_args["target"])


# -- bounded input: refused in check and real runs, nothing defined or built --------------------

def pool_names():
    conn = libvirt.open("qemu:///system")
    try:
        return [p.name() for p in conn.listAllStoragePools()]
    finally:
        conn.close()


def test_xml_whose_name_differs_is_refused_then_the_fixed_one_applies(libvirt_cleanup, run_module, tmp_path):
    name, other = libvirt_cleanup + "xmlname", libvirt_cleanup + "other"
    os.makedirs(tmp_path / "x")
    xml = "<pool type='dir'><name>%s</name><target><path>%s</path></target></pool>"
    for check in (True, False):
        result = run_module("pool", {"name": name, "xml": xml % (other, tmp_path / "x"), "state": "present"},
                            check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option xml: value ")
        assert "<name>%s</name>" % other in result["msg"] and "option name is %r" % name in result["msg"]
    assert name not in pool_names() and other not in pool_names()
    four_ways("pool", {"name": name, "xml": xml % (name, tmp_path / "x"), "state": "present"})


@pytest.mark.parametrize("option, value", [("target", "/tmp/mlkvmtest-ctl\n"), ("name", "mlkvmtest-ctl\x1b")])
def test_control_characters_refused_nothing_defined(libvirt_cleanup, run_module, tmp_path, option, value):
    args = {"name": libvirt_cleanup + "ctl", "target": str(tmp_path / "p")}
    args[option] = value
    for check in (True, False):
        result = run_module("pool", args, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option %s: value %r contains the control character" % (option, value))
    assert not any(n.startswith(libvirt_cleanup) for n in pool_names())
    assert not os.path.exists(tmp_path / "p") and not os.path.exists(value)
