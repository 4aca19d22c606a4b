#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: domain_migration
short_description: Move a libvirt domain to another hypervisor, live or cold
version_added: 0.5.0
description:
  - Moves the domain O(name) from the hypervisor of O(uri) (the source) to the one of O(dest_uri).
    The domain keeps its name, UUID, definition and disk paths.
  - "B(Live) for a running or paused domain without PCI host devices, through libvirt's
    peer-to-peer migration (C(VIR_MIGRATE_PEER2PEER), C(LIVE), C(PERSIST_DEST), C(UNDEFINE_SOURCE)):
    the source's libvirtd connects to O(dest_uri) itself, so that URI must be one the source host can
    reach. The guest keeps running; at the switch-over it pauses for at most about O(max_downtime_ms).
    Disks on storage that is not shared are copied during the migration (O(copy_storage))."
  - "B(Cold) for a shut-off domain, and for a running domain with PCI host devices when O(allow_cold=true):
    the state of a passed-through device (a GPU) cannot be migrated, so such a domain is refused live
    with a message naming its host devices. Cold means a clean shutdown (bounded by O(shutdown_timeout)),
    the disk images copied through libvirt streams, the domain defined on the destination with its host
    devices chosen there (O(hostdevs)), started if it ran, and undefined on the source."
  - "B(Preflight) before anything moves: the destination has the domain's networks (active, when the domain
    will run there) and, for every disk, either a storage pool where the copy lands (same path; the pool of the
    same name for a volume disk) with room for it, or the disk itself at the same path (a disk that is not
    copied: read-only, shareable, on a shared pool such as netfs or rbd, or O(copy_storage=none)) and, for a copied
    disk, no volume at its path there (unless O(stale_disks=replace) may remove it); enough free
    memory for a domain that will run there; a CPU that can run the domain's (libvirt's
    C(compareHypervisorCPU) with the domain's CPU; modes C(host-passthrough) and C(maximum) cannot be
    compared and are reported as a warning); no domain of that name or UUID; and, cold, host devices that
    exist there, are free and whose IOMMU group is bound to vfio-pci (the rule of M(mlinfra.kvm.domain)).
    Every problem is reported at once, each naming what is missing and the fix; nothing is changed."
  - B(Idempotence.) A domain that is on the destination and not on the source is left alone
    (C(changed=false), RV(mode=none)). A domain on both is refused (a stale copy to remove first).
  - B(Check mode) runs the preflight and reports the planned actions with C(changed=true); nothing moves.
  - B(A failure half-way) leaves the domain on the source. A live migration that fails or passes
    O(timeout) (the job is then aborted) leaves it running there, as libvirt does; a cold move undoes what
    it did (the copy on the destination undefined, the volumes it made removed) and starts the domain on
    the source again. Volumes made on the destination for a failed live migration are removed. The
    failure names what was done, what was undone and the domain's state on the source.
  - "B(A killed move) (after the domain reached the destination, before the source's images were removed) leaves
    those images on the source: moving the domain back is refused until they are removed, or with
    O(stale_disks=replace), which removes them first when nothing there uses them."
  - After a move with copied disks, the source's images of those disks are removed (O(remove_source_disks)),
    except one another domain of the source uses or one outside the source's storage pools (a warning says so).
  - Progress cannot be streamed by a module; the job's statistics (memory and disk data remaining, the
    transfer rate) are read every half second and returned as lines in RV(progress).
options:
  name:
    description: Name of the domain to move.
    type: str
    required: true
  dest_uri:
    description:
      - libvirt URI of the destination hypervisor, for example V(qemu+ssh://root@hv2/system) or
        V(qemu+tcp://hv2/system). The module opens it for the preflight, and for a live migration the
        source's libvirtd opens it too (peer-to-peer), so it must work from both the controller's target
        host and the source hypervisor.
      - Must differ from O(uri).
    type: str
    required: true
  migration_uri:
    description:
      - Where the source's QEMU sends the migration stream, V(tcp://ADDRESS[:PORT]) of the destination, for a
        dedicated migration network or a destination whose host name does not resolve to the right address.
        Disks copied during a live migration take the same address (NBD).
      - When not set, the destination's libvirtd tells the source its own host name (or its
        C(migration_host) from qemu.conf).
    type: str
  copy_storage:
    description:
      - Which disk images are copied to the destination (read-only disks, cdroms, shareable disks and disks
        on shared pools such as netfs, gluster, rbd or iSCSI are never copied; they must be on the destination
        at the same path).
      - V(all) copies every other disk whole; an image with a backing file arrives flattened (C(NON_SHARED_DISK)).
      - V(incremental) copies only each disk's top image; its backing image must already be on the destination
        at the same path, for example a base image on shared storage (C(NON_SHARED_INC)).
      - V(none) copies nothing; every disk must already be on the destination (shared storage).
      - V(auto) is V(incremental) when every backing image is on the destination (or there is none), else V(all),
        and V(none) when no disk needs copying.
      - A disk of type C(volume) (a pool and a volume name) is copied only whole during a live migration, since libvirt
        cannot pre-create it for an incremental copy; V(auto) is then V(all), and V(incremental) is refused.
      - The destination's volumes are created by the module before the copy (libvirt cannot pre-create an
        incremental one); a volume already at that path is refused (it would be overwritten), unless
        O(stale_disks=replace).
      - "A cold move copies each image file as it is (always the top image): its backing image must be on the
        destination."
    type: str
    choices: [auto, all, incremental, none]
    default: auto
  max_downtime_ms:
    description:
      - The longest pause of the guest at the switch-over of a live migration, in milliseconds (1 to 600000),
        set with libvirt's C(migrateSetMaxDowntime) on the source before the migration starts. QEMU's default
        is 300. A tighter bound may keep a busy guest from converging until O(timeout).
    type: int
  timeout:
    description:
      - Seconds (1 to 86400) the whole move may take. A live migration still running then is aborted
        (C(abortJob)) and the domain keeps running on the source; a cold copy still running is stopped and
        undone.
    type: int
    default: 600
  allow_cold:
    description:
      - Allow a running domain with PCI host devices to be moved cold (shut down, copied, started on the
        destination). Without it such a domain is refused, naming its host devices. A shut-off domain is moved
        cold anyway (it has no downtime to cause).
    type: bool
    default: false
  shutdown_timeout:
    description: Seconds (1 to 3600) a cold move waits for the guest to shut down cleanly (ACPI) before it fails.
    type: int
    default: 120
  remove_source_disks:
    description:
      - Remove the source's images of the disks that were copied once the domain is on the destination.
        With V(false) they stay, stale, on the source.
    type: bool
    default: true
  stale_disks:
    description:
      - What the preflight does when the destination already has a volume at the path of a disk that is copied
        (a stale image, for example the one a move killed before O(remove_source_disks) ran left on the host the
        domain now comes back to).
      - V(refuse) stops the move, naming the disk and the path; nothing is changed.
      - "V(replace) removes that volume on the destination before the copy, only when it is in an active storage pool
        there (libvirt deletes it), that pool is not of a shared type (netfs, gluster, rbd, iSCSI...), no domain
        defined there uses it (running or not; the live and the persistent definitions are read) and no volume
        there has it as its backing image. Otherwise the move is still refused, naming the domain or the volume
        that uses it. RV(actions) names each volume removed; check mode predicts the removal and removes nothing."
      - "Use V(replace) only where the image at the destination is known to be a stale copy of this domain's
        (as the record of the collection's hypervisor maintenance playbook proves), and never where both hosts
        share the storage through a plain directory pool (an NFS mount, say): the volume there would be the very
        image the domain runs on. Set O(copy_storage=none) for shared storage."
    type: str
    choices: [refuse, replace]
    default: refuse
  hostdevs:
    description:
      - For a cold move of a domain with PCI host devices, the devices it gets on the destination, in the
        selector grammar of M(mlinfra.kvm.domain)'s O(mlinfra.kvm.domain#module:hostdevs) (an address, or vendor
        and device ids with an index), resolved on the destination through libvirt's node device API.
      - When not set, the domain keeps the same PCI addresses (identical hosts).
      - Refused for a domain without host devices, and for a live migration.
    type: list
    elements: dict
    suboptions:
      address:
        description: PCI address on the destination, V(0000:01:00.0).
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
        description: Also pass the slot's other functions (a GPU's HDMI audio).
        type: bool
        default: false
      managed:
        description: Let libvirt detach the device from its host driver and reattach it (C(managed='yes')).
        type: bool
        default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
notes:
  - O(uri) is the source. A migration needs both hypervisors to run compatible QEMU and libvirt versions.
  - docs/migration.md describes how the collection proves this module with a second libvirtd on one machine.
seealso:
  - module: mlinfra.kvm.domain
  - module: mlinfra.kvm.pool
  - module: mlinfra.kvm.network
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Move a worker live to the second hypervisor over the migration network
  mlinfra.kvm.domain_migration:
    name: worker1
    uri: qemu:///system
    dest_uri: qemu+ssh://root@hv2/system
    migration_uri: tcp://10.10.0.2
    max_downtime_ms: 500
    timeout: 900
  register: moved

- name: Show how it went
  ansible.builtin.debug:
    var: moved.progress

- name: Move a GPU worker cold, onto the destination's first H200
  mlinfra.kvm.domain_migration:
    name: gpu-worker1
    dest_uri: qemu+ssh://root@hv2/system
    allow_cold: true
    shutdown_timeout: 300
    hostdevs:
      - {vendor: 10de, device: 2335, index: 0}
'''

RETURN = r'''
mode:
  description: "How the domain moved (would move, in check mode): V(live), V(cold), or V(none) when it already was on
    the destination."
  returned: always
  type: str
  sample: live
source:
  description: The source's URI.
  returned: always
  type: str
destination:
  description: The destination's URI.
  returned: always
  type: str
domain:
  description: The domain after the run (as it would be, in check mode).
  returned: always
  type: dict
  contains:
    name: {description: Its name., type: str}
    uuid: {description: Its UUID (unchanged by a move)., type: str}
    state: {description: "Its state on the destination (V(running), V(paused), V(shutoff))", type: str}
    uri: {description: "Where it is: the destination's URI.", type: str}
  sample: {name: worker1, uuid: 6695eb01-f6a4-8304-79aa-97f2502e193f, state: running, uri: "qemu+ssh://root@hv2/system"}
copy_storage:
  description: What was copied in effect, V(all), V(incremental) or V(none) (O(copy_storage=auto) resolved).
  returned: always
  type: str
disks:
  description: Each disk with what the move did with it, V(copy) (whole), V(copy-top) (the top image) or V(present)
    (not copied; on the destination already).
  returned: always
  type: list
  elements: dict
  sample: [{target: vda, path: /var/lib/libvirt/images/worker1.qcow2, action: copy-top}]
preflight:
  description: The checks that passed on the destination, one line each.
  returned: always
  type: list
  elements: str
progress:
  description: The live migration's progress, a line each time the job's statistics changed (elapsed time, memory
    and disk data remaining, the rate), and a line per disk a cold move copied.
  returned: always
  type: list
  elements: str
  sample: ["1.0 s, memory 210.3 MiB of 1024.0 MiB remaining, pass 1, 310.2 MiB/s", completed]
downtime_ms:
  description: The pause QEMU measured at the switch-over of a live migration, where the destination reports it;
    null otherwise.
  returned: always
  type: int
hostdevs:
  description: The PCI addresses the domain has on the destination.
  returned: always
  type: list
  elements: str
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["migrate live to qemu+ssh://root@hv2/system (peer-to-peer, no disk copied)"]
'''

from typing import Any, Dict

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._migration import argument_spec, run_migration


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_lxml(module)

    def runner() -> Dict[str, Any]:
        return run_migration(module)

    run(module, runner)


if __name__ == "__main__":
    main()
