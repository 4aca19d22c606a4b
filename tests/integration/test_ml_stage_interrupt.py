"""ml_stage cut short: SIGKILL and SIGHUP of the module while its command runs, and a process
of the run that escaped its process group, against a real `mlflow server` (sqlite).

The stage's command is a Python script that starts a grandchild (so "the whole process
tree" is tested, not only the direct child), records its pids in ``started`` and sleeps; with
the file ``quick`` present it finishes at once instead. With the file ``escape`` (seconds) it
also double-forks a process into its own session, out of the command's process group.
Every process a test starts is killed in teardown, on failure too.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from conftest import warning_texts
from ml_stage_processes import StageProcesses, alive, ml, wait_until
from mlflow_server import Server

pytestmark = pytest.mark.integration

SCRIPT = r'''
import json, os, subprocess, sys, time
with open("runs.log", "a") as f:
    f.write("%d %s\n" % (os.getpid(), os.environ.get("MLFLOW_RUN_ID", "-")))
if os.path.exists("quick"):
    os.makedirs("out", exist_ok=True)
    open("out/model.bin", "w").write("weights")
    sys.exit(0)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
escaped = None
if os.path.exists("escape"):
    seconds = float(open("escape").read())
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        pid = os.fork()
        if pid == 0:
            time.sleep(seconds)
            os._exit(0)
        os.write(w, str(pid).encode())
        os._exit(0)
    escaped = int(os.read(r, 32))
with open("started.tmp", "w") as f:
    json.dump({"cmd": os.getpid(), "child": child.pid, "escaped": escaped}, f)
os.rename("started.tmp", "started")
time.sleep(900)
'''


@pytest.fixture
def server(mlflow_server: Server) -> Server:
    return mlflow_server   # one server for the integration tier (tests/conftest.py)


class Project(StageProcesses):
    """The stage directory of train.py, its module processes (their output captured) and pids."""

    def __init__(self, base: Path) -> None:
        super().__init__(base, capture=True)
        (base / "train.py").write_text(SCRIPT)

    def args(self, mlflow: Dict[str, Any] = None, **over: Any) -> Dict[str, Any]:
        args = {"name": "train", "chdir": str(self.dir), "cmd": [sys.executable, "train.py"],
                "outs": ["out/"], "params": {"lr": 0.1}, "code": {"paths": ["train.py"]}}
        if mlflow:
            args["mlflow"] = mlflow
        args.update(over)
        return args

    def started(self) -> Dict[str, Any]:
        wait_until("the stage's command to start", (self.dir / "started").exists, timeout=120)
        pids = json.loads((self.dir / "started").read_text())
        self.pids += [p for p in pids.values() if p]
        return pids

    def runs(self) -> List[str]:
        log = self.dir / "runs.log"
        return log.read_text().splitlines() if log.exists() else []

    def record(self) -> Path:
        return self.dir / ".ml_stage" / "train.running.json"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    proj = Project(tmp_path / "stage")
    yield proj
    proj.cleanup()


def test_sigkill_of_ml_stage_stops_the_command_tree_and_the_next_run_ends_its_mlflow_run(
        server: Server, project: Project) -> None:
    mlflow = {"tracking_uri": server.url, "experiment": "interrupt-sigkill"}
    module = project.start(project.args(mlflow))
    pids = project.started()
    killed_run = project.runs()[-1].split()[1]
    assert server.run(killed_run)["info"]["status"] == "RUNNING"

    module.send_signal(signal.SIGKILL)
    module.wait(timeout=30)
    # The supervisor gets SIGTERM from the kernel when ml_stage dies and stops its group.
    wait_until("the command and its child to end", lambda: not alive(pids["cmd"]) and not alive(pids["child"]),
               timeout=60)
    assert project.record().exists(), "the cut-short run must stay recorded"
    assert server.run(killed_run)["info"]["status"] == "RUNNING"   # nobody could end it yet

    (project.dir / "quick").write_text("")
    args = project.args(mlflow)
    predicted = ml(args, check=True)
    assert not predicted["failed"] and predicted["changed"] is True, predicted
    assert "would be ended KILLED" in predicted["interrupted_run"]["mlflow"], predicted
    assert server.run(killed_run)["info"]["status"] == "RUNNING"   # check mode wrote nothing
    assert project.record().exists()

    applied = ml(args)
    assert not applied["failed"] and applied["changed"] is True and applied["ran"] is True, applied
    assert "ended KILLED" in applied["interrupted_run"]["mlflow"], applied
    assert any("was cut short" in w for w in warning_texts(applied)), applied
    old = server.run(killed_run)
    assert old["info"]["status"] == "KILLED", old
    assert "cut short" in old["tags"]["mlinfra.stage.failure"]
    assert server.run(applied["mlflow_run_id"])["info"]["status"] == "FINISHED"
    assert not project.record().exists()

    again = ml(args, check=True)
    assert again["changed"] is False and again["interrupted_run"] is None, again
    again = ml(args)
    assert again["changed"] is False and again["interrupted_run"] is None, again
    assert len(project.runs()) == 2   # the killed run and the one re-run, nothing more


def test_sighup_of_ml_stage_stops_the_command_and_ends_its_mlflow_run_killed(
        server: Server, project: Project) -> None:
    mlflow = {"tracking_uri": server.url, "experiment": "interrupt-sighup"}
    module = project.start(project.args(mlflow))
    pids = project.started()
    run_id = project.runs()[-1].split()[1]

    module.send_signal(signal.SIGHUP)   # what sshd sends when the controller's connection drops
    out, _unused = module.communicate(timeout=120)
    result = json.loads(out[out.index(b"{"):])
    assert result["failed"] is True and result["changed"] is True, result
    assert "interrupted by SIGHUP" in result["msg"] and result["interrupted_by"] == "SIGHUP", result
    assert not alive(pids["cmd"]) and not alive(pids["child"])
    assert server.run(run_id)["info"]["status"] == "KILLED"
    assert not project.record().exists(), "ml_stage ended the run itself: nothing is left over"

    (project.dir / "quick").write_text("")
    rerun = ml(project.args(mlflow))
    assert not rerun["failed"] and rerun["ran"] is True and rerun["interrupted_run"] is None, rerun
    assert "no lock" in " ".join(rerun["reasons"]), rerun


def test_a_process_that_left_the_group_blocks_a_second_copy_until_it_ends(project: Project) -> None:
    (project.dir / "escape").write_text("25")
    module = project.start(project.args())
    pids = project.started()
    module.send_signal(signal.SIGKILL)
    module.wait(timeout=30)
    wait_until("the command to end", lambda: not alive(pids["cmd"]), timeout=60)
    assert alive(pids["escaped"]), "the escaped process must outlive the group for this test"

    (project.dir / "quick").write_text("")
    args = project.args()
    for check in (True, False):
        refused = ml(args, check=check)
        assert refused["failed"] is True and refused["changed"] is False, refused
        assert "pid %d" % pids["escaped"] in refused["msg"] and "kill -TERM" in refused["msg"], refused
        assert refused["pids"] == [pids["escaped"]]
    assert len(project.runs()) == 1, "no second copy may start"

    waited = ml(dict(args, lock_timeout=120))   # waits for the escaped process to end
    assert not waited["failed"] and waited["ran"] is True, waited
    assert not alive(pids["escaped"])
    assert waited["interrupted_run"]["mlflow"] == "no run was open", waited
    assert len(project.runs()) == 2
    assert not project.record().exists()
