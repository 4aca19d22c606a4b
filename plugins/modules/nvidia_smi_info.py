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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_info import MUTUALLY_EXCLUSIVE, argument_spec, run_nvidia_smi_info


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                        supports_check_mode=True)
    run(module, lambda: run_nvidia_smi_info(module))


if __name__ == "__main__":
    main()
