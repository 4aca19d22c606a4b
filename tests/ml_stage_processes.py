"""The processes that the tests of ml_stage's process handling start and must not leave behind
(tests/unit/plugins/modules/test_ml_stage_leftovers.py: what a stage's command leaves running;
tests/integration/test_ml_stage_interrupt.py: ml_stage itself killed mid-run): whether a pid is
alive, waiting for a condition, and a stage directory with the module processes started on it
and the pids its teardown kills."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from conftest import ROOT, module_env, run_module_process


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %s s waiting for %s" % (timeout, what))
        time.sleep(0.1)


def ml(args: Dict[str, Any], check: bool = False) -> Dict[str, Any]:
    return run_module_process("ml_stage", args, check=check, timeout=300)


class StageProcesses:
    """A stage directory, the module processes started on it and the pids to clean up. With
    capture, a started module's stdout and stderr are pipes (for communicate()); else discarded."""

    def __init__(self, base: Path, capture: bool = False) -> None:
        self.dir = base
        base.mkdir(parents=True)
        self.capture = capture
        self.modules: List[subprocess.Popen] = []
        self.pids: List[int] = []

    def start(self, args: Dict[str, Any]) -> subprocess.Popen:
        """The module as Ansible starts it on a target, left running."""
        payload = dict(args, _ansible_check_mode=False, _ansible_diff=False)
        output = subprocess.PIPE if self.capture else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.ml_stage"],
            stdin=subprocess.PIPE, stdout=output, stderr=output,
            env=module_env(), cwd=str(ROOT), start_new_session=True)
        self.modules.append(proc)
        proc.stdin.write(json.dumps({"ANSIBLE_MODULE_ARGS": payload}).encode())
        proc.stdin.close()
        proc.stdin = None   # so that communicate() does not touch it again
        return proc

    def cleanup(self) -> None:
        for proc in self.modules:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
