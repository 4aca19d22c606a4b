# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_health's argument spec and run: read each GPU (NVML, else ``nvidia-smi -q -x``, or a
saved copy) and the XIDs of the kernel log, judge them with ``_health`` and report. It changes
nothing.

The rules are ``_health``'s, which must stay standard library only (the monitoring role installs
that file beside the GPU exporter); the reads, bounded commands and Ansible's words live here.
"""
from __future__ import annotations

import os
from typing import Any, Dict

from .._core._command import CommandNotFoundError, CommandTimeoutError, run_bounded
from .._core._errors import InvalidInputError, KvmError
from . import _health
from ._mig_service import SEARCH_DIRS, run_nvidia_smi
from ._smi_xml import NO_GPU_MESSAGE, NvidiaSmiParseError, _parse, looks_like_no_gpu

MUTUALLY_EXCLUSIVE = [("nvidia_smi", "xml_file")]
# Where the NVRM Xid lines are: the kernel ring buffer, or the journal's kernel messages of this boot.
KERNEL_LOG_COMMANDS = {"dmesg": ["dmesg"], "journal": ["journalctl", "-k", "-b", "--no-pager", "-o", "short"]}


def argument_spec() -> Dict[str, Any]:
    return dict(
        source=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        nvidia_smi=dict(type="path"),
        xml_file=dict(type="path"),
        kernel_log=dict(type="str", choices=["auto", "dmesg", "journal", "none"], default="auto"),
        kernel_log_file=dict(type="path"),
        command_timeout=dict(type="int", default=60),
    )


def read_file(option: str, path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise KvmError("option %s: cannot read %s: %s" % (option, path, exc.strerror or exc), option=option)


def readings_from_xml(xml: bytes) -> list:
    try:
        root = _parse(xml)
    except NvidiaSmiParseError as exc:
        raise KvmError(str(exc))
    if root.tag != "nvidia_smi_log":
        raise KvmError("expected nvidia-smi's <nvidia_smi_log>, got <%s>" % root.tag)
    return _health.readings_from_xml_root(root)


def readings_from_nvidia_smi(module: Any) -> tuple:
    """(readings, source, why no GPU)."""
    params = module.params
    if params["xml_file"]:
        return readings_from_xml(read_file("xml_file", params["xml_file"])), "xml_file", ""
    binary = params["nvidia_smi"] or module.get_bin_path("nvidia-smi", opt_dirs=SEARCH_DIRS)
    if not binary or not os.access(binary, os.X_OK):
        return [], None, "nvidia-smi not found (%s)" % (params["nvidia_smi"] or "PATH, " + ", ".join(SEARCH_DIRS))
    rc, stdout, stderr = run_nvidia_smi([binary, "-q", "-x"], params["command_timeout"])
    if rc != 0:
        text = (stdout + "\n" + stderr).strip()
        if looks_like_no_gpu(text) or rc in (6, 9):  # 6: no device, 9: driver not loaded
            return [], None, "nvidia-smi exited %d: %s" % (rc, text[-400:])
        raise KvmError("%s -q -x exited %d: %s" % (binary, rc, text[-2000:]), rc=rc)
    return readings_from_xml(stdout.encode("utf-8")), "nvidia-smi", ""


def load_nvml() -> tuple:
    """(pynvml, None) when NVML is usable, else (None, why not)."""
    try:
        import pynvml  # type: ignore  # optional: nvidia-ml-py
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pylint: disable=broad-except  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, "NVML did not initialise: %s" % (exc or type(exc).__name__)
    return pynvml, None


def readings_from_nvml(nvml: Any) -> list:
    lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)

    def optional(call, *args):
        try:
            return call(*args)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == lost:
                raise
            return None  # not supported on this GPU: N/A, never 0

    readings = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                readings.append(_health.reading_from_nvml(nvml, index, optional))
            except nvml.NVMLError as exc:  # a GPU NVML cannot read is the worst news there is
                readings.append({"index": index, "source": "nvml", "read_error": str(exc) or type(exc).__name__})
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return readings


def read_gpus(module: Any) -> tuple:
    source = module.params["source"]
    if source != "nvidia-smi" and not module.params["xml_file"]:
        nvml, why = load_nvml()
        if nvml is not None:
            return readings_from_nvml(nvml), "nvml", ""
        if source == "nvml":
            return [], None, why
    return readings_from_nvidia_smi(module)


def read_kernel_log(module: Any) -> tuple:
    """(text, where it came from or why there is none)."""
    params = module.params
    if params["kernel_log_file"]:
        return read_file("kernel_log_file", params["kernel_log_file"]).decode("utf-8", "replace"), params["kernel_log_file"]
    if params["kernel_log"] == "none":
        return "", "not read (kernel_log=none)"
    tried = []
    for name in ("dmesg", "journal") if params["kernel_log"] == "auto" else (params["kernel_log"],):
        argv = KERNEL_LOG_COMMANDS[name]
        try:
            rc, out, err = run_bounded(argv, timeout_s=params["command_timeout"])
        except CommandTimeoutError:
            raise KvmError("`%s` did not finish within %s s (command_timeout) and was killed; raise command_timeout "
                           "or set kernel_log=none" % (" ".join(argv), params["command_timeout"]))
        except CommandNotFoundError as exc:
            tried.append("%s: %s" % (argv[0], exc.msg.rsplit(": ", 1)[-1]))
            continue
        if rc == 0:
            return out, name
        tried.append("%s exited %d: %s" % (argv[0], rc, (err or out).strip()[-200:]))
    return "", "unreadable (%s): XIDs unknown" % "; ".join(tried)


def describe(gpu: dict) -> str:
    return "GPU %s %s (%s, %s): %s" % (gpu.get("index"), gpu.get("name") or "unknown", gpu.get("uuid") or "no UUID",
                                       gpu.get("pci_bus_id") or "no PCI address", gpu["summary"])


def judge_read_errors(gpus: list) -> list:
    for gpu in gpus:
        if gpu.get("read_error"):
            reason = {"check": "read", "verdict": _health.UNHEALTHY, "action": _health.DRAIN_REPLACE,
                      "detail": "NVML cannot read this GPU: %s" % gpu["read_error"],
                      "what_to_do": _health.ACTION_TEXT[_health.DRAIN_REPLACE]}
            gpu.update(verdict=_health.UNHEALTHY, reasons=[reason] + gpu["reasons"])
            gpu["summary"] = "%s (%s)" % (reason["detail"], reason["what_to_do"])
    return gpus


def result_from(gpus: list, source: Any, kernel_log: str, no_gpu_reason: str) -> dict:
    if not gpus:
        msg = "%s, nothing to judge (%s)" % (NO_GPU_MESSAGE, no_gpu_reason or "no GPU listed")
        return dict(changed=False, gpus=[], verdict=None, unhealthy=[], degraded=[], gpu_visible=False,
                    source=None, kernel_log=kernel_log, msg=msg)
    verdict = max((g["verdict"] for g in gpus), key=_health.verdict_code)
    unhealthy = [describe(g) for g in gpus if g["verdict"] == _health.UNHEALTHY]
    degraded = [describe(g) for g in gpus if g["verdict"] == _health.DEGRADED]
    counts = ", ".join("%d %s" % (n, v) for v, n in (
        (v, sum(1 for g in gpus if g["verdict"] == v)) for v in (_health.UNHEALTHY, _health.DEGRADED, _health.HEALTHY)) if n)
    msg = "%d GPU%s: %s" % (len(gpus), "" if len(gpus) == 1 else "s", counts)
    return dict(changed=False, gpus=gpus, verdict=verdict, unhealthy=unhealthy, degraded=degraded, gpu_visible=True,
                source=source, kernel_log=kernel_log, msg=msg)


def run_gpu_health(module: Any) -> Dict[str, Any]:
    if module.params["command_timeout"] < 1:
        raise InvalidInputError("command_timeout", module.params["command_timeout"], "is below 1",
                                "give the seconds each command may take, for example 60")
    readings, source, why = read_gpus(module)
    if not readings:
        return result_from([], None, "not read (no GPU)", why)
    text, where = read_kernel_log(module)
    gpus = judge_read_errors(_health.judge_all(readings, _health.parse_kernel_xids(text)))
    return result_from(gpus, source, where, "")
