# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # Options shared by every module that talks to libvirt.
    DOCUMENTATION = r'''
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
    HOST_LOCK = r'''
options: {}
notes:
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
    PARTIAL_CHANGE = r'''
options: {}
notes:
  - A failure after the first side effect (a network defined whose start is then refused, a
    domain started that gets no address in time) is reported as the partial change it is,
    C(changed=true), the actions that completed in C(actions), the one that failed in
    C(failed_action), and the message ends by naming what was already done. A failure before
    any side effect reports C(changed=false), and nothing was changed.
'''


def _notes(fragment: str) -> str:
    """The items of a fragment's notes, its last key."""
    return fragment.split("\nnotes:\n", 1)[1]


# A module that changes one named libvirt object extends this alone: DOCUMENTATION (the uri option,
# the requirements, libvirt's errors) with the notes of HOST_LOCK and PARTIAL_CHANGE after its own,
# in that order. It is joined here, outside the class, from the three texts above, which
# ansible-test's yamllint reads as the literals of the class body; ansible-core reads it as any
# other attribute of the class.
ModuleDocFragment.OBJECT = (ModuleDocFragment.DOCUMENTATION.rstrip("\n") + "\n"
                            + _notes(ModuleDocFragment.HOST_LOCK) + _notes(ModuleDocFragment.PARTIAL_CHANGE))
