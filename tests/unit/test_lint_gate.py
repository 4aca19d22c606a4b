"""The lint gates: ansible-lint's production profile over the checkout (scripts/lint.sh, with
.ansible-lint) and antsibull-changelog's check of the changelog fragments and changelog.yaml.

Each runs as its own process; a failure shows that tool's whole output. Skipped only when the
tool is not installed in .venv (requirements.txt pins both; make venv installs them).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(ROOT) / ".venv" / "bin"


def _env() -> dict:
    env = checkout_shell_env()
    env["ANSIBLE_CONFIG"] = str(Path(ROOT) / "ansible.cfg")
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    return env


def _run(argv: list, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)


def _require(tool: str) -> None:
    if not (VENV_BIN / tool).is_file():
        pytest.skip("%s is not installed in .venv (requirements.txt pins it; run make venv)" % tool)


@pytest.mark.timeout(900)
def test_ansible_lint_production_profile_is_clean():
    _require("ansible-lint")
    proc = _run(["bash", str(Path(ROOT) / "scripts" / "lint.sh")], timeout=840)
    assert proc.returncode == 0, "scripts/lint.sh exited %d\n--- stdout\n%s\n--- stderr\n%s" % (
        proc.returncode, proc.stdout, proc.stderr)


def test_antsibull_changelog_lint_is_clean():
    _require("antsibull-changelog")
    proc = _run([str(VENV_BIN / "antsibull-changelog"), "lint"], timeout=300)
    # lint reports problems on stdout and may still exit 0 on older releases: both count.
    assert proc.returncode == 0 and not proc.stdout.strip(), (
        "antsibull-changelog lint exited %d\n--- stdout\n%s\n--- stderr\n%s" % (
            proc.returncode, proc.stdout, proc.stderr))
