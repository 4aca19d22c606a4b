"""scripts/ensure-libvirtd.sh against the real libvirtd: the QEMU capability cache stays valid,
and a restart (as tests and the fault-injection tier do it) keeps the same set-up.

On a machine whose KVM is advertised but unusable, libvirt re-probes QEMU at every lookup unless
the daemon was started with a consistent /dev/kvm view (the script's private mount namespace);
on a hypervisor with working KVM nothing is changed. Both are checked the same way: through
libvirtd's own capability-cache debug log (``--check``), never by timing.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, mounted_tmpfs

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "ensure-libvirtd.sh"
VIEW_FILE = Path("/run/mlinfra/libvirtd-kvm-view")


def libvirtd_pid() -> int:
    """The running libvirtd; zombies (a daemon the fault-injection tests killed, not yet reaped
    where PID 1 is no init) are not counted."""
    out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, check=False).stdout.split()
    alive = [pid for pid in out if Path("/proc/%s/stat" % pid).exists()
             and Path("/proc/%s/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert len(alive) == 1, "expected one running libvirtd, found %s (all: %s)" % (alive, out)
    return int(alive[0])


def kvm_seen_by(pid: int) -> os.stat_result:
    """/dev/kvm as the process sees it (through its own mount namespace)."""
    return os.stat("/proc/%d/root/dev/kvm" % pid)


def under_systemd() -> bool:
    return Path("/proc/1/comm").read_text().strip() == "systemd"


def test_capability_cache_stays_valid(libvirtd) -> None:
    check = subprocess.run([str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "cache stays valid" in check.stdout


@pytest.mark.skipif(not Path("/dev/kvm").exists(), reason="no /dev/kvm: libvirt has no KVM view to keep consistent")
def test_restart_keeps_the_same_set_up(libvirtd) -> None:
    if under_systemd():
        pytest.skip("libvirtd runs under systemd here: the script leaves its units alone")
    view = VIEW_FILE.read_text().strip() if VIEW_FILE.exists() else "host"
    before = libvirtd_pid()
    host_before = os.stat("/dev/kvm")
    restart = subprocess.run([str(SCRIPT), "--restart"], capture_output=True, text=True, timeout=300, check=False)
    assert restart.returncode == 0, restart.stdout + restart.stderr
    after = libvirtd_pid()
    assert after != before, "--restart must start a new libvirtd"

    host_kvm = os.stat("/dev/kvm")
    seen = kvm_seen_by(after)
    assert (os.major(seen.st_rdev), os.minor(seen.st_rdev)) == (os.major(host_kvm.st_rdev), os.minor(host_kvm.st_rdev))
    own_ns = os.readlink("/proc/self/ns/mnt")
    daemon_ns = os.readlink("/proc/%d/ns/mnt" % after)
    if view == "host":
        # Nothing was changed at start: the daemon sees the host's node in the host's namespace.
        assert daemon_ns == own_ns
        assert seen.st_ino == host_kvm.st_ino
    else:
        # The recorded view survived the restart: a private node in a private namespace.
        assert daemon_ns != own_ns
        assert seen.st_ino != host_kvm.st_ino
        expected_mode = 0o660 if view == "qemu-group" else 0o600
        assert stat.S_IMODE(seen.st_mode) == expected_mode, (view, oct(seen.st_mode))
        assert seen.st_uid == 0
    # The host's own node is never touched by the script (mode, owner, change time).
    assert (host_kvm.st_mode, host_kvm.st_uid, host_kvm.st_gid, host_kvm.st_ctime_ns) == (
        host_before.st_mode, host_before.st_uid, host_before.st_gid, host_before.st_ctime_ns)

    check = subprocess.run([str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_libvirtd_sees_mounts_made_after_it_started(libvirtd, tmp_path) -> None:
    """A file system mounted on the host after libvirtd started (a pool's disk, an NFS share)
    is what libvirtd sees at that path too. In a namespace cut off from the host's later mounts,
    libvirtd wrote volumes into the directory under the mount point and reported success
    (found by tests/integration/test_fault_pool_full.py)."""
    with mounted_tmpfs(tmp_path / "later", "1m") as target:
        (target / "marker").write_text("on the new file system\n")
        seen = Path("/proc/%d/root%s/marker" % (libvirtd_pid(), target))
        assert seen.exists() and seen.read_text() == "on the new file system\n", \
            "libvirtd does not see a mount made after it started"
