# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's files on disk: atomic writes, the lock (the record of the last successful
run) with its manifest, and the fcntl lock that keeps two runs of a stage apart.

Layout under the stage's ``state_dir`` (``<chdir>/.ml_stage`` by default)::

    NAME.lock.json              inputs, key, outputs of the last successful run
    NAME.manifest.<hash>.json   per-file hashes of its tree deps and outs (content addressed)
    NAME.statcache[.trees]      stat cache (a cache: deleting it only costs a rehash)
    NAME.flock                  fcntl lock; holds the pid of the run holding it
    NAME.stdout.log / .stderr.log   output of the last run
    NAME.runstats.json          counters and last run for the Prometheus textfile
                                (only with metrics_textfile_dir; see _stage_metrics)
    NAME.running.json           a run in progress: its token, pids and MLflow run; left
                                behind only by a run that was cut short (see _stage_proc)
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from typing import Any, Dict, Optional, Tuple

from .._core._atomic_file import write_bytes_atomic
from .._core._errors import KvmError

LOCK_FORMAT = 1
# Mode of the files that record a stage's runs (lock, manifest, fcntl lock, run record, logs):
# they show the command, its env and its output, which are the task owner's business only.
PRIVATE = 0o600


def canonical_json(data: Any) -> str:
    """The one serialisation hashed into keys: sorted keys, no spaces, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def write_json_atomic(path: str, data: Any, mode: int = PRIVATE) -> None:
    """The stage's own records (lock, run record, run statistics): private by default."""
    write_bytes_atomic(path, (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False)
                              + "\n").encode("utf-8"), mode=mode)


def open_private(path: str) -> Any:
    """``path`` truncated for writing with mode 0600, also when it existed with another mode
    (a log of an earlier version): the command's output may hold what its env held."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), PRIVATE)
    try:
        os.fchmod(fd, PRIVATE)
    except OSError:  # not the owner: the mode stays, the write goes on
        pass
    return os.fdopen(fd, "wb")


def remove_path(path: str) -> None:
    """A file, link or directory tree removed (a link is removed, not followed); nothing there
    is nothing to do."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


class StageFiles:
    """Paths of one stage's files and reading/writing its lock and manifest."""

    def __init__(self, state_dir: str, name: str) -> None:
        self.state_dir = state_dir
        self.name = name
        self.lock = os.path.join(state_dir, name + ".lock.json")
        self.flock = os.path.join(state_dir, name + ".flock")
        self.statcache = os.path.join(state_dir, name + ".statcache")
        self.stdout = os.path.join(state_dir, name + ".stdout.log")
        self.stderr = os.path.join(state_dir, name + ".stderr.log")
        self.runstats = os.path.join(state_dir, name + ".runstats.json")
        self.running = os.path.join(state_dir, name + ".running.json")

    def read_lock(self) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
        """(lock, problem): (None, None) when there is none, (None, why) when unreadable."""
        try:
            with open(self.lock, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as exc:
            return None, "lock %s is unreadable (%s)" % (self.lock, exc)
        if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT \
                or not isinstance(data.get("inputs"), dict) or not data.get("key"):
            return None, "lock %s has an unknown format" % self.lock
        return data, None

    def read_manifest(self, lock: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """The manifest a lock points to; {} when it is gone (reasons get less detailed)."""
        name = (lock or {}).get("manifest")
        if not name or os.path.basename(name) != name:
            return {}
        try:
            with open(os.path.join(self.state_dir, name), "r", encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, lock: Dict[str, Any], manifest: Dict[str, Any]) -> None:
        """Manifest first (content addressed), then the lock that names it, then drop
        manifests no lock names any more."""
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        mname = "%s.manifest.%s.json" % (self.name, hashlib.sha256(body.encode("utf-8")).hexdigest()[:20])
        write_bytes_atomic(os.path.join(self.state_dir, mname), body.encode("utf-8"), mode=PRIVATE)
        lock = dict(lock, manifest=mname)
        write_json_atomic(self.lock, lock)
        prefix = self.name + ".manifest."
        for entry in os.listdir(self.state_dir):
            if entry.startswith(prefix) and entry.endswith(".json") and entry != mname:
                try:
                    os.unlink(os.path.join(self.state_dir, entry))
                except OSError:
                    pass


class StageBusyError(KvmError):
    """Another process holds the stage's fcntl lock."""


class FileLock:
    """An exclusive ``fcntl.flock`` on the stage's ``.flock`` file.

    Waits up to ``timeout`` seconds (0: not at all) and then fails naming the holder. The
    kernel drops the lock when its holder dies, so a killed run never blocks the next one.
    """

    def __init__(self, path: str, stage: str, timeout: float) -> None:
        self.path = path
        self.stage = stage
        self.timeout = timeout
        self._fd: Optional[int] = None

    def _holder(self) -> str:
        try:
            with open(self.path, "r", encoding="utf-8") as f:
                info = json.load(f)
            return "pid %s on %s since %s" % (info.get("pid"), info.get("host"), info.get("since"))
        except (OSError, ValueError, AttributeError):
            return "another process"

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, PRIVATE)
        try:
            os.fchmod(fd, PRIVATE)  # also a lock file an earlier version made 0644
        except OSError:
            pass
        deadline = time.monotonic() + max(0.0, self.timeout)
        delay = 0.05
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    os.close(fd)
                    raise StageBusyError(
                        "stage %s is being run by %s (lock file %s); wait for it, or set "
                        "lock_timeout to a number of seconds to wait for it (currently %s)"
                        % (self.stage, holder, self.path, self.timeout),
                        lock_file=self.path, holder=holder)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
