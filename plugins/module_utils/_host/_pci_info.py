# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pci_info report: every PCI device, the GPUs with their passthrough verdict, the IOMMU.

pci_info changes nothing, so there is no runner with a tracker here, only the report built from
what :class:`._pci.PciScanner` reads (the only code touching sysfs and /proc). Check mode and a
real run therefore give the same answer. The verdict per GPU is ``PciScanner.passthrough``, the
one vfio rule shared with vfio_pci and the domain module.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set

from ._pci import PciDevice, PciScanner
from ._pci_select import index_among_twins
from ._sysfs import Roots, list_dir, roots_argspec


def argument_spec() -> Dict[str, Any]:
    return dict(
        **roots_argspec("sysfs_root", "proc_root"),
        gpus_only=dict(type="bool", default=False),
        check_usage=dict(type="bool", default=True),
    )


def run_pci_info(module: Any) -> Dict[str, Any]:
    """The report on the trees the module's roots name (a bad root fails here, naming it)."""
    roots = Roots(module.params["sysfs_root"], module.params["proc_root"])
    return pci_report(PciScanner(roots), module.params["gpus_only"], module.params["check_usage"])


def pci_report(scanner: PciScanner, gpus_only: bool, check_usage: bool) -> Dict[str, Any]:
    devices = scanner.devices()
    iommu = scanner.iommu()
    gpus = gpu_reports(scanner, devices, iommu, check_usage)
    listed = list(devices.values())
    if gpus_only:
        wanted = gpus_and_their_groups(gpus)
        listed = [d for d in listed if d["address"] in wanted]
    vfio_dir = scanner.roots.sys("bus", "pci", "drivers", "vfio-pci")
    return {
        "changed": False,
        "devices": listed,
        "gpus": gpus,
        "iommu": iommu,
        "vfio": {
            "driver_loaded": bool(list_dir(vfio_dir)),
            "devices": sorted(a for a, d in devices.items() if d["driver"] == "vfio-pci"),
        },
    }


def gpu_reports(scanner: PciScanner, devices: Dict[str, Dict[str, Any]], iommu: Dict[str, Any],
                check_usage: bool) -> List[Dict[str, Any]]:
    """Each GPU's device info with its ``selector``, ``passthrough`` and (asked) ``in_use``."""
    records = {address: PciDevice.from_info(info) for address, info in devices.items()}
    gpus: List[Dict[str, Any]] = []
    for address, info in devices.items():
        if not info["is_gpu"]:
            continue
        gpu = dict(info)
        # The same GPU in the selector grammar of vfio_pci, domain and gpu_hostdev: it stays
        # right when addresses change (another slot, a firmware update renumbering buses).
        gpu["selector"] = {"vendor": info["vendor_id"], "device": info["device_id"],
                           "index": index_among_twins(address, records), "include_functions": True}
        gpu["passthrough"] = scanner.passthrough(address, devices, iommu)
        if check_usage:
            gpu["in_use"] = scanner.usage(address)
        gpus.append(gpu)
    return gpus


def gpus_and_their_groups(gpus: List[Dict[str, Any]]) -> Set[str]:
    """The addresses gpus_only keeps: each GPU, its IOMMU group's members and its other functions."""
    wanted = {g["address"] for g in gpus}
    for gpu in gpus:
        wanted.update(gpu["passthrough"]["group_members"])
        wanted.update(gpu["functions"])
    return wanted
