# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_smi_info's argument spec and run: read ``nvidia-smi -q -x`` (or a saved copy) and
report the GPUs as facts. It changes nothing.

A host without nvidia-smi, without a driver or without a GPU is an answer here
(``gpu_visible=false`` with the reason), not a failure, unless ``require_gpu`` says it must be
one; the parsing is ``_smi_xml``'s.

A GPU in MIG mode also lists its MIG devices (``-q -x``'s ``<mig_devices>``), each with its
profile (``nvidia-smi mig -lgi``/``-lci``) and the device files a job on it needs: the parent
``/dev/nvidiaN`` and the GPU and compute instances' access capabilities, whose
``/dev/nvidia-caps/nvidia-capM`` minors only the driver's mig-minors table gives.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Tuple

from .._core._errors import InvalidInputError, KvmError
from ._mig_service import SEARCH_DIRS, MigService, run_nvidia_smi
from ._smi_xml import NO_GPU_MESSAGE, NvidiaSmiParseError, looks_like_no_gpu, parse_log

MUTUALLY_EXCLUSIVE = [("nvidia_smi", "xml_file")]

MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"
CAP_DEVICE = "/dev/nvidia-caps/nvidia-cap%d"
# One line of the driver's table (NVIDIA/open-gpu-kernel-modules, kernel-open/nvidia/nv-caps.c,
# nv_procfs_read_mig_minors): "config 1", "monitor 2", then "gpu<G>/gi<I>/access <M>" and
# "gpu<G>/gi<I>/ci<C>/access <M>" for every GPU minor G, GPU instance I and compute instance C the
# driver could ever have, whatever exists now; M is the minor of /dev/nvidia-caps/nvidia-cap<M>.
# nvidia-container-toolkit (internal/nvcaps) and Slurm's NVML plugin read it the same way.
_MINORS_LINE = re.compile(r"^(config|monitor|gpu\d+/gi\d+(?:/ci\d+)?/access)\s+(\d+)$")


def argument_spec() -> Dict[str, Any]:
    return dict(
        nvidia_smi=dict(type="path"),
        xml_file=dict(type="path"),
        require_gpu=dict(type="bool", default=False),
        command_timeout=dict(type="int", default=120),
        mig_minors_file=dict(type="path", default=MIG_MINORS_FILE),
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


# -- MIG devices -----------------------------------------------------------------------------------

def parse_mig_minors(text: str, path: str) -> Dict[str, int]:
    """The mig-minors table: {"gpu0/gi1/access": 12, ...}. A line of another shape means the file
    is not the driver's table, which is said rather than guessed around."""
    minors: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        match = _MINORS_LINE.match(line)
        if not match:
            raise KvmError("option mig_minors_file: line %d of %s is not '<capability> <minor>' as the NVIDIA driver "
                           "writes it: %r" % (number, path, line[:200]), option="mig_minors_file")
        minors[match.group(1)] = int(match.group(2))
    return minors


def read_mig_minors(path: str) -> Dict[str, int]:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        raise KvmError("option mig_minors_file: cannot read %s (%s); the NVIDIA driver publishes it once loaded, and "
                       "only it names the capability files of MIG devices" % (path, exc.strerror or exc),
                       option="mig_minors_file")
    return parse_mig_minors(text, path)


def mig_device_files(gpu: Dict[str, Any], device: Dict[str, Any], minors: Dict[str, int], path: str) -> List[str]:
    """The files a job on one MIG device needs, in the order Slurm's NVML autodetection lists
    them (SchedMD/slurm, src/plugins/gpu/nvml/gpu_nvml.c, _handle_mig): the parent GPU's device
    file, then the GPU instance's and the compute instance's access capabilities. The table is
    keyed by the GPU's minor number (its /dev/nvidiaN), not by nvidia-smi's index."""
    minor = gpu["minor_number"]
    gi, ci = device["gpu_instance_id"], device["compute_instance_id"]
    keys = ["gpu%d/gi%d/access" % (minor, gi), "gpu%d/gi%d/ci%d/access" % (minor, gi, ci)]
    missing = [key for key in keys if key not in minors]
    if missing:
        raise KvmError("option mig_minors_file: %s has no line for %s (GPU %d's MIG device %d); give the loaded "
                       "driver's table" % (path, " or ".join(missing), gpu["index"], device["index"]),
                       option="mig_minors_file")
    return ["/dev/nvidia%d" % minor] + [CAP_DEVICE % minors[key] for key in keys]


def mig_profiles(module: Any, binary: str, index: int) -> Dict[Tuple[int, int], str]:
    """{(GPU instance, compute instance): the MIG device's profile name} from nvidia-smi mig
    -lgi and -lci: -q -x does not name profiles. A compute instance that spans its GPU instance
    is named like it (3g.71gb); a smaller one by its share (1c.3g.71gb)."""
    return {(ci.gi, ci.id): ci.name for gi in MigService(module, binary).instances(index) for ci in gi.cis}


def add_mig_devices(facts: Dict[str, Any], module: Any, binary: str) -> None:
    """Complete each GPU's MIG devices with their profile (null when only a saved XML was read:
    there is no nvidia-smi to ask) and their device files."""
    gpus = [gpu for gpu in facts.get("gpus", []) if gpu["mig_devices"]]
    if not gpus:
        return  # nothing to name: the table is not read (a driver without MIG support has none)
    path = module.params["mig_minors_file"]
    minors = read_mig_minors(path)
    for gpu in gpus:
        if gpu["minor_number"] is None:
            raise KvmError("GPU %d: nvidia-smi -q -x gives no minor_number, so its MIG devices' files cannot be named"
                           % gpu["index"])
        names = mig_profiles(module, binary, gpu["index"]) if binary else {}
        for device in gpu["mig_devices"]:
            key = (device["gpu_instance_id"], device["compute_instance_id"])
            if binary and key not in names:
                raise KvmError("GPU %d: nvidia-smi -q -x lists MIG device %d (GPU instance %d, compute instance %d) and "
                               "nvidia-smi mig -lci does not: the instances changed while they were read; run again"
                               % (gpu["index"], device["index"], key[0], key[1]))
            device["profile"] = names.get(key)
            device["files"] = mig_device_files(gpu, device, minors, path)


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
    add_mig_devices(facts, module, binary)
    return result_from(facts, binary)


def run_nvidia_smi_info(module: Any) -> Dict[str, Any]:
    return require_gpu(gather(module), module.params["require_gpu"])
