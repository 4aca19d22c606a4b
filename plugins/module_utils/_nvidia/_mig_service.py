# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The only code of nvidia_mig that touches the machine: nvidia-smi (argv lists, never a
shell) and, with ``force``, signals to the processes that hold MIG instances.

Every call is recorded in :attr:`MigService.calls` (the module returns them), and every
failure becomes a KvmError that quotes the command and nvidia-smi's own words.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .._core._command import CommandNotFoundError, CommandTimeoutError, run_bounded
from .._core._errors import KvmError
from ._mig import (QUERY_FIELDS, GpuInstance, GpuRow, MigDevice, MigParseError, Process, Profile,
                   join_instances, mig_devices, parse_gpu_rows, parse_lci, parse_lgi, parse_list,
                   parse_xml_gpu, profile_table)
from ._smi_xml import NvidiaSmiParseError, _parse, looks_like_no_gpu

# Where drivers put nvidia-smi besides PATH (the H200 guest: /usr/local/nvidia/bin).
SEARCH_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"]
# Seconds one nvidia-smi call may take: a healthy one answers in seconds even while it
# creates MIG instances; a wedged driver never answers.
DEFAULT_NVIDIA_SMI_TIMEOUT_S = 120


def resolve_binary(module: Any, value: str) -> str:
    """``nvidia_smi`` as given: a path must be executable, a bare name is looked up."""
    if "/" in value:
        if os.access(value, os.X_OK) and os.path.isfile(value):
            return value
        raise KvmError("option nvidia_smi: %s is not an executable file; install the NVIDIA driver's "
                       "utilities (role mlinfra.kvm.nvidia_driver) or point nvidia_smi at nvidia-smi" % value,
                       option="nvidia_smi", value=value)
    found = module.get_bin_path(value, opt_dirs=SEARCH_DIRS)
    if not found:
        raise KvmError("option nvidia_smi: %r is not on PATH nor in %s; install the NVIDIA driver's utilities "
                       "(role mlinfra.kvm.nvidia_driver) or give its path" % (value, ", ".join(SEARCH_DIRS)),
                       option="nvidia_smi", value=value)
    return found


def run_nvidia_smi(argv: Sequence[str], timeout_s: float) -> Tuple[int, str, str]:
    """One nvidia-smi call within ``timeout_s`` (a wedged driver makes nvidia-smi wait for
    ever); a hang or a binary that cannot run fails naming the command."""
    try:
        return run_bounded(argv, timeout_s=timeout_s, env_update={"LC_ALL": "C"})
    except CommandTimeoutError:
        raise KvmError("`%s` did not finish within %s s (command_timeout) and was killed; the NVIDIA driver may "
                       "be wedged (see dmesg for Xid errors); fix the GPU or raise command_timeout"
                       % (" ".join(argv), timeout_s), cmd=list(argv), timeout_s=timeout_s)
    except CommandNotFoundError as exc:
        raise KvmError("`%s` cannot be run: %s; install the NVIDIA driver's utilities (role "
                       "mlinfra.kvm.nvidia_driver) or point nvidia_smi at nvidia-smi"
                       % (" ".join(argv), exc.msg.rsplit(": ", 1)[-1]), cmd=list(argv))


class MigService:
    def __init__(self, module: Any, binary: str, sleep: Callable[[float], None] = time.sleep) -> None:
        self.module = module
        self.binary = binary
        self.timeout_s = module.params.get("command_timeout") or DEFAULT_NVIDIA_SMI_TIMEOUT_S
        self.sleep = sleep
        self.calls: List[List[str]] = []

    # -- running nvidia-smi ------------------------------------------------------------------------

    def _run(self, args: Sequence[str], ok_texts: Sequence[str] = ()) -> str:
        argv = [self.binary] + list(args)
        self.calls.append(argv)
        rc, out, err = run_nvidia_smi(argv, self.timeout_s)
        text = ((out or "") + ("\n" + err if err else "")).strip()
        # -lgi/-lci exit non-zero when the list is empty; that is an answer, not a failure.
        if rc != 0 and not any(ok in text for ok in ok_texts):
            hint = " (no usable GPU or driver)" if looks_like_no_gpu(text) else ""
            raise KvmError("`%s` exited %d%s: %s" % (" ".join(argv), rc, hint, text[-1500:] or "no output"),
                           rc=rc, cmd=argv, stdout=out, stderr=err)
        return out or ""

    def _parsed(self, args: Sequence[str], parse: Callable[[str], Any], ok_texts: Sequence[str] = ()) -> Any:
        text = self._run(args, ok_texts)
        try:
            return parse(text)
        except (MigParseError, NvidiaSmiParseError, ValueError) as exc:
            raise KvmError("cannot read the output of `%s`: %s; it began: %r"
                           % (" ".join([self.binary] + list(args)), exc, text[:300]), cmd=[self.binary] + list(args))

    # -- reads ------------------------------------------------------------------------------------

    def gpus(self) -> List[GpuRow]:
        return self._parsed(["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader"], parse_gpu_rows)

    def gpu(self, index: int) -> GpuRow:
        rows = [row for row in self.gpus() if row.index == index]
        if not rows:
            raise KvmError("GPU %d is no longer listed by nvidia-smi" % index)
        return rows[0]

    def profiles(self, index: int) -> List[Profile]:
        lgip = self._run(["mig", "-i", str(index), "-lgip"])
        lgipp = self._run(["mig", "-i", str(index), "-lgipp"])
        try:
            return profile_table(lgip, lgipp, index)
        except MigParseError as exc:
            raise KvmError("cannot read GPU %d's MIG profile table (`nvidia-smi mig -lgip`/`-lgipp`): %s; "
                           "output began: %r" % (index, exc, (lgip + lgipp)[:300]))

    def instances(self, index: int) -> List[GpuInstance]:
        gis = self._parsed(["mig", "-i", str(index), "-lgi"], lambda t: parse_lgi(t, index),
                           ok_texts=["No GPU instances found"])
        cis = self._parsed(["mig", "-i", str(index), "-lci"], lambda t: parse_lci(t, index),
                           ok_texts=["No compute instances found", "No GPU instances found"])
        try:
            return join_instances(gis, cis)
        except MigParseError as exc:
            raise KvmError("GPU %d: -lgi and -lci disagree: %s" % (index, exc))

    def devices_and_processes(self, index: int) -> Tuple[List[MigDevice], List[Process]]:
        root = self._parsed(["-q", "-x", "-i", str(index)], _parse)
        xml_devices, processes = self._from_xml(root)
        listing = self._parsed(["-L"], parse_list)
        try:
            return mig_devices(listing, index, xml_devices), processes
        except MigParseError as exc:
            raise KvmError("GPU %d: nvidia-smi -L and -q -x disagree: %s" % (index, exc))

    def processes(self, index: int) -> List[Process]:
        return self._from_xml(self._parsed(["-q", "-x", "-i", str(index)], _parse))[1]

    @staticmethod
    def _from_xml(root: Any) -> Tuple[Dict[int, Tuple[int, int]], List[Process]]:
        try:
            return parse_xml_gpu(root)
        except MigParseError as exc:
            raise KvmError("cannot read MIG devices or processes from `nvidia-smi -q -x`: %s" % exc)

    # -- changes ----------------------------------------------------------------------------------

    # The argument lists of the changing commands; the runner decides whether they run.

    @staticmethod
    def mode_args(index: int, enabled: bool) -> List[str]:
        return ["-i", str(index), "-mig", "1" if enabled else "0"]

    @staticmethod
    def destroy_args(index: int, gi: GpuInstance) -> List[List[str]]:
        out = [["mig", "-i", str(index), "-dci", "-gi", str(gi.id)]] if gi.cis else []
        return out + [["mig", "-i", str(index), "-dgi", "-gi", str(gi.id)]]

    @staticmethod
    def create_args(index: int, items: Sequence[Tuple[Profile, int]]) -> List[str]:
        # Explicit placements (profile:start): the driver's own choice could block the rest.
        tuples = ",".join("%d:%d" % (profile.id, start) for profile, start in items)
        return ["mig", "-i", str(index), "-cgi", tuples, "-C"]

    def run_change(self, args: Sequence[str]) -> str:
        return self._run(args)

    def stop_processes(self, index: int, victims: Sequence[Process], timeout: float) -> None:
        """SIGTERM each process, then wait until nvidia-smi no longer lists them."""
        for pid in sorted({p.pid for p in victims}):
            self.signal_process(pid)
        self.wait_stopped(index, victims, timeout)

    @staticmethod
    def signal_process(pid: int) -> None:
        """SIGTERM one process (one already gone is stopped already)."""
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        except PermissionError as exc:
            raise KvmError("force: cannot signal pid %d (%s); run the module as root" % (pid, exc))

    def wait_stopped(self, index: int, victims: Sequence[Process], timeout: float) -> None:
        """Wait until nvidia-smi no longer lists ``victims`` on GPU ``index``."""
        pids = {p.pid for p in victims}
        deadline = time.monotonic() + timeout
        remaining: List[Process] = list(victims)
        while True:
            remaining = [p for p in self.processes(index) if p.pid in pids]
            if not remaining or time.monotonic() >= deadline:
                break
            self.sleep(0.5)
        if remaining:
            raise KvmError("force: %s still on the GPU %ds after SIGTERM; nothing was destroyed. Stop them "
                           "(or raise force_timeout) and run again"
                           % (", ".join(p.label() for p in remaining), timeout),
                           processes=[p._asdict() for p in remaining])
