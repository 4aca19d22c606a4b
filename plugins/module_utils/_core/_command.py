# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every external command a module runs, with a time bound.

``AnsibleModule.run_command`` waits for ever: a ``qemu-img`` that spins on a looping backing
chain, an ``update-grub`` stuck on a dead disk or an ``nvidia-smi`` waiting on a wedged driver
then holds the task until its controller gives up and orphans the process. Here each command
runs in its own process group with an argv list (never a shell string); when the bound passes,
the whole group is killed and :class:`CommandTimeoutError` names the command and the bound. A
binary that does not exist raises :class:`CommandNotFoundError` naming it, so callers can say
which option pointed at it.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ._errors import KvmError

# Seconds; long enough for update-initramfs on a slow disk, short enough that a hang is reported
# inside any sensible task timeout.
DEFAULT_TIMEOUT_S = 300


class CommandTimeoutError(KvmError):
    """The command ran past its bound and was killed with its process group."""

    def __init__(self, argv: Sequence[str], timeout_s: float) -> None:
        super().__init__("command %s did not finish within %s s and was killed with its process group"
                         % (" ".join(argv), timeout_s), command=list(argv), timeout_s=timeout_s)


class CommandNotFoundError(KvmError):
    """The command's binary is not on the host (or not executable)."""

    def __init__(self, argv: Sequence[str], reason: str) -> None:
        super().__init__("command %s cannot be run: %s" % (argv[0] if argv else "(empty)", reason),
                         command=list(argv))


def run_bounded(argv: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                env_update: Optional[Mapping[str, str]] = None, data: Optional[str] = None,
                cwd: Optional[str] = None) -> Tuple[int, str, str]:
    """Run ``argv`` (a list, no shell) and return ``(rc, stdout, stderr)`` as text.

    Raises CommandTimeoutError past ``timeout_s`` (the process group is killed first) and
    CommandNotFoundError when the binary cannot be executed.
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise CommandNotFoundError(argv, "empty command")
    env: Dict[str, str] = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    if env_update:
        env.update(env_update)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                start_new_session=True)
    except OSError as exc:
        raise CommandNotFoundError(argv, exc.strerror or str(exc)) from None
    try:
        out, err = proc.communicate(None if data is None else data.encode("utf-8"), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise CommandTimeoutError(argv, timeout_s) from None
    return (proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the command's whole process group and reap it, so nothing is left behind."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        pass


def module_runner(timeout_s: float = DEFAULT_TIMEOUT_S):
    """A ``run_command``-shaped callable ``(argv, **ignored) -> (rc, out, err)`` with a bound,
    for code written against ``AnsibleModule.run_command``'s shape."""
    def run(argv: List[str], **kwargs) -> Tuple[int, str, str]:
        env = kwargs.get("environ_update")
        return run_bounded(argv, timeout_s=kwargs.get("timeout_s", timeout_s), env_update=env,
                           data=kwargs.get("data"), cwd=kwargs.get("cwd"))
    return run
