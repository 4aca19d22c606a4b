#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: slurm_config
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
short_description: A Slurm cluster's slurm.conf, gres.conf and cgroup.conf from one declaration
version_added: 0.5.0
description:
  - Renders the three files every Slurm host reads from one description of the cluster (controller,
    nodes with their GPUs, partitions) and writes only those that differ, atomically. Every host
    renders the same files, as Slurm requires.
  - Refuses, before anything is written and in check mode too, what slurmctld would reject or
    misread - a partition naming an undeclared node, two nodes at one address, a GPU without an
    absolute device path, a value with a space or C(#) - naming the option, the value and the fix.
  - "With O(local_node): a GPU declared for this host's node that is not a character device here (for
    a MIG device, any of its files) is refused (slurmd would fail with an invalid GRES); CPUs or memory
    above the host's are returned in RV(local_mismatch) so the caller can drain the node with that reason."
  - Says what the running cluster needs to take the change - RV(restart_required) (the node set, ports,
    authentication, plugins; gres.conf and cgroup.conf, read by slurmd at start) or
    RV(reconfigure_required) (C(scontrol reconfigure)) - and does neither itself.
  - Debian's Slurm 22.05 has no NVML autodetection, so each GPU's device file, and each MIG device's
    files, come from the caller's facts (M(mlinfra.kvm.nvidia_smi_info), M(mlinfra.kvm.pci_info)).
options:
  config_dir:
    description: Directory of the three files.
    type: path
    default: /etc/slurm
  cluster_name:
    description: The cluster's name (ClusterName; slurmdbd's accounting key).
    type: str
    required: true
  controller:
    description: The host slurmctld runs on.
    type: dict
    required: true
    suboptions:
      host:
        description: Its short host name, as C(hostname -s) prints it there.
        type: str
        required: true
      address:
        description: The address nodes and clients reach it at (default, the host name resolved).
        type: str
  slurmctld_port:
    description: slurmctld's port.
    type: int
    default: 6817
  slurmd_port:
    description: slurmd's port.
    type: int
    default: 6818
  slurm_user:
    description: The user slurmctld runs as.
    type: str
    default: slurm
  munge_socket:
    description:
      - munged's socket when it is not the default one (AuthInfo and AccountingStoragePass).
    type: path
  accounting:
    description: slurmdbd's address; accounting, associations, limits and QOS are enforced when set.
    type: dict
    suboptions:
      host:
        description: slurmdbd's host.
        type: str
        required: true
      port:
        description: slurmdbd's port.
        type: int
        default: 6819
  nodes:
    description: Every slurmd host.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Node name (NodeName).
        type: str
        required: true
      address:
        description: Its address (NodeAddr); default, the name.
        type: str
      cpus:
        description: CPUs the node offers.
        type: int
      memory_mb:
        description: Memory the node offers, in MB (RealMemory); memory becomes a consumable when every node gives it.
        type: int
      gpus:
        description:
          - The node's GPUs, one entry per device (a MIG device is a GPU of its own type), each with
            exactly one of O(nodes[].gpus[].file) and O(nodes[].gpus[].files); an entry with both or
            neither is refused naming it.
          - Slurm forbids typed and untyped GPUs on one node, so that is refused too; a node with MIG
            devices types its whole GPUs as well (for example by model, C(nvidia_h200)).
        type: list
        elements: dict
        default: []
        suboptions:
          file:
            description: A whole GPU's device file, e.g. C(/dev/nvidia0) (gres.conf C(File)).
            type: path
          files:
            description:
              - A MIG device's device files (gres.conf C(MultipleFiles), Slurm 21.08 and later), its GPU's
                device file first, then its GPU instance's and compute instance's capability files, e.g.
                C([/dev/nvidia0, /dev/nvidia-caps/nvidia-cap21, /dev/nvidia-caps/nvidia-cap22]);
                M(mlinfra.kvm.nvidia_smi_info) returns them as C(mig_devices[].files).
              - The MIG devices of one GPU share its device file; every other file belongs to one entry.
            type: list
            elements: path
          type:
            description: GRES type (e.g. C(h200), or a MIG profile such as C(1g.18gb)); jobs may ask for it.
            type: str
      shards:
        description: GPU shares the node offers as C(shard) GRES (GPU sharing; 0 for none).
        type: int
        default: 0
      features:
        description: Node features jobs can constrain on.
        type: list
        elements: str
        default: []
  partitions:
    description: Partitions; each lists its nodes (default, every node).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Partition name.
        type: str
        required: true
      nodes:
        description: Its nodes (default, all).
        type: list
        elements: str
      default:
        description: The partition jobs go to when they name none.
        type: bool
        default: false
      max_time:
        description: Its time limit (Slurm's form, e.g. C(1-00:00:00)); default, none.
        type: str
  proctrack:
    description:
      - How slurmd tracks a job's processes. V(cgroup) (and task/cgroup, device constraints)
        needs systemd's cgroup layout; V(linuxproc) works without systemd as PID 1.
    type: str
    choices: [cgroup, linuxproc]
    default: cgroup
  cgroup_plugin:
    description: cgroup.conf's CgroupPlugin.
    type: str
    choices: [autodetect, cgroup/v1, cgroup/v2]
    default: autodetect
  paths:
    description: Where the daemons keep state, spool, PID and log files.
    type: dict
    default: {}
    suboptions:
      state_save:
        description: slurmctld's state (StateSaveLocation).
        type: path
        default: /var/lib/slurm/slurmctld
      spool:
        description: slurmd's spool (SlurmdSpoolDir; C(%n) is the node name).
        type: path
        default: /var/lib/slurm/slurmd
      run:
        description: PID files.
        type: path
        default: /run/slurm
      log:
        description: Log files.
        type: path
        default: /var/log/slurm
  extra:
    description: Further slurm.conf keys (one token each); keys this module sets itself are refused.
    type: dict
    default: {}
  local_node:
    description: This host's node name, for the checks only this host can make (see above).
    type: str
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: One controller, two GPU workers, one partition
  mlinfra.kvm.slurm_config:
    cluster_name: lab
    controller: {host: tracking, address: 192.168.130.10}
    accounting: {host: tracking}
    nodes:
      - {name: worker1, address: 192.168.130.11, cpus: 8, memory_mb: 30000, gpus: [{file: /dev/nvidia0, type: h200}]}
      - {name: worker2, address: 192.168.130.12, cpus: 8, memory_mb: 30000, gpus: [{file: /dev/nvidia0, type: h200}]}
    partitions:
      - {name: gpu, default: true}
    local_node: "{{ inventory_hostname_short if inventory_hostname in groups['workers'] else omit }}"
  register: slurm_conf

- name: A node whose first H200 is split into two MIG devices, beside a whole second H200
  mlinfra.kvm.slurm_config:
    cluster_name: lab
    controller: {host: tracking}
    nodes:
      - name: worker1
        gpus:
          - {type: 3g.71gb, files: [/dev/nvidia0, /dev/nvidia-caps/nvidia-cap12, /dev/nvidia-caps/nvidia-cap13]}
          - {type: 3g.71gb, files: [/dev/nvidia0, /dev/nvidia-caps/nvidia-cap21, /dev/nvidia-caps/nvidia-cap22]}
          - {type: nvidia_h200, file: /dev/nvidia1}
    partitions:
      - {name: gpu, default: true}
'''

RETURN = r'''
files:
  description: The files written (or that would be, in check mode).
  type: list
  elements: str
  returned: always
actions:
  description: What was done, in order.
  type: list
  elements: str
  returned: always
restart_required:
  description: Daemons the change needs restarted (C(slurmctld), C(slurmd)); empty when none.
  type: list
  elements: str
  returned: always
reconfigure_required:
  description: True when the change is taken by C(scontrol reconfigure) without a restart.
  type: bool
  returned: always
local_mismatch:
  description: Why this host's node offers less than declared (CPUs, memory); empty when it matches.
  type: list
  elements: str
  returned: always
nodes:
  description: The declared node names.
  type: list
  elements: str
  returned: always
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._config_runner import run_slurm_config
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._spec import slurm_config_spec


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=slurm_config_spec(), supports_check_mode=True)
    run(module, lambda: run_slurm_config(module))


if __name__ == "__main__":
    main()
