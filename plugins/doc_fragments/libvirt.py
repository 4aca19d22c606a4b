# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

# ansible-core reads a fragment as an attribute of this class, so the texts below are written once and
# joined: the notes of a fragment that covers more are the notes of the ones it covers, in order.

# Options shared by every module that talks to libvirt.
_OPTIONS = r'''
options:
  uri:
    description:
      - libvirt connection URI.
      - When not set, the C(LIBVIRT_DEFAULT_URI) environment variable is used, and
        C(qemu:///system) when that is unset too.
      - Set it once for all libvirt modules with C(module_defaults) and the action group
        C(group/mlinfra.kvm.libvirt).
    type: str
requirements:
  - libvirt-python
  - lxml
notes:
  - libvirt errors are reported with libvirt's error code and message in C(libvirt_code) and
    C(libvirt_message).
'''

# Modules that change one named libvirt object (and each item of the list modules): every
# libvirt module that changes something (the info modules only read, and have no diff).
_HOST_LOCK_NOTES = r'''
  - Supports check mode and diff mode. Check mode takes the same decisions as a real run and
    reports them; only the side effects are skipped.
  - With a local URI, a run holds an exclusive lock file for each object while it reads, compares
    and changes it (C(/run/mlinfra/KIND@NAME.lock), or under C(/tmp/mlinfra-UID) where
    C(/run/mlinfra) is not writable; a snapshot takes its domain's lock). Two plays against one
    hypervisor at once take turns object by object; the second finds what the first made and
    reports it unchanged. A run that waits more than 30 minutes fails naming the lock and changes
    nothing. With a remote URI nothing is shared, and libvirt's own refusals are reported instead.
'''

# Modules that change one named libvirt object: how a failure half-way is reported.
_PARTIAL_CHANGE_NOTES = r'''
  - A failure after the first side effect (a network defined whose start is then refused, a
    domain started that gets no address in time) is reported as the partial change it is,
    C(changed=true), the actions that completed in C(actions), the one that failed in
    C(failed_action), and the message ends by naming what was already done. A failure before
    any side effect reports C(changed=false), and nothing was changed.
'''


class ModuleDocFragment:
    # Every libvirt module: the uri option, the requirements, how libvirt errors are reported.
    DOCUMENTATION = _OPTIONS

    # The list modules (networks, pools, volumes, domains), with DOCUMENTATION: the host lock
    # each item takes.
    HOST_LOCK = "options: {}\nnotes:" + _HOST_LOCK_NOTES

    # A module that changes one named libvirt object, alone: DOCUMENTATION, the host lock and
    # how a failure half-way is reported.
    OBJECT = _OPTIONS.rstrip("\n") + _HOST_LOCK_NOTES + _PARTIAL_CHANGE_NOTES.lstrip("\n")
