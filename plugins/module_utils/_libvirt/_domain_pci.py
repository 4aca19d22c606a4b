# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's PCI devices as the domain module needs them for its hostdev checks.

Two sources with one interface, both returning ``_pci``'s :class:`PciDevice` records, which
``_pci.group_blockers`` (the one viability rule, shared with pci_info and vfio_pci) judges:

* :class:`SysfsPci` reads ``<sysfs_root>`` through ``_pci``'s :class:`PciScanner` (the reader
  pci_info and vfio_pci use) on the machine the module runs on. ``sysfs_root`` is the test
  seam: tests point it at a synthetic tree.
* :class:`NodeDevPci` asks libvirt's node device API (through :class:`NodeDeviceService`, the
  only code here that calls libvirt), so the checks also work when libvirt runs on another host
  (a remote URI), where the local /sys says nothing.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._domain_spec import pci_string
from .._core._errors import KvmError
from ._connection import call, libvirt
from .._host._pci import PciDevice, PciScanner
from .._host._sysfs import Roots
from .._core._xml import parse


class SysfsPci:
    """PCI devices from a sysfs tree (``/sys`` or a test's synthetic copy)."""

    def __init__(self, sysfs_root: str = "/sys") -> None:
        self.root = sysfs_root
        self.scanner = PciScanner(Roots(sysfs_root=sysfs_root))
        self._cache: Optional[Dict[str, PciDevice]] = None

    def devices(self) -> Dict[str, PciDevice]:
        if self._cache is None:
            self._cache = self.scanner.records()
        return self._cache

    def group_members(self, group: int) -> List[str]:
        found = self.scanner.devices_in_group(str(group))
        return sorted(n.lower() for n in found) or sorted(
            a for a, d in self.devices().items() if d.iommu_group == group)

    def describe(self) -> str:
        return "sysfs under %s" % self.root


class NodeDeviceService:
    """The only code that calls libvirt's node device API."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def pci_devices(self) -> List[Any]:
        return call("listing the host's PCI devices", self.conn.listAllDevices,
                    libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)

    @staticmethod
    def xml(dev: Any) -> str:
        return call("reading node device %s" % dev.name(), dev.XMLDesc, 0)


class NodeDevPci:
    """PCI devices from libvirt's node device API (works for remote URIs too)."""

    def __init__(self, conn: Any) -> None:
        self.service = NodeDeviceService(conn)
        self._cache: Optional[Dict[str, PciDevice]] = None
        self._groups: Dict[int, List[str]] = {}

    def devices(self) -> Dict[str, PciDevice]:
        if self._cache is None:
            found: Dict[str, PciDevice] = {}
            for dev in self.service.pci_devices():
                root = parse(self.service.xml(dev))
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
                    address, cap.find("vendor").get("id") or "0000", cap.find("product").get("id") or "0000",
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
