"""mlinfra.kvm.domain_migration between the host's libvirtd and a second libvirtd on this machine
(tests/second_hypervisor.py: its own daemons, state and network namespace, reached over a veth as
qemu+tcp://ADDRESS/system; docs/migration.md says what that proves and what it does not).

The guests here boot no operating system: a type='qemu' domain of 64 MiB runs SeaBIOS, which
keeps looking for a boot device; that is a running QEMU with RAM, a disk and a NIC to migrate, in
seconds. A real guest that keeps counting through two moves is the vm tier's
(tests/vm/test_migration_guest.py). Each change is run four ways (check, apply, check again,
apply again); every object is named with the session-pid prefix and removed after the test, on
both hypervisors."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest
from lxml import etree

from conftest import _cleanup_libvirt, four_ways, run_module_process
from second_hypervisor import SecondHypervisor

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not shutil.which("qemu-io") or not shutil.which("unshare") or not shutil.which("ip"),
                       reason="needs qemu-io (qemu-utils), unshare (util-linux) and ip (iproute2)"),
]

IMAGES = Path("/var/lib/libvirt/images")
PATTERN = "0x5a"  # written into each test disk before a move, read back after it


def _sub(parent: Any, tag: str, attrs: Optional[Dict[str, str]] = None, text: Optional[str] = None) -> Any:
    el = etree.SubElement(parent, tag, attrs or {})
    if text is not None:
        el.text = text
    return el


def domain_xml(name: str, disks: list, network: Optional[str], cpu_model: Optional[str] = None,
               hostdev: Optional[str] = None, uuid: Optional[str] = None) -> str:
    """A SeaBIOS-only type='qemu' domain (no OS: it keeps running, looking for a boot device)."""
    root = etree.Element("domain", {"type": "qemu"})
    _sub(root, "name", text=name)
    if uuid:
        _sub(root, "uuid", text=uuid)
    _sub(root, "memory", {"unit": "MiB"}, "64")
    _sub(root, "vcpu", text="1")
    _sub(_sub(root, "os"), "type", {"arch": "x86_64", "machine": "pc"}, "hvm")
    if cpu_model:
        cpu = _sub(root, "cpu", {"mode": "custom", "match": "exact"})
        _sub(cpu, "model", {"fallback": "forbid"}, cpu_model)
        _sub(cpu, "feature", {"policy": "require", "name": "avx512f"})
    else:
        _sub(root, "cpu", {"mode": "maximum"})  # TCG (lab-facts: KVM does not run guests here)
    devices = _sub(root, "devices")
    for index, source in enumerate(disks):  # a path (type file) or (pool, volume) (type volume)
        volume = isinstance(source, tuple)
        disk = _sub(devices, "disk", {"type": "volume" if volume else "file", "device": "disk"})
        _sub(disk, "driver", {"name": "qemu", "type": "qcow2"})
        _sub(disk, "source", {"pool": source[0], "volume": source[1]} if volume else {"file": str(source)})
        _sub(disk, "target", {"dev": "vd" + "abcd"[index], "bus": "virtio"})
    if network:
        iface = _sub(devices, "interface", {"type": "network"})
        _sub(iface, "source", {"network": network})
        _sub(iface, "model", {"type": "virtio"})
    if hostdev:
        # managed='no' and an address this host lacks: nothing can ever be detached from a host driver.
        dev = _sub(devices, "hostdev", {"mode": "subsystem", "type": "pci", "managed": "no"})
        dom, bus, rest = hostdev.split(":")
        slot, func = rest.split(".")
        address = {"domain": "0x" + dom, "bus": "0x" + bus, "slot": "0x" + slot, "function": "0x" + func}
        _sub(_sub(dev, "source"), "address", address)
    _sub(devices, "memballoon", {"model": "none"})
    return etree.tostring(root, encoding="unicode")


def network_xml(name: str) -> str:
    """An isolated network without addresses: a bridge only, so no subnet can clash."""
    root = etree.Element("network")
    _sub(root, "name", text=name)
    return etree.tostring(root, encoding="unicode")


def pool_xml(name: str, path: Path) -> str:
    root = etree.Element("pool", {"type": "dir"})
    _sub(root, "name", text=name)
    _sub(_sub(root, "target"), "path", text=str(path))
    return etree.tostring(root, encoding="unicode")


def make_pool(conn: Any, name: str, path: Path) -> Any:
    pool = conn.storagePoolDefineXML(pool_xml(name, path), 0)
    pool.build(0)
    pool.create(0)
    return pool


def make_network(conn: Any, name: str) -> None:
    conn.networkDefineXML(network_xml(name)).create()


def qemu_io(path: Path, command: str) -> subprocess.CompletedProcess:
    """qemu-io on an image; a read takes no lock (-U -r), since a running QEMU may hold the image."""
    argv = ["qemu-io", "-U", "-r", "-c", command, str(path)] if command.startswith("read") else ["qemu-io", "-c", command, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def has_pattern(path: Path) -> bool:
    proc = qemu_io(path, "read -P %s 0 1M" % PATTERN)
    return proc.returncode == 0 and "Pattern verification failed" not in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def hv2(libvirtd: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondHypervisor]:
    """One second hypervisor for the file (it starts in about a second; its state is wiped with it)."""
    import libvirt
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    second = SecondHypervisor(tmp_path_factory.mktemp("hv2")).start()
    print("\nsecond hypervisor %s up in %.2f s" % (second.uri, second.started_s))
    yield second
    second.stop()


@pytest.fixture
def env(libvirt_cleanup: str, hv2: SecondHypervisor) -> Iterator[Dict[str, Any]]:
    """A network and a pool of the same names on both hypervisors (the pool at the same path: each
    host has its own /var/lib/libvirt), and the connections; everything named with the prefix is
    removed from both after the test."""
    import libvirt
    prefix = libvirt_cleanup
    host = libvirt.open("qemu:///system")
    second = hv2.connect()
    try:
        pool_dir = IMAGES / ("%spool" % prefix)
        for conn in (host, second):
            make_network(conn, "%snet" % prefix)
            make_pool(conn, "%spool" % prefix, pool_dir)
        yield {"prefix": prefix, "host": host, "second": second, "hv2": hv2, "pool_dir": pool_dir,
               "pool": "%spool" % prefix, "network": "%snet" % prefix}
    finally:
        _cleanup_libvirt(hv2.uri, prefix)
        second.close()
        host.close()
        shutil.rmtree(str(IMAGES / ("%spool" % prefix)), ignore_errors=True)


def disk_in(conn: Any, pool: str, name: str, size_mib: int = 16) -> Path:
    """A qcow2 volume in ``pool`` holding the test pattern in its first MiB."""
    root = etree.Element("volume")
    _sub(root, "name", text=name)
    _sub(root, "capacity", {"unit": "MiB"}, str(size_mib))
    _sub(_sub(root, "target"), "format", {"type": "qcow2"})
    vol = conn.storagePoolLookupByName(pool).createXML(etree.tostring(root, encoding="unicode"), 0)
    path = Path(vol.path())
    proc = qemu_io(path, "write -P %s 0 1M" % PATTERN)
    assert proc.returncode == 0, proc.stderr
    return path


def lookup(conn: Any, name: str) -> Optional[Any]:
    import libvirt
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError:
        return None


def timed_four_ways(args: Dict[str, Any], label: str) -> Dict[str, Dict[str, Any]]:
    """four_ways, with its wall time printed (pytest -s shows it; docs/migration.md quotes it)."""
    began = time.monotonic()
    results = four_ways("domain_migration", args)
    seconds = time.monotonic() - began
    print("%s: four ways in %.1f s (apply %s); applied: %s"
          % (label, seconds, results["apply"]["mode"], results["apply"]["actions"]))
    return results


def test_live_to_the_second_hypervisor_and_back_four_ways(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%slive" % env["prefix"]
    path = disk_in(host, env["pool"], "live.qcow2")
    by_name = disk_in(host, env["pool"], "by-name.qcow2")  # a type='volume' disk: pool and volume name
    dom = host.defineXML(domain_xml(name, [path, (env["pool"], "by-name.qcow2")], env["network"]))
    dom.create()
    uuid = dom.UUIDString()
    # libvirt copies a type='volume' disk only whole during a live migration
    refused = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri, "copy_storage": "incremental"},
                                 check=True)
    assert refused["failed"] and "option copy_storage" in refused["msg"] and "(vdb)" in refused["msg"], refused

    there = timed_four_ways({"name": name, "dest_uri": hv2.uri, "migration_uri": hv2.migration_uri,
                             "max_downtime_ms": 500, "timeout": 300}, "live_there")
    check, apply = there["check"], there["apply"]
    assert check["mode"] == apply["mode"] == "live"
    assert check["actions"] == apply["actions"], "check mode predicts what the real run does"
    assert apply["copy_storage"] == "all" and apply["disks"] == [
        {"target": "vda", "path": str(path), "action": "copy"}, {"target": "vdb", "path": str(by_name), "action": "copy"}]
    assert any(line.startswith("network %s is active" % env["network"]) for line in apply["preflight"])
    assert apply["progress"][-1] == "completed" and len(apply["progress"]) >= 1, apply["progress"]
    assert there["check_again"]["mode"] == there["apply_again"]["mode"] == "none"
    moved = lookup(second, name)
    assert moved is not None and moved.isActive() and moved.UUIDString() == uuid and moved.isPersistent()
    assert lookup(host, name) is None, "undefined on the source"
    assert not path.exists() and not by_name.exists(), "the source's copies of the disks are removed"
    assert has_pattern(hv2.path_here(str(path))) and has_pattern(hv2.path_here(str(by_name))), "the disks arrived"

    back = timed_four_ways({"name": name, "uri": hv2.uri, "dest_uri": hv2.host_uri,
                            "migration_uri": hv2.host_migration_uri, "timeout": 300}, "live_back")
    assert back["apply"]["mode"] == "live" and back["apply_again"]["mode"] == "none"
    home = lookup(host, name)
    assert home is not None and home.isActive() and home.UUIDString() == uuid
    assert lookup(second, name) is None
    assert has_pattern(path) and has_pattern(by_name) and not hv2.path_here(str(path)).exists()


def test_shut_off_domain_moves_cold_four_ways(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%scold" % env["prefix"]
    path = disk_in(host, env["pool"], "cold.qcow2")
    by_name = disk_in(host, env["pool"], "cold-by-name.qcow2")
    dom = host.defineXML(domain_xml(name, [path, (env["pool"], "cold-by-name.qcow2")], env["network"]))
    dom.setAutostart(1)

    results = timed_four_ways({"name": name, "dest_uri": hv2.uri, "timeout": 120}, "cold")
    apply = results["apply"]
    assert apply["mode"] == "cold" and apply["domain"]["state"] == "shutoff"
    assert results["check"]["actions"] == apply["actions"]
    assert [a.split(" ")[0] for a in apply["actions"]] == ["create", "copy", "create", "copy", "define", "undefine", "set",
                                                           "remove", "remove"]
    assert any(line.startswith("copied %s" % path) for line in apply["progress"])
    assert any(line.startswith("copied %s" % by_name) for line in apply["progress"])
    moved = lookup(second, name)
    assert moved is not None and not moved.isActive() and moved.autostart()
    assert lookup(host, name) is None and not path.exists() and not by_name.exists()
    assert has_pattern(hv2.path_here(str(path))) and has_pattern(hv2.path_here(str(by_name))), "the image files arrived"


def test_preflight_refuses_against_the_second_libvirtd_naming_each_problem(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    prefix = env["prefix"]
    only_here = "%sonly-here" % prefix
    make_network(host, only_here)
    lonely_dir = IMAGES / ("%slonely" % prefix)
    make_pool(host, "%slonely" % prefix, lonely_dir)
    lonely = disk_in(host, "%slonely" % prefix, "a.qcow2")
    taken = disk_in(host, env["pool"], "taken.qcow2")
    disk_in(second, env["pool"], "taken.qcow2")  # the destination already has a file at that path
    name = "%srefused" % prefix
    host.defineXML(domain_xml(name, [lonely, taken], only_here, cpu_model="Skylake-Server"))

    for check in (True, False):
        result = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri}, check=check)
        assert result["failed"] and result["changed"] is False, result
        problems = result["problems"]
        assert len(problems) == 4, problems
        assert "network %s" % only_here in problems[0] and "does not exist on the destination" in problems[0]
        assert "no active storage pool with target %s" % lonely_dir in problems[1]
        assert "already has a volume at that path" in problems[2] and str(taken) in problems[2]
        assert "cannot run the domain's CPU (model Skylake-Server)" in problems[3]
        assert "avx512" in problems[3].lower(), "libvirt's own reason is passed on"
    assert lookup(second, name) is None and lookup(host, name) is not None
    assert lonely.exists() and taken.exists()
    shutil.rmtree(str(lonely_dir), ignore_errors=True)


def test_domain_with_a_hostdev_is_refused_live_and_checked_on_the_destination_cold(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%sgpu" % env["prefix"]
    dom = host.defineXML(domain_xml(name, [], env["network"]))
    dom.create()
    # The running guest has no device; its persistent definition has one (what the destination would
    # keep): the refusal holds for either.
    host.defineXML(domain_xml(name, [], env["network"], hostdev="0000:7f:1f.7", uuid=dom.UUIDString()))

    refused = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri})
    assert refused["failed"] and not refused["changed"], refused
    assert "has PCI host devices (0000:7f:1f.7)" in refused["msg"] and "allow_cold: true" in refused["msg"]

    cold = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri, "allow_cold": True}, check=True)
    assert cold["failed"] and not cold["changed"], cold
    assert any("0000:7f:1f.7" in p and "is not a PCI device on the destination" in p for p in cold["problems"]), cold
    assert dom.isActive() and lookup(second, name) is None


def test_a_live_migration_failing_half_way_leaves_the_domain_running_on_the_source(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%shalf" % env["prefix"]
    path = disk_in(host, env["pool"], "half.qcow2")
    dom = host.defineXML(domain_xml(name, [path], env["network"]))
    dom.create()
    # Port 1 on the second hypervisor: nothing listens, so QEMU's stream cannot connect after the
    # module has made the destination's volume.
    result = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri,
                                                     "migration_uri": "tcp://%s:1" % hv2.addr, "timeout": 60})
    assert result["failed"] and result["changed"] is True, result
    assert result["failed_action"].startswith("migrate live to %s" % hv2.uri)
    assert result["actions"][0].startswith("create volume %s" % path)
    assert result["actions"][1].startswith("undo: remove volume %s" % path)
    assert "is running on the source" in result["msg"] and result["source_state"] == "running"
    assert dom.isActive() and lookup(second, name) is None
    assert not hv2.path_here(str(path)).exists(), "the volume made for the copy is removed again"
    assert has_pattern(path)


def test_past_the_timeout_the_job_is_aborted_and_the_domain_keeps_running_on_the_source(env):
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%sslow" % env["prefix"]
    path = disk_in(host, env["pool"], "slow.qcow2", size_mib=64)
    # 64 MiB of data to copy: a minute at the bound below, so that the abort past 3 s lands while
    # the copy runs even when a loaded machine delays a progress poll by many seconds
    assert qemu_io(path, "write -P 0x33 1M 63M").returncode == 0
    dom = host.defineXML(domain_xml(name, [path], env["network"]))
    dom.create()
    # 1 MiB/s: libvirt bounds the disk mirror with the migration's bandwidth
    dom.migrateSetMaxSpeed(1, 0)
    began = time.monotonic()
    result = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri,
                                                     "migration_uri": hv2.migration_uri, "timeout": 3})
    seconds = time.monotonic() - began
    print("ended after %.1f s: %s" % (seconds, result.get("msg", "(no message: the move did not fail)")[:160]))
    assert result["failed"] and result["changed"] is True, result
    assert "did not finish within 3 s (option timeout) and was aborted" in result["msg"]
    assert "abort the migration job (past the timeout of 3 s)" in result["actions"]
    assert result["source_state"] == "running" and result["progress"], result
    assert dom.isActive() and lookup(second, name) is None
    assert not hv2.path_here(str(path)).exists(), "the volume made for the copy is removed again"
    assert has_pattern(path)


def test_a_stale_image_left_by_a_killed_move_blocks_the_move_back_until_stale_disks_replace(env):
    # A move killed after the domain reached the second hypervisor, before it removed the source's
    # image, is remove_source_disks: false: the host keeps the image the domain left behind.
    host, second, hv2 = env["host"], env["second"], env["hv2"]
    name = "%sstale" % env["prefix"]
    path = disk_in(host, env["pool"], "stale.qcow2")
    dom = host.defineXML(domain_xml(name, [path], env["network"]))
    dom.create()
    uuid = dom.UUIDString()
    away = run_module_process("domain_migration", {"name": name, "dest_uri": hv2.uri, "migration_uri": hv2.migration_uri,
                                                   "remove_source_disks": False, "timeout": 300})
    assert not away["failed"] and away["mode"] == "live", away
    assert lookup(host, name) is None and path.exists(), "the source's image stays, stale"
    # Mark the stale image: what comes back must be the domain's disk from the second hypervisor.
    assert qemu_io(path, "write -P 0x11 0 1M").returncode == 0
    back = {"name": name, "uri": hv2.uri, "dest_uri": hv2.host_uri, "migration_uri": hv2.host_migration_uri,
            "timeout": 300}

    for check in (True, False):
        refused = run_module_process("domain_migration", back, check=check)
        assert refused["failed"] and refused["changed"] is False, refused
        assert len(refused["problems"]) == 1, refused["problems"]
        assert "already has a volume at that path" in refused["problems"][0] and str(path) in refused["problems"][0]
        assert "stale_disks: replace" in refused["problems"][0]

    replace = dict(back, stale_disks="replace")
    removal = ("remove the destination's stale volume %s in pool %s before the copy (disk vda, stale_disks: replace)"
               % (path, env["pool"]))
    predicted = run_module_process("domain_migration", replace, check=True)
    assert not predicted["failed"] and predicted["changed"] is True and predicted["mode"] == "live", predicted
    assert predicted["actions"][0] == removal, predicted["actions"]
    assert any("is used by no domain there: removed before the copy" in line for line in predicted["preflight"])
    still = qemu_io(path, "read -P 0x11 0 1M")
    assert still.returncode == 0 and "verification failed" not in still.stdout + still.stderr, "check mode removed nothing"
    assert lookup(second, name).isActive() and lookup(host, name) is None

    began = time.monotonic()
    moved = run_module_process("domain_migration", replace)
    print("moved back over the stale image in %.1f s: %s" % (time.monotonic() - began, moved.get("actions")))
    assert not moved["failed"] and moved["changed"] is True and moved["mode"] == "live", moved
    assert moved["actions"] == predicted["actions"], "check mode predicts what the real run does"
    home = lookup(host, name)
    assert home is not None and home.isActive() and home.UUIDString() == uuid and lookup(second, name) is None
    assert has_pattern(path), "the domain's own disk came back over the stale image"
    assert not hv2.path_here(str(path)).exists(), "the second hypervisor's copy is removed"

    again = run_module_process("domain_migration", replace)
    assert not again["failed"] and again["changed"] is False and again["mode"] == "none", again
