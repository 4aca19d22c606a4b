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
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
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

import os
import shutil
import stat
import tempfile
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _cloudinit as C
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import run_bounded
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError, InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run

SEED_MODE = 0o600
SEED_BUILD_TIMEOUT_S = 60


class SeedService:
    """The only code that touches the file system or runs the ISO tool."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module

    def file_mode(self, path: str) -> Optional[int]:
        try:
            return stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            return None

    def iso_ids(self, path: str) -> Optional[Dict[str, str]]:
        return C.read_iso_ids(path)

    def tool_argv(self) -> List[str]:
        genisoimage = self.module.get_bin_path("genisoimage")
        if genisoimage:
            return [genisoimage]
        xorriso = self.module.get_bin_path("xorriso")
        if xorriso:
            return [xorriso, "-as", "mkisofs"]
        raise KvmError("neither genisoimage nor xorriso is installed on the host that builds the seed; "
                       "install one (apt-get install genisoimage)")

    def build(self, dest: str, files: Dict[str, str], appid: str) -> None:
        """Write the ISO next to ``dest`` and rename it into place."""
        tool = self.tool_argv()
        # The rendered files hold secrets: a private directory, files 0600, removed afterwards.
        workdir = tempfile.mkdtemp(prefix="mlkvm-seed-")
        fd, tmp_iso = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".%s." % os.path.basename(dest),
                                       suffix=".tmp")
        os.close(fd)
        try:
            paths = []
            for name in sorted(files):
                path = os.path.join(workdir, name)
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w",
                               encoding="utf-8") as handle:
                    handle.write(files[name])
                paths.append(path)
            argv = tool + ["-output", tmp_iso, "-volid", C.VOLUME_ID, "-joliet", "-rock",
                           "-appid", appid, "-input-charset", "utf-8", "-quiet"] + paths
            # A seed is a few KiB: a minute is ample, and a wedged tool must not hang the play.
            rc, out, err = run_bounded(argv, timeout_s=SEED_BUILD_TIMEOUT_S)
            if rc != 0:
                raise KvmError("building the seed ISO failed: %s exited %d: %s"
                               % (os.path.basename(tool[0]), rc, (err or out).strip()),
                               argv=argv, rc=rc, stderr=err)
            os.chmod(tmp_iso, SEED_MODE)
            os.replace(tmp_iso, dest)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if os.path.exists(tmp_iso):
                os.unlink(tmp_iso)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def remove(self, path: str) -> None:
        os.unlink(path)


class SeedRunner:
    def __init__(self, module: AnsibleModule, service: SeedService) -> None:
        self.module = module
        self.params = module.params
        self.service = service
        self.tracker = DifferenceTracker()
        self.check = module.check_mode

    def validate_dest(self) -> str:
        dest = self.params["dest"]
        if not dest or not os.path.isabs(dest):
            raise InvalidInputError("dest", dest, "is not an absolute path", "give the full path of the ISO file")
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            raise InvalidInputError("dest", dest, "is in a directory that does not exist (%s)" % parent,
                                    "create the directory first (ansible.builtin.file state=directory)")
        if os.path.isdir(dest):
            raise InvalidInputError("dest", dest, "is a directory", "give the path of the ISO file inside it")
        return dest

    def current_digest(self, dest: str, exists: bool) -> Optional[str]:
        """The content hash recorded in the ISO at ``dest``; refuses to clobber foreign files."""
        if not exists:
            return None
        ids = self.service.iso_ids(dest)
        if ids is None:
            if os.path.getsize(dest) > 0 and not self.params["force"]:
                raise ConflictError(
                    "dest %s exists and is not an ISO image; refusing to overwrite it. Remove it, "
                    "choose another dest, or set force=true" % dest, dest=dest)
            return None
        if ids["volume_id"] != C.VOLUME_ID:
            return None
        return C.digest_from_appid(ids["application_id"])

    def run(self) -> Dict[str, Any]:
        dest = self.validate_dest()
        mode = self.service.file_mode(dest)
        exists = mode is not None
        if self.params["state"] == "absent":
            return self.ensure_absent(dest, exists)
        return self.ensure_present(dest, exists, mode)

    def ensure_present(self, dest: str, exists: bool, mode: Optional[int]) -> Dict[str, Any]:
        p = self.params
        files, iid = C.render_seed(p["user_data"], p["meta_data"], p["network_config"], p["instance_id"])
        digest = C.content_hash(files)
        current = self.current_digest(dest, exists)
        if self.tracker.add("content_sha256", current, digest):
            # A rebuild also fixes the mode (the new file is written 0600).
            self.tracker.action("build seed ISO")
            if not self.check:
                self.service.build(dest, files, C.appid_for(digest))
            self.tracker.add("mode", "%04o" % mode if exists else None, "%04o" % SEED_MODE,
                             active=exists and mode != SEED_MODE)
        elif mode != SEED_MODE:
            self.tracker.add("mode", "%04o" % mode, "%04o" % SEED_MODE)
            self.tracker.action("chmod %04o" % SEED_MODE)
            if not self.check:
                self.service.chmod(dest, SEED_MODE)
        summary = C.summary(files)
        before = {"dest": dest, "state": "present" if exists else "absent", "content_sha256": current,
                  "mode": "%04o" % mode if exists else None}
        after = {"dest": dest, "state": "present", "content_sha256": digest, "mode": "%04o" % SEED_MODE,
                 "instance_id": iid, "files": summary}
        return self.result(dest, digest, iid, summary, before, after, mode="%04o" % SEED_MODE)

    def ensure_absent(self, dest: str, exists: bool) -> Dict[str, Any]:
        before = {"dest": dest, "state": "present" if exists else "absent"}
        if exists:
            self.tracker.add("state", "present", "absent")
            self.tracker.action("remove seed ISO")
            if not self.check:
                self.service.remove(dest)
        return self.result(dest, None, None, [], before, {"dest": dest, "state": "absent"})

    def result(self, dest: str, digest: Optional[str], iid: Optional[str], files: List[Dict[str, Any]],
               before: Dict[str, Any], after: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
        out: Dict[str, Any] = {"changed": self.tracker.changed, "actions": self.tracker.actions, "dest": dest,
                               "content_sha256": digest, "instance_id": iid, "files": files}
        out.update(extra)
        if self.module._diff:
            out["diff"] = self.tracker.diff(before, after)
        return out


def main() -> None:
    module = new_module(
        AnsibleModule,
        argument_spec=dict(
            dest=dict(type="path", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            user_data=dict(type="raw", no_log=True),
            meta_data=dict(type="raw"),
            instance_id=dict(type="str"),
            network_config=dict(type="raw"),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    if not C.HAS_YAML:
        module.fail_json(msg="PyYAML is required on the host that builds the seed (pip install PyYAML)")
    run(module, SeedRunner(module, SeedService(module)).run)


if __name__ == "__main__":
    main()
