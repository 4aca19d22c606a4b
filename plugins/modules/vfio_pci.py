#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: vfio_pci
short_description: Bind PCI devices (GPUs) to vfio-pci now and at every boot, whole IOMMU groups only
version_added: "0.1.0"
description:
  - Binds the requested devices to C(vfio-pci) now (C(driver_override), unbind from the host
    driver, C(drivers_probe)) and persistently (a modprobe.d file with
    C(options vfio-pci ids=...) and C(softdep <driver> pre vfio-pci) lines so vfio-pci wins
    over nvidia, nouveau, snd_hda_intel...; the vfio modules in the initramfs; then
    C(update-initramfs -u) or C(dracut -f), only when a file changed).
  - A failed initramfs rebuild is not forgotten. A marker
    C(<etc_root>/modprobe.d/.<conf_name>.initramfs-pending) is written before the files and
    removed only once the command succeeded; while it exists every run (check mode included)
    plans the rebuild again and reports C(changed). The failing run itself reports failed with
    C(changed=true).
  - Binds a whole IOMMU group or nothing; a request that leaves another endpoint of a group
    out is refused, naming it (bridges are ignored, as vfio ignores them).
  - Safe by default, it never takes a device the host needs. The whole sysfs subtree of each
    device is searched (symlinks are not followed, the walk is bounded), so interfaces below a
    child device (virtio-net's C(virtio0/net/eth0)) and disks and partitions deep below a
    controller (AHCI, SCSI, NVMe) are found; stacked block devices (LVM, dm-crypt, md) are
    followed through C(/sys/class/block/<dev>/holders), transitively.
  - A device is in use when it is the boot VGA device, one of its device nodes is open by a
    process, one of its disks, partitions or their holders is mounted (C(<proc_root>/self/mountinfo)
    by major:minor and source, C(/dev/mapper/<name>) included; else C(<proc_root>/mounts)), used
    as swap (C(<proc_root>/swaps)) or held by another block device, or one of its network
    interfaces (or the bridge or bond it is a port of) carries a route
    (C(<proc_root>/net/route), C(<proc_root>/net/ipv6_route); link-local and multicast routes
    do not count) or a global IPv6 address (C(<proc_root>/net/if_inet6)), or is up.
    The refusal names the device, each use (C(eth0 carries the default route),
    C(dm-0 (vg-root) is mounted at /)) and the fix, and changes nothing; check mode refuses the same way.
  - I(force=true) takes a device in use anyway, with a warning, except a disk under the host's own
    filesystems (mounted at C(/), C(/usr), C(/var), C(/etc), C(/boot) or C(/boot/efi)), which
    is refused even with I(force).
  - Refuses when the IOMMU is off, naming the kernel argument (C(intel_iommu=on) or
    C(amd_iommu=on)) and the reboot that are missing (see M(mlinfra.kvm.kernel_cmdline)).
  - C(state=absent) hands the devices back to their host driver (clears driver_override,
    unbinds from vfio-pci, C(drivers_probe)) and removes them from the persistent files.
options:
  devices:
    description:
      - Devices, each a PCI address (C(0000:01:00.0) or C(01:00.0)), C(vendor:device) ids
        (C(10de:2335), every device with these ids), or a dict, C({address}) or
        C({vendor, device, index}) (V(index) counts from 0 among the devices with these ids, in
        address order; without it, every such device), either with V(include_functions=true)
        for the slot's other functions (a GPU's HDMI audio).
      - The grammar M(mlinfra.kvm.domain)'s O(mlinfra.kvm.domain#module:hostdevs), the
        P(mlinfra.kvm.gpu_hostdev#filter) filter and M(mlinfra.kvm.pci_info)'s C(selector) share.
    type: list
    elements: raw
    required: true
  state:
    description: C(present) binds to vfio-pci, C(absent) hands back to the host driver.
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - Also bind the boot VGA device and devices in use (warns, naming each use).
      - Never overrides a disk mounted at C(/), C(/usr), C(/var), C(/etc), C(/boot) or C(/boot/efi).
    type: bool
    default: false
  bind_now:
    description:
      - Change the running kernel's binding. With C(false) only the persistent files are
        written (for a host that will reboot anyway, e.g. to turn the IOMMU on); the IOMMU
        group check then needs groups, and is skipped with a warning when there are none.
    type: bool
    default: true
  persistent:
    description: Write the modprobe.d and initramfs configuration so the binding survives a reboot.
    type: bool
    default: true
  conf_name:
    description:
      - Base name of the modprobe.d file (C(<etc_root>/modprobe.d/<conf_name>.conf)) and of the
        dracut file. The file lists exactly the devices of the request, so give all
        passthrough devices of a host in one task (vfio-pci reads one C(ids=) list).
    type: str
    default: mlinfra-vfio-pci
  softdep_modules:
    description:
      - Extra host driver modules that vfio-pci must load before. The modules of the drivers
        the devices are bound to now, and nouveau/nvidia (NVIDIA GPUs), amdgpu/radeon (AMD)
        and snd_hda_intel (audio functions) are added by themselves.
    type: list
    elements: str
    default: []
  initramfs:
    description:
      - How the vfio modules get into the initramfs. C(auto) picks C(initramfs-tools) when
        C(<etc_root>/initramfs-tools) exists, else C(dracut) when C(<etc_root>/dracut.conf.d)
        exists, else C(none) (with a warning).
    type: str
    choices: [auto, initramfs-tools, dracut, none]
    default: auto
  initramfs_command:
    description:
      - argv that rebuilds the initramfs after a persistent file changed. Default
        C([update-initramfs, -u]) for initramfs-tools, C([dracut, -f]) for dracut.
    type: list
    elements: str
  modprobe_command:
    description: argv prefix that loads a module (C(vfio-pci) is appended) when vfio-pci is not loaded yet.
    type: list
    elements: str
    default: [modprobe]
  bind_timeout:
    description: Seconds to wait for the kernel to show the new binding after C(drivers_probe).
    type: int
    default: 10
  command_timeout:
    description:
      - Seconds I(modprobe_command) or I(initramfs_command) may run. One that runs longer is killed
        (with its child processes) and the task fails naming it, saying what was already changed.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.host.sysfs_root
  - mlinfra.kvm.host.proc_root
  - mlinfra.kvm.host.etc_root
notes:
  - Reads C(self/mountinfo), C(mounts), C(swaps), C(net/route), C(net/ipv6_route), C(net/if_inet6) and
    C(<pid>/fd) below O(proc_root), and writes C(modprobe.d/<conf_name>.conf) and
    C(initramfs-tools/modules) or C(dracut.conf.d/<conf_name>.conf) below O(etc_root).
  - Supports check mode and diff mode. Check mode takes the same decisions (and refusals) as a
    real run and reports them.
  - Needs root on the target. Run M(mlinfra.kvm.pci_info) first to see groups and drivers.
seealso:
  - module: mlinfra.kvm.pci_info
  - module: mlinfra.kvm.kernel_cmdline
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Give both functions of the GPU (display and HDMI audio) to vfio-pci, now and at boot
  mlinfra.kvm.vfio_pci:
    devices: ["0000:01:00.0", "0000:01:00.1"]

- name: Every H200 of the host
  mlinfra.kvm.vfio_pci:
    devices: ["10de:2335"]

- name: The second H200 (address order) with its slot's other functions
  mlinfra.kvm.vfio_pci:
    devices:
      - {vendor: "10de", device: "2335", index: 1, include_functions: true}

- name: Write only the boot configuration; the IOMMU comes on with the next reboot
  mlinfra.kvm.vfio_pci:
    devices: ["10de:2335"]
    bind_now: false

- name: Hand the GPU back to its host driver
  mlinfra.kvm.vfio_pci:
    devices: ["0000:01:00.0", "0000:01:00.1"]
    state: absent
'''

RETURN = r'''
devices:
  description: The devices of the request with their driver before and after.
  returned: always
  type: list
  elements: dict
  sample:
    - {address: "0000:01:00.0", id: "10de:2335", iommu_group: "14", driver_before: nvidia, driver: vfio-pci}
files:
  description: Persistent files managed and whether each changed.
  returned: always
  type: dict
  sample: {"/etc/modprobe.d/mlinfra-vfio-pci.conf": true}
initramfs_updated:
  description: Whether the initramfs command ran.
  returned: always
  type: bool
reboot_required:
  description: True when only the boot configuration changed (I(bind_now=false)), so the binding starts with the next boot.
  returned: always
  type: bool
in_use:
  description: On a refusal for a device the host uses, each use found.
  returned: failure
  type: list
  elements: str
  sample:
    - sda2 is held by dm-0 (vg-root)
    - dm-0 (vg-root) is mounted at / (a filesystem the host itself runs from)
actions:
  description: What was done (or would be, in check mode).
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._vfio import argument_spec, run_vfio_pci


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    run(module, lambda: run_vfio_pci(module))


if __name__ == "__main__":
    main()
