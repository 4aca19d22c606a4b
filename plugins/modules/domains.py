#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: domains
short_description: A hypervisor's libvirt domains as one list (merged, replaced, overridden, deleted, gathered, rendered)
version_added: 0.3.0
description:
  - Declares many domains in one module call, with the states of Ansible's network resource
    modules. Each item goes through the same validation, guards, check mode and diff as
    M(mlinfra.kvm.domain), on one libvirt connection and in one module process (a loop over
    M(mlinfra.kvm.domain) starts one process per item).
  - Items are applied in order, one after another; a domain started by an item boots while the
    next items are applied (O(config[].wait_for_ip) waits for that item's guest alone).
  - With O(state=replaced) or O(state=overridden), a change a running domain cannot take live is
    written for its next start (RV(objects) says C(restart_required)), or applied at once by a
    restart with O(config[].restart).
  - A list never removes a running domain without O(force) (or the item's O(config[].force));
    without it, the call fails before anything changes.
  - O(state=rendered) refuses items with O(config[].hostdevs) (passthrough is checked against the
    hypervisor), and takes a pool volume's format from its name (C(.qcow2), else raw).
options:
  config:
    description:
      - The domains, each with the options of M(mlinfra.kvm.domain) (but O(state) and O(uri)).
      - "An option an item does not set: O(state=merged) leaves it as the domain has it (as
        M(mlinfra.kvm.domain) does). O(state=replaced) and O(state=overridden) declare the whole
        domain: O(config[].memory) and O(config[].vcpus) are required, other unset options take the
        value a new domain gets, and unset O(config[].disks), O(config[].cdroms),
        O(config[].interfaces), O(config[].hostdevs), O(config[].metadata) become empty."
    type: list
    elements: dict
    # BEGIN generated config suboptions
    suboptions:
      name:
        description:
        - Domain name (letters, digits, C(.), C(_), C(+), C(-)).
        type: str
        required: true
      state:
        description:
        - V(present) defines the domain without changing whether it runs; V(running), V(paused), V(shutdown)
          and V(destroyed) also bring it to that run state, as M(mlinfra.kvm.domain) does.
        - V(absent) removes it, with the same guards as M(mlinfra.kvm.domain), whatever the list's O(state)
          (with O(state=deleted) every listed object is removed).
        - 'When the item does not set it: V(present) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - present
        - running
        - paused
        - shutdown
        - destroyed
        - absent
      virt_type:
        description:
        - Domain type. On creation the default is V(kvm) when libvirt reports KVM and V(qemu) (software emulation,
          TCG) otherwise.
        - Nested or paravirtual KVM may be advertised but hang guests; set V(qemu) explicitly there.
        type: str
        choices:
        - kvm
        - qemu
      machine:
        description:
        - Machine type; V(q35) on creation. libvirt stores it expanded (C(pc-q35-7.2)), which matches.
        type: str
      arch:
        description:
        - Guest architecture; V(x86_64) on creation.
        type: str
      memory:
        description:
        - Current memory, as a size with unit (V(2G), V(512M)); a bare number means MiB. From 16 MiB to 16
          TiB, and at most the host's total memory (as libvirt reports it).
        - Required to define a new domain. Changed live (balloon) within O(config[].max_memory).
        - On a shut-off domain, a value above the current maximum raises the maximum with it (when O(config[].max_memory)
          is not set). A running domain keeps its maximum until a restart, so there a value above it is refused.
        type: str
      max_memory:
        description:
        - Maximum memory (libvirt's C(<memory>)); equal to O(config[].memory) on creation. From 16 MiB to
          16 TiB, and at most the host's total memory (as libvirt reports it).
        - On a running domain a new maximum is written to the definition and needs a restart.
        type: str
      vcpus:
        description:
        - Current number of vCPUs, from 1 to 4096 (QEMU's q35 and KVM's x86 limit; the host's own, shown by
          C(virsh domcapabilities), may be lower and libvirt enforces it). Required to define a new domain.
          Changed live within O(config[].max_vcpus).
        - On a shut-off domain, a value above the current maximum raises the maximum with it (when O(config[].max_vcpus)
          is not set; a CPU topology of the domain must then be changed to match, with O(config[].cpu)). On
          a running domain a value above the maximum is refused.
        type: int
      max_vcpus:
        description:
        - Maximum number of vCPUs, from 1 to 4096; equal to O(config[].vcpus) on creation.
        - On a running domain a new maximum is written to the definition and needs a restart.
        type: int
      cpu:
        description:
        - CPU mode and topology.
        type: dict
        suboptions:
          mode:
            description:
            - CPU model mode. On creation V(host-passthrough) for V(kvm) and V(maximum) for V(qemu).
            type: str
            choices:
            - host-passthrough
            - host-model
            - maximum
          sockets:
            description:
            - Sockets (1-4096); O(config[].cpu.sockets) * O(config[].cpu.cores) * O(config[].cpu.threads)
              must equal O(config[].max_vcpus).
            type: int
          cores:
            description:
            - Cores per socket (1-4096).
            type: int
          threads:
            description:
            - Threads per core (1-4096).
            type: int
      cpu_pinning:
        description:
        - CPU pinning (C(<cputune>)). Replaces all vcpupin and emulatorpin settings.
        type: dict
        suboptions:
          vcpupin:
            description:
            - Host CPUs for each vCPU.
            type: list
            elements: dict
            suboptions:
              vcpu:
                description:
                - vCPU number, from 0 to the maximum vCPUs - 1; each vCPU at most once.
                type: int
                required: true
              cpuset:
                description:
                - Host CPU set such as V(2-3), V(4,6) or V(0-7,^3). CPU indexes go from 0 to the host's CPU
                  count - 1 (as libvirt reports it; 8191, Linux's largest NR_CPUS, at most), ranges low to
                  high, no empty items.
                type: str
                required: true
          emulatorpin:
            description:
            - Host CPU set for QEMU's emulator threads, written as O(config[].cpu_pinning.vcpupin[].cpuset).
            type: str
      numa_tuning:
        description:
        - Host NUMA memory policy (C(<numatune>)).
        type: dict
        suboptions:
          mode:
            description:
            - Policy.
            type: str
            choices:
            - strict
            - preferred
            - interleave
            - restrictive
            default: strict
          nodeset:
            description:
            - Host NUMA nodes such as V(0) or V(0-1), from 0 to 1023 (Linux's MAX_NUMNODES).
            type: str
            required: true
      hugepages:
        description:
        - Back guest memory with host hugepages (they must be reserved on the host).
        type: bool
      hugepage_size:
        description:
        - Hugepage size (V(2M), V(1G)), a power of two from 4K to 16G; the host default when not set.
        type: str
      firmware:
        description:
        - V(bios) (SeaBIOS) on creation.
        - V(uefi) boots OVMF with a per-VM NVRAM that libvirt copies from O(config[].ovmf_vars) on first start
          (and deletes with O(config[].state=absent)).
        - V(kernel) boots O(config[].kernel) directly, with O(config[].initrd) and O(config[].cmdline). Implied
          when O(config[].kernel) is set.
        type: str
        choices:
        - bios
        - uefi
        - kernel
      ovmf_code:
        description:
        - OVMF code image for V(uefi).
        - 'When the item does not set it: V(/usr/share/OVMF/OVMF_CODE_4M.fd) (replaced, overridden, and a
          new object in merged; merged keeps an existing object''s value).'
        type: path
      ovmf_vars:
        description:
        - OVMF variables template for V(uefi), copied to each domain's own NVRAM file.
        - 'When the item does not set it: V(/usr/share/OVMF/OVMF_VARS_4M.fd) (replaced, overridden, and a
          new object in merged; merged keeps an existing object''s value).'
        type: path
      kernel:
        description:
        - Guest kernel for direct kernel boot (on the libvirt host).
        type: path
      initrd:
        description:
        - Initial ramdisk for direct kernel boot.
        type: path
      cmdline:
        description:
        - Kernel command line for direct kernel boot.
        type: str
      boot:
        description:
        - Boot device order for V(bios) and V(uefi); V([hd]) on creation.
        type: list
        elements: str
        choices:
        - hd
        - cdrom
        - network
        - fd
      disks:
        description:
        - Disks, compared as a set keyed by target. Each is a pool volume (O(config[].disks[].pool) and O(config[].disks[].volume),
          which must exist) or a file (O(config[].disks[].path)).
        - An empty list removes every disk; leaving the option out leaves disks alone.
        - On a running domain, adding or removing virtio disks is done live.
        type: list
        elements: dict
        suboptions:
          pool:
            description:
            - Storage pool of the volume.
            type: str
          volume:
            description:
            - Volume name in O(config[].disks[].pool).
            type: str
          path:
            description:
            - Image file (or block device) on the libvirt host.
            - It must lie inside the target directory of one of the host's libvirt storage pools (active or
              not), or inside a directory listed in O(config[].allowed_paths); on a local host both are resolved
              (symlinks, C(..)) first. So must every image of its backing chain, which is read from the qcow2
              headers (never with C(qemu-img)) and refused when it loops, is deeper than 32 images or holds
              anything but files and block devices (a FIFO, a socket, a character device). Anything else -
              V(/etc/shadow), a device outside the pools - is refused before libvirt is asked, naming the
              option, the value and the fix.
            type: path
          format:
            description:
            - Image format; read from the volume, or V(qcow2) for C(*.qcow2) paths and V(raw) otherwise.
            type: str
          bus:
            description:
            - Disk bus.
            type: str
            choices:
            - virtio
            - sata
            - scsi
            - usb
            default: virtio
          target:
            description:
            - Guest device name; the next free V(vdX) (V(sdX) for other buses) when not set.
            type: str
          readonly:
            description:
            - Attach read-only.
            type: bool
            default: false
      cdroms:
        description:
        - CD-ROMs (for example cloud-init seed ISOs), a pool volume or a file each, on SATA.
        type: list
        elements: dict
        suboptions:
          pool:
            description:
            - Storage pool of the ISO volume.
            type: str
          volume:
            description:
            - ISO volume name.
            type: str
          path:
            description:
            - ISO file on the libvirt host.
            type: path
          bus:
            description:
            - Bus.
            type: str
            choices:
            - sata
            - scsi
            - usb
            default: sata
          target:
            description:
            - Guest device name; the next free V(sdX) when not set.
            type: str
      interfaces:
        description:
        - Network interfaces, in guest order. The network must exist.
        - Without O(config[].interfaces[].mac), the MAC is derived from the domain name and the interface
          index (C(52:54:00:xx:xx:xx)), so re-runs and redefinitions never change it.
        type: list
        elements: dict
        suboptions:
          network:
            description:
            - libvirt network name.
            type: str
          bridge:
            description:
            - Host bridge name (instead of O(config[].interfaces[].network)), at most 15 characters.
            type: str
          model:
            description:
            - NIC model.
            type: str
            default: virtio
          mac:
            description:
            - MAC address.
            type: str
      console:
        description:
        - A serial console (pty) on the first serial port; V(true) on creation.
        type: bool
      console_log:
        description:
        - Write the serial console to this file on the libvirt host (appended), with a file-backed serial
          port instead of a pty (a guest kernel logging to a pty nobody reads can stall).
        type: path
      rng:
        description:
        - A virtio RNG fed from the host's C(/dev/urandom); V(true) on creation.
        type: bool
      guest_agent:
        description:
        - The QEMU guest agent channel; V(true) on creation.
        type: bool
      memballoon:
        description:
        - The virtio memory balloon, which live memory changes need; libvirt adds it unless V(false).
        type: bool
      hostdevs:
        description:
        - PCI devices passed through with VFIO, by address or by selector (vendor and device ids and an index
          among the matching devices, in address order). Compared as a set.
        - The selector grammar of M(mlinfra.kvm.vfio_pci)'s O(mlinfra.kvm.vfio_pci#module:devices); M(mlinfra.kvm.pci_info)
          reports each GPU's C(selector), which can be copied here.
        - New hostdevs are checked before anything changes - the device exists, every device of its IOMMU
          group is bound to vfio-pci or pci-stub or to no driver (PCI-to-PCI bridges may keep pcieport; the
          kernel's vfio rule, which M(mlinfra.kvm.pci_info) reports too), and no other running domain uses
          it.
        - The host's devices are read from O(config[].sysfs_root) when libvirt is local, and through libvirt's
          node device API for remote URIs.
        type: list
        elements: dict
        suboptions:
          address:
            description:
            - PCI address, V(0000:01:00.0) (domain optional).
            type: str
          vendor:
            description:
            - Vendor id (hex, V(10de) for NVIDIA).
            type: str
          device:
            description:
            - Device id (hex).
            type: str
          index:
            description:
            - Which of the matching devices, from 0 in address order (at most 65535).
            type: int
            default: 0
          include_functions:
            description:
            - Also pass the other functions of the same slot (a GPU's HDMI audio function).
            type: bool
            default: false
          managed:
            description:
            - Let libvirt detach the device from its host driver on start and reattach it on stop.
            type: bool
            default: true
      hide_hypervisor:
        description:
        - Hide the hypervisor from the guest (KVM hidden state and a Hyper-V vendor id), which older consumer
          NVIDIA drivers need (error 43).
        type: bool
      hypervisor_vendor_id:
        description:
        - The Hyper-V vendor id shown with O(config[].hide_hypervisor) (1-12 letters or digits).
        - 'When the item does not set it: V(mlinfra) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
      metadata:
        description:
        - Key/value pairs stored in the domain as C(<mlinfra:vm xmlns:mlinfra="https://mlinfra.example/kvm/1">),
          one child element each. The inventory plugin P(mlinfra.kvm.libvirt#inventory) turns them into groups
          and host variables (for example C(role=worker)). Replaced as a whole; changed live.
        type: dict
      description:
        description:
        - Free-text description of the domain. Changed live.
        type: str
      autostart:
        description:
        - Start the domain with libvirtd. Left as it is when not set.
        type: bool
      restart:
        description:
        - When a change to a running domain cannot be made live, shut it down (as for V(shutdown), honouring
          O(config[].shutdown_timeout) and O(config[].force)) and start it again.
        - 'When the item does not set it: V(false) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: bool
      shutdown_timeout:
        description:
        - Seconds to wait for a guest to shut down, from 0 to 86400.
        - 'When the item does not set it: V(120) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: int
      force:
        description:
        - When the guest has not shut down within O(config[].shutdown_timeout), force it off.
        type: bool
      wait_for_ip:
        description:
        - With O(config[].state=running), wait until an interface has an IPv4 address in its network's DHCP
          leases.
        - In check mode nothing is waited for; a domain that already runs reports the address it has (one
          read), so that the tasks after it can predict on the guest.
        - 'When the item does not set it: V(false) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: bool
      wait_for_ip_timeout:
        description:
        - Seconds to wait for the address, from 0 to 86400.
        - 'When the item does not set it: V(300) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: int
      sysfs_root:
        description:
        - Where the host's sysfs is mounted (for the hostdev checks on local URIs); a test seam.
        - 'When the item does not set it: V(/sys) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: path
      allowed_paths:
        description:
        - Directories (or single image files) outside the host's storage pools where O(config[].disks[].path)
          images and their backing images may lie, for sites that keep images elsewhere.
        - Absolute paths; a file under one of them (after resolving symlinks and C(..)) is allowed. The storage
          pools' target directories are always allowed.
        type: list
        elements: path
    # END generated config suboptions
  force:
    description:
      - Lets this call destroy the running domains it removes without an item of their own
        (O(state=overridden), and O(state=deleted) by scope) and the deleted items that do not set
        O(config[].force). Without it such a domain fails the call before anything changes.
    type: bool
    default: false
notes:
  - Two items that pass the same PCI device are not checked against each other; the second
    fails when it starts (libvirt refuses a device in use).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt
  - mlinfra.kvm.libvirt.host_lock
  - mlinfra.kvm.resource_list
seealso:
  - module: mlinfra.kvm.domain
  - module: mlinfra.kvm.domain_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Two workers, defined and started in one call
  mlinfra.kvm.domains:
    config:
      - name: ml-worker-1
        state: running
        memory: 8G
        vcpus: 4
        disks: [{pool: mlinfra-lab, volume: ml-worker-1.qcow2}]
        interfaces: [{network: mlinfra-lab}]
      - name: ml-worker-2
        state: running
        memory: 8G
        vcpus: 4
        disks: [{pool: mlinfra-lab, volume: ml-worker-2.qcow2}]
        interfaces: [{network: mlinfra-lab}]

- name: A site's existing domains, as a starting inventory
  mlinfra.kvm.domains:
    state: gathered
  register: existing

- name: Exactly these bench domains; shut-off leftovers with the prefix are removed
  mlinfra.kvm.domains:
    state: overridden
    scope: {name_prefix: bench-}
    config:
      - {name: bench-1, memory: 1G, vcpus: 1, virt_type: qemu}
'''

RETURN = r'''
objects:
  description:
    - Per domain, keyed by name, what M(mlinfra.kvm.domain) would return for it (without its XML
      and diff) - C(changed), C(actions), C(restart_required), C(restarted), C(domain).
    - Named C(objects), not C(results), which Ansible keeps for the results of a loop.
  returned: unless state is gathered or rendered
  type: dict
  sample: {"ml-worker-1": {"changed": true, "actions": ["define", "start"], "restart_required": false}}
actions:
  description: "Every action taken (or, in check mode, that would be), as C(<name>: <action>)."
  returned: unless state is gathered or rendered
  type: list
  elements: str
gathered:
  description: The domains on the host (in O(scope) if set) as O(config) items.
  returned: when state is gathered
  type: list
  elements: dict
rendered:
  description: Per item, keyed by name, the XML it defines.
  returned: when state is rendered
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain import LIST_KIND
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import list_argument_spec, run_list


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=list_argument_spec(LIST_KIND), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_list(module, LIST_KIND))


if __name__ == "__main__":
    main()
