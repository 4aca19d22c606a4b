"""mlinfra.kvm.pool against a real libvirtd (qemu:///system)."""
from __future__ import annotations

import os

import libvirt
import pytest

from conftest import four_ways

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
