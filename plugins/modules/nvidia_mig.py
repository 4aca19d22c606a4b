#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: nvidia_mig
short_description: Declarative MIG mode and GPU-instance geometry of one NVIDIA GPU
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
version_added: "0.2.0"
description:
  - Brings one GPU's Multi-Instance GPU (MIG) mode and its GPU instances (GIs) to the wanted
    state, each GI with one compute instance (CI) spanning it, so that each GI is one MIG
    device with its own UUID for C(CUDA_VISIBLE_DEVICES) and the Kubernetes device plugin.
  - The request is checked against the GPU's own profile table (C(nvidia-smi mig -lgip)) and
    placements (C(-lgipp)) before anything changes. An unknown profile, more instances of a
    profile than the GPU allows, or a layout with no arrangement on the GPU's memory slices
    (a placement search over each profile's allowed start slices) fails with the GPU's valid
    profiles and a layout that fits (the largest part of the request that does).
  - Existing instances (C(-lgi), C(-lci)) are compared with the request as a multiset of
    profiles, in any order. Only the difference changes; the module keeps as many existing
    instances as still leave room for the missing ones, destroys the others
    (C(nvidia-smi mig -dci -gi ID), C(-dgi -gi ID)) and creates the missing ones in one call
    with explicit placements (C(nvidia-smi mig -cgi PROFILE:START,... -C)).
  - An instance that a process uses (the C(processes) of C(nvidia-smi -q -x), with their GPU
    instance ids) is never destroyed unless I(force=true); the failure names each process
    (pid and name).
  - Changing the MIG mode runs C(nvidia-smi -i N -mig 1|0). When the driver leaves the change
    pending until a GPU reset (typical in a passthrough VM, where the hypervisor may refuse a
    reset), the module returns C(reset_required=true) instead of failing and changes no
    geometry until the mode is effective. Reboot the VM (or reset the GPU) and run again.
  - Every command is an argument list, never a shell string.
options:
  gpu:
    description:
      - The GPU, as nvidia-smi's index (C(0)), its UUID (C(GPU-...)) or its PCI bus id
        (C(00000000:00:06.0), C(0000:00:06.0) or C(00:06.0)).
    type: str
    default: "0"
  mig_mode:
    description:
      - C(enabled) or C(disabled). Disabling destroys every instance first (busy ones only
        with I(force)).
    type: str
    choices: [enabled, disabled]
    default: enabled
  instances:
    description:
      - The wanted GPU instances, in any order. Omit to manage only I(mig_mode); an empty list
        destroys every instance.
      - Only with I(mig_mode=enabled).
    type: list
    elements: dict
    suboptions:
      profile:
        description: GPU-instance profile by name (C(3g.71gb), C(MIG 3g.71gb)) or id (C(9)), as C(nvidia-smi mig -lgip) lists them.
        type: str
        required: true
      count:
        description: How many instances of this profile.
        type: int
        default: 1
  force:
    description:
      - Destroy instances that processes use. The module sends those processes SIGTERM and
        waits up to I(force_timeout) seconds for nvidia-smi to stop listing them; if one is
        still there it fails before destroying anything.
      - A process for which nvidia-smi reports no GPU instance id counts as using every instance.
    type: bool
    default: false
  force_timeout:
    description: Seconds to wait for the processes I(force) stops.
    type: int
    default: 30
  nvidia_smi:
    description: The nvidia-smi to run, a name looked up on PATH (and in /usr/local/nvidia/bin) or a path.
    type: str
    default: nvidia-smi
  command_timeout:
    description:
      - Seconds each nvidia-smi call may take. One that runs longer (a wedged driver) is killed and
        the task fails naming it, with what this run had already changed.
    type: int
    default: 120
notes:
  - A failure after a change (a create refused after the destroys) fails with C(changed=true),
    C(actions) (what was done), C(failed_action) and C(commands); run the task again once the
    cause is fixed.
  - Supports check mode (nvidia-smi is only read; C(commands) lists what a real run would do)
    and diff mode (the mode and the geometry before and after).
  - In check mode, enabling MIG predicts the geometry as if the mode became effective at once;
    the real run may instead return C(reset_required=true).
  - Compute instances smaller than their GPU instance are not managed; a GI holding any other
    set of CIs counts as not matching and is replaced (only with I(force) when it is busy).
seealso:
  - module: mlinfra.kvm.nvidia_device_plugin_config
  - module: mlinfra.kvm.nvidia_smi_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: One 3g, one 2g and two 1g instances on the H200
  mlinfra.kvm.nvidia_mig:
    gpu: "0"
    mig_mode: enabled
    instances:
      - {profile: 3g.71gb}
      - {profile: 2g.35gb}
      - {profile: 1g.18gb, count: 2}
  register: mig

- name: Reboot when the mode change waits for a GPU reset (passthrough VM)
  ansible.builtin.reboot:
  when: mig.reset_required

- name: Use the MIG devices
  ansible.builtin.debug:
    msg: "CUDA_VISIBLE_DEVICES={{ mig.cuda_visible_devices }}"

- name: Back to a whole GPU, stopping whatever still runs on its instances
  mlinfra.kvm.nvidia_mig:
    gpu: GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2
    mig_mode: disabled
    force: true
'''

RETURN = r'''
gpu:
  description: The selected GPU.
  returned: always
  type: dict
  sample: {index: 0, uuid: GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2, pci_bus_id: "00000000:00:06.0", name: NVIDIA H200}
mig_mode:
  description: MIG mode after the run (C(current), C(pending)); in check mode the predicted one.
  returned: always
  type: dict
  sample: {current: enabled, pending: enabled}
reset_required:
  description: The wanted MIG mode is pending until the GPU is reset (reboot a passthrough VM); no geometry was changed.
  returned: always
  type: bool
profiles:
  description: The GPU's GPU-instance profiles (C(-lgip) joined with C(-lgipp)); empty when MIG is not wanted.
  returned: always
  type: list
  elements: dict
  sample:
    - {id: 9, name: 3g.71gb, total: 2, free: 2, memory_gib: 69.75, placement_starts: [0, 4], placement_size: 4, compute_slices: 3}
instances:
  description:
    - The GPU instances after the run, by placement; in check mode the planned ones have null ids and UUIDs.
  returned: always
  type: list
  elements: dict
  sample:
    - {gpu_instance_id: 1, profile: 3g.71gb, profile_id: 9, placement: {start: 4, size: 4}, compute_instance_id: 0,
       mig_device_index: 0, uuid: MIG-3b6c7b9e-8f0a-5d3c-9d62-0e1b2c3d4e5f}
uuids:
  description: The MIG device UUIDs, in the order of RV(instances).
  returned: always
  type: list
  elements: str
cuda_visible_devices:
  description: RV(uuids) joined with commas, for C(CUDA_VISIBLE_DEVICES).
  returned: always
  type: str
geometry:
  description: The instances as C(profile@start:size), by placement.
  returned: always
  type: list
  elements: str
  sample: ["2g.35gb@0:2", "1g.18gb@2:1", "1g.18gb@3:1", "3g.71gb@4:4"]
actions:
  description: What the module did (or would do in check mode), in words.
  returned: always
  type: list
  elements: str
commands:
  description: The nvidia-smi commands that change the GPU, as argument lists (not run in check mode).
  returned: always
  type: list
  elements: list
failed_action:
  description: The action that failed after others were done (a partial change; C(actions) lists those done).
  returned: when a change fails after an earlier one was done
  type: str
mig_mode_message:
  description: nvidia-smi's answer to the mode change (empty when the mode was not changed).
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_runner import argument_spec, run_nvidia_mig


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    run(module, lambda: run_nvidia_mig(module))


if __name__ == "__main__":
    main()
