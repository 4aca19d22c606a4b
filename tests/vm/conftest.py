"""Fixtures of the ``vm`` tier: the guest image (built once, cached by its recipe stamp) and
booted guests (one at a time: the lab host has 2 cores and guests run under TCG)."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

# pytest imports every conftest.py under the name "conftest"; loading this one replaced the
# tests/ conftest in sys.modules. Re-export its helpers so `from conftest import four_ways`
# keeps working for tests in this directory.
_spec = importlib.util.spec_from_file_location("_mlkvm_root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
four_ways = _root.four_ways
run_module_process = _root.run_module_process
ROOT = _root.ROOT
SHARED = _root.SHARED
TEST_PREFIX = _root.TEST_PREFIX
COLLECTIONS = _root.COLLECTIONS
module_env = _root.module_env


# Guests take minutes to boot. tests/conftest.py's pytest_sessionfinish removes EVERY
# 'mlkvmtest-' object when any pytest session ends, so on a shared host another engineer's
# 20-second unit run destroyed our guests mid-boot (seen repeatedly). The vm tier therefore
# names its objects 'mlkvmvm-<pid>-<hex>-': nobody else's cleanup matches them, and leftovers
# of killed runs are removed here when their pytest process is gone.
VM_PREFIX = "mlkvmvm-"
_VM_NAME_RE = re.compile(r"^%s(\d+)-" % VM_PREFIX)


@pytest.fixture
def prefix() -> str:
    """Overrides tests/conftest.py's prefix for this directory (see VM_PREFIX above)."""
    return "%s%d-%s-" % (VM_PREFIX, os.getpid(), uuid.uuid4().hex[:6])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session", autouse=True)
def _remove_vm_leftovers(libvirtd):
    """Remove guests, networks and guest directories of vm-tier runs whose process died."""
    dead = set()
    try:
        import libvirt
        conn = libvirt.open(libvirtd)
        names = [d.name() for d in conn.listAllDomains()] + [n.name() for n in conn.listAllNetworks()]
        conn.close()
    except Exception:  # no daemon: the tests will say so themselves
        names = []
    names += [p.name for p in harness.GUEST_DIR_ROOT.glob(VM_PREFIX + "*")] if harness.GUEST_DIR_ROOT.is_dir() else []
    for name in names:
        match = _VM_NAME_RE.match(name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            dead.add("%s%s-" % (VM_PREFIX, match.group(1)))
    for stale in sorted(dead):
        _root._cleanup_libvirt(libvirtd, stale)
        for path in harness.GUEST_DIR_ROOT.glob(stale + "*"):
            import shutil
            shutil.rmtree(str(path), ignore_errors=True)
    yield


@pytest.fixture(scope="session")
def guest_image() -> harness.Image:
    """lab/build/base.qcow2 + kernel + initrd; builds them (about 2 min) unless the stamp matches."""
    if not Path("/usr/sbin/debootstrap").exists():
        pytest.skip("debootstrap is not installed (apt-get install debootstrap): cannot build the guest image")
    return harness.ensure_image()


@pytest.fixture
def boot_guest(libvirtd, prefix, guest_image, run_module, tmp_path):
    """boot_guest(nat=False, memory_mib=1024, vcpus=2, user_data_extra=None) -> a running Guest
    reachable over pinned SSH. Everything it made is removed when the test ends, on every path."""
    stack = []

    def boot(**kwargs):
        if stack:
            raise RuntimeError("one guest per test: the host has 2 cores and guests run under TCG")
        ctx = harness.booted_guest(libvirtd, prefix, guest_image, run_module, tmp_path / "keys", **kwargs)
        stack.append(ctx)
        return ctx.__enter__()

    yield boot
    while stack:
        stack.pop().__exit__(None, None, None)
