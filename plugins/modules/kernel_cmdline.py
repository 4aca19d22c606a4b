#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: kernel_cmdline
short_description: Kernel command line arguments present or absent (GRUB drop-in or grubby), with reboot_required
version_added: "0.1.0"
description:
  - Makes kernel arguments (C(intel_iommu=on), C(iommu=pt), C(default_hugepagesz=1G hugepagesz=1G hugepages=N),
    C(vfio-pci.ids=...)) part of the boot configuration.
  - On Debian and Ubuntu it writes a drop-in C(<etc_root>/default/grub.d/<name>.cfg) that appends the
    arguments to C(GRUB_CMDLINE_LINUX_DEFAULT), then runs C(update-grub), only when the drop-in changed.
    The drop-in holds exactly the arguments of the task; use one I(name) per concern.
  - A failed C(update-grub) is not forgotten. A marker C(<etc_root>/default/grub.d/.<name>.update-grub-pending)
    (not a C(.cfg), so GRUB never reads it) is written before the drop-in and removed only once the
    command succeeded; while it exists every run (check mode included) plans C(update-grub) again and
    reports C(changed). The failing run itself reports failed with C(changed=true), the C(commands)
    it ran and what it wrote.
  - On EL (RHEL, Rocky, Alma, Fedora) it runs C(grubby --update-kernel=ALL --args=...) or
    C(--remove-args=...) when a kernel lacks (or still has) an argument.
  - Returns C(reboot_required) by comparing the wanted arguments with the running kernel's
    C(/proc/cmdline); it never reboots.
  - Refuses arguments that would break the GRUB line or run as shell code (spaces, quotes, C($),
    backticks, backslashes...), before changing anything.
options:
  args:
    description: Kernel arguments, one per item (C(intel_iommu=on), C(iommu=pt)).
    type: list
    elements: str
    default: []
  iommu:
    description:
      - Add the argument that turns the IOMMU on. C(auto) picks C(intel_iommu=on) or C(amd_iommu=on)
        from the CPU vendor in C(<proc_root>/cpuinfo).
    type: str
    choices: [none, auto, intel, amd]
    default: none
  state:
    description:
      - C(present) puts the arguments on the command line. C(absent) takes them off; with the GRUB
        backend and no I(args) the whole drop-in is removed.
    type: str
    choices: [present, absent]
    default: present
  name:
    description: Base name of the GRUB drop-in (C(<etc_root>/default/grub.d/<name>.cfg)).
    type: str
    default: 90-mlinfra-kvm
  backend:
    description:
      - C(grub_dropin) (Debian/Ubuntu) or C(grubby) (EL). C(auto) reads C(<etc_root>/os-release).
    type: str
    choices: [auto, grub_dropin, grubby]
    default: auto
  update_grub_command:
    description: argv that regenerates grub.cfg after the drop-in changed.
    type: list
    elements: str
    default: [update-grub]
  grubby_command:
    description: argv prefix for grubby.
    type: list
    elements: str
    default: [grubby]
  command_timeout:
    description:
      - Seconds each I(update_grub_command) or I(grubby_command) run may take. One that runs longer
        is killed (with its child processes) and the task fails naming it.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.host.etc_root
  - mlinfra.kvm.host.proc_root
notes:
  - Reads C(cmdline) and C(cpuinfo) below O(proc_root), C(os-release) below O(etc_root), and writes
    C(default/grub.d) below O(etc_root).
  - The C(grub_dropin) backend needs C(default/grub) below O(etc_root) (the GRUB configuration
    update-grub reads); without it the task fails before writing anything.
  - When the update command fails after the drop-in was written, the task fails with
    C(changed=true), the paths it wrote (C(written)), what it did (C(actions)) and the action that
    failed (C(failed_action)), the failing command (C(cmd)), its C(rc) and C(stderr); the next run
    runs the command again.
  - Supports check mode and diff mode.
  - The new arguments take effect at the next boot; C(reboot_required) says whether one is
    needed. The role P(mlinfra.kvm.hypervisor#role) orchestrates that reboot.
seealso:
  - module: mlinfra.kvm.vfio_pci
  - module: mlinfra.kvm.pci_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Turn the IOMMU on for this CPU, in passthrough mode
  mlinfra.kvm.kernel_cmdline:
    iommu: auto
    args: [iommu=pt]
    name: 50-mlinfra-iommu
  register: cmdline

- name: Reboot when the running kernel lacks them
  ansible.builtin.reboot:
  when: cmdline.reboot_required

- name: 1G hugepages at boot
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: [default_hugepagesz=1G, hugepagesz=1G, hugepages=64]

- name: Drop them again
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: [default_hugepagesz=1G, hugepagesz=1G, hugepages=64]
    state: absent
'''

RETURN = r'''
args:
  description: The arguments of the task (with the IOMMU argument when I(iommu) is set).
  returned: always
  type: list
  elements: str
  sample: [intel_iommu=on, iommu=pt]
backend:
  description: grub_dropin or grubby.
  returned: always
  type: str
path:
  description: The GRUB drop-in (grub_dropin backend).
  returned: when backend is grub_dropin
  type: str
reboot_required:
  description: The running kernel's command line differs from what the task wants.
  returned: always
  type: bool
pending:
  description: Arguments the running kernel lacks (present) or still has (absent).
  returned: always
  type: list
  elements: str
running_cmdline:
  description: The running kernel's arguments (C(/proc/cmdline), init's part left out).
  returned: always
  type: list
  elements: str
commands:
  description: Commands run (or that would run, in check mode).
  returned: always
  type: list
  elements: list
written:
  description:
    - The paths this run wrote or removed before the update command failed (the pending marker,
      then the drop-in); the failure also carries C(cmd), C(rc) and C(stderr).
  returned: when the update command fails
  type: list
  elements: str
actions:
  description: What was done before a failure (writing the marker, then the drop-in), in words.
  returned: when a change fails after an earlier one was done
  type: list
  elements: str
failed_action:
  description: The action that failed after others were done (a partial change; C(actions) lists those done).
  returned: when a change fails after an earlier one was done
  type: str
uid:
  description: Numeric owner of the GRUB drop-in (Ansible adds the file's attributes to a result that names a file).
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 0
gid:
  description: Numeric group of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 0
owner:
  description: Owner name of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: root
group:
  description: Group name of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: root
size:
  description: Size of the GRUB drop-in in bytes.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 374784
state:
  description: Kind of the GRUB drop-in (C(file)).
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: file
mode:
  description: File mode of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: "0644"
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._cmdline import argument_spec, run_kernel_cmdline


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    run(module, lambda: run_kernel_cmdline(module))


if __name__ == "__main__":
    main()
