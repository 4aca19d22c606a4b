"""The pipeline role's stage scripts and the monitoring role's dashboard files, installed on
localhost (connection local) into a temporary directory, four ways: check mode predicts what the
run does, the run does it, and then both change nothing. A script that drifted (content or mode)
is copied again, alone; a dashboard whose digest file is gone is installed again.

Both tasks files read what the host has in one module run and act only where it differs
(roles/pipeline/tasks/layout.yml, roles/monitoring/tasks/dashboard.yml): these tests are what
says the shortcut still makes the same decisions the plain copy did.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest
import yaml

from conftest import ROOT
from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit
SCRIPTS = ["generate.py", "prepare.py", "train.py", "worker_facts.py"]
PREDICTED = "Dashboard files (check mode; their digest differs, so they would be installed)"
DASHBOARD_FILES = ROOT / "roles" / "monitoring" / "files" / "dashboard"


def tasks_play(tmp_path: Path, role: str, tasks_from: str, role_vars: dict) -> Path:
    path = tmp_path / ("play-%s-%s.yml" % (role, tasks_from))
    path.write_text(yaml.safe_dump([{
        "name": "%s %s on localhost" % (role, tasks_from),
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.include_role": {"name": "mlinfra.kvm.%s" % role, "tasks_from": tasks_from},
                   "vars": role_vars}],
    }], sort_keys=False))
    return path


def changed(path: Path, *extra: str) -> List[str]:
    """Run the play; return what it changed (or would change) as 'task' or 'task: item'."""
    proc = run_playbook(path, "--diff", *extra)
    assert proc.returncode == 0 and not failures(proc), proc.stdout[-3000:] + proc.stderr[-2000:]
    found, task = [], None
    for line in proc.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")].split(" : ", 1)[-1]
        match = re.match(r"changed: \[localhost\](?: => \(item=([^)]*)\))?", line)
        if match:
            found.append("%s: %s" % (task, match.group(1)) if match.group(1) else task)
    return found


def test_stage_scripts_four_ways_then_a_drifted_script_alone(tmp_path):
    root = tmp_path / "pipeline"
    play = tasks_play(tmp_path, "pipeline", "layout", {"pipeline_root": str(root), "pipeline_dataset_file": ""})
    expected = ["Pipeline directories: %s" % d for d in ("code", "data", "work")] \
        + ["Stage scripts: %s" % s for s in SCRIPTS]
    assert changed(play, "--check") == expected
    assert not root.exists(), "check mode made the layout"
    assert changed(play) == expected
    for script in SCRIPTS:
        installed = root / "code" / script
        assert installed.read_bytes() == (ROOT / "roles" / "pipeline" / "files" / script).read_bytes()
        assert installed.stat().st_mode & 0o7777 == 0o644
    assert changed(play, "--check") == []
    assert changed(play) == []

    with (root / "code" / "train.py").open("a") as handle:
        handle.write("# edited on the host\n")
    (root / "code" / "prepare.py").chmod(0o600)
    drifted = ["Stage scripts: prepare.py", "Stage scripts: train.py"]
    assert changed(play, "--check") == drifted
    assert changed(play) == drifted
    assert (root / "code" / "train.py").read_bytes() == (ROOT / "roles" / "pipeline" / "files" / "train.py").read_bytes()
    assert (root / "code" / "prepare.py").stat().st_mode & 0o7777 == 0o644
    assert changed(play) == []

    # The directories come from the same one read: a drifted mode is corrected alone.
    (root / "data").chmod(0o755)
    assert changed(play, "--check") == ["Pipeline directories: data"]
    assert changed(play) == ["Pipeline directories: data"]
    assert (root / "data").stat().st_mode & 0o7777 == 0o750
    assert changed(play) == []


def test_dashboard_files_four_ways_then_reinstalled_without_their_digest(tmp_path):
    target = tmp_path / "dashboard"
    play = tasks_play(tmp_path, "monitoring", "dashboard", {"monitoring_dashboard_dir": str(target)})
    expected = ["Dashboard directory",
                PREDICTED,
                "Dashboard settings"]
    assert changed(play, "--check") == expected
    assert not target.exists(), "check mode made the dashboard directory"
    assert changed(play) == ["Dashboard directory", "Dashboard files", "Dashboard settings"]
    sources = [p for p in DASHBOARD_FILES.rglob("*") if p.is_file()]
    assert sources
    for source in sources:
        installed = target / source.relative_to(DASHBOARD_FILES)
        assert installed.read_bytes() == source.read_bytes(), installed
        assert installed.stat().st_mode & 0o7777 == 0o644 and installed.stat().st_uid == 0
    for directory in [target] + [p for p in target.rglob("*") if p.is_dir()]:
        assert directory.stat().st_mode & 0o7777 == 0o755, directory
    assert changed(play, "--check") == []
    assert changed(play) == []

    (target / ".mlinfra-dashboard.sha256").unlink()
    (target / "index.html").write_text("stale\n")
    assert changed(play, "--check") == [PREDICTED]
    assert changed(play) == ["Dashboard files"]
    assert (target / "index.html").read_bytes() == (DASHBOARD_FILES / "index.html").read_bytes()
    assert changed(play) == []
    assert not list(Path("/tmp").glob("mlinfra-dashboard-*")), "the controller's archive directory was left behind"
