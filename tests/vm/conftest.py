"""Fixtures of the ``vm`` tier: the guest image (built once, cached by its recipe stamp) and
booted guests (one at a time: the lab host has 2 cores and guests run under TCG)."""
from __future__ import annotations

import importlib.util
import sys
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
