"""mlinfra.kvm.domain_migration as a module process on libvirt's test driver: a source hypervisor
read from tests/fixtures/migration/source-node.xml, the destination test:///default. The test
driver cannot migrate, so this tier holds the input checks, the preflight's refusals, the domain
already on the destination (ok, changed=false) and check mode's plan; moves for real are
tests/integration/test_migration.py (a second libvirtd) and tests/vm/test_migration_guest.py."""
from __future__ import annotations

from typing import Any, Dict

import pytest

from conftest import ROOT, run_module_process

pytestmark = pytest.mark.unit

SOURCE = "test://%s" % (ROOT / "tests" / "fixtures" / "migration" / "source-node.xml")
DEST = "test:///default"


def migrate(check: bool = True, **args: Any) -> Dict[str, Any]:
    request = {"uri": SOURCE, "dest_uri": DEST, "name": "mlkvmtest-mover"}
    request.update(args)
    return run_module_process("domain_migration", request, check=check, diff=True)


@pytest.mark.parametrize("args,option,fragment", [
    ({"name": "../etc/passwd"}, "name", "not a valid name"),
    ({"dest_uri": SOURCE}, "dest_uri", "is the source's URI"),
    ({"dest_uri": "qemu+tcp://hv2 /system"}, "dest_uri", "is not a libvirt URI"),
    ({"dest_uri": "qemu+tcp://hv2/system\n"}, "dest_uri", "control character"),
    ({"migration_uri": "http://hv2"}, "migration_uri", "is not a migration URI"),
    ({"migration_uri": "tcp://hv2;reboot"}, "migration_uri", "is not a migration URI"),
    ({"timeout": 0}, "timeout", "out of range"),
    ({"max_downtime_ms": 600001}, "max_downtime_ms", "out of range"),
    ({"shutdown_timeout": -1}, "shutdown_timeout", "out of range"),
    ({"hostdevs": [{"address": "3b:00"}]}, "hostdevs[0].address", "PCI address"),
])
def test_bad_input_is_refused_naming_the_option_before_any_connection(args, option, fragment):
    # dest_uri points nowhere reachable: a refusal that named the connection would mean it was opened.
    request = dict({"dest_uri": "qemu+tcp://192.0.2.1/system"}, **args)
    result = migrate(**request)
    assert result["failed"] and not result["changed"], result
    assert "option %s" % option in result["msg"] and fragment in result["msg"], result["msg"]


def test_check_mode_runs_the_preflight_and_plans_a_live_migration():
    result = migrate(check=True, max_downtime_ms=400)
    assert not result["failed"], result
    assert result["changed"] is True and result["mode"] == "live"
    assert result["actions"] == [
        "create volume /default-pool/mover.qcow2 in pool default-pool on the destination (disk vda)",
        "set the maximum downtime to 400 ms",
        "migrate live to test:///default (peer-to-peer, copy_storage incremental: vda)",
        "remove the source's copy of disk vda (/default-pool/mover.qcow2)",
    ]
    assert result["disks"] == [{"target": "vda", "path": "/default-pool/mover.qcow2", "action": "copy"}]
    assert "network default is active on the destination" in result["preflight"]
    assert any(line.startswith("the destination has 3.0 MiB of free memory") for line in result["preflight"])
    assert result["domain"] == {"name": "mlkvmtest-mover", "uuid": "3f2a8c1e-5b7d-4e9a-8c6f-1d2e3f4a5b6c",
                                "state": "running", "uri": DEST}
    assert result["diff"] == {"before": {"uri": SOURCE, "state": "running"}, "after": {"uri": DEST, "state": "running"}}
    assert result["progress"] == [] and result["downtime_ms"] is None


def test_copy_storage_none_needs_the_disk_on_the_destination():
    result = migrate(copy_storage="none")
    assert result["failed"] and not result["changed"]
    assert result["problems"] == [
        "disk vda (/default-pool/mover.qcow2) is not copied (copy_storage none) and the destination has no volume at "
        "that path: make it available there in a storage pool at the same path (shared storage), or let it be copied "
        "(copy_storage auto)"]


@pytest.mark.parametrize("check", [True, False])
def test_a_domain_already_on_the_destination_is_ok_and_unchanged(check):
    # test:///default's own domain "test" is there and not on the source.
    result = migrate(check=check, name="test")
    assert not result["failed"], result
    assert result["changed"] is False and result["mode"] == "none" and result["actions"] == []
    assert result["domain"]["state"] == "running" and result["domain"]["uri"] == DEST


def test_a_domain_on_neither_side_is_refused():
    result = migrate(name="mlkvmtest-nowhere")
    assert result["failed"] and "is a domain on neither the source" in result["msg"] and "option name" in result["msg"]


def test_the_preflight_names_every_problem_at_once_and_changes_nothing():
    for check in (True, False):
        result = migrate(check=check, name="mlkvmtest-big")
        assert result["failed"] and result["changed"] is False, result
        assert result["problems"] == [
            "network mlkvmtest-only-here (interface 52:54:00:6d:6b:02) does not exist on the destination: define it "
            "there with the same name (mlinfra.kvm.network)",
            "the destination has 3.0 MiB of free memory, the domain needs 2048.0 MiB: free memory there (stop or move "
            "other guests) or pick another destination"]
        assert result["msg"].startswith("domain mlkvmtest-big cannot move to test:///default, nothing was changed: (1) ")


def test_a_running_domain_with_a_hostdev_is_refused_live_naming_it():
    result = migrate(check=False, name="mlkvmtest-gpu")
    assert result["failed"] and not result["changed"]
    assert result["hostdevs"] == ["0000:3b:00.0"]
    assert "has PCI host devices (0000:3b:00.0)" in result["msg"] and "allow_cold: true" in result["msg"]


def test_allow_cold_checks_the_hostdevs_on_the_destination():
    # test:///default lists no PCI node devices: the source's address is not there.
    result = migrate(name="mlkvmtest-gpu", allow_cold=True)
    assert result["failed"] and not result["changed"]
    assert any("0000:3b:00.0" in p and "is not a PCI device on the destination" in p and "option hostdevs" in p
               for p in result["problems"]), result["problems"]


def test_hostdevs_are_refused_for_a_live_migration():
    result = migrate(hostdevs=[{"vendor": "10de", "device": "2335"}])
    assert result["failed"] and "option hostdevs" in result["msg"] and "applies to a cold move only" in result["msg"]


def test_an_unknown_stale_disks_value_is_refused_naming_the_option_the_value_and_the_choices():
    result = migrate(dest_uri="qemu+tcp://192.0.2.1/system", stale_disks="overwrite")
    assert result["failed"] and not result.get("changed"), result
    assert "stale_disks" in result["msg"] and "overwrite" in result["msg"] and "refuse, replace" in result["msg"], result


def test_check_mode_with_stale_disks_replace_and_nothing_stale_plans_the_same_move():
    # replace only matters where the destination has a volume at a copied disk's path
    plain, replace = migrate(check=True), migrate(check=True, stale_disks="replace")
    assert not replace["failed"] and replace["actions"] == plain["actions"] and replace["preflight"] == plain["preflight"]
