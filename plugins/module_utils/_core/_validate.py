# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input validation shared by the modules. Every check raises InvalidInputError, whose
message names the option, the value and the fix, before any side effect."""
from __future__ import annotations

import ipaddress
import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from ._errors import InvalidInputError

# Names of libvirt objects (domains, networks, pools, volumes, snapshots) and of what the
# collection makes from them. Stricter than libvirt on purpose: these names become file names
# (libvirt's NAME.xml, a network's dnsmasq NAME.conf/.hostsfile/.addnhosts, a domain's
# per-guest directories and sockets, the host lock KIND@POOL@NAME.lock), iptables comments and
# inventory host names, so XML/shell metacharacters, '/', whitespace and control characters are
# refused. At most NAME_MAX characters: with libvirt's suffixes and prefixes a name stays well
# under Linux's 255-byte file names and 108-byte socket paths, and 64 is the DNS label limit
# (63) plus one, so a guest's name can be its host name.
NAME_MAX = 64
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,%d}$" % (NAME_MAX - 1))
_MAC_RE = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_PCI_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}
_SIZE_MAX = 1024 ** 6  # 1 EiB


def object_name(option: str, value: Any) -> str:
    """A name as the collection takes it (see NAME_MAX); libvirt object names are checked with it
    before any lock, file or libvirt call (_host_lock.local_object_lock)."""
    if isinstance(value, str) and len(value) > NAME_MAX:
        raise InvalidInputError(
            option, value, "is not a valid name: it has %d characters, more than %d" % (len(value), NAME_MAX),
            "use at most %d characters (the name becomes file, socket and host names)" % NAME_MAX)
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise InvalidInputError(
            option, value, "is not a valid name",
            "use 1-%d letters, digits, '.', '_', '+' or '-', starting with a letter or digit "
            "(no '/', '<', '&', quotes, spaces or control characters)" % NAME_MAX)
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
    if number * _UNITS[unit] > _SIZE_MAX:
        # Also keeps float('9' * 400) = inf away from int(), which would raise OverflowError.
        raise InvalidInputError(option, value, "is larger than any size this collection handles",
                                "give a size below 1 EiB, e.g. 10G")
    return int(number * _UNITS[unit])


def absolute_path(option: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise InvalidInputError(option, value, "is not an absolute path", "give a path starting with '/'")
    return value


def ca_file(option: str, value: Any, base: Optional[str] = None) -> Optional[str]:
    """A PEM file of CA certificates to verify a server with (``ca_path`` of the MLflow modules),
    as an absolute path; None when unset. A relative path is relative to ``base``, and refused
    without one. The file is loaded once here: a missing, unreadable or non-PEM file would
    otherwise fail every HTTPS call later, with an error that names no option."""
    if value is None or value == "":
        return None
    fix = ("give the PEM file of the CA that signed the server's certificate, on the host the "
           "module runs on, or leave %s unset to trust the system's CAs" % option)
    if not isinstance(value, str) or "\n" in value or "\x00" in value:
        raise InvalidInputError(option, value, "is not a path", fix)
    if not os.path.isabs(value) and base is None:
        raise InvalidInputError(option, value, "is not an absolute path", fix)
    path = os.path.normpath(os.path.join(base or "/", value))
    shown = value if path == value else "%s (%s)" % (value, path)
    if not os.path.exists(path):
        raise InvalidInputError(option, shown, "does not exist", fix)
    if not os.path.isfile(path):  # stat only: a FIFO must not be opened (it would block)
        raise InvalidInputError(option, shown, "is %s, not a regular file"
                                % ("a directory" if os.path.isdir(path) else "a special file"), fix)
    if not os.access(path, os.R_OK):
        raise InvalidInputError(option, shown, "cannot be read by this user (uid %d)" % os.getuid(),
                                "make it readable (CA certificates are public: mode 0644), or " + fix)
    _load_ca(option, shown, path, fix)
    return path


def _load_ca(option: str, shown: str, path: str, fix: str) -> None:
    import ssl  # only modules that take a CA file pay for it
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InvalidInputError(option, shown, "holds no CA certificate that Python's ssl module "
                                "can load (%s)" % exc, fix)


# --------------------------------------------------------------------------- numeric ranges

def int_range(option: str, value: Any, low: int, high: int, why: str = "") -> int:
    """An integer within [low, high]; ``why`` says where the bounds come from."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise InvalidInputError(option, value, "is not a whole number",
                                    "give a number from %d to %d" % (low, high))
    if not low <= value <= high:
        raise InvalidInputError(option, value, "is out of range",
                                "give a number from %d to %d%s" % (low, high, " (%s)" % why if why else ""))
    return value


# Memory bounds for a domain, in KiB. Below 16 MiB neither SeaBIOS nor OVMF nor any usable
# kernel boots; 16 TiB is far beyond any host this collection targets and catches unit slips
# (a bare number means MiB: 16777216 is already 16 TiB).
MEMORY_MIN_KIB = 16 * 1024
MEMORY_MAX_KIB = 16 * 1024 ** 3

# QEMU's x86 q35 machine accepts at most 4096 vCPUs (max_cpus, QEMU >= 9.0) and KVM's
# KVM_MAX_VCPUS on x86 is 4096 too; the host's real limit (`virsh domcapabilities`, <vcpu max>)
# may be lower, and libvirt enforces that one when the domain is defined.
VCPUS_MAX = 4096

# Highest host CPU / NUMA node index accepted in a set: Linux's largest x86 NR_CPUS
# (CONFIG_MAXSMP) is 8192, so index 8191. It also stops '0-999999999' from building a
# billion-element list.
CPU_INDEX_MAX = 8191


def memory_kib_range(option: str, raw: Any, kib: int) -> int:
    """``kib`` (parsed from the user's ``raw`` value) within MEMORY_MIN_KIB..MEMORY_MAX_KIB."""
    if not MEMORY_MIN_KIB <= kib <= MEMORY_MAX_KIB:
        raise InvalidInputError(option, raw, "is out of range",
                                "give from 16M to 16T (a bare number means MiB)")
    return kib


_CPUSET_FIX = "write a list such as '0-3', '2,4' or '0-7,^3'"
_CPUSET_ITEM_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def cpuset(option: str, value: Any, max_index: int = CPU_INDEX_MAX) -> List[int]:
    """'0-3,^2,8' -> [0, 1, 3, 8], refusing empty items, descending ranges, indexes above
    ``max_index`` and sets that exclude everything."""
    if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value).strip() == "":
        raise InvalidInputError(option, value, "is not a CPU/node set", _CPUSET_FIX)
    wanted: set = set()
    excluded: set = set()
    for item in str(value).replace(" ", "").split(","):
        target = excluded if item.startswith("^") else wanted
        low, high = _cpuset_item(option, value, item[1:] if item.startswith("^") else item, max_index)
        target.update(range(low, high + 1))
    cpus = sorted(wanted - excluded)
    if not cpus:
        raise InvalidInputError(option, value, "selects no CPU or node", _CPUSET_FIX)
    return cpus


def _cpuset_item(option: str, value: Any, item: str, max_index: int) -> Tuple[int, int]:
    match = _CPUSET_ITEM_RE.match(item)
    if not match:
        problem = "has an empty item" if item == "" else "has the item %r, which is not N or N-M" % item
        raise InvalidInputError(option, value, problem, _CPUSET_FIX)
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low > high:
        raise InvalidInputError(option, value, "has the descending range %r" % item,
                                "write ranges low to high, e.g. '%d-%d'" % (high, low))
    if high > max_index:
        raise InvalidInputError(option, value, "names index %d, above the maximum %d" % (high, max_index),
                                "use indexes from 0 to %d (see lscpu / numactl -H for this host's)" % max_index)
    return low, high


# --------------------------------------------------------------------------- free text

# lxml refuses these in element text and attributes ("All strings must be XML compatible"),
# and libvirt/dnsmasq config lines would break on them: C0 controls (tab and newline
# included, except where a caller says the option is multi-line), DEL, lone surrogates and the non-characters
# U+FFFE/U+FFFF.
_BAD_TEXT_RE = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
# Where a whole text or document is expected (a description, a pool's xml), lines and tabs
# are content: only the other controls are refused.
_BAD_MULTILINE_TEXT_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def plain_text(option: str, value: Any, multiline: bool = False) -> Any:
    """Refuse a string that holds a control character; other values pass unchanged.
    ``multiline`` lets newlines, carriage returns and tabs through (descriptions, documents)."""
    if isinstance(value, str):
        found = (_BAD_MULTILINE_TEXT_RE if multiline else _BAD_TEXT_RE).search(value)
        if found:
            raise InvalidInputError(
                option, value, "contains the control character U+%04X at position %d"
                % (ord(found.group()), found.start()),
                "remove control characters (%s escapes); they cannot go into XML or configuration files"
                % ("" if multiline else "newlines, tabs, "))
    return value


def plain_texts(params: Dict[str, Any], paths: Iterable[str], multiline: Iterable[str] = ()) -> None:
    """Apply :func:`plain_text` to every option named by ``paths``; those also named in
    ``multiline`` may hold newlines and tabs.

    A path is dotted option names; ``name[]`` walks a list, ``name{}`` a dict (keys and
    values): ``disks[].path``, ``metadata{}``, ``dns_hosts[].hostnames[]``.
    """
    lines_ok = set(multiline)
    for path in paths:
        for option, value in _walk(params, path.split("."), ""):
            plain_text(option, value, multiline=path in lines_ok)


def _walk(node: Any, steps: List[str], label: str) -> Iterator[Tuple[str, Any]]:
    if not steps:
        yield label, node
        return
    step, rest = steps[0], steps[1:]
    name = step.rstrip("[]{}")
    value = node.get(name) if isinstance(node, dict) and name else node
    option = "%s.%s" % (label, name) if label and name else (label or name)
    if value is None:
        return
    if step.endswith("[]") and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, rest, "%s[%d]" % (option, index))
    elif step.endswith("{}") and isinstance(value, dict):
        for key, item in value.items():
            yield option, key
            yield from _walk(item, rest, "%s.%s" % (option, key))
    elif not step.endswith(("[]", "{}")):
        yield from _walk(value, rest, option)
