#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: domain
short_description: Declarative libvirt domains (VMs) with PCI passthrough for GPU workers
version_added: 0.1.0
description:
  - Defines, updates, starts, stops, pauses and removes libvirt domains from structured options
    (no XML templates).
  - "An update compares the request with libvirt's B(inactive) XML over the options that were
    set, and only those: what libvirt adds by itself (PCI addresses, aliases, controllers,
    seclabels, NVRAM paths) is never compared and survives the update. Options left unset are
    not managed; defaults marked I(on creation) only apply when the domain is defined."
  - A domain is never undefined to be updated (that would lose its UEFI NVRAM); it is redefined
    in place.
  - On a running domain, changes that can be made live are made live and in the persistent
    definition at once (C(AFFECT_LIVE|AFFECT_CONFIG)) - vCPUs and memory within their maxima,
    attaching/detaching hostdevs and virtio disks, metadata and description. Anything else is
    written to the persistent definition and RV(restart_required) is returned; O(restart=true)
    restarts the domain to apply it.
  - "Every numeric option is bounded (ranges below), and free-text options refuse control
    characters (C(0x00)-C(0x1f), C(0x7f)): they could not go into the XML. Bad input fails with the
    option, the value and the allowed range, before anything changes."
  - Before any change, hostdevs are checked on the host - the device exists, its whole IOMMU group
    is viable for vfio (the rule M(mlinfra.kvm.pci_info) reports), and no other running domain uses it. Networks, pools and volumes are checked
    to exist. A refused request changes nothing.
  - "O(memory), O(max_memory) and the CPU sets of O(cpu_pinning) are checked against the host as libvirt
    reports it for the connection (C(virsh nodeinfo), the remote host for a remote O(uri)): more memory than
    the host has in total, or a CPU index the host lacks, is refused before anything is defined."
  - When a domain this run defined fails to start (O(state=running) or V(paused)), the definition is
    undone (undefined again) and the failure says so (C(undone) lists what was undone, C(changed) is
    false); a domain that existed before the run is left defined as it was.
options:
  name:
    description: Domain name (letters, digits, C(.), C(_), C(+), C(-)).
    type: str
    required: true
  state:
    description:
      - V(present) defines or updates the domain and leaves it running or not as it is.
      - V(running) also starts it (or resumes it when paused); see O(wait_for_ip).
      - V(paused) starts it paused or pauses it.
      - V(shutdown) asks the guest to shut down (ACPI) and waits up to O(shutdown_timeout); with
        O(force=true) it then forces the domain off, otherwise the run fails.
      - V(destroyed) forces the domain off at once.
      - V(absent) forces it off and undefines it, with its NVRAM, managed save and snapshot
        metadata. Disk images are not deleted.
    type: str
    choices: [present, running, paused, shutdown, destroyed, absent]
    default: present
  virt_type:
    description:
      - Domain type. On creation the default is V(kvm) when libvirt reports KVM and V(qemu)
        (software emulation, TCG) otherwise.
      - Nested or paravirtual KVM may be advertised but hang guests; set V(qemu) explicitly there.
    type: str
    choices: [kvm, qemu]
  machine:
    description: Machine type; V(q35) on creation. libvirt stores it expanded (C(pc-q35-7.2)), which matches.
    type: str
  arch:
    description: Guest architecture; V(x86_64) on creation.
    type: str
  memory:
    description:
      - Current memory, as a size with unit (V(2G), V(512M)); a bare number means MiB. From 16 MiB to 16 TiB,
        and at most the host's total memory (as libvirt reports it).
      - Required to define a new domain. Changed live (balloon) within O(max_memory).
      - On a shut-off domain, a value above the current maximum raises the maximum with it (when
        O(max_memory) is not set). A running domain keeps its maximum until a restart, so there a
        value above it is refused.
    type: str
  max_memory:
    description:
      - Maximum memory (libvirt's C(<memory>)); equal to O(memory) on creation. From 16 MiB to 16 TiB,
        and at most the host's total memory (as libvirt reports it).
      - On a running domain a new maximum is written to the definition and needs a restart.
    type: str
  vcpus:
    description:
      - Current number of vCPUs, from 1 to 4096 (QEMU's q35 and KVM's x86 limit; the host's own,
        shown by C(virsh domcapabilities), may be lower and libvirt enforces it). Required to define
        a new domain. Changed live within O(max_vcpus).
      - On a shut-off domain, a value above the current maximum raises the maximum with it (when
        O(max_vcpus) is not set; a CPU topology of the domain must then be changed to match, with
        O(cpu)). On a running domain a value above the maximum is refused.
    type: int
  max_vcpus:
    description:
      - Maximum number of vCPUs, from 1 to 4096; equal to O(vcpus) on creation.
      - On a running domain a new maximum is written to the definition and needs a restart.
    type: int
  cpu:
    description: CPU mode and topology.
    type: dict
    suboptions:
      mode:
        description:
          - CPU model mode. On creation V(host-passthrough) for V(kvm) and V(maximum) for V(qemu).
        type: str
        choices: [host-passthrough, host-model, maximum]
      sockets:
        description: Sockets (1-4096); O(cpu.sockets) * O(cpu.cores) * O(cpu.threads) must equal O(max_vcpus).
        type: int
      cores:
        description: Cores per socket (1-4096).
        type: int
      threads:
        description: Threads per core (1-4096).
        type: int
  cpu_pinning:
    description: CPU pinning (C(<cputune>)). Replaces all vcpupin and emulatorpin settings.
    type: dict
    suboptions:
      vcpupin:
        description: Host CPUs for each vCPU.
        type: list
        elements: dict
        suboptions:
          vcpu:
            description: vCPU number, from 0 to the maximum vCPUs - 1; each vCPU at most once.
            type: int
            required: true
          cpuset:
            description:
              - Host CPU set such as V(2-3), V(4,6) or V(0-7,^3). CPU indexes go from 0 to the host's
                CPU count - 1 (as libvirt reports it; 8191, Linux's largest NR_CPUS, at most), ranges low to
                high, no empty items.
            type: str
            required: true
      emulatorpin:
        description: Host CPU set for QEMU's emulator threads, written as O(cpu_pinning.vcpupin[].cpuset).
        type: str
  numa_tuning:
    description: Host NUMA memory policy (C(<numatune>)).
    type: dict
    suboptions:
      mode:
        description: Policy.
        type: str
        choices: [strict, preferred, interleave, restrictive]
        default: strict
      nodeset:
        description: Host NUMA nodes such as V(0) or V(0-1), from 0 to 1023 (Linux's MAX_NUMNODES).
        type: str
        required: true
  hugepages:
    description: Back guest memory with host hugepages (they must be reserved on the host).
    type: bool
  hugepage_size:
    description: Hugepage size (V(2M), V(1G)), a power of two from 4K to 16G; the host default when not set.
    type: str
  firmware:
    description:
      - V(bios) (SeaBIOS) on creation.
      - V(uefi) boots OVMF with a per-VM NVRAM that libvirt copies from O(ovmf_vars) on first start
        (and deletes with O(state=absent)).
      - V(kernel) boots O(kernel) directly, with O(initrd) and O(cmdline). Implied when O(kernel) is set.
    type: str
    choices: [bios, uefi, kernel]
  ovmf_code:
    description: OVMF code image for V(uefi).
    type: path
    default: /usr/share/OVMF/OVMF_CODE_4M.fd
  ovmf_vars:
    description: OVMF variables template for V(uefi), copied to each domain's own NVRAM file.
    type: path
    default: /usr/share/OVMF/OVMF_VARS_4M.fd
  kernel:
    description: Guest kernel for direct kernel boot (on the libvirt host).
    type: path
  initrd:
    description: Initial ramdisk for direct kernel boot.
    type: path
  cmdline:
    description: Kernel command line for direct kernel boot.
    type: str
  boot:
    description: Boot device order for V(bios) and V(uefi); V([hd]) on creation.
    type: list
    elements: str
    choices: [hd, cdrom, network, fd]
  disks:
    description:
      - Disks, compared as a set keyed by target. Each is a pool volume (O(disks[].pool) and
        O(disks[].volume), which must exist) or a file (O(disks[].path)).
      - An empty list removes every disk; leaving the option out leaves disks alone.
      - On a running domain, adding or removing virtio disks is done live.
    type: list
    elements: dict
    suboptions:
      pool:
        description: Storage pool of the volume.
        type: str
      volume:
        description: Volume name in O(disks[].pool).
        type: str
      path:
        description:
          - Image file (or block device) on the libvirt host.
          - It must lie inside the target directory of one of the host's libvirt storage pools
            (active or not), or inside a directory listed in O(allowed_paths); on a local host both
            are resolved (symlinks, C(..)) first. So must every image of its backing chain, which
            is read from the qcow2 headers (never with C(qemu-img)) and refused when it loops, is
            deeper than 32 images or holds anything but files and block devices (a FIFO, a socket,
            a character device). Anything else - V(/etc/shadow), a device outside the pools - is
            refused before libvirt is asked, naming the option, the value and the fix.
        type: path
      format:
        description: Image format; read from the volume, or V(qcow2) for C(*.qcow2) paths and V(raw) otherwise.
        type: str
      bus:
        description: Disk bus.
        type: str
        choices: [virtio, sata, scsi, usb]
        default: virtio
      target:
        description: Guest device name; the next free V(vdX) (V(sdX) for other buses) when not set.
        type: str
      readonly:
        description: Attach read-only.
        type: bool
        default: false
  cdroms:
    description: CD-ROMs (for example cloud-init seed ISOs), a pool volume or a file each, on SATA.
    type: list
    elements: dict
    suboptions:
      pool:
        description: Storage pool of the ISO volume.
        type: str
      volume:
        description: ISO volume name.
        type: str
      path:
        description: ISO file on the libvirt host.
        type: path
      bus:
        description: Bus.
        type: str
        choices: [sata, scsi, usb]
        default: sata
      target:
        description: Guest device name; the next free V(sdX) when not set.
        type: str
  interfaces:
    description:
      - Network interfaces, in guest order. The network must exist.
      - Without O(interfaces[].mac), the MAC is derived from the domain name and the interface index
        (C(52:54:00:xx:xx:xx)), so re-runs and redefinitions never change it.
    type: list
    elements: dict
    suboptions:
      network:
        description: libvirt network name.
        type: str
      bridge:
        description: Host bridge name (instead of O(interfaces[].network)), at most 15 characters.
        type: str
      model:
        description: NIC model.
        type: str
        default: virtio
      mac:
        description: MAC address.
        type: str
  console:
    description: A serial console (pty) on the first serial port; V(true) on creation.
    type: bool
  console_log:
    description:
      - Write the serial console to this file on the libvirt host (appended), with a file-backed
        serial port instead of a pty (a guest kernel logging to a pty nobody reads can stall).
    type: path
  rng:
    description: A virtio RNG fed from the host's C(/dev/urandom); V(true) on creation.
    type: bool
  guest_agent:
    description: The QEMU guest agent channel; V(true) on creation.
    type: bool
  memballoon:
    description: The virtio memory balloon, which live memory changes need; libvirt adds it unless V(false).
    type: bool
  hostdevs:
    description:
      - PCI devices passed through with VFIO, by address or by selector (vendor and device ids and
        an index among the matching devices, in address order). Compared as a set.
      - The selector grammar of M(mlinfra.kvm.vfio_pci)'s O(mlinfra.kvm.vfio_pci#module:devices);
        M(mlinfra.kvm.pci_info) reports each GPU's C(selector), which can be copied here.
      - New hostdevs are checked before anything changes - the device exists, every device of its
        IOMMU group is bound to vfio-pci or pci-stub or to no driver (PCI-to-PCI bridges may keep
        pcieport; the kernel's vfio rule, which M(mlinfra.kvm.pci_info) reports too), and no other
        running domain uses it.
      - The host's devices are read from O(sysfs_root) when libvirt is local, and through libvirt's
        node device API for remote URIs.
    type: list
    elements: dict
    suboptions:
      address:
        description: PCI address, V(0000:01:00.0) (domain optional).
        type: str
      vendor:
        description: Vendor id (hex, V(10de) for NVIDIA).
        type: str
      device:
        description: Device id (hex).
        type: str
      index:
        description: Which of the matching devices, from 0 in address order (at most 65535).
        type: int
        default: 0
      include_functions:
        description: Also pass the other functions of the same slot (a GPU's HDMI audio function).
        type: bool
        default: false
      managed:
        description: Let libvirt detach the device from its host driver on start and reattach it on stop.
        type: bool
        default: true
  hide_hypervisor:
    description:
      - Hide the hypervisor from the guest (KVM hidden state and a Hyper-V vendor id), which older
        consumer NVIDIA drivers need (error 43).
    type: bool
  hypervisor_vendor_id:
    description: The Hyper-V vendor id shown with O(hide_hypervisor) (1-12 letters or digits).
    type: str
    default: mlinfra
  metadata:
    description:
      - Key/value pairs stored in the domain as C(<mlinfra:vm xmlns:mlinfra="https://mlinfra.example/kvm/1">),
        one child element each. The inventory plugin P(mlinfra.kvm.libvirt#inventory) turns them into groups
        and host variables (for example C(role=worker)). Replaced as a whole; changed live.
    type: dict
  description:
    description: Free-text description of the domain. Changed live.
    type: str
  autostart:
    description: Start the domain with libvirtd. Left as it is when not set.
    type: bool
  restart:
    description:
      - When a change to a running domain cannot be made live, shut it down (as for V(shutdown),
        honouring O(shutdown_timeout) and O(force)) and start it again.
    type: bool
    default: false
  shutdown_timeout:
    description: Seconds to wait for a guest to shut down, from 0 to 86400.
    type: int
    default: 120
  force:
    description: When the guest has not shut down within O(shutdown_timeout), force it off.
    type: bool
    default: false
  wait_for_ip:
    description:
      - With O(state=running), wait until an interface has an IPv4 address in its network's DHCP leases.
      - In check mode nothing is waited for; a domain that already runs reports the address it has
        (one read), so that the tasks after it can predict on the guest.
    type: bool
    default: false
  wait_for_ip_timeout:
    description: Seconds to wait for the address, from 0 to 86400.
    type: int
    default: 300
  sysfs_root:
    description: Where the host's sysfs is mounted (for the hostdev checks on local URIs); a test seam.
    type: path
    default: /sys
  allowed_paths:
    description:
      - Directories (or single image files) outside the host's storage pools where O(disks[].path)
        images and their backing images may lie, for sites that keep images elsewhere.
      - Absolute paths; a file under one of them (after resolving symlinks and C(..)) is allowed.
        The storage pools' target directories are always allowed.
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
notes:
  - Changes that need a restart on a running domain - virt type, machine, architecture, maximum memory,
    maximum vCPUs, CPU, pinning, NUMA, hugepages, firmware, boot order, hypervisor hiding, cdroms,
    interfaces, console, rng, agent, balloon; and disk changes other than adding or removing virtio disks.
  - A domain found in a state nobody asked for - shut off because its QEMU process ended without a
    shutdown (V(crashed)), crashed, paused on a disk I/O error or by its watchdog - is reported
    with a warning naming the reason and libvirt's log of the domain, also when O(state) puts it
    back; the start or resume action then names the state and reason it found.
  - Disk paths follow one policy with M(mlinfra.kvm.volume)'s O(mlinfra.kvm.volume#module:backing) - inside a
    storage pool's target or O(allowed_paths), image files or block devices only, a backing chain that ends.
    With a remote URI the module cannot read the host's files - the path is compared as spelled
    (normalised) with the pools' targets and O(allowed_paths), and its chain is not read.
    O(cdroms[].path) is not checked by this policy.
seealso:
  - module: mlinfra.kvm.domain_info
  - module: mlinfra.kvm.volume
  - module: mlinfra.kvm.network
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: A GPU worker with its GPU and the GPU's audio function
  mlinfra.kvm.domain:
    name: gpu-worker-1
    state: running
    memory: 32G
    vcpus: 8
    cpu: {mode: host-passthrough, sockets: 1, cores: 8, threads: 1}
    firmware: uefi
    disks:
      - {pool: images, volume: gpu-worker-1.qcow2}
    cdroms:
      - {pool: images, volume: gpu-worker-1-seed.iso}
    interfaces:
      - network: ml
    hostdevs:
      - {vendor: 10de, device: 2204, index: 0, include_functions: true}
    hide_hypervisor: true
    metadata: {role: worker, gpu: rtx3090}
    wait_for_ip: true

- name: A TCG test VM booting a kernel directly (no bootloader)
  mlinfra.kvm.domain:
    name: test-vm
    virt_type: qemu
    memory: 1G
    max_memory: 2G
    vcpus: 1
    max_vcpus: 2
    kernel: /var/lib/mlinfra/vmlinuz
    initrd: /var/lib/mlinfra/initrd.img
    cmdline: root=/dev/vda rw console=ttyS0 net.ifnames=0
    disks: [{pool: images, volume: test-vm.qcow2}]
    interfaces: [{network: default}]
    console_log: /var/log/libvirt/qemu/test-vm-serial.log
    state: running

- name: Two more vCPUs, live (within max_vcpus)
  mlinfra.kvm.domain:
    name: test-vm
    vcpus: 2

- name: Stop it cleanly, forcing it off after a minute
  mlinfra.kvm.domain:
    name: test-vm
    state: shutdown
    shutdown_timeout: 60
    force: true
'''

RETURN = r'''
domain:
  description: The domain after the run (what it would be, in check mode).
  returned: always
  type: dict
  contains:
    name: {description: Name., type: str}
    uuid: {description: libvirt UUID (empty for a domain that check mode would define)., type: str}
    state: {description: "V(running), V(paused), V(shutoff), ... or V(absent).", type: str}
    autostart: {description: Whether it autostarts., type: bool}
    vcpus: {description: Current vCPUs (persistent definition)., type: int}
    max_vcpus: {description: Maximum vCPUs., type: int}
    memory_mib: {description: Current memory in MiB (persistent definition)., type: int}
    max_memory_mib: {description: Maximum memory in MiB., type: int}
    interfaces: {description: "Interfaces (network, bridge, model, mac)., type: list", type: list, elements: dict}
    disks: {description: "Disks (pool, volume, path, format, bus, target).", type: list, elements: dict}
    hostdevs: {description: "PCI hostdevs (address, managed).", type: list, elements: dict}
    metadata: {description: The mlinfra metadata key/values., type: dict}
    ip_addresses: {description: "IPv4 addresses from DHCP leases (with O(wait_for_ip))", type: list, elements: dict}
  sample: {name: gpu-worker-1, state: running, vcpus: 8, memory_mib: 32768,
           interfaces: [{network: ml, model: virtio, mac: "52:54:00:3c:11:9a"}]}
restart_required:
  description: A change was written to the persistent definition of a running domain that only a restart applies.
  returned: always
  type: bool
restarted:
  description: The domain was restarted (O(restart=true)) to apply such a change.
  returned: always
  type: bool
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["define", "set vcpus live", "start"]
xml:
  description: The persistent (inactive) XML after the run; empty in check mode and when absent.
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain import argument_spec, run_domain
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import connected_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, connected_runner(module, run_domain))


if __name__ == "__main__":
    main()
