#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: gpu_health
short_description: Is each NVIDIA GPU healthy enough to train on
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: N/A
    details: Reads only; there is nothing to show a difference of.
  platform:
    platforms: posix
version_added: 0.5.0
description:
  - Reads each GPU through NVML (the C(pynvml) module of C(nvidia-ml-py)) when it imports and
    initialises, otherwise through C(nvidia-smi -q -x), and the XID errors the NVIDIA driver
    logged in the kernel log (its C(NVRM Xid) lines, from C(dmesg) or the journal).
  - Judges each GPU C(healthy), C(degraded) or C(unhealthy), with the reasons and what to do
    about each, from volatile and aggregate ECC errors (single- and double-bit), pending page
    retirements, row remapping (pending, failed), the PCIe link generation and width against the
    card's maximum, clock throttle reasons (thermal, power brake, hardware slowdown), temperature
    and power against their limits, NVLink error counters where the GPU has links, the driver's
    recovery action, and the XIDs, classified by NVIDIA's XID catalogue (an application fault
    such as XID 13 leaves the GPU healthy with a note; XID 48, 79, 95, 119 make it unhealthy).
  - The kernel log holds the XIDs since boot. After a GPU reset that cleared the cause, an XID
    logged before it still counts until the machine reboots; O(kernel_log=none) judges without them.
  - Without a visible GPU (a guest with no GPU, no driver, no nvidia-smi) it does not fail and
    returns RV(gpus=[]) with a message saying there is nothing to judge.
  - Never changes anything; runs the same in check mode.
options:
  source:
    description:
      - Where to read the GPUs. C(auto) uses NVML when C(pynvml) imports and initialises, else nvidia-smi.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi:
    description:
      - Path of the nvidia-smi binary. Searched in C(PATH), C(/usr/bin) and
        C(/usr/local/nvidia/bin) when not set.
    type: path
  xml_file:
    description: Read C(nvidia-smi -q -x) output from this file instead (saved captures, tests).
    type: path
  kernel_log:
    description:
      - Where to read the XIDs. C(auto) tries C(dmesg), then C(journalctl -k -b). C(none) judges without XIDs.
    type: str
    choices: [auto, dmesg, journal, none]
    default: auto
  kernel_log_file:
    description: Read the kernel log from this file instead; O(kernel_log) is then not used (saved logs, tests).
    type: path
  command_timeout:
    description:
      - Seconds each command (nvidia-smi, dmesg, journalctl) may take; one that runs longer is
        killed and the task fails naming it.
    type: int
    default: 60
requirements:
  - nvidia-ml-py (pynvml) on the managed host is used when present; nvidia-smi otherwise.
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Judge this worker's GPUs
  mlinfra.kvm.gpu_health:
  register: health

- name: Refuse an unhealthy GPU
  ansible.builtin.assert:
    that: health.unhealthy | length == 0
    fail_msg: "{{ health.unhealthy | join('; ') }}"
'''

RETURN = r'''
gpus:
  description: One entry per GPU with its reading, its XIDs and its verdict. Empty when no GPU is visible.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H200
      uuid: GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2
      pci_bus_id: "00000000:00:06.0"
      source: nvidia-smi
      ecc_dbe_volatile: 0
      row_remap_pending: false
      pcie_width_current: 16
      pcie_width_max: 16
      xids: [79]
      last_xid: 79
      verdict: unhealthy
      reasons:
        - check: xid
          verdict: unhealthy
          detail: XID 79 (GPU has fallen off the bus; hardware, PCIe or power) logged 1 time
          action: drain_and_replace
          what_to_do: drain the node and have the GPU inspected or replaced
      notes: []
      summary: XID 79 (...) logged 1 time (drain the node and have the GPU inspected or replaced)
verdict:
  description: The worst verdict over all GPUs (C(healthy), C(degraded), C(unhealthy)); null without GPU.
  returned: always
  type: str
unhealthy:
  description: One line per unhealthy GPU, naming the GPU and the reasons (empty when none is).
  returned: always
  type: list
  elements: str
degraded:
  description: One line per degraded GPU, naming the GPU and the reasons.
  returned: always
  type: list
  elements: str
gpu_visible:
  description: Whether at least one GPU is visible.
  returned: always
  type: bool
source:
  description: Where the readings came from (C(nvml), C(nvidia-smi), C(xml_file)); null without GPU.
  returned: always
  type: str
kernel_log:
  description: Where the XIDs were read (C(dmesg), C(journal), the file, or why none could be read).
  returned: always
  type: str
msg:
  description: A one-line summary, for example C(1 GPU, all healthy) or C(no GPU visible, nothing to judge (...)).
  returned: always
  type: str
'''

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import (  # noqa: E402
    CommandNotFoundError, CommandTimeoutError, run_bounded)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _health  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_xml import (  # noqa: E402
    NO_GPU_MESSAGE, NvidiaSmiParseError, _parse, looks_like_no_gpu)
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_service import run_nvidia_smi  # noqa: E402

SEARCH_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"]
KERNEL_LOG_COMMANDS = {"dmesg": ["dmesg"], "journal": ["journalctl", "-k", "-b", "--no-pager", "-o", "short"]}


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


def readings_from_nvidia_smi(module: AnsibleModule) -> tuple:
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


def readings_from_nvml(nvml) -> list:
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


def read_gpus(module: AnsibleModule) -> tuple:
    source = module.params["source"]
    if source != "nvidia-smi" and not module.params["xml_file"]:
        nvml, why = load_nvml()
        if nvml is not None:
            return readings_from_nvml(nvml), "nvml", ""
        if source == "nvml":
            return [], None, why
    return readings_from_nvidia_smi(module)


def read_kernel_log(module: AnsibleModule) -> tuple:
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


def result_from(gpus: list, source, kernel_log: str, no_gpu_reason: str) -> dict:
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


def runner_for(module: AnsibleModule):
    def runner() -> dict:
        if module.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", module.params["command_timeout"], "is below 1",
                                    "give the seconds each command may take, for example 60")
        readings, source, why = read_gpus(module)
        if not readings:
            return result_from([], None, "not read (no GPU)", why)
        text, where = read_kernel_log(module)
        gpus = judge_read_errors(_health.judge_all(readings, _health.parse_kernel_xids(text)))
        return result_from(gpus, source, where, "")
    return runner


def main() -> None:
    module = new_module(
        AnsibleModule,
        argument_spec=dict(
            source=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
            nvidia_smi=dict(type="path"),
            xml_file=dict(type="path"),
            kernel_log=dict(type="str", choices=["auto", "dmesg", "journal", "none"], default="auto"),
            kernel_log_file=dict(type="path"),
            command_timeout=dict(type="int", default=60),
        ),
        mutually_exclusive=[("nvidia_smi", "xml_file")],
        supports_check_mode=True,
    )
    run(module, runner_for(module))


if __name__ == "__main__":
    main()
