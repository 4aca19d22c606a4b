#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: pci_info
short_description: Report PCI devices, GPUs and the IOMMU state of a host, and whether each GPU can be passed through
version_added: "0.1.0"
description:
  - Reads sysfs (and C(/proc/cmdline), C(/proc/cpuinfo)) and reports every PCI device with its
    ids, class, driver, NUMA node, boot VGA flag, IOMMU group and sibling functions.
  - Singles out GPUs (every display/3D controller, class 0x03) and tells for each whether it
    can be handed to a VM right now, and if not, why. Passthrough is possible when the IOMMU
    is enabled and every device of the GPU's IOMMU group is bound to vfio-pci (or pci-stub)
    or to no driver; PCI-to-PCI bridges (classes 0x0604, 0x0607, 0x0609) may keep their driver, as
    the kernel's vfio allows. M(mlinfra.kvm.domain) checks new hostdevs by the same rule.
  - Reports the IOMMU state, enabled (the kernel made IOMMU groups) or not and why, the
    groups and their members, the IOMMU flags on the kernel command line and the flag this
    CPU needs.
  - Changes nothing. Reads a C(sysfs_root) and C(proc_root) so it can answer on a captured tree.
options:
  gpus_only:
    description: Return only the GPUs and the members of their IOMMU groups in C(devices).
    type: bool
    default: false
  check_usage:
    description:
      - "Also report, per GPU, whether the host uses it, as M(mlinfra.kvm.vfio_pci) judges before
        it takes a device: an open device node, a network interface anywhere in the function's
        sysfs subtree that is up or carries a route, a block device there (at any depth, and
        through LVM/device-mapper/md holders) that is mounted or swapped on. Scans C(/proc/*/fd)."
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes.info
  - mlinfra.kvm.host.sysfs_root
  - mlinfra.kvm.host.proc_root
notes:
  - Reads C(cmdline), C(cpuinfo), C(<pid>/fd) and C(mounts) below O(proc_root).
  - Supports check mode (it never changes anything).
  - Inside a VM without a virtual IOMMU there are no IOMMU groups; the module says so, with
    the reason, instead of failing.
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Read the PCI and IOMMU facts of a GPU host
  mlinfra.kvm.pci_info:
  register: pci

- name: Show which GPUs can be passed through and why the others cannot
  ansible.builtin.debug:
    msg: "{{ item.address }} {{ item.id }}: {{ item.passthrough.possible }} {{ item.passthrough.reasons }}"
  loop: "{{ pci.gpus }}"

- name: Refuse to go on without an IOMMU
  ansible.builtin.assert:
    that: pci.iommu.enabled
    fail_msg: "{{ pci.iommu.reason }}"
'''

RETURN = r'''
devices:
  description: Every PCI device (or only GPUs and their group members with C(gpus_only)).
  returned: always
  type: list
  elements: dict
  contains:
    address: {description: "Full PCI address, e.g. 0000:01:00.0.", type: str}
    slot: {description: "The address without its function, e.g. 0000:01:00 (the functions of one slot share it).", type: str}
    id: {description: "vendor:device, e.g. 10de:2335.", type: str}
    vendor_id: {description: Vendor id (4 hex digits)., type: str}
    device_id: {description: Device id (4 hex digits)., type: str}
    vendor_name: {description: Vendor name when known., type: str}
    subsystem_vendor_id: {description: Subsystem vendor id., type: str}
    subsystem_device_id: {description: Subsystem device id., type: str}
    revision: {description: "Revision id (2 hex digits, e.g. a1; null when sysfs has none).", type: str}
    class: {description: "Class code (6 hex digits, e.g. 030200).", type: str}
    class_name: {description: Human name of the class., type: str}
    driver: {description: Driver bound now (null when none)., type: str}
    driver_override: {description: The device's driver_override (null when unset)., type: str}
    iommu_group: {description: IOMMU group number (null without IOMMU)., type: str}
    numa_node: {description: NUMA node (null when the kernel reports -1)., type: int}
    boot_vga: {description: Whether the firmware used it as the boot display., type: bool}
    is_gpu: {description: A display/3D controller (class 0x03)., type: bool}
    is_bridge: {description: A bridge (class 0x06)., type: bool}
    functions: {description: Other functions of the same slot., type: list, elements: str}
  sample:
    - address: "0000:00:06.0"
      id: "10de:2335"
      class: "030200"
      class_name: 3D controller
      driver: nvidia
      iommu_group: null
gpus:
  description:
    - The GPUs, each with C(passthrough) (possible, reasons, iommu_group, group_members, blocking_devices) and C(in_use).
    - Each also has C(selector), the GPU as C({vendor, device, index, include_functions}) in the selector grammar of
      M(mlinfra.kvm.vfio_pci)'s O(mlinfra.kvm.vfio_pci#module:devices), M(mlinfra.kvm.domain)'s
      O(mlinfra.kvm.domain#module:hostdevs) and the P(mlinfra.kvm.gpu_hostdev#filter) filter (V(index) counts among the
      devices with the same ids, in address order).
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:00:06.0"
      id: "10de:2335"
      driver: nvidia
      selector: {vendor: "10de", device: "2335", index: 0, include_functions: true}
      passthrough:
        possible: false
        reasons:
          - "IOMMU is not enabled: no IOMMU groups under /sys/kernel/iommu_groups; ..."
          - "0000:00:06.0 (10de:2335) is bound to driver nvidia, not vfio-pci"
iommu:
  description: IOMMU state.
  returned: always
  type: dict
  contains:
    enabled: {description: The kernel made IOMMU groups., type: bool}
    groups: {description: "Group number -> member addresses.", type: dict}
    group_count: {description: Number of groups., type: int}
    units: {description: "IOMMU units under /sys/class/iommu (dmar0, ivhd0...).", type: list}
    cmdline_flags: {description: "intel_iommu=, amd_iommu=, iommu= arguments of the running kernel.", type: list}
    passthrough_mode: {description: iommu=pt is set., type: bool}
    cpu_vendor: {description: "intel, amd or null.", type: str}
    virtual_machine: {description: The CPU flags say this kernel runs in a VM., type: bool}
    required_argument: {description: The kernel argument that enables the IOMMU on this CPU., type: str}
    reason: {description: Why the IOMMU is off (null when enabled)., type: str}
vfio:
  description: "Whether the vfio-pci driver is loaded (C(driver_loaded)) and the devices bound to it (C(devices))."
  returned: always
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci_info import argument_spec, run_pci_info


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    run(module, lambda: run_pci_info(module))


if __name__ == "__main__":
    main()
