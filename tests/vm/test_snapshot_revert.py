"""Snapshot revert in a real guest: the guest sees the content from snapshot time again.

Two paths, matching the module's documented policy (internal snapshots only), on one guest
(each boot costs a minute or more under TCG, and the second path starts where the first ends):
* running guest without hostdevs -> internal checkpoint (disks + RAM) -> change -> revert ->
  the guest resumes with the original content, without a reboot;
* shut off -> internal disk snapshot -> boot, change -> revert (and start) -> original content.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MARKER = "/home/mlkvm/marker"


def write_marker(guest, text: str) -> None:
    # sync: the write must be on the virtual disk before a snapshot or a hard stop.
    guest.ssh("printf %%s %s > %s && sync" % (text, MARKER))


def read_marker(guest) -> str:
    return guest.ssh("cat %s" % MARKER).stdout


def boot_id(guest) -> str:
    return guest.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()


def test_revert_live_checkpoint_then_disk_snapshot_of_shut_off_guest(boot_guest, run_module, libvirtd) -> None:
    guest = boot_guest()
    revert_live_checkpoint_of_running_guest(guest, run_module, libvirtd)
    revert_disk_snapshot_of_shut_off_guest(guest, run_module, libvirtd)


def revert_live_checkpoint_of_running_guest(guest, run_module, libvirtd) -> None:
    base = {"uri": libvirtd, "domain": guest.name, "name": "live"}
    write_marker(guest, "original")
    booted = boot_id(guest)

    created = run_module("snapshot", base)
    assert created["changed"] is True and not created["failed"], created
    assert created["snapshot"]["domain_state"] == "running" and created["snapshot"]["memory"] == "internal"
    assert created["domain_state"] == "running"

    write_marker(guest, "changed")
    reverted = run_module("snapshot", dict(base, state="reverted"))
    assert reverted["changed"] is True and not reverted["failed"], reverted
    assert reverted["domain_state"] == "running"
    guest.wait_ready()
    assert read_marker(guest) == "original"
    # Resumed from RAM, not rebooted.
    assert boot_id(guest) == booted


def revert_disk_snapshot_of_shut_off_guest(guest, run_module, libvirtd) -> None:
    base = {"uri": libvirtd, "domain": guest.name, "name": "before-change"}
    write_marker(guest, "original")
    guest.shutdown()

    created = run_module("snapshot", dict(base, description="marker says original", metadata={"step": "1"}))
    assert created["changed"] is True and not created["failed"], created
    assert created["snapshot"]["domain_state"] == "shutoff" and created["snapshot"]["memory"] == "no"
    assert run_module("snapshot", base)["changed"] is False

    guest.start()
    guest.wait_ready()
    write_marker(guest, "changed")
    assert read_marker(guest) == "changed"

    # The guest is running; the snapshot was taken shut off: libvirt stops it, restores the
    # disk, and after_revert=running boots it again.
    reverted = run_module("snapshot", dict(base, state="reverted", after_revert="running"))
    assert reverted["changed"] is True and not reverted["failed"], reverted
    assert reverted["domain_state"] == "running"
    guest.wait_ready()
    assert read_marker(guest) == "original"
