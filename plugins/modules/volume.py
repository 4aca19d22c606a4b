#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: volume
short_description: Declarative libvirt storage volumes (qcow2, raw, overlays, imports)
version_added: 0.1.0
description:
  - Creates, grows and deletes volumes in a libvirt storage pool.
  - A volume can be empty, a copy-on-write overlay on a backing image (how a VM disk is made
    from a base image), or imported from a local image file.
  - Volumes are grown to a larger O(capacity) in place. They are never shrunk, and never
    recreated to change their format, backing image or backing format, since either would lose
    data; such requests fail and name the way out.
  - A volume that a defined domain (running or not) uses is not deleted unless O(force=true).
options:
  name:
    description: Volume name (the file name in a dir pool).
    type: str
    required: true
  pool:
    description: Name of the active pool that holds the volume.
    type: str
    required: true
  state:
    description:
      - V(present) creates or grows the volume; V(absent) deletes it.
      - V(absent) refuses to delete a volume that a defined domain, running or shut off, uses
        as a disk (by path or as C(<source pool= volume=>)), or that is the backing image of
        such a disk, and names the domains; see O(force).
      - V(absent) in a pool that does not exist reports nothing to do (there is no volume).
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - With O(state=absent), delete the volume even when defined domains use it (their
        disks then point at a missing file and they will not start).
      - The same meaning in M(mlinfra.kvm.pool) (with O(mlinfra.kvm.pool#module:purge=true)).
    type: bool
    default: false
  capacity:
    description:
      - Virtual size, in bytes or with a binary unit (V(10G), V(512M)).
      - Required for an empty volume. Defaults to the backing image's virtual size for an
        overlay, and to the imported image's virtual size for an import.
      - A larger value than the current one grows the volume; a smaller one is refused.
      - Must be more than 0 and at most 1 PiB (V(1P)); anything else is refused before libvirt is
        contacted, naming the value.
    type: str
  format:
    description: Volume format. For an import, defaults to the format of the imported file.
    type: str
    choices: [qcow2, raw]
  backing:
    description:
      - Absolute path of a backing image; the volume becomes a qcow2 copy-on-write overlay on it.
      - The backing image is never written to.
      - When the volume is created, the image must lie inside the target directory of one of the
        host's libvirt storage pools (active or not), or inside a directory listed in
        O(allowed_paths); on a local host both are resolved (symlinks, C(..)) first. So must every
        image of its backing chain. The chain is read from the qcow2 headers (never with
        C(qemu-img), which follows a looping chain for ever) and refused when it loops, is deeper
        than 32 images, or holds anything but files and block devices (a FIFO, a socket, a
        character device, a directory). A refusal names the option, the value, what is wrong
        (for example that the chain loops, C(a.qcow2 -> b.qcow2 -> a.qcow2)) and the fix; nothing is changed.
    type: path
  backing_format:
    description: Format of O(backing). Detected with C(qemu-img info) when not set.
    type: str
    choices: [qcow2, raw]
  import_from:
    description:
      - Local image file whose content becomes the volume, uploaded through libvirt.
      - Only when the volume does not exist yet; an existing volume is never overwritten.
      - The upload goes into a temporary volume C(NAME.mlinfra-partial). Only when every byte of
        the file was sent, the file did not change size while it was read, and libvirt reports the
        expected virtual size, is the volume O(name) created from it (a copy made by libvirt, so
        the pool needs room for the image twice during the import) and the temporary deleted.
        A failed or interrupted import therefore never leaves a volume O(name) that a later run
        would call unchanged.
      - Any run for O(name) (any O(state), check mode included in its prediction) deletes a
        temporary volume an interrupted import left, and reports it as a change.
      - An image with a backing file is refused; the volume would point at that file unchecked.
    type: path
  allowed_paths:
    description:
      - Directories (or single image files) outside the host's storage pools where O(backing)
        images and their backing images may lie, for sites that keep base images elsewhere.
      - Absolute paths; a file under one of them (after resolving symlinks and C(..)) is allowed.
        The storage pools' target directories are always allowed.
    type: list
    elements: path
    default: []
notes:
  - Free-text options (O(name), O(pool), O(backing), O(import_from), O(capacity)) may not contain
    control characters (newlines, tabs, escapes); such values are refused before anything is done.
  - A volume's lock file is C(volume@POOL@NAME.lock). A second run for the same volume never
    resizes or uploads into a volume still being made. With a remote URI, libvirt's refusals
    (the volume exists already, or is still being allocated) are reported as clear errors.
  - A failure after something was changed reports C(changed=true) and lists in C(done) what was
    changed (for example a leftover temporary volume that was deleted).
  - The backing policy is checked when a volume is created. With a remote URI the module cannot
    read the host's files - O(backing) is compared as spelled (normalised) with the pools' targets
    and O(allowed_paths), and its chain is not read. C(qemu-img info) runs with a 60 s bound.
  - The in-use check reads every defined domain's disks (persistent definition, and the live
    one of running domains) and follows backing chains through volumes libvirt knows. A disk
    that uses the file through another path (a symlink) is not recognised.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: A 20 GiB disk for worker-1, copy-on-write on the base image (in libvirt's default pool)
  mlinfra.kvm.volume:
    name: worker-1.qcow2
    pool: vms
    backing: /var/lib/libvirt/images/debian-12-base.qcow2
    capacity: 20G

- name: Import the base image into the images pool
  mlinfra.kvm.volume:
    name: debian-12-base.qcow2
    pool: images
    import_from: /srv/build/base.qcow2

- name: Scratch space
  mlinfra.kvm.volume:
    name: scratch.raw
    pool: vms
    format: raw
    capacity: 100G
'''

RETURN = r'''
volume:
  description: The volume after the run (predicted in check mode).
  returned: always
  type: dict
  contains:
    name: {description: Volume name., type: str}
    pool: {description: Pool name., type: str}
    state: {description: V(present) or V(absent)., type: str}
    path: {description: Path of the volume on the libvirt host., type: str}
    format: {description: Volume format., type: str}
    capacity: {description: Virtual size in bytes., type: int}
    allocation: {description: Bytes allocated on disk., type: int}
    backing: {description: Backing image path (overlays)., type: str}
    backing_format: {description: Backing image format (overlays)., type: str}
xml:
  description: libvirt's XML description of the volume (empty when absent or in check mode).
  returned: always
  type: str
actions:
  description: Side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["delete leftover partial import base.qcow2.mlinfra-partial", "import /srv/build/base.qcow2"]
done:
  description:
    - On a failure after a change, the changes already made (the failure then has C(changed=true)).
  returned: on failure after a partial change
  type: list
  elements: str
users:
  description:
    - The defined domains that use the volume, one line each, when V(state=absent) met a volume
      in use (deleted anyway with O(force=true); on a refusal the failure carries it too).
  returned: when state is absent and the volume exists
  type: list
  elements: str
  sample: ["domain worker-1 (disk)", "domain worker-2 (backing image of its disk /srv/vms/worker-2.qcow2)"]
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import connected_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._volume import (
    MUTUALLY_EXCLUSIVE, argument_spec, run_volume, validate_params,
)


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True, mutually_exclusive=MUTUALLY_EXCLUSIVE)
    fail_without_lxml(module)
    run(module, connected_runner(module, run_volume, validate_params))


if __name__ == "__main__":
    main()
