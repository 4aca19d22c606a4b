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
  - mlinfra.kvm.attributes.info
version_added: 0.1.0
description:
  - Runs C(nvidia-smi -q -x) (or reads a saved copy of its output) and returns, for each
    GPU, its name, memory, driver and CUDA versions, MIG mode and virtualization mode
    (for example C(Pass-Through) inside a VM that was given the GPU by PCI passthrough).
  - When nvidia-smi is missing, or runs but finds no GPU or no loaded driver, the module
    does not fail. It returns RV(gpus=[]) and the message C(no GPU visible), unless
    O(require_gpu=true).
  - A GPU in MIG mode lists its MIG devices in RV(gpus[].mig_devices), each with its GPU and compute
    instance ids, its profile (from C(nvidia-smi mig -lgi) and C(-lci)) and the device files a job on it
    needs - the parent C(/dev/nvidiaN) and the two C(/dev/nvidia-caps/nvidia-capM) access capabilities,
    whose minors come from O(mig_minors_file) - ready for M(mlinfra.kvm.slurm_config)'s
    O(mlinfra.kvm.slurm_config#module:nodes[].gpus[].files).
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
  mig_minors_file:
    description:
      - The NVIDIA driver's table of MIG capability minors (C(gpu0/gi1/access 12) names
        C(/dev/nvidia-caps/nvidia-cap12)). Read only when a GPU has MIG devices; a table that cannot
        be read, or lacks one of them, fails the task naming this option.
    type: path
    default: /proc/driver/nvidia-caps/mig-minors
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
      minor_number: 0
      memory_total_mib: 143771
      driver_version: "580.159.04"
      cuda_version: "13.0"
      mig_mode: enabled
      mig_enabled: true
      mig_devices:
        - {index: 0, gpu_instance_id: 1, compute_instance_id: 0, profile: 3g.71gb,
           files: [/dev/nvidia0, /dev/nvidia-caps/nvidia-cap12, /dev/nvidia-caps/nvidia-cap13]}
      virtualization_mode: Pass-Through
  contains:
    index: {description: "nvidia-smi's index of the GPU.", type: int, returned: always}
    pci_bus_id: {description: "Its PCI address as nvidia-smi prints it.", type: str, returned: always}
    name: {description: "Product name.", type: str, returned: always}
    brand: {description: "Product brand.", type: str, returned: always}
    architecture: {description: "Product architecture (for example C(Hopper)).", type: str, returned: always}
    uuid: {description: "The GPU's UUID.", type: str, returned: always}
    serial: {description: "Board serial number.", type: str, returned: always}
    minor_number: {description: "The N of its device file C(/dev/nvidiaN).", type: int, returned: always}
    pci_device_id: {description: "PCI device and vendor id, for example C(0x233510de).", type: str, returned: always}
    pci_sub_system_id: {description: "PCI subsystem id.", type: str, returned: always}
    vbios_version: {description: "VBIOS version.", type: str, returned: always}
    memory_total_mib: {description: "Framebuffer memory in MiB.", type: int, returned: always}
    memory_reserved_mib: {description: "Memory the driver reserves, in MiB.", type: int, returned: always}
    memory_used_mib: {description: "Memory in use, in MiB.", type: int, returned: always}
    memory_free_mib: {description: "Memory free, in MiB.", type: int, returned: always}
    driver_version: {description: "The driver's version.", type: str, returned: always}
    cuda_version: {description: "The highest CUDA version the driver supports.", type: str, returned: always}
    mig_mode: {description: "C(enabled), C(disabled), or null for a GPU without MIG.", type: str, returned: always}
    mig_mode_pending: {description: "The MIG mode after the next GPU reset.", type: str, returned: always}
    mig_enabled: {description: "Whether MIG mode is on now.", type: bool, returned: always}
    mig_devices:
      description: The GPU's MIG devices (a compute instance in a GPU instance), by index; empty without MIG mode or instances.
      type: list
      elements: dict
      returned: always
      contains:
        index: {description: "The MIG device's index on its GPU.", type: int, returned: always}
        gpu_instance_id: {description: "Its GPU instance.", type: int, returned: always}
        compute_instance_id: {description: "Its compute instance in that GPU instance.", type: int, returned: always}
        profile:
          description:
            - Its profile as nvidia-smi names it, for example C(1g.18gb), or C(1c.3g.71gb) for a compute instance
              smaller than its GPU instance.
            - Null when O(xml_file) was read, since C(nvidia-smi -q -x) does not name profiles.
          type: str
          returned: always
        files:
          description:
            - The device files a job on it needs, the parent GPU's first, then its GPU instance's and compute
              instance's access capabilities, for example
              C([/dev/nvidia0, /dev/nvidia-caps/nvidia-cap12, /dev/nvidia-caps/nvidia-cap13]).
          type: list
          elements: str
          returned: always
    virtualization_mode: {description: "For example C(Pass-Through) in a VM given the GPU by PCI passthrough.", type: str, returned: always}
    persistence_mode: {description: "C(enabled) or C(disabled).", type: str, returned: always}
    compute_mode: {description: "The compute mode, for example C(Default).", type: str, returned: always}
    pcie_link_gen_max: {description: "The highest PCIe generation of its link.", type: int, returned: always}
    pcie_link_width_max: {description: "The widest PCIe link width (lanes).", type: int, returned: always}
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
