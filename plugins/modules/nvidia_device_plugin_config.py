#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: nvidia_device_plugin_config
short_description: Render the NVIDIA Kubernetes device plugin's config and a mig-parted config
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
version_added: "0.2.0"
description:
  - Renders, from options, the config file of the NVIDIA device plugin for Kubernetes
    (C(version) v1, C(flags.migStrategy), C(sharing.timeSlicing) or C(sharing.mps)) and,
    from the same geometry declaration M(mlinfra.kvm.nvidia_mig) takes, a mig-parted config
    (C(version) v1, C(mig-configs)). Returns both as YAML text and as data, and the Helm
    values that apply the plugin config through the chart's C(config.map).
  - Pure rendering; no GPU and no Kubernetes are touched. Kubernetes is not run by this
    collection; the output is configuration for a cluster that applies it (see the Helm values
    in C(helm_values)). A file is written only when I(dest) or I(mig_parted_dest) is given.
  - Refuses what the plugin rejects at start-up and what its lenient parser accepts and then
    ignores, so that the file means what it says. Refused are C(replicas) below 2; MPS with
    I(mig_strategy=mixed) (the plugin exits), with I(mig_strategy=single) or with MIG-enabled
    GPUs in I(mig_configs) (MIG-enabled GPUs are not MPS-capable); time-slicing and MPS together
    (the plugin silently drops time-slicing); C(devices) other than C(all) in a shared resource
    (ignored by the plugin); unknown or misplaced keys in I(flags), such as C(renameByDefault)
    under C(flags) (ignored without a word, NVIDIA/k8s-device-plugin issue 1433); MIG resources
    the I(mig_strategy) never advertises; profiles not in the GPU's table when
    I(mig_profiles) is given (and, with its placements, layouts that do not fit).
options:
  mig_strategy:
    description: How the plugin advertises MIG devices (C(flags.migStrategy)).
    type: str
    choices: [none, single, mixed]
    default: none
  sharing:
    description: Oversubscription of the advertised resources; give at most one of the two.
    type: dict
    suboptions:
      time_slicing:
        description: C(sharing.timeSlicing) (CUDA time-slicing).
        type: dict
        suboptions:
          rename_by_default:
            description: Advertise C(<name>.shared) instead of C(<name>).
            type: bool
            default: false
          fail_requests_greater_than_one:
            description: Fail pods that request more than one shared resource. Unset is the plugin's default, false.
            type: bool
          resources:
            description: The shared resources.
            type: list
            elements: dict
            required: true
            suboptions:
              name:
                description: C(nvidia.com/gpu), or C(nvidia.com/mig-<profile>) with I(mig_strategy=mixed); C(gpu) means C(nvidia.com/gpu).
                type: str
                default: nvidia.com/gpu
              replicas:
                description: Shared accesses per device, 2 or more.
                type: int
                required: true
              devices:
                description: Which devices; only C(all), as the plugin ignores any other selection.
                type: raw
                default: all
      mps:
        description: C(sharing.mps) (CUDA MPS; whole GPUs without MIG only, I(mig_strategy=none)).
        type: dict
        suboptions:
          rename_by_default:
            description: Advertise C(<name>.shared) instead of C(<name>).
            type: bool
            default: false
          fail_requests_greater_than_one:
            description: Fail pods that request more than one shared resource. Unset is the plugin's default for MPS, true.
            type: bool
          resources:
            description: The shared resources (C(nvidia.com/gpu) only).
            type: list
            elements: dict
            required: true
            suboptions:
              name:
                description: C(nvidia.com/gpu).
                type: str
                default: nvidia.com/gpu
              replicas:
                description: Clients per GPU, 2 or more; each gets that fraction of memory and compute.
                type: int
                required: true
              devices:
                description: Which devices; only C(all), as the plugin ignores any other selection.
                type: raw
                default: all
  flags:
    description:
      - Further keys of the plugin's C(flags) section, in the plugin's own spelling
        (C(failOnInitError), C(nvidiaDriverRoot), C(plugin.deviceListStrategy), C(gfd.oneshot), ...).
        Unknown or misplaced keys are refused; C(migStrategy) is I(mig_strategy).
    type: dict
    default: {}
  mig_configs:
    description:
      - MIG geometries for mig-parted; entries with the same I(name) form one named config
        (one entry per set of GPUs). Rendered as C(mig_parted).
    type: list
    elements: dict
    suboptions:
      name:
        description: The config's name (the value of the node label C(nvidia.com/mig.config)).
        type: str
        required: true
      devices:
        description: C(all) or a list of GPU indices.
        type: raw
        default: all
      mig_mode:
        description: MIG mode of those GPUs.
        type: str
        choices: [enabled, disabled]
        default: enabled
      instances:
        description: GPU instances per GPU, as in M(mlinfra.kvm.nvidia_mig).
        type: list
        elements: dict
        suboptions:
          profile:
            description: GPU-instance profile name (C(3g.71gb)); with I(mig_profiles) also its id.
            type: str
            required: true
          count:
            description: How many instances of this profile.
            type: int
            default: 1
  mig_profiles:
    description:
      - The GPU's GPU-instance profile table, to check profile names, counts and (with
        C(placement_starts)/C(placement_size)) that each geometry fits. Give
        M(mlinfra.kvm.nvidia_mig)'s C(profiles) return value, or a list of profile names.
    type: list
    elements: raw
  helm_config_name:
    description: Key of the plugin config in the Helm values' C(config.map) (and C(config.default)).
    type: str
    default: mlinfra
  dest:
    description: Write the plugin config here (atomically, mode 0644); omit to only return it.
    type: path
  mig_parted_dest:
    description: Write the mig-parted config here (atomically, mode 0644); needs I(mig_configs).
    type: path
requirements:
  - PyYAML (on the managed host)
notes:
  - Supports check mode (nothing is written) and diff mode (the files before and after).
  - Kubernetes does not run on these machines; the output is configuration only. Apply it with
    the chart values in C(helm_values) (C(helm upgrade -i nvdp nvdp/nvidia-device-plugin -f values.yaml)).
seealso:
  - module: mlinfra.kvm.nvidia_mig
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Four time-sliced replicas of every whole GPU
  mlinfra.kvm.nvidia_device_plugin_config:
    sharing:
      time_slicing:
        rename_by_default: true
        resources:
          - {name: nvidia.com/gpu, replicas: 4}
    dest: /etc/mlinfra/nvidia-device-plugin.yaml

- name: MIG geometry (checked against the GPU's table) and the mixed strategy
  mlinfra.kvm.nvidia_device_plugin_config:
    mig_strategy: mixed
    mig_profiles: "{{ mig.profiles }}"        # registered from mlinfra.kvm.nvidia_mig
    mig_configs:
      - name: h200-balanced
        devices: all
        instances:
          - {profile: 3g.71gb}
          - {profile: 2g.35gb}
          - {profile: 1g.18gb, count: 2}
    sharing:
      time_slicing:
        resources:
          - {name: nvidia.com/mig-1g.18gb, replicas: 2}
    mig_parted_dest: /etc/mlinfra/mig-parted.yaml
  register: plugin

- name: Helm values for the cluster that applies it
  ansible.builtin.copy:
    content: "{{ plugin.helm_values_yaml }}"
    dest: /etc/mlinfra/nvidia-device-plugin-values.yaml
    mode: "0644"
'''

RETURN = r'''
config:
  description: The device plugin config as data.
  returned: always
  type: dict
  sample:
    version: v1
    flags: {migStrategy: none}
    sharing:
      timeSlicing:
        renameByDefault: true
        failRequestsGreaterThanOne: false
        resources: [{name: nvidia.com/gpu, devices: all, replicas: 4}]
config_yaml:
  description: The device plugin config as YAML (what I(dest) holds).
  returned: always
  type: str
mig_parted:
  description: The mig-parted config as data (null without I(mig_configs)).
  returned: always
  type: dict
  sample:
    version: v1
    mig-configs:
      h200-balanced: [{devices: all, mig-enabled: true, mig-devices: {3g.71gb: 1, 2g.35gb: 1, 1g.18gb: 2}}]
mig_parted_yaml:
  description: The mig-parted config as YAML (empty without I(mig_configs)).
  returned: always
  type: str
helm_values:
  description: Values for the nvidia-device-plugin chart that install the config (C(config.map), C(config.default)).
  returned: always
  type: dict
helm_values_yaml:
  description: RV(helm_values) as YAML, for C(helm ... -f).
  returned: always
  type: str
advertised:
  description: The shared resources as Kubernetes will see them, with replicas per device.
  returned: always
  type: list
  elements: dict
  sample: [{resource: nvidia.com/gpu.shared, replicas_per_device: 4}]
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._device_plugin_runner import (
    argument_spec, fail_without_yaml, run_nvidia_device_plugin_config)


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_yaml(module)
    run(module, lambda: run_nvidia_device_plugin_config(module))


if __name__ == "__main__":
    main()
