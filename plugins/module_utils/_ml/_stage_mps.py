# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's ``mps`` option: run the command as a client of a CUDA MPS control daemon.

The settings only decide how the command shares the GPU with other processes; they do not
change what it computes, so they stay out of the cache key (a change of the thread share
alone never re-runs a stage). They reach the command as the CUDA_MPS_* variables, and are
recorded in the result, the lock's run record and the MLflow run's tags.

A CUDA client that cannot reach the daemon silently runs without MPS, so before the command
starts the module checks that the daemon's ``control`` socket exists in the pipe directory
(the daemon itself, nvidia-cuda-mps-control -d, needs a GPU: tests bind a socket of that name).
"""
from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, List, Optional

from .._core._errors import InvalidInputError

PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VAR = "CUDA_MPS_LOG_DIRECTORY"
THREADS_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEM_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_ENV = (PIPE_VAR, LOG_VAR, THREADS_VAR, MEM_VAR)
CONTROL_SOCKET = "control"
OPTIONS = ("pipe_directory", "log_directory", "active_thread_percentage", "pinned_device_mem_limit")

# The sizes the nvidia_mps role accepts for nvidia_mps_pinned_device_mem_limit (16G, 8192M),
# so one value works for the daemon's default and for a stage.
_SIZE = r"[1-9][0-9]*[MG]"
_ENTRY = re.compile(r"^([0-9]+)=(%s)$" % _SIZE)
_BARE = re.compile(r"^%s$" % _SIZE)
DAEMON_FIX = ("start the MPS control daemon for that pipe directory: apply the role "
              "mlinfra.kvm.nvidia_mps with nvidia_mps_pipe_directory set to it (service "
              "nvidia-mps), or run CUDA_MPS_PIPE_DIRECTORY=%s nvidia-cuda-mps-control -d; or "
              "fix mps.pipe_directory, or drop mps to run without MPS")


def _abs(chdir: str, path: str) -> str:
    return os.path.normpath(os.path.join(chdir, os.path.expanduser(path)))


def pinned_mem_limit(value: Any) -> Optional[str]:
    """The CUDA_MPS_PINNED_DEVICE_MEM_LIMIT text: DEV=SIZE[,DEV=SIZE...], or a bare SIZE,
    which means device 0 (the first device the command sees)."""
    option = "mps.pinned_device_mem_limit"
    fix = ("give DEVICE=SIZE pairs separated by commas with sizes in M or G, e.g. 0=16G or "
           "0=16G,1=8192M, or one size such as 16G (device 0)")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidInputError(option, value, "is not a string", fix)
    text = value.replace(" ", "")
    if _BARE.match(text):
        return "0=" + text
    seen: List[str] = []
    for part in text.split(","):
        match = _ENTRY.match(part)
        if not match:
            raise InvalidInputError(option, value, "is not a device memory limit (%r)" % part, fix)
        device = str(int(match.group(1)))
        if device in seen:
            raise InvalidInputError(option, value, "limits device %s twice" % device,
                                    "give each device index once")
        seen.append(device)
    return text


def thread_percentage(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise InvalidInputError("mps.active_thread_percentage", value,
                                "is not a whole number from 1 to 100",
                                "give e.g. 50 (the command may use half of the GPU's SMs), "
                                "or leave it unset for the daemon's default")
    return value


class MpsSpec:
    """The ``mps`` option, checked and normalised (paths absolute, relative to chdir)."""

    def __init__(self, raw: Dict[str, Any], chdir: str) -> None:
        unknown = sorted(set(raw) - set(OPTIONS))
        if unknown:
            raise InvalidInputError("mps", raw, "has unknown keys %s" % unknown,
                                    "use only %s" % ", ".join(OPTIONS))
        pipe = raw.get("pipe_directory")
        if not isinstance(pipe, str) or not pipe.strip():
            raise InvalidInputError("mps.pipe_directory", pipe, "is not set",
                                    "give the MPS control daemon's pipe directory, e.g. "
                                    "/run/nvidia-mps (the nvidia_mps role's nvidia_mps_pipe_directory)")
        self.pipe_directory = _abs(chdir, pipe.strip())
        log = raw.get("log_directory")
        if log is not None and (not isinstance(log, str) or not log.strip()):
            raise InvalidInputError("mps.log_directory", log, "is not a path",
                                    "give the daemon's log directory, e.g. /var/log/nvidia-mps, or "
                                    "leave it unset")
        self.log_directory: Optional[str] = _abs(chdir, log.strip()) if log else None
        self.active_thread_percentage = thread_percentage(raw.get("active_thread_percentage"))
        self.pinned_device_mem_limit = pinned_mem_limit(raw.get("pinned_device_mem_limit"))

    def env(self) -> Dict[str, str]:
        """The variables the command gets; unset ones are removed from the inherited
        environment, so what the task declares is what the command sees."""
        values = {PIPE_VAR: self.pipe_directory, LOG_VAR: self.log_directory,
                  THREADS_VAR: (None if self.active_thread_percentage is None
                                else str(self.active_thread_percentage)),
                  MEM_VAR: self.pinned_device_mem_limit}
        return {k: v for k, v in values.items() if v is not None}

    def apply(self, env: Dict[str, str]) -> None:
        for name in MPS_ENV:
            env.pop(name, None)
        env.update(self.env())

    def summary(self) -> Dict[str, Any]:
        """For the result and the lock's run record."""
        return {"pipe_directory": self.pipe_directory, "log_directory": self.log_directory,
                "active_thread_percentage": self.active_thread_percentage,
                "pinned_device_mem_limit": self.pinned_device_mem_limit, "env": self.env()}

    def tags(self) -> Dict[str, str]:
        """MLflow tags of a run made under MPS (only the settings that are set)."""
        return {"mlinfra.stage.mps." + k: str(v) for k, v in self.summary().items()
                if k != "env" and v is not None}

    @property
    def control_socket(self) -> str:
        return os.path.join(self.pipe_directory, CONTROL_SOCKET)

    def daemon_problem(self) -> Optional[str]:
        """Why no MPS control daemon seems to serve the pipe directory; None when its
        control socket is there. (A socket left by a daemon that crashed also passes.)"""
        try:
            st = os.stat(self.pipe_directory)
        except OSError as exc:
            return "cannot be read (%s)" % (exc.strerror or exc)
        if not stat.S_ISDIR(st.st_mode):
            return "is not a directory"
        try:
            st = os.stat(self.control_socket)
        except FileNotFoundError:
            return "holds no control socket (%s missing): no MPS control daemon serves it" \
                % self.control_socket
        except OSError as exc:
            return "holds a control socket that cannot be read (%s)" % (exc.strerror or exc)
        if not stat.S_ISSOCK(st.st_mode):
            return "holds %s, which is not a Unix socket: no MPS control daemon serves it" \
                % self.control_socket
        return None

    def check_daemon(self) -> None:
        """Refuse to start the command when no daemon serves the pipe directory."""
        problem = self.daemon_problem()
        if problem:
            raise InvalidInputError("mps.pipe_directory", self.pipe_directory, problem,
                                    DAEMON_FIX % self.pipe_directory)
