#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: pools
short_description: A hypervisor's libvirt pools as one list (merged, replaced, overridden, deleted, gathered, rendered)
version_added: 0.3.0
description:
  - Declares many pools in one module call, with the states of Ansible's network resource
    modules. Each item goes through the same validation, guards, check mode and diff as
    M(mlinfra.kvm.pool), on one libvirt connection and in one module process (a loop over
    M(mlinfra.kvm.pool) starts one process per item).
options:
  config:
    description:
      - The pools, each with the options of M(mlinfra.kvm.pool) (but O(state) and O(uri)).
      - "An option an item does not set: O(state=merged) keeps the existing object's value;
        O(state=replaced) and O(state=overridden) use M(mlinfra.kvm.pool)'s default (so a
        field set earlier goes back to it)."
    type: list
    elements: dict
    # BEGIN generated config suboptions
    suboptions:
      name:
        description:
        - Pool name.
        type: str
        required: true
      state:
        description:
        - V(active) defines and starts the object, V(present) defines it without changing whether it runs.
        - V(absent) removes it, with the same guards as M(mlinfra.kvm.pool), whatever the list's O(state)
          (with O(state=deleted) every listed object is removed).
        - 'When the item does not set it: V(active) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - active
        - present
        - absent
      type:
        description:
        - Pool type. V(logical) needs an existing volume group (or O(config[].build=true) with O(config[].source_devices),
          which libvirt refuses on devices that carry data).
        - 'When the item does not set it: V(dir) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - dir
        - logical
        - netfs
      target:
        description:
        - Directory of a V(dir) or V(netfs) pool (the mount point for netfs).
        - For V(logical), C(/dev/<vgname>) (defaults to that).
        type: path
      source_host:
        description:
        - NFS server of a V(netfs) pool.
        type: str
      source_dir:
        description:
        - Exported directory of a V(netfs) pool.
        type: str
      source_format:
        description:
        - File system type of a V(netfs) pool.
        - 'When the item does not set it: V(auto) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - auto
        - nfs
        - glusterfs
        - cifs
      source_name:
        description:
        - Volume group name of a V(logical) pool (defaults to O(config[].name)).
        type: str
      source_devices:
        description:
        - Physical volumes of a V(logical) pool (used when it is built).
        type: list
        elements: path
      build:
        description:
        - Build the pool when its target is missing. For V(dir) and V(netfs) this creates the directory. For
          V(logical) it creates the volume group with libvirt's no-overwrite flag, and only when set to V(true)
          explicitly.
        type: bool
      autostart:
        description:
        - Start the pool when libvirtd starts. Left as it is when not set.
        type: bool
      recreate:
        description:
        - Allow a change of O(config[].type), O(config[].target), O(config[].source_host), O(config[].source_dir)
          or O(config[].source_name) of an existing pool by undefining and defining it again. Volumes in the
          old target stay on disk but leave the pool.
        - 'When the item does not set it: V(false) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: bool
      purge:
        description:
        - With O(config[].state=absent), delete every volume of the pool first (and the empty directory).
        - The volumes to delete are listed in RV(mlinfra.kvm.pool#module:purged) and in the diff (also in
          check mode) before the first one is deleted.
        - Refused, with nothing changed, when a defined domain (running or shut off) uses one of the volumes
          as a disk or as the backing image of a disk; the error names each volume and domain. See O(config[].force).
        - 'When the item does not set it: V(false) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: bool
      force:
        description:
        - With O(config[].purge=true), delete the volumes even when defined domains use them.
        - The same meaning as O(mlinfra.kvm.volume#module:force) for a single volume.
        type: bool
      xml:
        description:
        - Escape hatch, the complete pool XML to define instead of the structured options. Compared as a whole
          (normalised) with the current definition.
        - Its C(<name>) must equal O(config[].name); a document that is not well-formed, is not a C(<pool>)
          or names another pool is refused (naming both names) before anything is done.
        type: str
    # END generated config suboptions
  force:
    description:
      - For the pools this call removes without an item of their own (O(state=overridden), and
        O(state=deleted) by scope), and for deleted items that do not set it - M(mlinfra.kvm.pool)'s
        O(mlinfra.kvm.pool#module:force).
    type: bool
    default: false
notes:
  - Pools of a type this collection does not manage (anything but V(dir), V(logical), V(netfs)) are left
    out of RV(gathered) and never removed by O(state=overridden).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt
  - mlinfra.kvm.libvirt.host_lock
  - mlinfra.kvm.resource_list
seealso:
  - module: mlinfra.kvm.pool
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: The lab's pools
  mlinfra.kvm.pools:
    config:
      - {name: mlinfra-lab, target: /var/lib/mlinfra/lab, autostart: true}
      - {name: mlinfra-images, target: /var/lib/mlinfra/images, autostart: true}

- name: Remove the bench pools, and the volumes in them
  mlinfra.kvm.pools:
    state: deleted
    scope: {name_prefix: bench-}
    config: []
'''

RETURN = r'''
objects:
  description:
    - Per pool, keyed by name, what M(mlinfra.kvm.pool) would return for it (without its XML
      and diff) - C(changed), C(actions), C(pool), C(purged).
    - Named C(objects), not C(results), which Ansible keeps for the results of a loop.
  returned: unless state is gathered or rendered
  type: dict
  sample: {"mlinfra-lab": {"changed": true, "actions": ["define", "build", "start", "autostart on"]}}
actions:
  description: "Every action taken (or, in check mode, that would be), as C(<name>: <action>)."
  returned: unless state is gathered or rendered
  type: list
  elements: str
gathered:
  description: The pools on the host (in O(scope) if set) as O(config) items.
  returned: when state is gathered
  type: list
  elements: dict
rendered:
  description: Per item, keyed by name, the XML it defines.
  returned: when state is rendered
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._pool import LIST_KIND
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import list_argument_spec, run_list


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=list_argument_spec(LIST_KIND), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_list(module, LIST_KIND))


if __name__ == "__main__":
    main()
