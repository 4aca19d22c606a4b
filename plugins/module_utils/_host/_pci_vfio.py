# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The persistent half of vfio-pci binding: what goes in modprobe.d and the initramfs.

Pure functions (text in, text out), so the module can compare the rendered files with what
is on disk, show them in diff mode and write them only when they differ.

The modprobe.d file is owned by the module and lists exactly the devices of the request:

    # Managed by mlinfra.kvm.vfio_pci; edits are overwritten.
    # device 0000:01:00.0 10de:2335 host-module nvidia
    options vfio-pci ids=10de:2335
    softdep nouveau pre: vfio-pci
    softdep nvidia pre: vfio-pci

The ``# device`` lines remember each device's host driver module: once a device is on
vfio-pci its original driver cannot be read from sysfs any more, and the softdep for it
must stay so the next boot still loads vfio-pci first.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Tuple

HEADER = "# Managed by mlinfra.kvm.vfio_pci; edits are overwritten.\n"
DEVICE_RE = re.compile(r"^# device (\S+) ([0-9a-f]{4}:[0-9a-f]{4}) host-module (\S+)$")
VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
BLOCK_BEGIN = "# BEGIN mlinfra.kvm vfio_pci"
BLOCK_END = "# END mlinfra.kvm vfio_pci"
MODULE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def default_softdeps(vendor: Optional[str], class_code: str) -> List[str]:
    """Host drivers that would grab a device of this kind at boot before vfio-pci."""
    if class_code.startswith("03"):
        if vendor == "10de":
            return ["nouveau", "nvidia"]
        if vendor == "1002":
            return ["amdgpu", "radeon"]
    if class_code.startswith("0403"):
        return ["snd_hda_intel"]
    return []


def parse_devices(text: Optional[str]) -> Dict[str, Tuple[str, Optional[str]]]:
    """{address: (vendor:device, host module or None)} from a file this module wrote."""
    out: Dict[str, Tuple[str, Optional[str]]] = {}
    for line in (text or "").splitlines():
        match = DEVICE_RE.match(line.strip())
        if match:
            module = match.group(3)
            out[match.group(1)] = (match.group(2), None if module == "-" else module)
    return out


def render_modprobe(entries: Dict[str, Tuple[str, Optional[str]]], softdeps: Iterable[str]) -> str:
    """The whole modprobe.d file for ``entries`` ({address: (id, host module)})."""
    lines = [HEADER.rstrip("\n")]
    for address in sorted(entries):
        ident, module = entries[address]
        lines.append("# device %s %s host-module %s" % (address, ident, module or "-"))
    ids = sorted({ident for ident, _unused in entries.values()})
    lines.append("options vfio-pci ids=%s" % ",".join(ids))
    for module in sorted(set(softdeps) - {"vfio_pci", "vfio-pci"}):
        lines.append("softdep %s pre: vfio-pci" % module)
    return "\n".join(lines) + "\n"


def render_initramfs_tools(current: Optional[str], present: bool) -> str:
    """/etc/initramfs-tools/modules with (or without) our marked block of vfio modules."""
    kept: List[str] = []
    inside = False
    for line in (current or "").splitlines():
        if line.strip() == BLOCK_BEGIN:
            inside = True
            continue
        if line.strip() == BLOCK_END:
            inside = False
            continue
        if not inside:
            kept.append(line)
    if present:
        kept.extend([BLOCK_BEGIN] + list(VFIO_MODULES) + [BLOCK_END])
    return ("\n".join(kept) + "\n") if kept else ""


def render_dracut() -> str:
    return HEADER + 'force_drivers+=" %s "\n' % " ".join(VFIO_MODULES)
