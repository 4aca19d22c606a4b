# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filesystem access for the host modules (pci_info, vfio_pci, kernel_cmdline, hugepages).

Every path the host modules read or write goes through a :class:`Roots` object, built from
the modules' ``sysfs_root`` / ``proc_root`` / ``etc_root`` options. On a real host those are
``/sys``, ``/proc`` and ``/etc``; the tests point them at temporary trees (a captured sysfs,
a synthetic one) so the same code runs against both without touching the machine.

Small helpers read sysfs attributes the way the kernel writes them (one value, trailing
newline) and write configuration files atomically, so a crash never leaves half a
modprobe.d or GRUB drop-in behind.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .._core._atomic_file import write_text_atomic as write_file_atomic
from .._core._errors import InvalidInputError, KvmError

# The roots' argument spec entries, paired with the doc fragments mlinfra.kvm.host.sysfs_root,
# .proc_root and .etc_root (plugins/doc_fragments/host.py).
ROOTS_ARGSPEC: Dict[str, Any] = dict(
    sysfs_root=dict(type="path", default="/sys"),
    proc_root=dict(type="path", default="/proc"),
    etc_root=dict(type="path", default="/etc"),
)


def roots_argspec(*names: str) -> Dict[str, Any]:
    """The argument spec entries of the roots a module reads (fresh copies)."""
    return {name: dict(ROOTS_ARGSPEC[name]) for name in names}


def _directory_or_absent(path: str) -> bool:
    """A directory, or nothing yet (an etc_root the module will fill); not a file, a FIFO, a
    device, a path through one, or a name with a NUL byte (no file can have one)."""
    if "\x00" in path:
        return False
    if os.path.lexists(path):
        return os.path.isdir(path)
    parent = os.path.dirname(path)
    while parent not in ("", "/") and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return os.path.isdir(parent or "/")


class Roots:
    """Where /sys, /proc and /etc are (a captured tree in tests, the real ones on a host)."""

    def __init__(self, sysfs_root: str = "/sys", proc_root: str = "/proc", etc_root: str = "/etc") -> None:
        for option, value in (("sysfs_root", sysfs_root), ("proc_root", proc_root), ("etc_root", etc_root)):
            if not isinstance(value, str) or not value.startswith("/"):
                raise InvalidInputError(option, value, "is not an absolute path",
                                        "give a path starting with '/', e.g. the default")
            # Checked here, once, so that a file, a FIFO or a missing tree fails naming the
            # option instead of as an unreadable attribute deep inside a scan.
            if not _directory_or_absent(value):
                raise InvalidInputError(option, value, "is not a directory",
                                        "give the directory that holds the tree (the default on a real host)")
        self.sysfs_root = sysfs_root.rstrip("/") or "/"
        self.proc_root = proc_root.rstrip("/") or "/"
        self.etc_root = etc_root.rstrip("/") or "/"

    @classmethod
    def from_params(cls, params: Dict[str, Any]) -> "Roots":
        # Only an option the module does not have falls back to the default: an empty string
        # given for a root is refused, not read as /sys (a real host's tree).
        def given(name: str, default: str) -> Any:
            value = params.get(name)
            return default if value is None else value
        return cls(given("sysfs_root", "/sys"), given("proc_root", "/proc"), given("etc_root", "/etc"))

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs_root, *parts)

    def proc(self, *parts: str) -> str:
        return os.path.join(self.proc_root, *parts)

    def etc(self, *parts: str) -> str:
        return os.path.join(self.etc_root, *parts)


def read_attr(path: str) -> Optional[str]:
    """A sysfs attribute's value without the trailing newline; None when it does not exist
    or cannot be read (many attributes are optional: boot_vga, numa_node, iommu_group)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def link_name(path: str) -> Optional[str]:
    """The last component of a symlink's target (``driver`` -> ``nvidia``), or None."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return None


def list_dir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def write_attr(path: str, value: str) -> None:
    """Write one value to a sysfs attribute (the kernel acts on the write itself)."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(value)
    except OSError as exc:
        raise KvmError("writing %r to %s failed: %s" % (value, path, exc), path=path, value=value)


def remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise KvmError("cannot remove %s: %s" % (path, exc), path=path)


def put_file(path: str, content: Optional[str], mode: int = 0o644) -> None:
    """Make ``path`` hold ``content`` (atomically), or remove it when ``content`` is None: the one
    write of the host modules' desired-file state (a drop-in, a sysctl.d file)."""
    if content is None:
        remove_file(path)
    else:
        write_file_atomic(path, content, mode)


def cmdline_args(text: Optional[str]) -> List[str]:
    """Kernel command line tokens (``/proc/cmdline``); everything after ``--`` belongs to init."""
    if not text:
        return []
    tokens = text.split()
    if "--" in tokens:
        tokens = tokens[:tokens.index("--")]
    return tokens


def cpu_vendor(cpuinfo: Optional[str]) -> Optional[str]:
    """``intel`` or ``amd`` from /proc/cpuinfo's vendor_id, None when unknown."""
    for line in (cpuinfo or "").splitlines():
        key, _unused, value = line.partition(":")
        if key.strip() == "vendor_id":
            value = value.strip()
            if value == "GenuineIntel":
                return "intel"
            if value in ("AuthenticAMD", "HygonGenuine"):
                return "amd"
            return None
    return None


def is_virtual_machine(cpuinfo: Optional[str]) -> bool:
    """True when the CPU flags carry ``hypervisor`` (the kernel runs as a guest)."""
    for line in (cpuinfo or "").splitlines():
        key, _unused, value = line.partition(":")
        if key.strip() == "flags":
            return "hypervisor" in value.split()
    return False


def meminfo_kib(text: Optional[str]) -> Dict[str, int]:
    """/proc/meminfo as {field: kB} (HugePages_* counts are plain numbers)."""
    out: Dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _unused, value = line.partition(":")
        fields = value.split()
        if fields and fields[0].isdigit():
            out[key.strip()] = int(fields[0])
    return out
