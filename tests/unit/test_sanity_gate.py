"""The sanity gate: ``ansible-test sanity`` over the collection (scripts/sanity.sh, Python 3.11).

scripts/sanity.sh copies the working tree (tracked and untracked, not ignored files) under an
``ansible_collections/mlinfra/kvm`` path and runs every sanity test there; it exits non-zero on any
error. A failure here shows the errors ansible-test reported, then the end of its whole output.
Skipped only when ansible-test is not installed in .venv (ansible-core from requirements.txt).
The first run builds ansible-test's tool virtual environments from PyPI (a few minutes); later
runs reuse them.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(ROOT) / ".venv" / "bin"


@pytest.mark.timeout(1200)
def test_ansible_test_sanity_is_clean():
    if not (VENV_BIN / "ansible-test").is_file():
        pytest.skip("ansible-test is not installed in .venv (ansible-core in requirements.txt; run make venv)")
    proc = subprocess.run(["bash", str(Path(ROOT) / "scripts" / "sanity.sh")], cwd=ROOT, env=checkout_shell_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1140, check=False)
    if proc.returncode != 0:
        errors = [line for line in proc.stdout.splitlines() if line.startswith(("ERROR:", "FATAL:"))]
        pytest.fail("scripts/sanity.sh exited %d\n--- errors\n%s\n--- end of output\n%s" % (
            proc.returncode, "\n".join(errors) or "(none reported)", proc.stdout[-6000:]), pytrace=False)


# -- the supported range, stated once and tested where it is stated ------------------------------

def _tested_minor() -> str:
    """The ansible-core minor the gate runs sanity under: the one requirements.txt pins."""
    pins = re.findall(r"^ansible-core==(\d+\.\d+)\.\d+\s*$", (Path(ROOT) / "requirements.txt").read_text(), re.M)
    assert len(pins) == 1, "requirements.txt must pin ansible-core exactly once (X.Y.Z), found %s" % pins
    return pins[0]


def test_requires_ansible_starts_at_the_minor_the_gate_runs():
    """The oldest ansible-core the collection claims is the one its sanity gate runs: a lower floor
    would claim a minor nothing tests."""
    runtime = yaml.safe_load((Path(ROOT) / "meta" / "runtime.yml").read_text())
    floor = re.fullmatch(r">=(\d+\.\d+)\.0", runtime["requires_ansible"])
    assert floor, "meta/runtime.yml requires_ansible should be '>=X.Y.0', is %r" % runtime["requires_ansible"]
    assert floor.group(1) == _tested_minor(), (
        "meta/runtime.yml claims ansible-core %s and later, the sanity gate runs %s (requirements.txt)"
        % (floor.group(1), _tested_minor()))


def test_ignore_files_only_for_the_tested_minor():
    """ansible-test reads tests/sanity/ignore-X.Y.txt only under ansible-core X.Y: one for a minor
    the gate does not run would never be checked (and its entries never expire)."""
    minors = sorted(p.name[len("ignore-"):-len(".txt")] for p in (Path(ROOT) / "tests" / "sanity").glob("ignore-*.txt"))
    assert set(minors) <= {_tested_minor()}, "ignore files for untested minors: %s" % minors


def test_readme_states_the_range_the_files_give():
    readme = (Path(ROOT) / "README.md").read_text()
    section = readme.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    runtime = yaml.safe_load((Path(ROOT) / "meta" / "runtime.yml").read_text())
    python = yaml.safe_load((Path(ROOT) / "tests" / "config.yml").read_text())["modules"]["python_requires"]
    assert 'requires_ansible: "%s"' % runtime["requires_ansible"] in section
    assert 'python_requires: "%s"' % python in section
    assert "ansible-core %s or newer" % _tested_minor() in section
    assert "Python %s or newer" % python.lstrip(">=") in section
