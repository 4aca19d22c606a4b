"""`ansible-test units` runs the unit tier (scripts/ansible-test.sh units, Python 3.11, --local).

ansible-test runs pytest with its own configuration file, --strict-markers and its collection
loader, on a copy of the tree under ansible_collections/mlinfra/kvm. tests/conftest.py registers
the tier markers there, puts the tests' own directories on sys.path, and skips the tiers other
than unit, each with the make target that runs it. Checked here: ansible-test collects the same
tests as the project's pytest run does, a unit test file passes through it, and a gates test is
skipped with its reason (not run, not failed). The whole unit tier through ansible-test takes
about as long as `make test-unit`, so CI runs it once, through pytest.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(sys.executable).parent
SCRIPT = Path(ROOT) / "scripts" / "ansible-test.sh"


def ansible_test_units(*args: str) -> subprocess.CompletedProcess:
    if not (VENV_BIN / "ansible-test").is_file():
        pytest.skip("ansible-test is not installed in the venv (ansible-core in requirements.txt; run make venv)")
    return subprocess.run(["bash", str(SCRIPT), "units", "--num-workers", "1", *args], cwd=ROOT,
                          env=checkout_shell_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, check=False)


def collected(output: str) -> int:
    """Tests collected over every session ansible-test ran: the tests under tests/unit/plugins/
    modules/ and module_utils/ run in its "module_utils" session (module code may not import the
    controller), the rest in its "controller" session."""
    found = re.findall(r"^=+ (\d+) tests? collected", output, re.M)
    assert found, output[-3000:]
    return sum(int(n) for n in found)


def outcome_totals(output: str) -> dict:
    """passed/skipped/failed summed over the sessions' summary lines."""
    totals = {"passed": 0, "skipped": 0, "failed": 0}
    for line in re.findall(r"^=+ (.*) in [\d.]+s", output, re.M):
        for count, outcome in re.findall(r"(\d+) (passed|skipped|failed)", line):
            totals[outcome] += int(count)
    return totals


@pytest.mark.timeout(900)
def test_ansible_test_collects_what_pytest_collects():
    proc = ansible_test_units("--collect-only")
    assert proc.returncode == 0, proc.stdout[-6000:]
    ours = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "tests/unit"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert ours.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:]
    count = re.findall(r"^(\d+) tests? collected", ours.stdout, re.M)
    assert count, ours.stdout[-3000:]
    assert collected(proc.stdout) == int(count[-1]) > 0


@pytest.mark.timeout(900)
def test_a_unit_file_runs_and_a_gates_file_is_skipped_with_its_reason():
    proc = ansible_test_units("tests/unit/plugins/module_utils/_core/test_atomic_file.py", "tests/unit/test_sanity_gate.py")
    assert proc.returncode == 0, proc.stdout[-6000:]
    totals = outcome_totals(proc.stdout)
    assert totals["passed"] >= 4 and totals["skipped"] >= 1 and totals["failed"] == 0, proc.stdout[-3000:]
    assert "ansible-test units runs the unit tier; the gates tier runs with make test-gates" in proc.stdout
