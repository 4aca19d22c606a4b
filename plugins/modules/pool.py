#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: pool
short_description: Declarative libvirt storage pools (dir, logical, netfs)
version_added: 0.1.0
description:
  - Defines, builds, starts, autostarts and removes libvirt storage pools.
  - Reads the pool's persistent definition, compares it with the request over the fields
    that were set and acts only on the difference.
  - A pool is built (its target directory created) only when the target is missing; the
    module never wipes or reformats anything.
  - Changing the target of an existing pool is refused unless O(recreate=true), since volumes
    that live in the old target would silently disappear from the pool.
options:
  name:
    description: Pool name.
    type: str
    required: true
  state:
    description:
      - V(active) defines the pool, builds it when its target is missing and starts it.
      - V(present) defines (and builds) it without changing whether it runs.
      - V(absent) stops and undefines it. Volumes stay on disk unless O(purge=true).
    type: str
    choices: [active, present, absent]
    default: active
  type:
    description:
      - Pool type. V(logical) needs an existing volume group (or O(build=true) with
        O(source_devices), which libvirt refuses on devices that carry data).
    type: str
    choices: [dir, logical, netfs]
    default: dir
  target:
    description:
      - Directory of a V(dir) or V(netfs) pool (the mount point for netfs).
      - For V(logical), C(/dev/<vgname>) (defaults to that).
    type: path
  source_host:
    description: NFS server of a V(netfs) pool.
    type: str
  source_dir:
    description: Exported directory of a V(netfs) pool.
    type: str
  source_format:
    description: File system type of a V(netfs) pool.
    type: str
    choices: [auto, nfs, glusterfs, cifs]
    default: auto
  source_name:
    description: Volume group name of a V(logical) pool (defaults to O(name)).
    type: str
  source_devices:
    description: Physical volumes of a V(logical) pool (used when it is built).
    type: list
    elements: path
    default: []
  build:
    description:
      - Build the pool when its target is missing. For V(dir) and V(netfs) this creates the
        directory. For V(logical) it creates the volume group with libvirt's no-overwrite flag,
        and only when set to V(true) explicitly.
    type: bool
  autostart:
    description: Start the pool when libvirtd starts. Left as it is when not set.
    type: bool
  recreate:
    description:
      - Allow a change of O(type), O(target), O(source_host), O(source_dir) or O(source_name)
        of an existing pool by undefining and defining it again. Volumes in the old target stay
        on disk but leave the pool.
    type: bool
    default: false
  purge:
    description:
      - With O(state=absent), delete every volume of the pool first (and the empty directory).
      - The volumes to delete are listed in RV(purged) and in the diff (also in check mode)
        before the first one is deleted.
      - Refused, with nothing changed, when a defined domain (running or shut off) uses one of
        the volumes as a disk or as the backing image of a disk; the error names each volume and
        domain. See O(force).
    type: bool
    default: false
  force:
    description:
      - With O(purge=true), delete the volumes even when defined domains use them.
      - The same meaning as O(mlinfra.kvm.volume#module:force) for a single volume.
    type: bool
    default: false
  xml:
    description:
      - Escape hatch, the complete pool XML to define instead of the structured options.
        Compared as a whole (normalised) with the current definition.
      - Its C(<name>) must equal O(name); a document that is not well-formed, is not a C(<pool>)
        or names another pool is refused (naming both names) before anything is done.
    type: str
notes:
  - Free-text options that end up in the pool XML (O(name), O(target), O(source_host),
    O(source_dir), O(source_name), O(source_devices)) may not contain control characters; such
    values are refused, naming the option and value, before libvirt is contacted.
  - The in-use check of O(purge) reads every defined domain's disks and follows backing chains
    through volumes libvirt knows; it matches volumes by path (C(target/name)) and by
    C(<source pool= volume=>). A disk that reaches the file through a symlink is not recognised.
  - In check mode, the volumes of an inactive pool can only be predicted for a local V(dir)
    pool (from its directory); libvirt lists them once the real run has started the pool.
  - A failure after a side effect (a purge that stops half way) reports C(changed=true), the
    actions already done and the volumes already deleted.
  - O(purge) deletes each volume under that volume's host lock (see the host lock note). A
    volume run still allocating or importing it (M(mlinfra.kvm.volume)) finishes first, and
    volumes that such a run made meanwhile are deleted too and listed in RV(purged).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Images pool
  mlinfra.kvm.pool:
    name: images
    target: /var/lib/libvirt/images
    autostart: true

- name: Remove a scratch pool and everything in it
  mlinfra.kvm.pool:
    name: scratch
    state: absent
    purge: true
'''

RETURN = r'''
pool:
  description: The pool after the run (what it would be, in check mode).
  returned: always
  type: dict
  contains:
    name: {description: Pool name., type: str}
    type: {description: Pool type., type: str}
    target: {description: Target path., type: str}
    state: {description: "V(active), V(inactive) or V(absent).", type: str}
    autostart: {description: Whether the pool autostarts., type: bool}
    uuid: {description: libvirt UUID., type: str}
    capacity: {description: Bytes., type: int}
    allocation: {description: Bytes., type: int}
    available: {description: Bytes., type: int}
    volumes: {description: Names of the volumes in the pool (active pools)., type: list, elements: str}
  sample: {name: images, type: dir, target: /var/lib/libvirt/images, state: active, autostart: true}
xml:
  description: The persistent XML definition of the pool (empty when absent).
  returned: always
  type: str
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["define", "build", "start", "autostart on"]
purged:
  description: The volumes a purge deleted (would delete, in check mode), in deletion order.
  returned: when state is absent with purge and the pool exists
  type: list
  elements: str
  sample: ["worker-1.qcow2", "worker-2.qcow2"]
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import connected_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._pool import (
    MUTUALLY_EXCLUSIVE, argument_spec, precheck_pool, run_pool,
)


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True, mutually_exclusive=MUTUALLY_EXCLUSIVE)
    fail_without_lxml(module)
    run(module, connected_runner(module, run_pool, precheck_pool))


if __name__ == "__main__":
    main()
