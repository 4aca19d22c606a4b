# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one grammar for naming PCI devices, used by ``vfio_pci`` (``devices``), ``domain``
(``hostdevs``), ``pci_info`` (each GPU's ``selector``), the ``gpu_hostdev`` filter and, through
``vfio_pci``, the hypervisor role's ``hypervisor_vfio_devices``.

An entry is one of:

* a PCI address, ``0000:3b:00.0`` or ``3b:00.0`` (domain 0000);
* ``vendor:device`` ids as ``lspci -nn`` prints them, ``10de:2335``;
* a dict: ``{address: ...}``, or ``{vendor: 10de, device: 2335, index: 0}``; either may carry
  ``include_functions: true`` (the slot's other functions too: a GPU's HDMI audio).

``index`` counts from 0 among the devices with those ids, in address order. Without an index a
selector names every such device (``vfio_pci`` binds all H200s of a host); the domain module's
argument spec gives its hostdevs index 0, since one hostdev entry is one device.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional

from .._core._errors import InvalidInputError
from .._core._validate import int_range, pci_address

_HEX4_RE = re.compile(r"^(?:0x)?([0-9a-fA-F]{4})$")
_IDS_RE = re.compile(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{4})$")
_KEYS = ("address", "vendor", "device", "index", "include_functions")
FORMS = "a PCI address (0000:3b:00.0), vendor:device ids (10de:2335), or {vendor, device, index}"


def pci_id(option: str, value: Any) -> str:
    """A 4-digit PCI id, ``10de`` (``0x10DE`` accepted)."""
    match = _HEX4_RE.match(str(value).strip()) if value is not None else None
    if not match:
        raise InvalidInputError(option, value, "is not a 4-digit PCI id",
                                "write hex digits as lspci -nn shows them, e.g. 10de")
    return match.group(1).lower()


class PciSelector:
    """One parsed entry: an address, or vendor/device ids with an optional index."""

    def __init__(self, option: str, address: Optional[str] = None, vendor: Optional[str] = None,
                 device: Optional[str] = None, index: Optional[int] = None,
                 include_functions: bool = False, dict_form: bool = False) -> None:
        self.option = option
        self.dict_form = dict_form  # written as a dict: errors name option.address
        self.address = address
        self.vendor = vendor
        self.device = device
        self.index = index
        self.include_functions = include_functions

    def as_hostdev(self) -> Dict[str, Any]:
        """The entry as an item of mlinfra.kvm.domain's ``hostdevs`` (index 0 when none)."""
        if self.address:
            return {"address": self.address, "include_functions": self.include_functions}
        return {"vendor": self.vendor, "device": self.device, "index": self.index or 0,
                "include_functions": self.include_functions}

    def resolve(self, records: Mapping[str, Any], where: str) -> List[str]:
        """The addresses the entry names among ``records`` (address -> a record with ``vendor``,
        ``device`` and ``slot``, e.g. ``_pci.PciDevice``), sorted; an entry naming nothing is refused.
        ``where`` ends the refusal's reason: "is not a PCI device <where>"."""
        if self.address:
            if self.address not in records:
                raise InvalidInputError(self.option + ".address" if self.dict_form else self.option,
                                        self.address, "is not a PCI device %s" % where,
                                        "list the host's devices with lspci -D (or mlinfra.kvm.pci_info)")
            found = [self.address]
        else:
            matches = sorted(a for a, rec in records.items() if (rec.vendor, rec.device) == (self.vendor, self.device))
            if self.index is None:
                if not matches:
                    raise InvalidInputError(self.option, "%s:%s" % (self.vendor, self.device),
                                            "matches no PCI device %s" % where,
                                            "check the ids with lspci -nn (or mlinfra.kvm.pci_info)")
                found = matches
            elif self.index >= len(matches):
                raise InvalidInputError(
                    self.option, "%s:%s index %d" % (self.vendor, self.device, self.index),
                    "matches no PCI device %s (%d with these ids)" % (where, len(matches)),
                    "check the ids with lspci -nn and the index (counted from 0 in address order)")
            else:
                found = [matches[self.index]]
        if self.include_functions:
            slots = {records[a].slot for a in found}
            found = [a for a in records if records[a].slot in slots]
        return sorted(set(found))


def parse_selector(option: str, value: Any) -> PciSelector:
    """Parse one entry of the grammar (see the module's docstring); bad input names the option."""
    if isinstance(value, str):
        text = value.strip()
        ids = _IDS_RE.match(text)
        if ids:
            return PciSelector(option, vendor=ids.group(1).lower(), device=ids.group(2).lower())
        return PciSelector(option, address=pci_address(option, text))
    if not isinstance(value, Mapping):
        raise InvalidInputError(option, value, "is neither a string nor a dict", "give " + FORMS)
    unknown = sorted(str(k) for k in value if k not in _KEYS and k not in ("managed",))
    if unknown:
        raise InvalidInputError(option, dict(value), "has unknown keys %s" % ", ".join(unknown),
                                "use only %s (and include_functions)" % ", ".join(_KEYS[:4]))
    has_address = bool(value.get("address"))
    if has_address == bool(value.get("vendor") or value.get("device")):
        raise InvalidInputError(option, dict(value), "needs either address or vendor + device",
                                "give address: 0000:01:00.0, or vendor and device ids (and index)")
    functions = value.get("include_functions")
    if functions is not None and not isinstance(functions, bool):
        raise InvalidInputError(option + ".include_functions", functions, "is not a boolean",
                                "write true or false")
    if has_address:
        return PciSelector(option, address=pci_address(option + ".address", value["address"]),
                           include_functions=bool(functions), dict_form=True)
    if not (value.get("vendor") and value.get("device")):
        raise InvalidInputError(option, dict(value), "needs both vendor and device",
                                "give both ids, e.g. vendor: 10de, device: 2204")
    index = value.get("index")
    if index is not None:
        index = int_range(option + ".index", index, 0, 65535, "counted from 0 among the matching devices")
    return PciSelector(option, vendor=pci_id(option + ".vendor", value["vendor"]),
                       device=pci_id(option + ".device", value["device"]), index=index,
                       include_functions=bool(functions), dict_form=True)


def index_among_twins(address: str, records: Mapping[str, Any]) -> int:
    """The ``index`` that selects ``address`` among the devices with its ids (address order)."""
    own = records[address]
    twins = sorted(a for a, rec in records.items() if (rec.vendor, rec.device) == (own.vendor, own.device))
    return twins.index(address)
