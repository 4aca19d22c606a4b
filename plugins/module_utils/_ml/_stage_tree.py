# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The whole process tree of a stage's run, found by its run token, and what is left of it.

A command that daemonises (``setsid sleep 600 &``, a double fork) exits 0 while its daemon
goes on writing the outputs; a re-run would start a second copy beside it. Every process of a
run inherits ``ML_STAGE_RUN_TOKEN=STAGE_ID:RUN_ID`` and keeps it in /proc/PID/environ (the
environment it was started with, which clearing ``os.environ`` does not change), so after the
command exits ml_stage finds the processes it left, and before a run it finds the processes any
earlier run of the same stage left, whatever became of that run's records.

``STAGE_ID`` is the stage's name and a digest of its state directory, so two projects with a
stage called ``train`` on one host never take each other's processes for their own.

A process started with a new environment (``env -i``, ``subprocess`` with ``env={...}``) does
not carry the token and is not found; that is the limit of this method.
"""
from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid
from typing import Dict, List, Optional

from ._stage_proc import TOKEN_VAR

# How long processes found right after the command exited may take to end on their own (a
# child that was finishing as its parent returned) before they count as left behind.
SETTLE_S = 1.0
# Seconds between polls of /proc while waiting for processes to end.
POLL_S = 0.1
# SIGKILL rounds after the grace: a process that forked between a scan and the signal is found
# by the next scan (its child carries the token too).
KILL_ROUNDS = 5
KILL_ROUND_WAIT_S = 2.0


def stage_id(state_dir: str, name: str) -> str:
    """``NAME@DIGEST``: the stage, told apart from a namesake in another state directory."""
    where = "%s\0%s" % (os.path.realpath(state_dir), name)
    digest = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()
    return "%s@%s" % (name, digest[:12])


def new_run_token(sid: str) -> str:
    """The token of one run of the stage ``sid``."""
    return "%s:%s" % (sid, uuid.uuid4().hex)


def _token_of(pid: int) -> Optional[str]:
    """The ``ML_STAGE_RUN_TOKEN`` in the process's environment; None when it has none, is gone,
    is a zombie (empty environ) or belongs to another user (unreadable; ml_stage only ever
    starts its own)."""
    prefix = (TOKEN_VAR + "=").encode()
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return None
    for var in env.split(b"\0"):
        if var.startswith(prefix):
            return var[len(prefix):].decode("utf-8", "replace")
    return None


def _tokens_by_pid() -> Dict[int, str]:
    """pid -> run token, for every process that carries one (the calling process left out)."""
    me = os.getpid()
    found: Dict[int, str] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit() and int(entry) != me:
            token = _token_of(int(entry))
            if token is not None:
                found[int(entry)] = token
    return found


def processes_of_run(token: str) -> List[int]:
    """Pids of the processes that carry exactly this run's token."""
    return sorted(pid for pid, tok in _tokens_by_pid().items() if tok == token)


def processes_of_stage(sid: str, exclude_token: Optional[str] = None) -> List[int]:
    """Pids of processes of any run of the stage ``sid`` (but those of ``exclude_token``)."""
    prefix = sid + ":"
    return sorted(pid for pid, tok in _tokens_by_pid().items()
                  if tok.startswith(prefix) and tok != exclude_token)


def cmdline(pid: int) -> str:
    """The process's command line ('' when it is gone or unreadable)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return " ".join(a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""


def listing(pids: List[int]) -> List[Dict[str, object]]:
    """``[{pid, cmd}]`` for results: which processes, running what."""
    return [{"pid": pid, "cmd": cmdline(pid)} for pid in pids]


def wait_gone(token: str, timeout: Optional[float]) -> List[int]:
    """Poll until no process carries ``token`` or ``timeout`` seconds passed (None: no bound,
    for ``leftover_processes: wait`` of a stage without a timeout); the pids left."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        pids = processes_of_run(token)
        if not pids or (deadline is not None and time.monotonic() >= deadline):
            return pids
        time.sleep(POLL_S if deadline is None else min(POLL_S, max(0.01, deadline - time.monotonic())))


def left_behind(token: str) -> List[int]:
    """The run's processes still there once its command exited (after a short settle)."""
    return wait_gone(token, SETTLE_S)


def _signal(pid: int, token: str, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it still carries ``token`` (checked through a pidfd where the
    host has them, so a pid reused in between is never hit), and to the process group it
    leads: a daemon's children that replaced their environment still share its group."""
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    try:
        if _token_of(pid) != token:
            return
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            return
        try:
            leads_group = os.getpgid(pid) == pid and pid != os.getpgrp()
        except OSError:
            leads_group = False
        if leads_group:
            try:
                os.killpg(pid, sig)
            except OSError:
                pass
    finally:
        if pidfd is not None:
            os.close(pidfd)


def stop_run(token: str, grace: float) -> List[int]:
    """SIGTERM to every process of the run, SIGKILL to those left after ``grace`` seconds
    (rescanning, so a child forked meanwhile is caught); the pids that still run after that."""
    pids = processes_of_run(token)
    for pid in pids:
        _signal(pid, token, signal.SIGTERM)
    left = wait_gone(token, grace) if pids else []
    for _round in range(KILL_ROUNDS):
        if not left:
            return []
        for pid in left:
            _signal(pid, token, signal.SIGKILL)
        left = wait_gone(token, KILL_ROUND_WAIT_S)
    return left


def describe_listing(procs: List[Dict[str, object]]) -> str:
    """``pid 123 (sleep 600), ...`` for messages."""
    parts = []
    for proc in procs:
        text = str(proc.get("cmd") or "?")
        parts.append("pid %s (%s)" % (proc["pid"], text[:77] + "..." if len(text) > 80 else text))
    return ", ".join(parts)
