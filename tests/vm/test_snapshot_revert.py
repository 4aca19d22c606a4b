"""Snapshot revert in a real guest: the guest sees the content from snapshot time again.

Two paths, matching the module's documented policy (internal snapshots only), on one guest that
boots twice (each boot costs a minute or more under TCG):
* a shut-off guest's internal disk snapshot, taken before its first boot; then a running guest
  without hostdevs -> internal checkpoint (disks + RAM) -> change -> revert -> the guest resumes
  with the original content, without a reboot;
* the disk snapshot reverted while the guest runs (and started again) -> the disk as it was
  when the snapshot was taken: what was written since is gone, and the guest boots afresh.
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


def marker_exists(guest) -> bool:
    return guest.ssh("test -e %s" % MARKER, check=False).returncode == 0


def test_revert_live_checkpoint_then_disk_snapshot_of_shut_off_guest(boot_guest, run_module, libvirtd) -> None:
    # Defined and never started: the disk snapshot of the shut-off guest comes first, so one boot
    # serves both paths (the snapshot of a guest shut down after its boot took a boot more).
    guest = boot_guest(start=False)
    disk = {"uri": libvirtd, "domain": guest.name, "name": "before-first-boot"}
    snapshot_disk_of_shut_off_guest(guest, run_module, disk)
    guest.start()
    guest.wait_ready(restarts_on_emulator_crash=1)
    revert_live_checkpoint_of_running_guest(guest, run_module, libvirtd)
    revert_disk_snapshot_of_running_guest(guest, run_module, disk)


def snapshot_disk_of_shut_off_guest(guest, run_module, disk) -> None:
    assert not guest.is_active()
    created = run_module("snapshot", dict(disk, description="before the first boot", metadata={"step": "1"}))
    assert created["changed"] is True and not created["failed"], created
    assert created["snapshot"]["domain_state"] == "shutoff" and created["snapshot"]["memory"] == "no"
    assert created["domain_state"] == "shutoff"
    assert run_module("snapshot", disk)["changed"] is False


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


def revert_disk_snapshot_of_running_guest(guest, run_module, disk) -> None:
    write_marker(guest, "changed")
    assert read_marker(guest) == "changed"
    booted = boot_id(guest)

    # The guest is running; the snapshot was taken shut off: libvirt stops it, restores the
    # disk, and after_revert=running boots it again.
    reverted = run_module("snapshot", dict(disk, state="reverted", after_revert="running"))
    assert reverted["changed"] is True and not reverted["failed"], reverted
    assert reverted["domain_state"] == "running"
    guest.wait_ready()
    # The disk as it was before the first boot: the marker written since is gone, and the guest
    # booted afresh from it.
    assert not marker_exists(guest)
    assert boot_id(guest) != booted
