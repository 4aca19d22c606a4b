# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input validation shared by the modules. Every check raises InvalidInputError, whose
message names the option, the value and the fix, before any side effect."""
from __future__ import annotations

import ipaddress
import re
from typing import Any, Optional

from ._errors import InvalidInputError

# Stricter than libvirt on purpose: these names become file names, bridge names and
# inventory host names, so XML/shell metacharacters and path separators are refused.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_MAC_RE = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_PCI_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}


def object_name(option: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise InvalidInputError(
            option, value, "is not a valid name",
            "use 1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit "
            "(no '/', '<', '&', quotes or spaces)")
    return value


def mac_address(option: str, value: Any) -> str:
    if not isinstance(value, str) or not _MAC_RE.match(value):
        raise InvalidInputError(option, value, "is not a MAC address",
                                "write six colon-separated hex pairs, e.g. 52:54:00:12:34:56")
    if int(value[:2], 16) & 1:
        raise InvalidInputError(option, value, "is a multicast MAC address",
                                "use a unicast address (even first octet), e.g. 52:54:00:...")
    return value.lower()


def ipv4_address(option: str, value: Any) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(str(value))
    except ValueError:
        raise InvalidInputError(option, value, "is not an IPv4 address",
                                "write a dotted quad such as 192.168.122.1")


def pci_address(option: str, value: Any) -> str:
    """Canonical ``dddd:bb:ss.f`` (lower case, domain 0000 when omitted)."""
    match = _PCI_RE.match(str(value).strip()) if value is not None else None
    if not match:
        raise InvalidInputError(option, value, "is not a PCI address",
                                "write domain:bus:slot.function, e.g. 0000:01:00.0")
    domain, bus, slot, func = match.groups()
    return "%s:%s:%s.%s" % ((domain or "0000").lower(), bus.lower(), slot.lower(), func)


def size_bytes(option: str, value: Any) -> Optional[int]:
    """Parse 10G / 512MiB / 1048576 into bytes (binary units)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidInputError(option, value, "is negative", "give a size such as 10G")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise InvalidInputError(option, value, "is not a size",
                                "give bytes or a number with K, M, G, T (binary units), e.g. 10G")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * _UNITS[unit])


def absolute_path(option: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise InvalidInputError(option, value, "is not an absolute path", "give a path starting with '/'")
    return value
