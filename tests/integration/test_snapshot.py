"""mlinfra.kvm.snapshot against the real libvirtd: a defined (never started) type='qemu' domain
with a tiny qcow2 disk. Revert is proven on the disk itself with qemu-io (no guest needed)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest
from lxml import etree

from conftest import four_ways

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not shutil.which("qemu-img") or not shutil.which("qemu-io"),
                       reason="qemu-img/qemu-io not installed (apt-get install qemu-utils)"),
]

DISK_DIR_ROOT = Path("/var/lib/libvirt/images")


def _sub(parent: Any, tag: str, attrs: Dict[str, str] = None, text: str = None) -> Any:
    el = etree.SubElement(parent, tag, attrs or {})
    if text is not None:
        el.text = text
    return el


def domain_xml(name: str, disk: Path, disk_format: str, cdrom: Path) -> str:
    root = etree.Element("domain", {"type": "qemu"})
    _sub(root, "name", text=name)
    _sub(root, "memory", {"unit": "MiB"}, "64")
    _sub(root, "vcpu", text="1")
    _sub(_sub(root, "os"), "type", {"arch": "x86_64", "machine": "q35"}, "hvm")
    devices = _sub(root, "devices")
    vda = _sub(devices, "disk", {"type": "file", "device": "disk"})
    _sub(vda, "driver", {"name": "qemu", "type": disk_format})
    _sub(vda, "source", {"file": str(disk)})
    _sub(vda, "target", {"dev": "vda", "bus": "virtio"})
    sda = _sub(devices, "disk", {"type": "file", "device": "cdrom"})
    _sub(sda, "driver", {"name": "qemu", "type": "raw"})
    _sub(sda, "source", {"file": str(cdrom)})
    _sub(sda, "target", {"dev": "sda", "bus": "sata"})
    _sub(sda, "readonly")
    return etree.tostring(root, encoding="unicode")


@pytest.fixture
def disk_dir(libvirt_cleanup: str):
    path = DISK_DIR_ROOT / ("%sdisks" % libvirt_cleanup)
    path.mkdir(mode=0o711)
    yield path
    shutil.rmtree(str(path), ignore_errors=True)


def define(uri: str, name: str, disk_dir: Path, disk_format: str = "qcow2") -> Path:
    import libvirt
    disk = disk_dir / ("%s.%s" % (name, disk_format))
    subprocess.run(["qemu-img", "create", "-q", "-f", disk_format, str(disk), "16M"], check=True)
    cdrom = disk_dir / ("%s-seed.iso" % name)
    cdrom.write_bytes(b"\0" * 2048)  # a raw read-only file: must be left out of the snapshot
    conn = libvirt.open(uri)
    try:
        conn.defineXML(domain_xml(name, disk, disk_format, cdrom))
    finally:
        conn.close()
    return disk


@pytest.fixture
def shutoff_domain(libvirtd: str, libvirt_cleanup: str, disk_dir: Path):
    name = "%sdom" % libvirt_cleanup
    disk = define(libvirtd, name, disk_dir)
    return {"name": name, "disk": disk, "uri": libvirtd}


def qemu_snapshots(disk: Path) -> str:
    return subprocess.run(["qemu-img", "snapshot", "-l", "-U", str(disk)], check=True, capture_output=True,
                          text=True).stdout


def qemu_io(disk: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, str(disk)], capture_output=True, text=True, check=False)


def snapshot_names(uri: str, domain: str):
    import libvirt
    conn = libvirt.open(uri)
    try:
        return sorted(s.getName() for s in conn.lookupByName(domain).listAllSnapshots())
    finally:
        conn.close()


def test_create_four_ways(shutoff_domain) -> None:
    d = shutoff_domain
    args = {"uri": d["uri"], "domain": d["name"], "name": "base", "description": "clean install",
            "metadata": {"dataset": "v3", "epoch": 7}}
    results = four_ways("snapshot", args)
    assert results["check"]["actions"] == ["create internal disk snapshot"]
    assert results["check"]["diff"]["before"] == {"state": "absent"}
    snap = results["apply"]["snapshot"]
    assert snap["name"] == "base" and snap["description"] == "clean install"
    assert snap["metadata"] == {"dataset": "v3", "epoch": "7"}
    assert snap["location"] == "internal" and snap["domain_state"] == "shutoff" and snap["current"] is True
    # The cdrom was left out, the qcow2 disk got an internal snapshot.
    assert {"name": "sda", "snapshot": "no"} in snap["disks"]
    assert {"name": "vda", "snapshot": "internal"} in snap["disks"]
    assert "base" in qemu_snapshots(d["disk"])
    assert snapshot_names(d["uri"], d["name"]) == ["base"]
    assert results["apply_again"]["snapshot"]["creation_time"] == snap["creation_time"]


def test_description_and_metadata_update_four_ways(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    base = {"uri": d["uri"], "domain": d["name"], "name": "base"}
    created = run_module("snapshot", dict(base, description="first", metadata={"a": "1"}))
    assert created["changed"] is True, created
    results = four_ways("snapshot", dict(base, description="second", metadata={"a": "2", "b": "x"}))
    assert results["check"]["diff"]["before"]["metadata"] == {"a": "1"}
    assert results["apply"]["snapshot"]["description"] == "second"
    assert results["apply"]["snapshot"]["metadata"] == {"a": "2", "b": "x"}
    # The disk snapshot was not retaken, nor the marker of the current snapshot lost.
    assert results["apply"]["snapshot"]["creation_time"] == created["snapshot"]["creation_time"]
    assert results["apply"]["current"] == "base"
    # Options left out leave the stored values alone.
    assert run_module("snapshot", base)["changed"] is False
    assert run_module("snapshot", base)["snapshot"]["metadata"] == {"a": "2", "b": "x"}


def test_delete_four_ways(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    base = {"uri": d["uri"], "domain": d["name"], "name": "base"}
    run_module("snapshot", base)
    assert "base" in qemu_snapshots(d["disk"])
    results = four_ways("snapshot", dict(base, state="absent"))
    assert results["apply"]["snapshot"] is None
    assert snapshot_names(d["uri"], d["name"]) == []
    assert "base" not in qemu_snapshots(d["disk"])


def test_revert_restores_the_disk_and_is_always_an_action(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    base = {"uri": d["uri"], "domain": d["name"], "name": "clean"}
    assert qemu_io(d["disk"], "write -P 0x11 0 64k").returncode == 0
    assert run_module("snapshot", base)["changed"] is True
    assert qemu_io(d["disk"], "write -P 0x22 0 64k").returncode == 0
    # Check mode predicts the revert and does nothing.
    check = run_module("snapshot", dict(base, state="reverted"), check=True)
    assert check["changed"] is True and check["actions"] == ["revert to clean (then snapshot)"]
    assert qemu_io(d["disk"], "read -P 0x22 0 64k").returncode == 0
    reverted = run_module("snapshot", dict(base, state="reverted"))
    assert reverted["changed"] is True and not reverted["failed"], reverted
    assert reverted["domain_state"] == "shutoff" and reverted["current"] == "clean"
    read = qemu_io(d["disk"], "read -P 0x11 0 64k")
    assert read.returncode == 0 and "Pattern verification failed" not in read.stdout, read.stdout
    # A second revert is a second action (documented): it reports changed again.
    again = run_module("snapshot", dict(base, state="reverted"))
    assert again["changed"] is True


def test_info_lists_in_order_and_changes_nothing(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    base = {"uri": d["uri"], "domain": d["name"]}
    run_module("snapshot", dict(base, name="one", metadata={"k": "v"}))
    run_module("snapshot", dict(base, name="two"))
    info = run_module("snapshot_info", base)
    assert info["changed"] is False and not info["failed"], info
    assert [s["name"] for s in info["snapshots"]] == ["one", "two"]
    assert info["snapshots"][1]["parent"] == "one"
    assert info["current"] == "two"
    assert info["snapshot"] is None
    assert info["domain_state"] == "shutoff"
    named = run_module("snapshot_info", dict(base, name="one"))
    assert named["snapshot"]["metadata"] == {"k": "v"} and named["changed"] is False
    assert [s["name"] for s in named["snapshots"]] == ["one", "two"]
    # Check mode answers the same (an _info module runs in check mode too).
    checked = run_module("snapshot_info", dict(base, name="one"), check=True)
    assert not checked["failed"] and checked["changed"] is False, checked
    assert checked["snapshot"] == named["snapshot"] and checked["snapshots"] == named["snapshots"]
    assert snapshot_names(d["uri"], d["name"]) == ["one", "two"]


def test_info_of_a_domain_without_snapshots(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    info = run_module("snapshot_info", {"uri": d["uri"], "domain": d["name"]})
    assert not info["failed"] and info["changed"] is False, info
    assert info["snapshots"] == [] and info["current"] is None and info["snapshot"] is None


def test_state_info_is_refused(shutoff_domain, run_module) -> None:
    """state=info was removed in 0.2.0 (snapshot_info lists): refused before anything is read."""
    d = shutoff_domain
    result = run_module("snapshot", {"uri": d["uri"], "domain": d["name"], "name": "s", "state": "info"})
    assert result["failed"] and not result.get("changed"), result
    assert "value of state must be one of: present, absent, reverted, got: info" in result["msg"], result["msg"]
    assert "Traceback" not in result["msg"] and "exception" not in result, result
    assert snapshot_names(d["uri"], d["name"]) == []


@pytest.mark.parametrize("case, args, fragment", [
    ("unknown domain", {"domain": "{prefix}missing"}, "option domain: value '{prefix}missing' does not exist"),
    ("bad domain name", {"domain": "a/b"}, "option domain: value 'a/b' is not a valid name"),
    ("unknown snapshot", {"name": "nope"}, "option name: value 'nope' is not a snapshot of domain {domain}"),
    ("bad name", {"name": "has space"}, "option name: value 'has space' is not a valid name"),
    ("no domain", {"domain": None}, "missing required arguments: domain"),
])
def test_info_bad_input_is_a_clear_error(shutoff_domain, run_module, libvirt_cleanup, case, args, fragment) -> None:
    d = shutoff_domain
    request = {"uri": d["uri"], "domain": d["name"]}
    request.update({k: v.format(prefix=libvirt_cleanup) if isinstance(v, str) else v for k, v in args.items()})
    request = {k: v for k, v in request.items() if v is not None}
    result = run_module("snapshot_info", request)
    assert result["failed"] and not result.get("changed"), (case, result)
    assert fragment.format(prefix=libvirt_cleanup, domain=d["name"]) in result["msg"], (case, result["msg"])
    assert "Traceback" not in result["msg"] and "exception" not in result, (case, result)


def test_delete_with_children(shutoff_domain, run_module) -> None:
    d = shutoff_domain
    base = {"uri": d["uri"], "domain": d["name"]}
    run_module("snapshot", dict(base, name="one"))
    run_module("snapshot", dict(base, name="two"))
    result = run_module("snapshot", dict(base, name="one", state="absent", children=True))
    assert result["changed"] is True and result["snapshots"] == []
    assert snapshot_names(d["uri"], d["name"]) == []


@pytest.mark.parametrize("case, args, fragment", [
    ("unknown domain", {"domain": "{prefix}missing", "name": "s"}, "option domain:"),
    ("bad domain name", {"domain": "a/b", "name": "s"}, "option domain:"),
    ("no name", {"name": None}, "missing required arguments: name"),
    ("bad name", {"name": "has space"}, "option name:"),
    ("revert unknown", {"name": "nope", "state": "reverted"}, "is not a snapshot of domain"),
    ("metadata nested", {"name": "s", "metadata": {"a": {"b": 1}}}, "option metadata.a:"),
    ("description with marker", {"name": "s", "description": "x\n-- mlinfra.kvm metadata --\n{}"},
     "option description:"),
    # lxml refuses these in the snapshot XML ("All strings must be XML compatible"): the module
    # names the option instead, before any call.
    ("description with a control character", {"name": "s", "description": "run\x1b[31m red"},
     "option description: value 'run\\x1b[31m red' contains the control character U+001B"),
    ("metadata value with a control character", {"name": "s", "metadata": {"run": "7\x00"}},
     "option metadata.run: value '7\\x00' contains the control character U+0000"),
    ("metadata key with a control character", {"name": "s", "metadata": {"ru\x07n": "7"}},
     "option metadata: value 'ru\\x07n' contains the control character U+0007"),
])
def test_bad_input_is_a_clear_error(shutoff_domain, run_module, libvirt_cleanup, case, args, fragment) -> None:
    d = shutoff_domain
    request = {"uri": d["uri"], "domain": d["name"]}
    request.update({k: v.format(prefix=libvirt_cleanup) if isinstance(v, str) and k == "domain" else v
                    for k, v in args.items()})
    request = {k: v for k, v in request.items() if v is not None}
    result = run_module("snapshot", request)
    # An argspec error (a missing required option) reports no "changed" at all.
    assert result["failed"] and not result.get("changed"), (case, result)
    assert fragment in result["msg"], result["msg"]
    assert snapshot_names(d["uri"], d["name"]) == []
    assert qemu_snapshots(d["disk"]).strip() == ""


def test_control_character_in_an_update_is_refused_before_any_call(shutoff_domain, run_module) -> None:
    """An existing snapshot's description: check mode and a real run refuse alike, and the
    snapshot keeps its description."""
    d = shutoff_domain
    args = {"uri": d["uri"], "domain": d["name"], "name": "s", "description": "kept"}
    assert not run_module("snapshot", args)["failed"]
    for check in (True, False):
        result = run_module("snapshot", dict(args, description="tab\tok, bell\x07 not"), check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["option"] == "description" and "U+0007" in result["msg"], result["msg"]
        assert "XML compatible" not in result["msg"]
    info = run_module("snapshot_info", {"uri": d["uri"], "domain": d["name"]})
    assert [s["description"] for s in info["snapshots"]] == ["kept"]


def test_raw_disk_is_refused(libvirtd, libvirt_cleanup, disk_dir, run_module) -> None:
    name = "%sraw" % libvirt_cleanup
    disk = define(libvirtd, name, disk_dir, disk_format="raw")
    result = run_module("snapshot", {"uri": libvirtd, "domain": name, "name": "s"})
    assert result["failed"] and result["changed"] is False, result
    assert "vda (raw)" in result["msg"] and "qcow2" in result["msg"]
    assert snapshot_names(libvirtd, name) == []
    assert disk.exists()
