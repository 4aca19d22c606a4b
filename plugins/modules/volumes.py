#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: volumes
short_description: A hypervisor's libvirt volumes as one list (merged, replaced, overridden, deleted, gathered, rendered)
version_added: 0.3.0
description:
  - Declares many volumes in one module call, with the states of Ansible's network resource
    modules. Each item goes through the same validation, guards, check mode and diff as
    M(mlinfra.kvm.volume), on one libvirt connection and in one module process (a loop over
    M(mlinfra.kvm.volume) starts one process per item).
  - An item's key is C(POOL/NAME); O(scope.name_prefix) matches that key.
options:
  config:
    description:
      - The volumes, each with the options of M(mlinfra.kvm.volume) (but O(state) and O(uri)).
      - "An option an item does not set: O(state=merged) keeps the existing object's value;
        O(state=replaced) and O(state=overridden) use M(mlinfra.kvm.volume)'s default (so a
        field set earlier goes back to it)."
    type: list
    elements: dict
    # BEGIN generated config suboptions
    suboptions:
      name:
        description:
        - Volume name (the file name in a dir pool).
        type: str
        required: true
      pool:
        description:
        - Name of the active pool that holds the volume.
        type: str
        required: true
      state:
        description:
        - V(absent) removes it, with the same guards as M(mlinfra.kvm.volume), whatever the list's O(state)
          (with O(state=deleted) every listed object is removed).
        - 'When the item does not set it: V(present) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - present
        - absent
      force:
        description:
        - With O(config[].state=absent), delete the volume even when defined domains use it (their disks then
          point at a missing file and they will not start).
        - The same meaning in M(mlinfra.kvm.pool) (with O(mlinfra.kvm.pool#module:purge=true)).
        type: bool
      capacity:
        description:
        - Virtual size, in bytes or with a binary unit (V(10G), V(512M)).
        - Required for an empty volume. Defaults to the backing image's virtual size for an overlay, and to
          the imported image's virtual size for an import.
        - A larger value than the current one grows the volume; a smaller one is refused.
        - Must be more than 0 and at most 1 PiB (V(1P)); anything else is refused before libvirt is contacted,
          naming the value.
        type: str
      format:
        description:
        - Volume format. For an import, defaults to the format of the imported file.
        type: str
        choices:
        - qcow2
        - raw
      backing:
        description:
        - Absolute path of a backing image; the volume becomes a qcow2 copy-on-write overlay on it.
        - The backing image is never written to.
        - When the volume is created, the image must lie inside the target directory of one of the host's
          libvirt storage pools (active or not), or inside a directory listed in O(config[].allowed_paths);
          on a local host both are resolved (symlinks, C(..)) first. So must every image of its backing chain.
          The chain is read from the qcow2 headers (never with C(qemu-img), which follows a looping chain
          for ever) and refused when it loops, is deeper than 32 images, or holds anything but files and block
          devices (a FIFO, a socket, a character device, a directory). A refusal names the option, the value,
          what is wrong (for example that the chain loops, C(a.qcow2 -> b.qcow2 -> a.qcow2)) and the fix;
          nothing is changed.
        type: path
      backing_format:
        description:
        - Format of O(config[].backing). Detected with C(qemu-img info) when not set.
        type: str
        choices:
        - qcow2
        - raw
      import_from:
        description:
        - Local image file whose content becomes the volume, uploaded through libvirt.
        - Only when the volume does not exist yet; an existing volume is never overwritten.
        - The upload goes into a temporary volume C(NAME.mlinfra-partial). Only when every byte of the file
          was sent, the file did not change size while it was read, and libvirt reports the expected virtual
          size, is the volume O(config[].name) created from it (a copy made by libvirt, so the pool needs
          room for the image twice during the import) and the temporary deleted. A failed or interrupted import
          therefore never leaves a volume O(config[].name) that a later run would call unchanged.
        - Any run for O(config[].name) (any O(config[].state), check mode included in its prediction) deletes
          a temporary volume an interrupted import left, and reports it as a change.
        - An image with a backing file is refused; the volume would point at that file unchecked.
        type: path
      allowed_paths:
        description:
        - Directories (or single image files) outside the host's storage pools where O(config[].backing) images
          and their backing images may lie, for sites that keep base images elsewhere.
        - Absolute paths; a file under one of them (after resolving symlinks and C(..)) is allowed. The storage
          pools' target directories are always allowed.
        type: list
        elements: path
    # END generated config suboptions
  force:
    description:
      - For the volumes this call removes without an item of their own (O(state=overridden), and
        O(state=deleted) by scope), and for deleted items that do not set it - M(mlinfra.kvm.volume)'s
        O(mlinfra.kvm.volume#module:force).
    type: bool
    default: false
notes:
  - O(state=rendered) needs O(config[].capacity) - it reads no backing image (its format defaults to V(qcow2)).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt
  - mlinfra.kvm.libvirt.host_lock
  - mlinfra.kvm.resource_list
seealso:
  - module: mlinfra.kvm.volume
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: One overlay per worker on the base image (kept outside every storage pool, so allowed explicitly)
  mlinfra.kvm.volumes:
    config: "{{ workers | map('combine', {'pool': 'mlinfra-lab', 'backing': '/var/lib/mlinfra/base.qcow2',
                                          'allowed_paths': ['/var/lib/mlinfra']}) }}"
  vars:
    workers: [{name: worker-1.qcow2}, {name: worker-2.qcow2}]

- name: Exactly these disks in the lab pool (others in it deleted; a disk in use is refused)
  mlinfra.kvm.volumes:
    state: overridden
    scope: {name_prefix: mlinfra-lab/}
    config:
      - {pool: mlinfra-lab, name: worker-1.qcow2, capacity: 20G}
'''

RETURN = r'''
objects:
  description:
    - Per volume, keyed by POOL/NAME key, what M(mlinfra.kvm.volume) would return for it (without its XML
      and diff) - C(changed), C(actions), C(volume), C(users) for a removal.
    - Named C(objects), not C(results), which Ansible keeps for the results of a loop.
  returned: unless state is gathered or rendered
  type: dict
  sample: {"mlinfra-lab/worker-1.qcow2": {"changed": false, "actions": []}}
actions:
  description: "Every action taken (or, in check mode, that would be), as C(<POOL/NAME key>: <action>)."
  returned: unless state is gathered or rendered
  type: list
  elements: str
gathered:
  description: The volumes on the host (in O(scope) if set) as O(config) items.
  returned: when state is gathered
  type: list
  elements: dict
rendered:
  description: Per item, keyed by POOL/NAME key, the XML it defines.
  returned: when state is rendered
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._volume import LIST_KIND
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import list_argument_spec, run_list


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=list_argument_spec(LIST_KIND), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_list(module, LIST_KIND))


if __name__ == "__main__":
    main()
