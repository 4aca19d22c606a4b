"""ml_stage and the processes a stage's command leaves behind: a daemon (setsid, a double fork)
or a background job still running when the command exits. Each is found by the run token every
process of the run inherits; by default the stage fails naming it and it is stopped, and no run
of the stage starts while a process of an earlier run lives.

The commands here write the pid of what they leave behind to ``daemon.pid`` before they exit
(so the module cannot stop it before its pid is known); every such pid is killed in teardown,
on failure too.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from conftest import warning_texts
from ml_stage_processes import StageProcesses, alive, ml, wait_until

pytestmark = pytest.mark.unit

# A daemon in a session of its own (setsid), the pid written by the daemon itself.
SETSID = ("setsid sh -c 'echo $$ > daemon.pid.tmp; mv daemon.pid.tmp daemon.pid; exec sleep %s' & "
          "while [ ! -s daemon.pid ]; do sleep 0.05; done; ")
# A double fork: the grandchild, reparented away from the command, in the command's session.
DOUBLE_FORK = ("%s -c 'import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n"
               "        open(\"daemon.pid.tmp\", \"w\").write(str(os.getpid())); "
               "os.rename(\"daemon.pid.tmp\", \"daemon.pid\"); time.sleep(%%s)\n    os._exit(0)\n"
               "os.wait()' ; while [ ! -s daemon.pid ]; do sleep 0.05; done; " % sys.executable)
# A plain background job, still in the command's process group.
BACKGROUND = "sleep %s & echo $! > daemon.pid; "
STAGE = "echo run >> runs.log; if [ -e quick ]; then echo ok > out.txt; exit 0; fi; "


class Project(StageProcesses):
    def args(self, leave: str, seconds: float = 600, **over: Any) -> Dict[str, Any]:
        script = STAGE + (leave % seconds) + "echo ok > out.txt"
        args = {"name": "serve", "chdir": str(self.dir), "cmd": ["sh", "-c", script], "outs": ["out.txt"]}
        args.update(over)
        return args

    def daemon(self) -> int:
        pid = int((self.dir / "daemon.pid").read_text())
        self.pids.append(pid)
        return pid

    def runs(self) -> int:
        log = self.dir / "runs.log"
        return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    proj = Project(tmp_path / "stage")
    yield proj
    proj.cleanup()


@pytest.mark.parametrize("leave", [SETSID, DOUBLE_FORK, BACKGROUND], ids=["setsid", "double-fork", "background"])
def test_a_command_that_leaves_a_process_fails_the_stage_naming_it_and_it_is_stopped(
        project: Project, leave: str) -> None:
    res = ml(project.args(leave))
    daemon = project.daemon()
    assert res["failed"] is True and res["changed"] is True and res["ran"] is True, res
    assert [p["pid"] for p in res["leftover_processes"]] == [daemon], res
    cmdline = res["leftover_processes"][0]["cmd"]
    assert cmdline and "pid %d (%s" % (daemon, cmdline[:40]) in res["msg"], res
    wait_until("the leftover process %d to be gone" % daemon, lambda: not alive(daemon))
    state = project.dir / ".ml_stage"
    assert not (state / "serve.lock.json").exists(), "a failed run records no lock"
    assert not (state / "serve.running.json").exists(), "nothing of the run is left running"
    # Nothing is left, so the next run is not refused: it runs again (no lock).
    (project.dir / "quick").write_text("")
    again = ml(project.args(leave))
    assert not again["failed"] and again["ran"] is True, again
    assert "no lock" in " ".join(again["reasons"]), again


def test_a_run_while_a_process_of_an_earlier_run_lives_is_refused_forced_or_not(project: Project) -> None:
    # The module is killed while its command runs; its daemon, in a session of its own, outlives
    # it, and then the stage's state directory (with the record of the cut-short run) is wiped.
    args = project.args(SETSID + "sleep 600; ")
    module = project.start(args)
    wait_until("the daemon to start", (project.dir / "daemon.pid").exists)
    daemon = project.daemon()
    module.send_signal(signal.SIGKILL)
    module.wait(timeout=30)
    assert alive(daemon), "the daemon must outlive the module for this test"
    shutil.rmtree(project.dir / ".ml_stage")
    (project.dir / "quick").write_text("")
    assert project.runs() == 1

    for check in (True, False):
        for force in (False, True):
            refused = ml(dict(args, force=force), check=check)
            assert refused["failed"] is True and refused["changed"] is False, refused
            assert refused["pids"] == [daemon], refused
            assert "pid %d (sleep 600)" % daemon in refused["msg"], refused
            assert "kill -TERM %d" % daemon in refused["msg"], refused
    assert project.runs() == 1, "no second copy may start beside the daemon"
    assert alive(daemon), "a refusal stops nothing"

    os.kill(daemon, signal.SIGTERM)
    wait_until("the daemon to end", lambda: not alive(daemon))
    done = ml(args)
    assert not done["failed"] and done["ran"] is True and done["changed"] is True, done
    assert project.runs() == 2


def test_leftover_processes_kill_stops_them_and_keeps_the_commands_result(project: Project) -> None:
    args = project.args(SETSID, leftover_processes="kill")
    res = ml(args)
    daemon = project.daemon()
    assert not res["failed"] and res["changed"] is True, res
    assert [p["pid"] for p in res["leftover_processes"]] == [daemon], res
    assert any("pid %d" % daemon in w and "leftover_processes: kill" in w for w in warning_texts(res)), res
    wait_until("the leftover process %d to be gone" % daemon, lambda: not alive(daemon))
    again = ml(args)
    assert not again["failed"] and again["changed"] is False, again


def test_leftover_processes_wait_waits_for_them_within_the_timeout(project: Project) -> None:
    # Three seconds: longer than the moment a process that was ending with the command gets.
    waited = ml(project.args(SETSID, seconds=3, leftover_processes="wait"))
    daemon = project.daemon()
    assert not waited["failed"] and waited["ran"] is True, waited
    assert [p["pid"] for p in waited["leftover_processes"]] == [daemon], waited
    assert not alive(daemon)

    (project.dir / "daemon.pid").unlink()
    over = ml(project.args(SETSID, leftover_processes="wait", timeout=2, force=True))
    daemon = project.daemon()
    assert over["failed"] is True and over["changed"] is True, over
    assert "pid %d" % daemon in over["msg"] and "timeout of 2.0 s" in over["msg"], over
    wait_until("the leftover process %d to be gone" % daemon, lambda: not alive(daemon))


def test_a_command_that_leaves_nothing_reports_no_leftovers(project: Project) -> None:
    (project.dir / "quick").write_text("")
    res = ml(project.args(SETSID))
    assert not res["failed"] and res["ran"] is True and "leftover_processes" not in res, res


def test_the_run_token_names_the_stage_and_is_reserved(project: Project) -> None:
    (project.dir / "quick").write_text("")
    args = project.args(SETSID, cmd=["sh", "-c", "echo $ML_STAGE_RUN_TOKEN > out.txt"])
    ml(args)
    token = (project.dir / "out.txt").read_text().strip()
    assert token.startswith("serve@") and ":" in token, token
    bad = ml(dict(args, env={"ML_STAGE_RUN_TOKEN": "x"}))
    assert bad["failed"] is True and "ML_STAGE_RUN_TOKEN" in bad["msg"], bad


def test_git_and_the_interpreter_probe_are_bounded(tmp_path: Path) -> None:
    """A command of the code fingerprint that hangs is killed with its process group."""
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import CommandTimeoutError
    from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_code import run_bytes
    pidfile = tmp_path / "child.pid"
    with pytest.raises(CommandTimeoutError):
        run_bytes(["sh", "-c", "sleep 600 & echo $! > %s; wait" % pidfile], timeout_s=1)
    child = int(pidfile.read_text())
    wait_until("the hung command's child to be killed", lambda: not alive(child))
