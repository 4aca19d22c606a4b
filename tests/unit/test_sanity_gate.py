"""The sanity gate: ``ansible-test sanity`` over the collection (scripts/sanity.sh, Python 3.11).

scripts/sanity.sh copies the working tree (tracked and untracked, not ignored files) under an
``ansible_collections/mlinfra/kvm`` path and runs every sanity test there; it exits non-zero on any
error. A failure here shows the errors ansible-test reported, then the end of its whole output.
Skipped only when ansible-test is not installed in .venv (ansible-core from requirements.txt).
The first run builds ansible-test's tool virtual environments from PyPI (a few minutes); later
runs reuse them.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
