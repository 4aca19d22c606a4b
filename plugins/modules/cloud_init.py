#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: cloud_init
short_description: NoCloud seed ISOs for cloud-init guests, rebuilt only when their content changes
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
version_added: 0.1.0
description:
  - Renders C(user-data), C(meta-data) and (optionally) C(network-config) and writes them to a
    NoCloud seed ISO (volume id C(cidata), Joliet and Rock Ridge) at O(dest), to attach to a
    domain as a cdrom.
  - The ISO is keyed by a SHA-256 of its rendered content, stored in the ISO's application
    identifier. A run whose content hash equals the one in the existing ISO changes nothing
    (genisoimage output is not byte-reproducible, so the bytes are never compared); any
    content change rebuilds it.
  - The ISO is written to a temporary file next to O(dest) and renamed over it, so a guest
    never sees a half-written seed, and gets mode C(0600) since user-data usually carries
    SSH keys or passwords.
  - Runs on the host that stores the ISO (the libvirt host); it does not talk to libvirt.
options:
  dest:
    description:
      - Path of the seed ISO. Its directory must exist.
      - An existing file that is not an ISO 9660 image is never overwritten unless O(force=true).
    type: path
    required: true
  state:
    description:
      - V(present) builds the ISO when missing or when its content differs.
      - V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  user_data:
    description:
      - The C(user-data) file. A dict is rendered to YAML (keys sorted) after a C(#cloud-config)
        header line; a string is written as it is (any format cloud-init reads, such as
        C(#cloud-config), C(#!) scripts or MIME multipart).
      - When omitted, an empty C(#cloud-config) is written.
      - Not logged (O(user_data) is C(no_log)); only its size and hash are returned. Values of
        user_data are masked wherever they occur in the module's output.
    type: raw
  meta_data:
    description:
      - The C(meta-data) file, as a dict (rendered to YAML) or a string.
      - It must carry an C(instance-id). With a dict, O(instance_id) is merged in; without
        either, C(iid-) plus the first 16 hex digits of the hash of user-data and
        network-config is used, so a content change makes cloud-init treat the guest as a new
        instance and apply it again.
    type: raw
  instance_id:
    description:
      - Sets C(instance-id) in O(meta_data) (which must then be a dict or omitted).
      - 1-128 letters, digits, C(.), C(_) or C(-), starting with a letter or digit.
    type: str
  network_config:
    description:
      - The C(network-config) file (network config v1 or v2), as a dict with a C(version) key
        (or a C(network) key holding one) or as a string. Left out of the ISO when not given.
    type: raw
  force:
    description: Overwrite O(dest) even when it exists and is not an ISO image.
    type: bool
    default: false
requirements:
  - genisoimage (Debian package C(genisoimage)), or xorriso used through C(xorriso -as mkisofs)
  - PyYAML (a dependency of ansible-core)
notes:
  - Supports check mode and diff mode. The diff shows file names, sizes and hashes, never
    the text of user-data.
  - The guest reads the seed at first boot of an instance-id; changing the ISO of a running
    guest has no effect until cloud-init sees a new instance-id.
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Seed for a GPU worker
  mlinfra.kvm.cloud_init:
    dest: /var/lib/libvirt/images/worker1-seed.iso
    instance_id: worker1-v1
    meta_data:
      local-hostname: worker1
    user_data:
      locale: C.UTF-8
      users:
        - name: ml
          sudo: ALL=(ALL) NOPASSWD:ALL
          shell: /bin/bash
          ssh_authorized_keys: ["{{ lookup('file', 'files/ml.pub') }}"]
      packages: [python3]
    network_config:
      version: 2
      ethernets:
        eth0: {dhcp4: true}

- name: Seed from files rendered elsewhere
  mlinfra.kvm.cloud_init:
    dest: /var/lib/libvirt/images/worker2-seed.iso
    user_data: "{{ lookup('template', 'user-data.j2') }}"
    meta_data: "instance-id: worker2\nlocal-hostname: worker2\n"

- name: Remove the seed once the guest is provisioned
  mlinfra.kvm.cloud_init:
    dest: /var/lib/libvirt/images/worker1-seed.iso
    state: absent
'''

RETURN = r'''
dest:
  description: Path of the seed ISO.
  returned: always
  type: str
  sample: /var/lib/libvirt/images/worker1-seed.iso
content_sha256:
  description: Hash of the rendered seed content (the key stored in the ISO); null when absent.
  returned: always
  type: str
  sample: 3f0c6d1e9a...
instance_id:
  description: The instance-id written to meta-data, read back from the written text as cloud-init parses
    it (the top-level C(instance-id) key of the YAML mapping); null with O(state=absent).
  returned: always
  type: str
  sample: worker1-v1
files:
  description: The files of the seed, with their size in bytes and SHA-256 (never their text).
  returned: always
  type: list
  elements: dict
  sample: [{name: meta-data, size: 38, sha256: 9b1c...}, {name: user-data, size: 412, sha256: 77ad...}]
mode:
  description: File mode of the ISO.
  returned: when O(state=present)
  type: str
  sample: "0600"
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["build seed ISO with genisoimage"]
uid:
  description: Numeric owner of the seed ISO (Ansible adds the file's attributes to a result that names a file).
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: int
  sample: 0
gid:
  description: Numeric group of the seed ISO.
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: int
  sample: 0
owner:
  description: Owner name of the seed ISO.
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: str
  sample: root
group:
  description: Group name of the seed ISO.
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: str
  sample: root
size:
  description: Size of the seed ISO in bytes.
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: int
  sample: 374784
state:
  description: Kind of the seed ISO (C(file)).
  returned: when the seed ISO exists after the run (a real run with O(state=present); check mode only for an existing one)
  type: str
  sample: file
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._cloudinit_runner import cloud_init_spec, run_cloud_init


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=cloud_init_spec(), supports_check_mode=True)
    run(module, lambda: run_cloud_init(module))


if __name__ == "__main__":
    main()
