# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only model of the host's PCI devices and IOMMU, from sysfs (and a little /proc).

Shared by ``pci_info`` (which reports it) and ``vfio_pci`` (which decides from it). Nothing
here writes: :class:`PciScanner` reads a :class:`Roots` tree and returns plain data, so a
captured ``/sys`` (tests/fixtures) answers exactly like the live one.

Decisions worth knowing:

* IOMMU "enabled" means the kernel made IOMMU groups (``/sys/kernel/iommu_groups/*``).
  That is what vfio needs; the command line flags are reported besides, because a kernel
  can turn the IOMMU on by default (Debian) or have it disabled in firmware despite them.
* Passthrough viability follows the kernel's vfio rule (``vfio_dev_driver_allowed``): every
  device of the group must be bound to vfio-pci or pci-stub, or to no driver, except PCI-to-PCI
  bridges (a bridge header, classes 0x0604, 0x0607, 0x0609), which may keep pcieport.
  :func:`group_blockers` is that rule, and the only copy of it: ``pci_info``, ``vfio_pci`` and
  the ``domain`` module's hostdev check all call it, on :class:`PciDevice` records from sysfs
  (:meth:`PciScanner.records`) or from libvirt's node devices (``_domain_pci``).
* "In use" is measured, not guessed (:mod:`._host_usage`): an open device node of the device
  (``/dev/dri/card0``, ``/dev/snd/...``, ``/dev/nvidiaN``) held by a process, a network
  interface that carries routes or addresses (or is up), or a block device anywhere below the
  function that is mounted, used as swap or held by LVM/device-mapper/md.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List, Optional

from ._host_usage import PCI_ADDRESS_RE, HostUsage, Use
from .._core._atomic_file import read_text
from ._sysfs import Roots, cmdline_args, cpu_vendor, is_virtual_machine, link_name, list_dir, read_attr

VFIO_DRIVERS = ("vfio-pci", "pci-stub")
# Classes whose devices have a bridge header (PCI-to-PCI, CardBus, semi-transparent): the kernel
# lets them keep their driver (pcieport) in a group given to vfio. Host and ISA bridges (0x0600,
# 0x0601) have an ordinary header and count like any endpoint.
INTERCONNECT_CLASSES = ("0604", "0607", "0609")
# Vendors whose display devices count as GPUs in the report (any class-0x03 device does too).
VENDORS = {"10de": "NVIDIA", "1002": "AMD", "8086": "Intel", "1234": "QEMU", "1af4": "Red Hat (virtio)",
           "1b36": "Red Hat (QEMU)", "15b3": "Mellanox", "1a03": "ASPEED"}
# PCI base classes and the few sub-classes that matter for passthrough decisions.
CLASS_NAMES = {
    "0000": "non-VGA unclassified device", "0100": "SCSI storage controller", "0101": "IDE interface",
    "0104": "RAID bus controller", "0106": "SATA controller", "0108": "non-volatile memory controller",
    "0180": "mass storage controller", "0200": "ethernet controller", "0207": "InfiniBand controller",
    "0280": "network controller", "0300": "VGA compatible controller", "0301": "XGA compatible controller",
    "0302": "3D controller", "0380": "display controller", "0401": "multimedia audio controller",
    "0403": "audio device", "0480": "multimedia controller", "0600": "host bridge", "0601": "ISA bridge",
    "0604": "PCI bridge", "0680": "bridge", "0700": "serial controller", "0780": "communication controller",
    "0880": "system peripheral", "0c03": "USB controller", "0c05": "SMBus", "1200": "processing accelerator",
    "ff00": "unassigned class",
}
BASE_CLASS_NAMES = {"01": "mass storage controller", "02": "network controller", "03": "display controller",
                    "04": "multimedia controller", "06": "bridge", "0c": "serial bus controller",
                    "12": "processing accelerator"}


def hex_id(value: Optional[str], width: int = 4) -> Optional[str]:
    """``0x10de`` -> ``10de``; None stays None."""
    if value is None:
        return None
    value = value.strip().lower()
    if value.startswith("0x"):
        value = value[2:]
    return value.zfill(width) if value else None


def slot_of(address: str) -> str:
    """``0000:01:00.1`` -> ``0000:01:00`` (the functions of one slot share it)."""
    return address.rsplit(".", 1)[0]


def is_interconnect(class_code: str) -> bool:
    """Whether a device of this class (``060400`` or ``0x060400``) has a bridge header."""
    return (hex_id(class_code, 6) or "")[:4] in INTERCONNECT_CLASSES


class PciDevice:
    """One PCI function as the passthrough rules see it, whichever source read it."""

    def __init__(self, address: str, vendor: str, device: str, class_code: str,
                 driver: Optional[str], iommu_group: Optional[int]) -> None:
        self.address = address.lower()
        self.vendor = hex_id(vendor) or "0000"
        self.device = hex_id(device) or "0000"
        self.class_code = hex_id(class_code, 6) or "000000"
        self.driver = driver or None
        self.iommu_group = iommu_group

    @property
    def slot(self) -> str:
        return slot_of(self.address)

    @property
    def is_interconnect(self) -> bool:
        return is_interconnect(self.class_code)

    @property
    def blocks_vfio(self) -> bool:
        """Whether this device, as bound now, keeps its IOMMU group from being given to vfio."""
        return not self.is_interconnect and self.driver is not None and self.driver not in VFIO_DRIVERS

    @classmethod
    def from_info(cls, info: Dict[str, Any]) -> "PciDevice":
        """From :meth:`PciScanner.device`'s report."""
        group = info.get("iommu_group")
        return cls(info["address"], info["vendor_id"] or "0000", info["device_id"] or "0000", info["class"],
                   info["driver"], int(group) if group is not None and str(group).isdigit() else None)


def group_blockers(members: Iterable[PciDevice]) -> List[PciDevice]:
    """The members that make a group unusable for vfio (the kernel's viability rule), in order."""
    return [member for member in members if member.blocks_vfio]


class PciScanner:
    """Reads devices, drivers and IOMMU groups from a sysfs tree."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots
        self.host_usage = HostUsage(roots)

    # -- devices ------------------------------------------------------------------------
    def device_dir(self, address: str) -> str:
        return self.roots.sys("bus", "pci", "devices", address)

    def addresses(self) -> List[str]:
        return [a for a in list_dir(self.roots.sys("bus", "pci", "devices")) if PCI_ADDRESS_RE.match(a)]

    def exists(self, address: str) -> bool:
        return os.path.isdir(self.device_dir(address))

    def driver(self, address: str) -> Optional[str]:
        return link_name(os.path.join(self.device_dir(address), "driver"))

    def driver_override(self, address: str) -> Optional[str]:
        value = read_attr(os.path.join(self.device_dir(address), "driver_override"))
        return None if value in (None, "", "(null)") else value

    def iommu_group(self, address: str) -> Optional[str]:
        return link_name(os.path.join(self.device_dir(address), "iommu_group"))

    def driver_module(self, driver: Optional[str]) -> Optional[str]:
        """The kernel module behind a driver (``bochs-drm`` -> ``bochs``), for softdep lines."""
        if not driver:
            return None
        module = link_name(self.roots.sys("bus", "pci", "drivers", driver, "module"))
        return module or driver.replace("-", "_")

    def device(self, address: str) -> Dict[str, Any]:
        path = self.device_dir(address)

        def attr(name: str) -> Optional[str]:
            return read_attr(os.path.join(path, name))

        class_code = hex_id(attr("class"), 6) or "000000"
        vendor, device = hex_id(attr("vendor")), hex_id(attr("device"))
        numa = attr("numa_node")
        boot_vga = attr("boot_vga")
        info: Dict[str, Any] = {
            "address": address,
            "slot": slot_of(address),
            "vendor_id": vendor,
            "device_id": device,
            "id": "%s:%s" % (vendor, device),
            "vendor_name": VENDORS.get(vendor or ""),
            "subsystem_vendor_id": hex_id(attr("subsystem_vendor")),
            "subsystem_device_id": hex_id(attr("subsystem_device")),
            "revision": hex_id(attr("revision"), 2),
            "class": class_code,
            "class_name": CLASS_NAMES.get(class_code[:4]) or BASE_CLASS_NAMES.get(class_code[:2], "other"),
            "driver": self.driver(address),
            "driver_override": self.driver_override(address),
            "iommu_group": self.iommu_group(address),
            # The kernel says -1 when it does not know (every VM without NUMA): report null.
            "numa_node": int(numa) if numa and numa.isdigit() else None,
            "boot_vga": boot_vga == "1",
            "is_bridge": class_code.startswith("06"),
            "is_gpu": class_code.startswith("03"),
            "functions": [],
        }
        return info

    def devices(self) -> Dict[str, Dict[str, Any]]:
        found = {address: self.device(address) for address in self.addresses()}
        for address, info in found.items():
            info["functions"] = sorted(a for a in found if a != address and slot_of(a) == info["slot"])
        return found

    def records(self) -> Dict[str, PciDevice]:
        """Every device as a :class:`PciDevice` (what the passthrough rules take)."""
        return {address: PciDevice.from_info(self.device(address)) for address in self.addresses()}

    def find_by_id(self, vendor: str, device: str) -> List[str]:
        want = (vendor.lower(), device.lower())
        out = []
        for address in self.addresses():
            path = self.device_dir(address)
            ids = (hex_id(read_attr(os.path.join(path, "vendor"))), hex_id(read_attr(os.path.join(path, "device"))))
            if ids == want:
                out.append(address)
        return out

    # -- IOMMU --------------------------------------------------------------------------
    def iommu_groups(self) -> Dict[str, List[str]]:
        groups = {group: self.devices_in_group(group) for group in list_dir(self.roots.sys("kernel", "iommu_groups"))}
        return dict(sorted(groups.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))

    def devices_in_group(self, group: str) -> List[str]:
        """The addresses the kernel lists in IOMMU group ``group`` (none where it has no such group)."""
        return list_dir(self.roots.sys("kernel", "iommu_groups", group, "devices"))

    def group_members(self, address: str) -> List[str]:
        group = self.iommu_group(address)
        if group is None:
            return []
        return self.devices_in_group(group) or [address]

    def cpu_vendor(self) -> Optional[str]:
        return cpu_vendor(read_text(self.roots.proc("cpuinfo")))

    def iommu_argument(self) -> str:
        """The kernel argument that turns the IOMMU on for this CPU (both when unknown)."""
        vendor = self.cpu_vendor()
        if vendor == "intel":
            return "intel_iommu=on"
        if vendor == "amd":
            return "amd_iommu=on"
        return "intel_iommu=on (Intel) or amd_iommu=on (AMD)"

    def iommu(self) -> Dict[str, Any]:
        groups = self.iommu_groups()
        cmdline = cmdline_args(read_text(self.roots.proc("cmdline")))
        flags = [a for a in cmdline if a.split("=", 1)[0] in ("intel_iommu", "amd_iommu", "iommu")]
        units = list_dir(self.roots.sys("class", "iommu"))
        cpuinfo = read_text(self.roots.proc("cpuinfo"))
        state: Dict[str, Any] = {
            "enabled": bool(groups),
            "groups": groups,
            "group_count": len(groups),
            "units": units,
            "cmdline_flags": flags,
            "passthrough_mode": "iommu=pt" in flags,
            "cpu_vendor": cpu_vendor(cpuinfo),
            "virtual_machine": is_virtual_machine(cpuinfo),
            "required_argument": self.iommu_argument(),
            "reason": None,
        }
        if not groups:
            state["reason"] = self.iommu_off_reason(flags)
        return state

    def iommu_off_reason(self, flags: List[str]) -> str:
        reason = "no IOMMU groups under %s" % self.roots.sys("kernel", "iommu_groups")
        if any(f in ("intel_iommu=on", "amd_iommu=on") for f in flags):
            return (reason + " although the kernel command line has %s: enable VT-d/AMD-Vi in the firmware "
                    "(or give the VM a virtual IOMMU)" % " ".join(flags))
        return (reason + "; the kernel command line lacks %s: add it (mlinfra.kvm.kernel_cmdline with "
                "iommu: auto) and reboot" % self.iommu_argument())

    # -- use of a device ------------------------------------------------------------------
    def nvidia_nodes(self, address: str) -> List[str]:
        """/dev/nvidiaN: NVIDIA's driver registers no class device, its procfs entry names the minor."""
        info = read_text(self.roots.proc("driver", "nvidia", "gpus", address, "information")) or ""
        match = re.search(r"^Device Minor:\s*(\d+)", info, re.MULTILINE)
        return ["/dev/nvidia%s" % match.group(1)] if match else []

    def device_nodes(self, address: str) -> List[str]:
        """/dev paths that belong to the device: DEVNAME of its class devices (drm, sound,
        block...) anywhere below it, and /dev/nvidiaN for NVIDIA's driver."""
        found = self.host_usage.scan(self.device_dir(address))
        return sorted(set(found.nodes) | set(self.nvidia_nodes(address)))

    def usage_details(self, address: str) -> List[Use]:
        """Why the host uses the device right now, each with whether force may override it."""
        return self.host_usage.uses(self.device_dir(address), self.nvidia_nodes(address))

    def usage(self, address: str) -> List[str]:
        """Why the device is in use right now (empty: nobody holds it)."""
        return [use.reason for use in self.usage_details(address)]

    # -- passthrough --------------------------------------------------------------------
    def passthrough(self, address: str, devices: Dict[str, Dict[str, Any]], iommu: Dict[str, Any]) -> Dict[str, Any]:
        """Can ``address`` be given to a VM now? If not, every reason, most basic first."""
        reasons: List[str] = []
        members: List[str] = []
        if not iommu["enabled"]:
            reasons.append("IOMMU is not enabled: %s" % iommu["reason"])
        elif devices[address]["iommu_group"] is None:
            reasons.append("%s has no IOMMU group (no iommu_group link in sysfs)" % address)
        else:
            members = self.group_members(address)
        infos = [devices.get(member) or self.device(member) for member in members or [address]]
        blockers = [device.address for device in group_blockers(PciDevice.from_info(info) for info in infos)]
        for info in infos:
            if info["address"] in blockers:
                reasons.append("%s (%s) is bound to driver %s, not vfio-pci" % (info["address"], info["id"],
                                                                                info["driver"]))
        return {
            "possible": not reasons,
            "reasons": reasons,
            "iommu_group": devices[address]["iommu_group"],
            "group_members": members,
            "blocking_devices": blockers,
        }
