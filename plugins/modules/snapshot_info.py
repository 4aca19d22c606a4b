#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: snapshot_info
short_description: List the libvirt snapshots of a domain
version_added: 0.2.0
description:
  - Lists a domain's snapshots, oldest first (parents before their children), with their
    description and metadata as M(mlinfra.kvm.snapshot) stores them, and names the domain's
    current snapshot.
  - With O(name), also returns that one snapshot in RV(snapshot).
  - Never changes anything; runs in check mode too and always reports C(changed=false).
  - A domain that does not exist, or a snapshot O(name) that the domain does not have, is an
    error naming the option and its value.
  - Replaces C(state=info) of M(mlinfra.kvm.snapshot), which was removed in 0.2.0.
options:
  domain:
    description: Name of the domain.
    type: str
    required: true
  name:
    description:
      - Name of one snapshot to return in RV(snapshot). RV(snapshots) still lists all of them.
      - When not set, RV(snapshot) is null.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes.info
  - mlinfra.kvm.libvirt
notes:
  - Never changes anything, so diff mode has nothing to show.
seealso:
  - module: mlinfra.kvm.snapshot
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: List the snapshots of a worker
  mlinfra.kvm.snapshot_info:
    domain: worker1
  register: snaps

- name: Their names, oldest first, and the current one
  ansible.builtin.debug:
    msg: "{{ snaps.snapshots | map(attribute='name') | list }} (current: {{ snaps.current }})"

- name: One snapshot's metadata
  mlinfra.kvm.snapshot_info:
    uri: qemu+ssh://root@gpu-host-1/system
    domain: worker1
    name: before-cuda-upgrade
  register: snap

- name: The commit it was taken on
  ansible.builtin.debug:
    msg: "{{ snap.snapshot.metadata.commit }}"
'''

RETURN = r'''
snapshot:
  description: With O(name), that snapshot; null without O(name).
  returned: always
  type: dict
  contains:
    name: {description: Snapshot name., type: str}
    description: {description: Its description (without the metadata trailer)., type: str}
    metadata: {description: Its metadata., type: dict}
    domain_state: {description: "State of the domain when taken (V(shutoff), V(running), ...).", type: str}
    creation_time: {description: Unix time it was taken., type: int}
    parent: {description: "Parent snapshot name, or null.", type: str}
    current: {description: Whether it is the domain's current snapshot., type: bool}
    location: {description: "V(internal), or V(external) for snapshots made outside mlinfra.kvm.snapshot.", type: str}
    memory: {description: "V(internal) for a checkpoint with RAM, V(no) for a disk snapshot.", type: str}
    disks: {description: "Per disk target, V(internal), V(external) or V(no).", type: list, elements: dict}
  sample: {name: before-cuda-upgrade, description: Driver 535, metadata: {commit: 4f2a9c1},
           domain_state: shutoff, current: true, location: internal, memory: "no", parent: null}
snapshots:
  description: All snapshots of the domain, oldest first (parents before children), each as RV(snapshot).
  returned: always
  type: list
  elements: dict
  sample: [{name: before-cuda-upgrade, description: Driver 535, metadata: {commit: 4f2a9c1},
            domain_state: shutoff, current: true, location: internal, memory: "no", parent: null}]
current:
  description: Name of the domain's current snapshot, or null.
  returned: always
  type: str
  sample: before-cuda-upgrade
domain_state:
  description: State of the domain now.
  returned: always
  type: str
  sample: shutoff
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._snapshot_info import argument_spec, run_snapshot_info


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_snapshot_info(module))


if __name__ == "__main__":
    main()
