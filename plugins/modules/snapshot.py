#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: snapshot
short_description: Create, revert to and delete internal libvirt snapshots of a domain
version_added: 0.1.0
description:
  - Creates named snapshots of a domain with a description and metadata, reverts the domain to
    one, and deletes them.
  - To list a domain's snapshots, use M(mlinfra.kvm.snapshot_info). (Up to 0.1.x this module
    listed them with C(state=info); that state was removed in 0.2.0.)
  - B(Which snapshots, and why.) The module makes only I(internal) snapshots, because they are
    the only kind libvirt 9.0 can revert to (it cannot revert external snapshots), and because
    libvirt refuses memory state for domains with PCI host devices (a passed-through GPU cannot
    be saved). In detail, see the next three points.
  - A B(shut off) domain gets an internal disk snapshot of every writable qcow2 disk; read-only
    disks and cdroms (seed ISOs) are left out. This is the mode for GPU domains (shut them down
    first).
  - A B(running or paused) domain B(without host devices) gets an internal system checkpoint
    (disks and RAM, qemu C(savevm)); reverting to it resumes the guest where it was. The guest
    is paused while RAM is written.
  - A running or paused domain B(with host devices) is refused, with nothing changed; shut it
    down and snapshot it then. A writable disk that is not qcow2 (raw, block device) is refused
    too, since it cannot hold an internal snapshot.
  - B(Idempotence.) O(state=present) with an existing snapshot of that name changes nothing,
    except its description and metadata when those options are given and differ (the snapshot
    is redefined; its disk state is never retaken). O(state=absent) with no such snapshot
    changes nothing.
  - O(state=reverted) is an action, not a state that can be read back; the disks may have been
    written since the last revert, and libvirt's "current snapshot" marker does not say so. So a
    revert always reverts and always reports C(changed=true), in check mode too. Put it behind
    a C(when:) if it should only run sometimes.
  - libvirt keeps C(metadata) nowhere in a snapshot, so the module stores it as a JSON trailer
    after a marker line in the snapshot's description; C(virsh snapshot-info) shows it, and it
    survives reverts (domain metadata would be rolled back by one).
options:
  domain:
    description: Name of the domain.
    type: str
    required: true
  name:
    description: Snapshot name.
    type: str
    required: true
  state:
    description:
      - V(present) creates the snapshot when it does not exist.
      - V(absent) deletes it (its internal data in the qcow2 files and libvirt's metadata).
      - V(reverted) reverts the domain to it (always an action, see above).
      - There is no V(info) (removed in 0.2.0); use M(mlinfra.kvm.snapshot_info) to list.
    type: str
    choices: [present, absent, reverted]
    default: present
  description:
    description:
      - Free text kept with the snapshot. When not set, an existing snapshot's description is
        left as it is.
    type: str
  metadata:
    description:
      - String keys and scalar values (stored as strings) kept with the snapshot, such as the
        dataset version or commit an experiment ran on.
      - When not set, an existing snapshot's metadata is left as it is; V({}) removes it.
    type: dict
  after_revert:
    description:
      - The domain's state after O(state=reverted). V(snapshot) leaves it as the snapshot was
        taken (shut off for a disk snapshot, running for a checkpoint); V(running) and V(paused)
        start or pause it after the revert.
    type: str
    choices: [snapshot, running, paused]
    default: snapshot
  force:
    description:
      - With O(state=reverted), pass libvirt's REVERT_FORCE flag, needed for risky reverts
        (for example to a checkpoint whose domain configuration no longer matches).
    type: bool
    default: false
  children:
    description: With O(state=absent), delete the snapshot's descendants too.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
seealso:
  - module: mlinfra.kvm.snapshot_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Shut the GPU worker down before snapshotting it (hostdevs rule out memory snapshots)
  mlinfra.kvm.domain:
    name: worker1
    state: shutdown

- name: Snapshot it before an experiment
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    description: Driver 535, CUDA 11.8, dataset v3
    metadata:
      commit: 4f2a9c1
      dataset: imagenet-v3

- name: List snapshots (a module of its own)
  mlinfra.kvm.snapshot_info:
    domain: worker1
  register: snaps

- name: Roll back and boot
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    state: reverted
    after_revert: running

- name: Drop it
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    state: absent
'''

RETURN = r'''
snapshot:
  description: The snapshot after the run (what it would be, in check mode); null when absent.
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
    location: {description: Always V(internal) for snapshots this module makes., type: str}
    memory: {description: "V(internal) for a checkpoint with RAM, V(no) for a disk snapshot.", type: str}
    disks: {description: "Per disk target, V(internal) or V(no).", type: list, elements: dict}
  sample: {name: before-cuda-upgrade, description: Driver 535, metadata: {commit: 4f2a9c1},
           domain_state: shutoff, current: true, location: internal, memory: "no", parent: null}
snapshots:
  description: All snapshots of the domain after the run, oldest first.
  returned: always
  type: list
  elements: dict
current:
  description: Name of the domain's current snapshot, or null.
  returned: always
  type: str
domain_state:
  description: State of the domain after the run.
  returned: always
  type: str
  sample: shutoff
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["create internal disk snapshot"]
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import connected_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._snapshot import argument_spec, run_snapshot


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, connected_runner(module, run_snapshot))


if __name__ == "__main__":
    main()
