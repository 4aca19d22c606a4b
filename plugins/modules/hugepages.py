#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: hugepages
short_description: Reserve 2M or 1G hugepages now and at boot, and report what the kernel granted
version_added: "0.1.0"
description:
  - Sets C(<sysfs_root>/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages) to I(count) now, then
    reads it back. The kernel may grant fewer pages than asked (fragmented memory, typical for 1G
    pages after boot). C(granted) is what it gave; a warning says when it is short.
  - Persistently, pages of the default hugepage size (C(Hugepagesize) in C(/proc/meminfo), usually
    2M) go to C(<etc_root>/sysctl.d/<sysctl_name>.conf) as C(vm.nr_hugepages). Pages of another size
    (1G) can only be reserved reliably at boot; the module returns the C(kernel_args) to put on the
    kernel command line with M(mlinfra.kvm.kernel_cmdline).
  - Refuses a request that would take more than I(max_memory_percent) of C(MemTotal), counting the
    pages already reserved in the other size, before changing anything.
options:
  size:
    description: Hugepage size.
    type: str
    choices: ["2M", "1G"]
    default: "2M"
  count:
    description: Number of pages of I(size) to reserve (0 releases them).
    type: int
    required: true
  persistent:
    description: Also reserve them at every boot (sysctl.d for the default size, C(kernel_args) otherwise).
    type: bool
    default: true
  sysctl_name:
    description: Base name of the sysctl.d file.
    type: str
    default: 80-mlinfra-hugepages
  max_memory_percent:
    description: The most of C(MemTotal) all hugepages together may take, in percent.
    type: int
    default: 90
  strict:
    description: Fail (after the write) when the kernel granted fewer pages than asked, instead of warning.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.host.sysfs_root
  - mlinfra.kvm.host.proc_root
  - mlinfra.kvm.host.etc_root
notes:
  - Reads C(meminfo) below O(proc_root) and writes C(sysctl.d) below O(etc_root).
  - Supports check mode and diff mode.
  - Pages are reserved system-wide (the kernel spreads them over NUMA nodes).
  - A failure after a change (the sysctl.d file not written after nr_hugepages was set) fails with
    C(changed=true), C(actions) (what was done) and C(failed_action).
seealso:
  - module: mlinfra.kvm.kernel_cmdline
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: 2M pages for VM memory, now and at boot
  mlinfra.kvm.hugepages:
    size: 2M
    count: 8192

- name: 1G pages now (as many as the kernel can find) and the boot arguments for all of them
  mlinfra.kvm.hugepages:
    size: 1G
    count: 64
  register: huge

- name: Reserve them at boot
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: "{{ huge.kernel_args }}"
  when: huge.kernel_args | length > 0
'''

RETURN = r'''
size:
  description: The page size.
  returned: always
  type: str
  sample: 1G
requested:
  description: Pages asked for.
  returned: always
  type: int
granted:
  description: Pages the kernel holds after the write (read back from nr_hugepages); in check mode the count it would be asked for.
  returned: always
  type: int
fully_granted:
  description: granted equals requested.
  returned: always
  type: bool
free:
  description: Pages of this size not in use (free_hugepages).
  returned: always
  type: int
persistent_method:
  description: sysctl (default size), kernel_args (other sizes) or none.
  returned: always
  type: str
sysctl_file:
  description: The sysctl.d file (when persistent_method is sysctl).
  returned: always
  type: str
kernel_args:
  description: Kernel arguments that reserve the pages at boot (persistent_method kernel_args), else empty.
  returned: always
  type: list
  elements: str
  sample: [hugepagesz=1G, hugepages=64]
actions:
  description: What was done before a failure, in words.
  returned: when a change fails after an earlier one was done
  type: list
  elements: str
failed_action:
  description: The action that failed after others were done (a partial change; C(actions) lists those done).
  returned: when a change fails after an earlier one was done
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._hugepages import argument_spec, run_hugepages


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    run(module, lambda: run_hugepages(module))


if __name__ == "__main__":
    main()
