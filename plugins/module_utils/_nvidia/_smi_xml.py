# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse ``nvidia-smi -q -x`` into plain facts (no side effects, no subprocess here).

lxml is used when it is installed (the nvidia_driver role installs python3-lxml); the
standard library's ElementTree is the fallback, so a guest without lxml still reports.
Neither parser loads the DTD nvidia-smi names in its DOCTYPE, resolves entities or
touches the network.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

try:
    from lxml import etree as _lxml  # type: ignore
    HAS_LXML = True
except ImportError:  # pragma: no cover - depends on the host
    _lxml = None
    HAS_LXML = False

NO_GPU_MESSAGE = "no GPU visible"

_MIB = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*MiB\s*$")


class NvidiaSmiParseError(ValueError):
    """The text is not nvidia-smi's XML log."""


def _parse(xml: Any) -> Any:
    data = xml.encode("utf-8") if isinstance(xml, str) else xml
    if HAS_LXML:
        parser = _lxml.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                                 dtd_validation=False, huge_tree=False)
        try:
            return _lxml.fromstring(data, parser)
        except _lxml.XMLSyntaxError as exc:
            raise NvidiaSmiParseError("nvidia-smi printed XML that does not parse: %s" % exc)
    import xml.etree.ElementTree as ET  # noqa: N817 - stdlib fallback
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise NvidiaSmiParseError("nvidia-smi printed XML that does not parse: %s" % exc)


def _text(node: Any, path: str) -> Optional[str]:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    if value in ("", "N/A", "None", "Not Supported", "[N/A]"):
        return None
    return value


def _mib(value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    match = _MIB.match(value)
    return int(float(match.group(1))) if match else None


def _mode(value: Optional[str]) -> Optional[str]:
    return value.lower() if value else None


def parse_gpu(gpu: Any, driver: Optional[str], cuda: Optional[str]) -> Dict[str, Any]:
    """Facts for one ``<gpu>`` element."""
    mig_current = _mode(_text(gpu, "mig_mode/current_mig"))
    return {
        "index": None,  # filled by parse_log (document order == nvidia-smi index)
        "pci_bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
        "name": _text(gpu, "product_name"),
        "brand": _text(gpu, "product_brand"),
        "architecture": _text(gpu, "product_architecture"),
        "uuid": _text(gpu, "uuid"),
        "serial": _text(gpu, "serial"),
        "minor_number": _int(_text(gpu, "minor_number")),
        "pci_device_id": _hex_id(_text(gpu, "pci/pci_device_id")),
        "pci_sub_system_id": _hex_id(_text(gpu, "pci/pci_sub_system_id")),
        "vbios_version": _text(gpu, "vbios_version"),
        "memory_total_mib": _mib(_text(gpu, "fb_memory_usage/total")),
        "memory_reserved_mib": _mib(_text(gpu, "fb_memory_usage/reserved")),
        "memory_used_mib": _mib(_text(gpu, "fb_memory_usage/used")),
        "memory_free_mib": _mib(_text(gpu, "fb_memory_usage/free")),
        "driver_version": driver,
        "cuda_version": cuda,
        "mig_mode": mig_current,
        "mig_mode_pending": _mode(_text(gpu, "mig_mode/pending_mig")),
        "mig_enabled": mig_current == "enabled",
        "mig_devices": parse_mig_devices(gpu),
        "virtualization_mode": _text(gpu, "gpu_virtualization_mode/virtualization_mode"),
        "persistence_mode": _mode(_text(gpu, "persistence_mode")),
        "compute_mode": _text(gpu, "compute_mode"),
        "pcie_link_gen_max": _int(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        "pcie_link_width_max": _int((_text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width") or "").rstrip("x") or None),
    }


def parse_mig_devices(gpu: Any) -> List[Dict[str, Any]]:
    """The ``<mig_device>`` elements of one GPU: its MIG devices (a compute instance in a GPU
    instance), by index. A GPU without MIG mode, or with MIG mode and no instances, has none
    (nvidia-smi prints ``<mig_devices>None</mig_devices>``)."""
    out = []
    for dev in gpu.findall("mig_devices/mig_device"):
        ids = {key: _int(_text(dev, key)) for key in ("index", "gpu_instance_id", "compute_instance_id")}
        missing = sorted(key for key, value in ids.items() if value is None)
        if missing:
            raise NvidiaSmiParseError("a <mig_device> without %s" % ", ".join(missing))
        out.append(ids)
    return sorted(out, key=lambda dev: dev["index"])


def _int(value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


def _hex_id(value: Optional[str]) -> Optional[str]:
    """'233510DE' or '0x233510DE' -> '0x233510de' (device id high half, vendor low half)."""
    if value is None:
        return None
    value = value.lower()
    return value if value.startswith("0x") else "0x" + value


def parse_log(xml: Any) -> Dict[str, Any]:
    """The whole log: driver/CUDA versions and one dict per GPU (possibly none)."""
    root = _parse(xml)
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError("expected <nvidia_smi_log> as the root element, got <%s>" % root.tag)
    driver = _text(root, "driver_version")
    cuda = _text(root, "cuda_version")
    gpus: List[Dict[str, Any]] = []
    for index, gpu in enumerate(root.findall("gpu")):
        facts = parse_gpu(gpu, driver, cuda)
        facts["index"] = index
        gpus.append(facts)
    return {"driver_version": driver, "cuda_version": cuda, "gpus": gpus,
            "attached_gpus": _int(_text(root, "attached_gpus"))}


# nvidia-smi's ways of saying that there is nothing to talk to (driver missing or no device).
_NO_GPU_PATTERNS = (
    "no devices were found",
    "couldn't communicate with the nvidia driver",
    "nvidia-smi has failed",
    "no nvidia gpu",
    "unable to determine the device handle",
)


def looks_like_no_gpu(output: str) -> bool:
    low = (output or "").lower()
    return any(pattern in low for pattern in _NO_GPU_PATTERNS)


def summary(facts: Dict[str, Any]) -> Dict[str, Any]:
    """Short per-GPU lines for messages (name, memory, driver, MIG)."""
    return {
        "count": len(facts.get("gpus", [])),
        "names": [g.get("name") for g in facts.get("gpus", [])],
        "driver_version": facts.get("driver_version"),
        "cuda_version": facts.get("cuda_version"),
    }
