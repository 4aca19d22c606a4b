#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: nvidia_smi_info
short_description: NVIDIA GPU facts from nvidia-smi's XML log
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
version_added: 0.1.0
description:
  - Runs C(nvidia-smi -q -x) (or reads a saved copy of its output) and returns, for each
    GPU, its name, memory, driver and CUDA versions, MIG mode and virtualization mode
    (for example C(Pass-Through) inside a VM that was given the GPU by PCI passthrough).
  - When nvidia-smi is missing, or runs but finds no GPU or no loaded driver, the module
    does not fail. It returns RV(gpus=[]) and the message C(no GPU visible), unless
    O(require_gpu=true).
  - Never changes anything; runs the same in check mode.
options:
  nvidia_smi:
    description:
      - Path of the nvidia-smi binary. Searched in C(PATH), C(/usr/bin) and
        C(/usr/local/nvidia/bin) when not set.
    type: path
  xml_file:
    description:
      - Read the XML from this file instead of running nvidia-smi (saved captures, tests).
    type: path
  require_gpu:
    description: Fail when no GPU is visible instead of reporting it.
    type: bool
    default: false
  command_timeout:
    description:
      - Seconds nvidia-smi may take. One that runs longer (a wedged driver) is killed and the task
        fails naming it, whatever O(require_gpu) says.
    type: int
    default: 120
requirements:
  - lxml on the managed host is used when present; the standard library parser otherwise.
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: What GPUs does this guest see
  mlinfra.kvm.nvidia_smi_info:
  register: smi

- name: Say so
  ansible.builtin.debug:
    msg: "{{ smi.msg }}: {{ smi.gpus | map(attribute='name') | list }}"
'''

RETURN = r'''
gpus:
  description: One entry per GPU, in nvidia-smi's index order. Empty when no GPU is visible.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H200
      pci_bus_id: "00000000:00:06.0"
      memory_total_mib: 143771
      driver_version: "580.159.04"
      cuda_version: "13.0"
      mig_mode: disabled
      mig_enabled: false
      virtualization_mode: Pass-Through
gpu_count:
  description: Number of GPUs in RV(gpus).
  returned: always
  type: int
gpu_visible:
  description: Whether at least one GPU is visible.
  returned: always
  type: bool
driver_version:
  description: The loaded driver's version (null without GPU).
  returned: always
  type: str
cuda_version:
  description: The highest CUDA version the driver supports (null without GPU).
  returned: always
  type: str
msg:
  description: C(no GPU visible) or a one-line summary such as C(1 GPU visible (NVIDIA H200), driver 580.159.04).
  returned: always
  type: str
reason:
  description: Why no GPU is visible (nvidia-smi missing, its message), null otherwise.
  returned: always
  type: str
nvidia_smi:
  description: The binary that ran (null when O(xml_file) was read or none was found).
  returned: always
  type: str
ansible_facts:
  description: C(nvidia_smi) with the same keys (gpus, gpu_count, gpu_visible, driver_version, cuda_version).
  returned: always
  type: dict
'''

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_xml import (  # noqa: E402
    NO_GPU_MESSAGE, NvidiaSmiParseError, looks_like_no_gpu, parse_log)
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_service import run_nvidia_smi  # noqa: E402

SEARCH_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"]


def find_nvidia_smi(module: AnsibleModule) -> str:
    path = module.params["nvidia_smi"]
    if path:
        return path if os.access(path, os.X_OK) else ""
    return module.get_bin_path("nvidia-smi", opt_dirs=SEARCH_DIRS) or ""


def result_from(facts: dict, binary: str, reason: str = "") -> dict:
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


def runner_for(module: AnsibleModule):
    def runner() -> dict:
        params = module.params
        if params["xml_file"]:
            try:
                with open(params["xml_file"], "rb") as handle:
                    xml = handle.read()
            except OSError as exc:
                raise KvmError("option xml_file: cannot read %s: %s" % (params["xml_file"], exc),
                               option="xml_file")
            binary = ""
        else:
            binary = find_nvidia_smi(module)
            if not binary:
                where = params["nvidia_smi"] or "PATH, " + ", ".join(SEARCH_DIRS)
                return finish(result_from({}, "", "nvidia-smi not found (looked in %s)" % where))
            if params["command_timeout"] < 1:
                raise InvalidInputError("command_timeout", params["command_timeout"], "is below 1",
                                        "give the seconds nvidia-smi may take, for example 120")
            rc, stdout, stderr = run_nvidia_smi([binary, "-q", "-x"], params["command_timeout"])
            if rc != 0:
                text = (stdout + "\n" + stderr).strip()
                if looks_like_no_gpu(text) or rc in (6, 9):  # 6: no device, 9: driver not loaded
                    return finish(result_from({}, binary, "nvidia-smi exited %d: %s" % (rc, text[-400:])))
                raise KvmError("nvidia-smi -q -x exited %d: %s" % (rc, text[-2000:]), rc=rc)
            xml = stdout
        try:
            facts = parse_log(xml)
        except NvidiaSmiParseError as exc:
            raise KvmError(str(exc))
        return finish(result_from(facts, binary))

    def finish(result: dict) -> dict:
        if module.params["require_gpu"] and not result["gpu_visible"]:
            raise KvmError("%s (require_gpu=true): %s" % (NO_GPU_MESSAGE, result["reason"]),
                           gpus=[], gpu_count=0, gpu_visible=False, reason=result["reason"])
        return result

    return runner


def main() -> None:
    module = new_module(
        AnsibleModule,
        argument_spec=dict(
            nvidia_smi=dict(type="path"),
            xml_file=dict(type="path"),
            require_gpu=dict(type="bool", default=False),
            command_timeout=dict(type="int", default=120),
        ),
        mutually_exclusive=[("nvidia_smi", "xml_file")],
        supports_check_mode=True,
    )
    run(module, runner_for(module))


if __name__ == "__main__":
    main()
