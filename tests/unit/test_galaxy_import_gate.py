"""The Galaxy gate: scripts/galaxy-import.sh builds the collection tarball and runs galaxy-importer
on it (Galaxy's own check of every upload: role READMEs, galaxy.yml, every module's docs through
ansible-doc), its ansible-test and ansible-lint steps off (the sanity and lint gates run those).

Any ERROR or WARNING line fails it. The importer's venv (.cache/galaxy-importer-venv) is built
from PyPI on first use; later runs take about 10 s.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(ROOT) / ".venv" / "bin"


@pytest.mark.timeout(600)
def test_galaxy_importer_accepts_the_built_collection():
    if not (VENV_BIN / "ansible-galaxy").is_file():
        pytest.skip("ansible-galaxy is not installed in .venv (ansible-core in requirements.txt; run make venv)")
    proc = subprocess.run(["bash", str(Path(ROOT) / "scripts" / "galaxy-import.sh")], cwd=ROOT,
                          env=checkout_shell_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=570, check=False)
    assert proc.returncode == 0, "scripts/galaxy-import.sh exited %d\n%s" % (proc.returncode, proc.stdout[-8000:])
