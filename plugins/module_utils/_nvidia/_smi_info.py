# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_smi_info's argument spec and run: read ``nvidia-smi -q -x`` (or a saved copy) and
report the GPUs as facts. It changes nothing.

A host without nvidia-smi, without a driver or without a GPU is an answer here
(``gpu_visible=false`` with the reason), not a failure, unless ``require_gpu`` says it must be
one; the parsing is ``_smi_xml``'s.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

from .._core._errors import InvalidInputError, KvmError
from ._mig_service import SEARCH_DIRS, run_nvidia_smi
from ._smi_xml import NO_GPU_MESSAGE, NvidiaSmiParseError, looks_like_no_gpu, parse_log

MUTUALLY_EXCLUSIVE = [("nvidia_smi", "xml_file")]


def argument_spec() -> Dict[str, Any]:
    return dict(
        nvidia_smi=dict(type="path"),
        xml_file=dict(type="path"),
        require_gpu=dict(type="bool", default=False),
        command_timeout=dict(type="int", default=120),
    )


# -- reads -----------------------------------------------------------------------------------------

def find_nvidia_smi(module: Any) -> str:
    """The nvidia_smi option when it is executable, else nvidia-smi on PATH; "" when none is."""
    path = module.params["nvidia_smi"]
    if path:
        return path if os.access(path, os.X_OK) else ""
    return module.get_bin_path("nvidia-smi", opt_dirs=SEARCH_DIRS) or ""


def read_xml_file(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise KvmError("option xml_file: cannot read %s: %s" % (path, exc), option="xml_file")


def query_nvidia_smi(binary: str, timeout_s: int) -> Tuple[str, str]:
    """(its XML, ""), or ("", why there is none) when nvidia-smi says there is no GPU or driver."""
    rc, stdout, stderr = run_nvidia_smi([binary, "-q", "-x"], timeout_s)
    if rc != 0:
        text = (stdout + "\n" + stderr).strip()
        if looks_like_no_gpu(text) or rc in (6, 9):  # 6: no device, 9: driver not loaded
            return "", "nvidia-smi exited %d: %s" % (rc, text[-400:])
        raise KvmError("nvidia-smi -q -x exited %d: %s" % (rc, text[-2000:]), rc=rc)
    return stdout, ""


# -- the report ------------------------------------------------------------------------------------

def result_from(facts: Dict[str, Any], binary: str, reason: str = "") -> Dict[str, Any]:
    gpus = facts.get("gpus", [])
    if gpus:
        names = sorted(set(g["name"] or "unknown" for g in gpus))
        msg = "%d GPU%s visible (%s), driver %s, CUDA %s" % (
            len(gpus), "" if len(gpus) == 1 else "s", ", ".join(names),
            facts.get("driver_version"), facts.get("cuda_version"))
        reason = ""
    else:
        msg = NO_GPU_MESSAGE
        reason = reason or "nvidia-smi lists no GPU"
    out = {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_visible": bool(gpus),
        "driver_version": facts.get("driver_version"),
        "cuda_version": facts.get("cuda_version"),
    }
    result = dict(out, changed=False, msg=msg, reason=reason or None, nvidia_smi=binary or None)
    result["ansible_facts"] = {"nvidia_smi": out}
    return result


def require_gpu(result: Dict[str, Any], required: bool) -> Dict[str, Any]:
    """``result``, or a failure when a GPU is required and none is visible."""
    if required and not result["gpu_visible"]:
        raise KvmError("%s (require_gpu=true): %s" % (NO_GPU_MESSAGE, result["reason"]),
                       gpus=[], gpu_count=0, gpu_visible=False, reason=result["reason"])
    return result


def gather(module: Any) -> Dict[str, Any]:
    """The report before ``require_gpu`` judges it."""
    params = module.params
    if params["xml_file"]:
        xml: Any = read_xml_file(params["xml_file"])
        binary = ""
    else:
        binary = find_nvidia_smi(module)
        if not binary:
            where = params["nvidia_smi"] or "PATH, " + ", ".join(SEARCH_DIRS)
            return result_from({}, "", "nvidia-smi not found (looked in %s)" % where)
        if params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", params["command_timeout"], "is below 1",
                                    "give the seconds nvidia-smi may take, for example 120")
        xml, why_none = query_nvidia_smi(binary, params["command_timeout"])
        if why_none:
            return result_from({}, binary, why_none)
    try:
        facts = parse_log(xml)
    except NvidiaSmiParseError as exc:
        raise KvmError(str(exc))
    return result_from(facts, binary)


def run_nvidia_smi_info(module: Any) -> Dict[str, Any]:
    return require_gpu(gather(module), module.params["require_gpu"])
