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
  - mlinfra.kvm.attributes.info
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._health_runner import MUTUALLY_EXCLUSIVE, argument_spec, run_gpu_health


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                        supports_check_mode=True)
    run(module, lambda: run_gpu_health(module))


if __name__ == "__main__":
    main()
