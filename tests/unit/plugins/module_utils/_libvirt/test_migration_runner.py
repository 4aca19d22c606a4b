"""domain_migration's runner in process, on libvirt's test driver (source and destination read
from tests/fixtures/migration/, a fresh copy per connection), with what the test driver cannot
do stood in for (the migration itself, a stream copy, the free memory of a node read from a file,
undefine's flags): the watch loop's progress lines and its abort past the timeout, a
failure half-way that removes what it made and says where the domain is, and a cold move that
undoes itself and starts the domain on the source again. The module as a process is
tests/unit/plugins/modules/test_domain_migration.py; real moves are the integration tier's."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci import PciDevice
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._migration import (
    MigrationRunner, argument_spec, memory_bytes, progress_line, read_disks, volume_xml)
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._migration_service import MigrationService
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import parse

from conftest import ROOT
from fake_module import StandInModule

libvirt = pytest.importorskip("libvirt")

pytestmark = pytest.mark.unit

SOURCE = "test://%s" % (ROOT / "tests" / "fixtures" / "migration" / "source-node.xml")
DEST = "test://%s" % (ROOT / "tests" / "fixtures" / "migration" / "dest-node.xml")


class FakeModule(StandInModule):
    def __init__(self, check_mode: bool = False, **params: Any) -> None:
        super().__init__(dict({"uri": SOURCE, "dest_uri": DEST, "name": "mlkvmtest-mover"}, **params), argument_spec(),
                         check_mode)


class Clock:
    """time.monotonic for the runner: each reading advances by ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class FakeJob:
    """A migration that runs for ``polls`` polls (forever with None, until aborted), then does
    ``finish`` (what a completed migration leaves behind) or fails with ``error``."""

    def __init__(self, polls: Optional[int], finish: Any = None, error: Optional[KvmError] = None) -> None:
        self.polls = polls
        self.finish = finish
        self.error = error
        self.aborted = False
        self.done = False

    def wait(self, seconds: float) -> bool:
        if self.done:
            return True
        if self.aborted:
            self.error = KvmError("libvirt error while migrating: code 78: operation aborted: migration out job: canceled by client")
            self.done = True
        elif self.polls is not None:
            self.polls -= 1
            if self.polls < 0:
                self.done = True
                if self.finish and not self.error:
                    self.finish()
        return self.done

    def succeeded(self) -> bool:
        return self.done and self.error is None

    def result(self) -> None:
        if self.error:
            raise self.error


@pytest.fixture
def conns() -> Iterator[Dict[str, Any]]:
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    src, dst = libvirt.open(SOURCE), libvirt.open(DEST)
    yield {"src": src, "dst": dst}
    src.close()
    dst.close()


def runner_for(conns: Dict[str, Any], check: bool = False, clock: Any = None, **params: Any) -> MigrationRunner:
    service = MigrationService(conns["src"], SOURCE, conns["dst"], DEST, sleep=lambda _s: None)
    service.set_max_downtime = lambda dom, ms: None  # the test driver has no migration parameters
    service.free_memory = lambda: 2 ** 30
    for side in (service.source, service.dest):  # the test driver refuses NVRAM/checkpoint flags
        side.undefine = lambda dom: dom.undefine()
    return MigrationRunner(FakeModule(check_mode=check, **params), service, monotonic=clock or Clock(0.5))


def arrive(conns: Dict[str, Any], name: str) -> Any:
    """What a completed peer-to-peer migration leaves: the domain running on the destination,
    gone from the source."""
    def finish() -> None:
        src = conns["src"].lookupByName(name)
        xml = src.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        src.destroy()
        src.undefine()
        conns["dst"].defineXML(xml).create()
    return finish


STATS = [
    {"type": 2, "time_elapsed": 500, "memory_total": 64 * 2 ** 20, "memory_remaining": 40 * 2 ** 20,
     "disk_total": 2 ** 20, "disk_remaining": 2 ** 20, "memory_iteration": 1, "memory_bps": 100 * 2 ** 20},
    {"type": 2, "time_elapsed": 1000, "memory_total": 64 * 2 ** 20, "memory_remaining": 2 ** 20,
     "disk_total": 2 ** 20, "disk_remaining": 0, "memory_iteration": 2, "memory_bps": 100 * 2 ** 20},
]


def test_check_mode_plans_and_moves_nothing(conns):
    runner = runner_for(conns, check=True)
    started: List[Any] = []
    runner.service.start_live_migration = lambda *args: started.append(args)
    result = runner.run()
    assert result["changed"] and result["mode"] == "live" and not started
    assert conns["src"].lookupByName("mlkvmtest-mover").isActive()
    assert [v.name() for v in conns["dst"].storagePoolLookupByName("default-pool").listAllVolumes()] == []


def test_a_live_migration_reports_progress_and_removes_the_source_copy(conns):
    runner = runner_for(conns, max_downtime_ms=250, migration_uri="tcp://192.0.2.2")
    stats = iter(STATS)
    calls: Dict[str, Any] = {}

    def start(dom: Any, params: Dict[str, Any], flags: int) -> FakeJob:
        calls.update(params=params, flags=flags)
        return FakeJob(2, finish=arrive(conns, "mlkvmtest-mover"))

    runner.service.start_live_migration = start
    runner.service.job_stats = lambda dom: next(stats, {})
    result = runner.run()
    assert result["changed"] and result["mode"] == "live" and result["domain"]["state"] == "running"
    assert result["progress"] == [
        "0.5 s, memory 40.0 MiB of 64.0 MiB remaining, disks 1.0 MiB of 1.0 MiB remaining, pass 1, 100.0 MiB/s",
        "1.0 s, memory 1.0 MiB of 64.0 MiB remaining, disks 0.0 MiB of 1.0 MiB remaining, pass 2, 100.0 MiB/s",
        "completed"]
    expected = (libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
                | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | libvirt.VIR_MIGRATE_NON_SHARED_INC)
    assert calls["flags"] == expected
    assert calls["params"] == {libvirt.VIR_MIGRATE_PARAM_URI: "tcp://192.0.2.2", libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS: ["vda"]}
    assert "set the maximum downtime to 250 ms" in result["actions"]
    assert conns["dst"].storageVolLookupByPath("/default-pool/mover.qcow2") is not None  # made before the copy
    with pytest.raises(libvirt.libvirtError):
        conns["src"].storageVolLookupByPath("/default-pool/mover.qcow2")


def test_past_the_timeout_the_job_is_aborted_and_the_domain_stays_on_the_source(conns):
    runner = runner_for(conns, clock=Clock(5.0), timeout=20)
    job = FakeJob(None)
    runner.service.start_live_migration = lambda *args: job
    runner.service.job_stats = lambda dom: STATS[0]
    runner.service.abort_job = lambda dom: setattr(job, "aborted", True)
    with pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    assert job.aborted
    assert "did not finish within 20 s (option timeout) and was aborted" in err.msg
    assert "Domain mlkvmtest-mover is running on the source" in err.msg
    assert err.details["changed"] is True and err.details["source_state"] == "running"
    assert err.details["failed_action"].startswith("migrate live to %s" % DEST)
    assert "abort the migration job (past the timeout of 20 s)" in err.details["actions"]
    assert err.details["undone"] == ["removed /default-pool/mover.qcow2 on the destination"]
    with pytest.raises(libvirt.libvirtError):
        conns["dst"].storageVolLookupByPath("/default-pool/mover.qcow2")


def test_a_job_that_completes_as_the_abort_comes_is_a_completed_move_and_keeps_the_destination_disk(conns):
    # A poll can wait behind a busy QEMU monitor: the deadline is seen only after the migration has
    # moved the domain, and libvirt refuses the abort since the domain has left the source.
    runner = runner_for(conns, clock=Clock(5.0), timeout=20)
    job = FakeJob(None, finish=arrive(conns, "mlkvmtest-mover"))
    runner.service.start_live_migration = lambda *args: job
    runner.service.job_stats = lambda dom: STATS[0]

    def abort_too_late(dom: Any) -> None:
        job.polls = 0  # the migration call returns successfully on the next wait
        raise KvmError("libvirt error while aborting the migration of mlkvmtest-mover: code 42: Domain not found")

    runner.service.abort_job = abort_too_late
    result = runner.run()
    assert result["changed"] is True and not result.get("failed"), result
    assert "abort the migration job (past the timeout of 20 s)" in result["actions"]
    assert "completed before the abort reached it" in result["progress"]
    assert conns["dst"].lookupByName("mlkvmtest-mover").isActive()
    assert conns["dst"].storageVolLookupByPath("/default-pool/mover.qcow2") is not None


def test_an_abort_refused_before_the_job_began_is_asked_again_and_the_move_is_aborted(conns):
    # On a loaded host the migration call may not have begun its job by the deadline: libvirt
    # refuses that abort; asked again a poll later, it cancels the move as the timeout says.
    runner = runner_for(conns, clock=Clock(5.0), timeout=20)
    job = FakeJob(None)
    runner.service.start_live_migration = lambda *args: job
    runner.service.job_stats = lambda dom: STATS[0]
    refusals = []

    def abort_once_the_job_began(dom: Any) -> None:
        if len(refusals) < 2:
            refusals.append(dom.name())
            raise KvmError("libvirt error while aborting the migration of mlkvmtest-mover: code 55: "
                           "operation not valid: no job is active on the domain")
        job.aborted = True

    runner.service.abort_job = abort_once_the_job_began
    with pytest.raises(KvmError) as caught:
        runner.run()
    assert len(refusals) == 2 and job.aborted
    assert "did not finish within 20 s (option timeout) and was aborted" in caught.value.msg
    assert caught.value.details["source_state"] == "running"


def test_an_abort_that_fails_while_the_job_runs_on_fails_the_move_naming_both(conns):
    runner = runner_for(conns, clock=Clock(5.0), timeout=20)
    job = FakeJob(None)
    runner.service.start_live_migration = lambda *args: job
    runner.service.job_stats = lambda dom: STATS[0]

    def abort_refused(dom: Any) -> None:
        raise KvmError("libvirt error while aborting the migration of mlkvmtest-mover: code 55: operation not valid")

    runner.service.abort_job = abort_refused
    with pytest.raises(KvmError) as caught:
        runner.run()
    assert "code 55" in caught.value.msg
    assert caught.value.details["failed_action"] == "abort the migration job (past the timeout of 20 s)"


class GpuOnDest:
    """The destination's PCI devices: an H200 alone in its IOMMU group, bound to vfio-pci."""

    def devices(self) -> Dict[str, PciDevice]:
        return {"0000:41:00.0": PciDevice("0000:41:00.0", "10de", "2335", "030200", "vfio-pci", 12)}

    def group_members(self, group: int) -> List[str]:
        return ["0000:41:00.0"]

    def describe(self) -> str:
        return "a stand-in node device list"


def test_a_cold_move_failing_half_way_is_undone_and_the_domain_runs_on_the_source_again(conns):
    runner = runner_for(conns, allow_cold=True, hostdevs=[{"vendor": "10de", "device": "2335", "index": 0}],
                        name="mlkvmtest-gpu")
    runner.service.dest_pci = GpuOnDest
    copied: List[str] = []
    runner.service.copy_volume = lambda path, pool, name, deadline: copied.append(path)
    # define on the destination succeeds, its start fails: everything done is undone
    real_start = runner.service.dest.start

    def refuse_start(dom: Any, paused: bool = False) -> None:
        raise KvmError("libvirt error while starting mlkvmtest-gpu: code 1: no IOMMU group")

    runner.service.dest.start = refuse_start
    with pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    assert err.details["failed_action"] == "start on the destination"
    assert err.details["undone"] == ["undefined it on the destination", "started it on the source again"]
    assert "Domain mlkvmtest-gpu is running on the source" in err.msg
    assert conns["src"].lookupByName("mlkvmtest-gpu").isActive()
    with pytest.raises(libvirt.libvirtError):
        conns["dst"].lookupByName("mlkvmtest-gpu")
    assert real_start is not refuse_start


def test_a_cold_move_puts_the_destination_hostdevs_into_the_definition(conns):
    runner = runner_for(conns, allow_cold=True, hostdevs=[{"vendor": "10de", "device": "2335", "index": 0}],
                        name="mlkvmtest-gpu")
    runner.service.dest_pci = GpuOnDest
    result = runner.run()
    assert result["mode"] == "cold" and result["hostdevs"] == ["0000:41:00.0"]
    assert result["actions"] == ["shut down on the source (clean, up to 120 s)",
                                 "define on the destination (hostdevs 0000:41:00.0)", "start on the destination",
                                 "undefine on the source"]
    moved = conns["dst"].lookupByName("mlkvmtest-gpu")
    assert moved.isActive() and "bus='0x41'" in moved.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    with pytest.raises(libvirt.libvirtError):
        conns["src"].lookupByName("mlkvmtest-gpu")


def test_a_domain_on_both_sides_is_refused(conns):
    conns["dst"].defineXML(conns["src"].lookupByName("mlkvmtest-mover").XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    with pytest.raises(ConflictError) as caught:
        runner_for(conns).run()
    assert "exists on both the source" in caught.value.msg


def test_readers() -> None:
    root = parse("<domain><currentMemory unit='MiB'>512</currentMemory><devices>"
                 "<disk type='file' device='cdrom'><source file='/x/seed.iso'/><target dev='sda'/><readonly/></disk>"
                 "<disk type='network' device='disk'><source protocol='rbd' name='p/v'/><target dev='vdb'/></disk>"
                 "</devices></domain>")
    assert memory_bytes(root) == 512 * 2 ** 20
    assert [(d["target"], d["path"], d["readonly"], d["type"]) for d in read_disks(root)] == [
        ("sda", "/x/seed.iso", True, "file"), ("vdb", None, False, "network")]
    assert progress_line({"time_elapsed": 2000, "data_remaining": 3 * 2 ** 20}) == "2.0 s, 3.0 MiB remaining"
    xml = volume_xml("top.qcow2", 1024, "qcow2", "/images/base.qcow2", "qcow2")
    assert parse(xml).findtext("backingStore/path") == "/images/base.qcow2"


# -- a stale image at a copied disk's path on the destination (option stale_disks) ----------------
STALE = "/default-pool/mover.qcow2"


def stale_volume_on_dest(conns: Dict[str, Any], name: str = "mover.qcow2", backing: Optional[str] = None) -> None:
    """What a move killed before remove_source_disks leaves on the host the domain comes back to."""
    root = ("<volume><name>%s</name><capacity unit='MiB'>16</capacity><target><format type='qcow2'/></target>%s"
            "</volume>" % (name, "<backingStore><path>%s</path><format type='qcow2'/></backingStore>" % backing
                           if backing else ""))
    conns["dst"].storagePoolLookupByName("default-pool").createXML(root, 0)


def dest_volumes(conns: Dict[str, Any]) -> List[str]:
    return sorted(v.name() for v in conns["dst"].storagePoolLookupByName("default-pool").listAllVolumes())


def test_a_stale_volume_on_the_destination_is_refused_by_default_naming_the_option(conns):
    stale_volume_on_dest(conns)
    with pytest.raises(ConflictError) as caught:
        runner_for(conns, check=True).run()
    problems = caught.value.details["problems"]
    assert len(problems) == 1 and "already has a volume at that path" in problems[0], problems
    assert STALE in problems[0] and "stale_disks: replace" in problems[0]
    assert dest_volumes(conns) == ["mover.qcow2"]


def test_check_mode_predicts_the_replacement_and_removes_nothing(conns):
    stale_volume_on_dest(conns)
    runner = runner_for(conns, check=True, stale_disks="replace")
    started: List[Any] = []
    runner.service.start_live_migration = lambda *args: started.append(args)
    result = runner.run()
    assert result["changed"] and not started
    assert result["actions"][:2] == [
        "remove the destination's stale volume %s in pool default-pool before the copy (disk vda, stale_disks: replace)"
        % STALE,
        "create volume %s in pool default-pool on the destination (disk vda)" % STALE]
    assert ("disk vda (%s): the destination's volume at that path (pool default-pool) is used by no domain there: "
            "removed before the copy (stale_disks: replace)" % STALE) in result["preflight"]
    assert dest_volumes(conns) == ["mover.qcow2"]
    assert conns["dst"].storageVolLookupByPath(STALE).info()[1] == 16 * 2 ** 20, "the stale volume is untouched"


def test_replace_removes_the_stale_volume_before_the_copy_and_moves(conns):
    stale_volume_on_dest(conns)
    runner = runner_for(conns, stale_disks="replace")
    order: List[str] = []
    real_delete = runner.service.delete_volume_in

    def delete(which: str, pool: str, name: str) -> None:
        order.append("delete %s %s/%s" % (which, pool, name))
        real_delete(which, pool, name)

    runner.service.delete_volume_in = delete

    def start(dom: Any, params: Dict[str, Any], flags: int) -> FakeJob:
        # the volume at the path now is the one made for the copy (the source's capacity), not the stale one
        order.append("migrate, destination volume of %d bytes" % conns["dst"].storageVolLookupByPath(STALE).info()[1])
        return FakeJob(0, finish=arrive(conns, "mlkvmtest-mover"))

    runner.service.start_live_migration = start
    runner.service.job_stats = lambda dom: {}
    result = runner.run()
    source_capacity = conns["dst"].storageVolLookupByPath(STALE).info()[1]
    assert order == ["delete dest default-pool/mover.qcow2", "migrate, destination volume of %d bytes" % source_capacity]
    assert source_capacity != 16 * 2 ** 20
    assert result["changed"] and result["domain"]["state"] == "running"
    assert result["actions"][0].startswith("remove the destination's stale volume %s" % STALE)
    assert conns["dst"].lookupByName("mlkvmtest-mover").isActive()


def test_replace_is_refused_when_a_domain_of_the_destination_uses_the_volume(conns):
    stale_volume_on_dest(conns)
    xml = conns["src"].lookupByName("mlkvmtest-mover").XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    root = parse(xml)
    root.find("name").text = "mlkvmtest-holder"
    root.remove(root.find("uuid"))
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import to_string
    conns["dst"].defineXML(to_string(root))  # defined, not running: it still counts
    with pytest.raises(ConflictError) as caught:
        runner_for(conns, check=True, stale_disks="replace").run()
    problems = caught.value.details["problems"]
    assert len(problems) == 1 and "is used by domain mlkvmtest-holder there" in problems[0], problems
    assert dest_volumes(conns) == ["mover.qcow2"]


def test_replace_is_refused_when_a_volume_of_the_destination_is_layered_on_it(conns):
    stale_volume_on_dest(conns)
    stale_volume_on_dest(conns, "overlay.qcow2", backing=STALE)
    with pytest.raises(ConflictError) as caught:
        runner_for(conns, stale_disks="replace").run()
    problems = caught.value.details["problems"]
    assert len(problems) == 1 and "is the backing image of /default-pool/overlay.qcow2" in problems[0], problems
    assert dest_volumes(conns) == ["mover.qcow2", "overlay.qcow2"]


@pytest.mark.parametrize("pool,fragment", [
    ({"active": False}, "outside its active storage pools, which libvirt cannot remove"),
    ({"type": "netfs"}, "of type netfs, storage both hosts may share"),
])
def test_replace_is_refused_outside_an_active_unshared_pool(conns, pool, fragment):
    # The pool list as the runner read it (once per run): what the test driver cannot be made to
    # hold with the volume still found at the path.
    stale_volume_on_dest(conns)
    runner = runner_for(conns, stale_disks="replace")
    runner._pools["dest"] = [dict(p, **pool) if p["name"] == "default-pool" else p for p in runner.service.pools("dest")]
    runner.dest_pool_for = lambda disk: {"name": "default-pool", "available": None}
    with pytest.raises(ConflictError) as caught:
        runner.run()
    problems = caught.value.details["problems"]
    assert len(problems) == 1 and fragment in problems[0], problems
    assert dest_volumes(conns) == ["mover.qcow2"]


def test_a_failed_move_after_the_replacement_says_the_stale_volume_was_removed(conns):
    stale_volume_on_dest(conns)
    runner = runner_for(conns, stale_disks="replace")
    runner.service.start_live_migration = lambda *args: FakeJob(
        0, error=KvmError("libvirt error while migrating: code 38: unable to connect"))
    with pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    assert err.details["changed"] is True
    assert err.details["actions"][0].startswith("remove the destination's stale volume %s" % STALE)
    assert err.details["replaced"] == [STALE]
    assert "the destination's stale volume %s had been removed before (stale_disks: replace)" % STALE in err.msg
    assert "Domain mlkvmtest-mover is running on the source" in err.msg
    assert dest_volumes(conns) == [], "the stale volume is gone and the one made for the copy removed again"
