# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's PCI devices as the domain module needs them for its hostdev checks.

Two sources with one interface:

* :class:`SysfsPci` reads ``<sysfs_root>/bus/pci/devices`` and
  ``<sysfs_root>/kernel/iommu_groups`` on the machine the module runs on. ``sysfs_root`` is
  the test seam: tests point it at a synthetic tree.
* :class:`NodeDevPci` asks libvirt's node device API, so the checks also work when libvirt
  runs on another host (a remote URI), where the local /sys says nothing.

Both return :class:`PciDevice` records; the checks in the domain service use only those.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ._domain_spec import pci_string
from ._errors import KvmError
from ._libvirt import call
from ._xml import parse

VFIO_DRIVER = "vfio-pci"
PCI_BRIDGE_CLASS_PREFIX = "0x0604"


class PciDevice:
    def __init__(self, address: str, vendor: str, device: str, pci_class: str,
                 driver: Optional[str], iommu_group: Optional[int]) -> None:
        self.address = address
        self.vendor = vendor.lower()
        self.device = device.lower()
        self.pci_class = pci_class.lower()
        self.driver = driver
        self.iommu_group = iommu_group

    @property
    def slot(self) -> str:
        return self.address.rsplit(".", 1)[0]

    @property
    def is_bridge(self) -> bool:
        return self.pci_class.startswith(PCI_BRIDGE_CLASS_PREFIX)

    def as_dict(self) -> Dict[str, Any]:
        return {"address": self.address, "vendor": self.vendor, "device": self.device,
                "class": self.pci_class, "driver": self.driver, "iommu_group": self.iommu_group}


class SysfsPci:
    """PCI devices from a sysfs tree (``/sys`` or a test's synthetic copy)."""

    def __init__(self, sysfs_root: str = "/sys") -> None:
        self.root = sysfs_root
        self._cache: Optional[Dict[str, PciDevice]] = None

    def _read(self, *parts: str) -> Optional[str]:
        try:
            with open(os.path.join(self.root, *parts)) as handle:
                return handle.read().strip()
        except OSError:
            return None

    def _link_name(self, *parts: str) -> Optional[str]:
        path = os.path.join(self.root, *parts)
        if not os.path.islink(path):
            return None
        return os.path.basename(os.readlink(path))

    def devices(self) -> Dict[str, PciDevice]:
        if self._cache is None:
            base = os.path.join(self.root, "bus", "pci", "devices")
            found: Dict[str, PciDevice] = {}
            try:
                names = sorted(os.listdir(base))
            except OSError:
                names = []
            for name in names:
                group = self._link_name("bus", "pci", "devices", name, "iommu_group")
                found[name.lower()] = PciDevice(
                    name.lower(),
                    (self._read("bus", "pci", "devices", name, "vendor") or "0x0000").replace("0x", ""),
                    (self._read("bus", "pci", "devices", name, "device") or "0x0000").replace("0x", ""),
                    self._read("bus", "pci", "devices", name, "class") or "0x000000",
                    self._link_name("bus", "pci", "devices", name, "driver"),
                    int(group) if group is not None and group.isdigit() else None)
            self._cache = found
        return self._cache

    def group_members(self, group: int) -> List[str]:
        path = os.path.join(self.root, "kernel", "iommu_groups", str(group), "devices")
        try:
            return sorted(n.lower() for n in os.listdir(path))
        except OSError:
            return sorted(a for a, d in self.devices().items() if d.iommu_group == group)

    def describe(self) -> str:
        return "sysfs under %s" % self.root


class NodeDevPci:
    """PCI devices from libvirt's node device API (works for remote URIs too)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._cache: Optional[Dict[str, PciDevice]] = None
        self._groups: Dict[int, List[str]] = {}

    def devices(self) -> Dict[str, PciDevice]:
        if self._cache is None:
            import libvirt  # type: ignore  # only reached with libvirt present
            found: Dict[str, PciDevice] = {}
            nodedevs = call("listing the host's PCI devices", self.conn.listAllDevices,
                            libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)
            for dev in nodedevs:
                root = parse(call("reading node device %s" % dev.name(), dev.XMLDesc, 0))
                cap = root.find("capability[@type='pci']")
                if cap is None:
                    continue
                address = pci_string(int(cap.findtext("domain", "0")), int(cap.findtext("bus", "0")),
                                     int(cap.findtext("slot", "0")), int(cap.findtext("function", "0")))
                group_el = cap.find("iommuGroup")
                group = int(group_el.get("number")) if group_el is not None else None
                if group is not None:
                    self._groups[group] = sorted(
                        pci_string(int(a.get("domain"), 16), int(a.get("bus"), 16),
                                   int(a.get("slot"), 16), int(a.get("function"), 16))
                        for a in group_el.findall("address"))
                found[address] = PciDevice(
                    address, (cap.find("vendor").get("id") or "0").replace("0x", ""),
                    (cap.find("product").get("id") or "0").replace("0x", ""),
                    cap.findtext("class", "0x000000"), root.findtext("driver/name"), group)
            self._cache = found
        return self._cache

    def group_members(self, group: int) -> List[str]:
        self.devices()
        return self._groups.get(group, [])

    def describe(self) -> str:
        return "libvirt's node device list"


def ensure_devices_known(source: Any) -> None:
    """Raise when the source holds no PCI device at all (a wrong sysfs_root, usually)."""
    if not source.devices():
        raise KvmError("no PCI devices found in %s; check option sysfs_root (it must point at a "
                       "sysfs tree with bus/pci/devices)" % source.describe())
