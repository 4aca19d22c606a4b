"""The test tree itself: pytest imports test files by basename ("prepend" import mode, no
packages under tests/), so two test files with one name in different tiers break the
collection of every tier at once. A subset run (``pytest tests/unit``) never sees the clash;
this test does, because it reads the whole tree."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_basenames_are_unique_across_tiers():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" in path.parts or ".cache" in path.parts:
            continue
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one file of each pair (pytest cannot import both): {clashes}"


def collected_files(marker_expression: str) -> set[str]:
    """The test files `pytest -m EXPR` collects (a subprocess: the markers come from conftest)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "-m", marker_expression, str(TESTS / "integration")],
                          capture_output=True, text=True, cwd=str(TESTS.parent), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}


def test_integration_files_that_reach_libvirtd_run_in_the_libvirtd_session():
    """scripts/run-tests.sh runs `integration and libvirtd` beside `integration and not
    libvirtd`, and the first restarts libvirtd in its fault tests. A file that opens
    qemu:///system (or lets a module default to it) but uses no libvirtd fixture would land in
    the other session and fail whenever a restart falls on it: this names such a file."""
    services = collected_files("integration and not libvirtd")
    libvirt_side = collected_files("integration and libvirtd")
    assert services and libvirt_side, (services, libvirt_side)
    assert not services & libvirt_side
    reaching = set()
    for path in (TESTS / "integration").glob("test_*.py"):
        text = path.read_text()
        if "qemu:///system" in text or "libvirt.open(" in text or "import libvirt" in text:
            reaching.add(str(path.relative_to(TESTS.parent)))
    misplaced = sorted(reaching & services)
    assert not misplaced, ("these files reach libvirtd but no test in them uses the libvirtd fixture, so "
                           "they run beside the fault tests that restart it; give one test the fixture: %s" % misplaced)
