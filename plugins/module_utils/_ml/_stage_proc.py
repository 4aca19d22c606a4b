# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stage's command as a process tree that ends with ml_stage, and what a cut-short run
leaves behind.

Three layers, because no single one covers every way a run is cut short:

* **Signals ml_stage can catch** (SIGHUP when the SSH connection drops, SIGTERM, SIGINT):
  the runner stops the command's process group, ends its MLflow run ``KILLED`` and fails.
* **SIGKILL of ml_stage** (or the OOM killer): nothing in ml_stage runs any more. The command
  is started under a small supervisor (:data:`SUPERVISOR`) that leads the command's process
  group and asks the kernel (``PR_SET_PDEATHSIG``) for SIGTERM when ml_stage dies; it then
  stops the whole group, grandchildren too (torchrun's workers, a shell's children).
* **A process that left the group** (``setsid``, a daemon): every process of the run carries
  ``ML_STAGE_RUN_TOKEN`` in its environment, and the run is recorded in
  ``NAME.running.json`` until it is over. The next run of the stage finds the processes
  with that token, waits for them (``lock_timeout``) or fails naming their pids, so two
  copies never write the same outputs; when none is left it ends the MLflow run the dead
  run left ``RUNNING`` and says so.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional

from ._stage_lock import write_json_atomic

TOKEN_VAR = "ML_STAGE_RUN_TOKEN"
RECORD_FORMAT = 1

# Run as ``python -c SUPERVISOR PARENT_PID GRACE_S CMD...`` in its own session, so it leads
# the command's process group. Exit status: the command's, a signal re-raised as itself.
SUPERVISOR = r'''
import ctypes, os, signal, subprocess, sys
parent, grace, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
STOP_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
class Stop(Exception):
    pass
def stop(signum, frame):
    for sig in STOP_ON:
        signal.signal(sig, signal.SIG_IGN)
    raise Stop()
for sig in STOP_ON:
    signal.signal(sig, stop)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # ml_stage died before the request took effect
    sys.exit(125)
try:
    child = subprocess.Popen(cmd)
except OSError as exc:
    sys.stderr.write("ml_stage: cannot start %s: %s\n" % (cmd[0], exc))
    sys.exit(127)
try:
    rc = child.wait()
except Stop:
    try:
        os.killpg(0, signal.SIGTERM)
        child.wait(timeout=grace)
    except (OSError, subprocess.TimeoutExpired):
        pass
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group, this process too
if rc < 0:
    signal.signal(-rc, signal.SIG_DFL)
    os.kill(os.getpid(), -rc)
sys.exit(rc)
'''


def supervised_argv(python: str, cmd: List[str], grace: float) -> List[str]:
    """The argv that runs ``cmd`` under the supervisor, child of the calling process."""
    return [python, "-c", SUPERVISOR, str(os.getpid()), "%g" % grace] + list(cmd)


def processes_with_token(token: str) -> List[int]:
    """Pids whose environment carries ``ML_STAGE_RUN_TOKEN=token`` (the caller excluded).

    Reads /proc/PID/environ: the environment the process was started with, which clearing
    os.environ does not change, so a daemon that did is still found (one started with a new
    environment, ``env -i``, is not). Tokens are made by _stage_tree.new_run_token.
    Processes of other users cannot be read and are not listed (ml_stage only ever starts
    its own).
    """
    needle = ("%s=%s" % (TOKEN_VAR, token)).encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return sorted(found)


def describe(pids: List[int]) -> str:
    """``pid 123 (python train.py ...)`` for each pid, from /proc/PID/cmdline."""
    parts = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = []
        text = " ".join(argv)
        parts.append("pid %d (%s)" % (pid, text[:77] + "..." if len(text) > 80 else text or "?"))
    return ", ".join(parts)


class RunRecord:
    """``NAME.running.json``: a run in progress, until it is over (success or failure)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, token: str, pid: int, cmd: List[str], mlflow: Optional[Dict[str, Any]]) -> None:
        write_json_atomic(self.path, {
            "format": RECORD_FORMAT, "token": token, "pid": pid, "module_pid": os.getpid(),
            "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cmd": cmd, "mlflow": mlflow or None})

    def read(self) -> Optional[Dict[str, Any]]:
        """The record, or None; an unreadable one is treated as a record without processes."""
        try:
            with open(self.path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"format": None, "token": None, "unreadable": True}
        return data if isinstance(data, dict) else {"format": None, "token": None, "unreadable": True}

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def wait_for_exit(token: str, timeout: float, poll: float = 0.5) -> List[int]:
    """Poll until no process carries ``token`` or ``timeout`` passes; the pids left."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        pids = processes_with_token(token)
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(min(poll, max(0.01, deadline - time.monotonic())))


def stop_group(proc: "subprocess.Popen[bytes]", grace: float) -> int:
    """SIGTERM to the command's process group, SIGKILL after the grace; its status."""
    for sig, wait in ((signal.SIGTERM, grace + 5), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return -signal.SIGKILL


# How long the members of a stopped command's process group may take to finish dying: the
# supervisor can exit while a grandchild killed with the group is still being torn down, and
# such a process is not one that "still runs" (a loaded host, seen in a rehearsal).
GROUP_EXIT_WAIT = 5.0


def still_running(token: str) -> List[int]:
    """The run's processes left after its group was stopped: waits up to GROUP_EXIT_WAIT for
    the group's dying members, so only a process that escaped the group is reported."""
    deadline = time.monotonic() + GROUP_EXIT_WAIT
    left = processes_with_token(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_with_token(token)
    return left
