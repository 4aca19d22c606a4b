# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does the host itself use a PCI device? Measured from sysfs and procfs, read-only.

``vfio_pci`` asks before it unbinds a device from its host driver: taking the host's NIC or
the disk controller under ``/`` from the host cuts the machine off or crashes it. The
answer must not depend on how deep the kernel nests its class devices, so the whole sysfs
subtree of the PCI function is walked:

* network interfaces hang below child devices (virtio: ``0000:00:03.0/virtio0/net/eth0``);
* disks and partitions sit many levels down (AHCI: ``ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1``,
  NVMe: ``nvme/nvme0/nvme0n1/nvme0n1p1``);
* a disk can be used only through a stacked device (LVM, dm-crypt, md): the kernel lists
  those under ``/sys/class/block/<name>/holders``, transitively.

The walk never follows symlinks (``subsystem``, ``driver``, ``firmware_node``,
``iommu_group``, ``device`` all lead out of the subtree and some back into it), skips child
PCI functions (devices of their own, judged on their own) and is bounded, so a strange
tree cannot make it loop or run forever. When the bound is hit the device counts as in
use: an unfinished check must never say "free".

Use is then matched against ``/proc/self/mountinfo`` (major:minor and source),
``/proc/swaps``, the open file descriptors under ``/proc/<pid>/fd``, and the routing tables
(``/proc/net/route``, ``/proc/net/ipv6_route``) and global IPv6 addresses
(``/proc/net/if_inet6``) of the interfaces, also through a bridge or bond they are a port of.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from .._core._atomic_file import read_text
from ._sysfs import Roots, link_name, list_dir, read_attr

PCI_ADDRESS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
# Far more than any real device needs (a GPU has ~50 directories, an HBA with many disks a
# few thousand); hitting it means a tree we do not understand, reported as "in use".
MAX_DIRS = 50000
# Attribute groups that never hold a device, and are large on big hosts (blk-mq has a
# directory per hardware queue and CPU for every disk): not worth walking.
NO_DEVICES = ("power", "mq", "queue", "msi_irqs", "trace", "integrity")
MAX_DEPTH = 24
# Mount points whose loss takes the host down: not even force may take their disk.
HOST_MOUNTS = ("/", "/usr", "/var", "/etc", "/boot", "/boot/efi")
MAX_MASTER_DEPTH = 4


class Use(NamedTuple):
    """One reason the host uses a device; ``critical`` ones cannot be overridden by force."""
    reason: str
    critical: bool = False


class Found(NamedTuple):
    """What lives in a PCI function's sysfs subtree."""
    nodes: List[str]
    block: Dict[str, str]  # block device name -> its sysfs directory
    net: Dict[str, str]  # interface name -> its sysfs directory
    truncated: bool


class Mount(NamedTuple):
    majmin: Optional[str]
    source: str
    target: str


def parse_uevent(text: Optional[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def unescape_mount(field: str) -> str:
    """mountinfo and /proc/mounts write space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def walk_subtree(base: str, max_dirs: int = MAX_DIRS, max_depth: int = MAX_DEPTH) -> Tuple[List[str], bool]:
    """Real directories below ``base`` (itself included), no symlinks followed, each once.

    Returns the directories and whether the bound cut the walk short."""
    seen: Set[Tuple[int, int]] = set()
    found: List[str] = []
    truncated = False
    stack: List[Tuple[str, int]] = [(base, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            stat = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen:  # a bind mount or another loop back into the tree
            continue
        seen.add(key)
        if len(found) >= max_dirs:
            return found, True
        found.append(path)
        children = _child_dirs(path)
        if depth >= max_depth:
            truncated = truncated or bool(children)
            continue
        stack.extend((child, depth + 1) for child in reversed(children))
    return found, truncated


def _child_dirs(path: str) -> List[str]:
    children = []
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        # A child PCI function (behind a bridge) is a device of its own, checked on its own.
        if not is_dir or PCI_ADDRESS_RE.match(entry.name):
            continue
        # Below net/ or block/ the name is a device's (an interface may be called "power").
        if entry.name in NO_DEVICES and os.path.basename(path) not in ("net", "block"):
            continue
        children.append(entry.path)
    return children


def ipv4_hex(value: str) -> str:
    """/proc/net/route prints the network-order address as a native u32 (``0001A8C0`` for
    192.168.1.0 on x86): packing it natively gives the address bytes back on any host."""
    return socket.inet_ntoa(struct.pack("=I", int(value, 16)))


class HostUsage:
    """Reads what uses the devices found under a sysfs directory; procfs is read once."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots
        self._open: Optional[Set[str]] = None
        self._mounts: Optional[List[Mount]] = None
        self._swaps: Optional[Set[str]] = None
        self._routes: Optional[Dict[str, List[str]]] = None
        self._addresses: Optional[Dict[str, List[str]]] = None
        self._block_paths: Dict[str, str] = {}

    # -- the subtree ----------------------------------------------------------------------
    def scan(self, base: str) -> Found:
        dirs, truncated = walk_subtree(base)
        nodes: Set[str] = set()
        block: Dict[str, str] = {}
        net: Dict[str, str] = {}
        for path in dirs:
            if path == base:
                continue
            uevent = parse_uevent(read_attr(os.path.join(path, "uevent")))
            if uevent.get("DEVNAME"):
                nodes.add("/dev/" + uevent["DEVNAME"])
            subsystem = link_name(os.path.join(path, "subsystem"))
            name = os.path.basename(path)
            if subsystem == "block" or uevent.get("DEVTYPE") in ("disk", "partition"):
                block[name] = path
            # Not uevent's INTERFACE=: USB interfaces carry one too ("3/1/1").
            elif subsystem == "net" or os.path.basename(os.path.dirname(path)) == "net":
                net[name] = path
        self._block_paths.update(block)
        return Found(sorted(nodes), block, net, truncated)

    # -- procfs, read once ----------------------------------------------------------------
    def open_nodes(self) -> Set[str]:
        """Every path some process holds open (the /proc/<pid>/fd links)."""
        if self._open is None:
            held: Set[str] = set()
            for pid in list_dir(self.roots.proc_root):
                if not pid.isdigit():
                    continue
                fd_dir = self.roots.proc(pid, "fd")
                for fd in list_dir(fd_dir):
                    try:
                        held.add(os.readlink(os.path.join(fd_dir, fd)))
                    except OSError:
                        continue
            self._open = held
        return self._open

    def mounts(self) -> List[Mount]:
        """mountinfo (with major:minor, which also catches a root given as /dev/root);
        /proc/mounts when there is no mountinfo."""
        if self._mounts is None:
            info = read_text(self.roots.proc("self", "mountinfo"))
            self._mounts = self._parse_mountinfo(info) if info is not None else self._parse_mounts()
        return self._mounts

    @staticmethod
    def _parse_mountinfo(text: str) -> List[Mount]:
        out = []
        for line in text.splitlines():
            head, sep, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if sep and len(fields) >= 5 and len(rest) >= 2:
                out.append(Mount(fields[2], unescape_mount(rest[1]), unescape_mount(fields[4])))
        return out

    def _parse_mounts(self) -> List[Mount]:
        out = []
        for line in (read_text(self.roots.proc("mounts")) or "").splitlines():
            fields = line.split()
            if len(fields) >= 2:
                out.append(Mount(None, unescape_mount(fields[0]), unescape_mount(fields[1])))
        return out

    def swaps(self) -> Set[str]:
        if self._swaps is None:
            lines = (read_text(self.roots.proc("swaps")) or "").splitlines()
            self._swaps = {unescape_mount(line.split()[0]) for line in lines[1:] if line.split()}
        return self._swaps

    def routes(self) -> Dict[str, List[str]]:
        """{interface: ["default", "10.0.0.0/24", "2001:db8::/64", ...]} from the kernel's tables."""
        if self._routes is None:
            routes: Dict[str, List[str]] = {}
            for iface, dest in self._ipv4_routes() + self._ipv6_routes():
                if dest not in routes.setdefault(iface, []):
                    routes[iface].append(dest)
            self._routes = routes
        return self._routes

    def _ipv4_routes(self) -> List[Tuple[str, str]]:
        out = []
        for line in (read_text(self.roots.proc("net", "route")) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8:
                continue
            try:
                dest, mask = ipv4_hex(fields[1]), ipv4_hex(fields[7])
            except (ValueError, struct.error):
                continue
            prefix = ipaddress.IPv4Network("0.0.0.0/%s" % mask).prefixlen
            out.append((fields[0], "default" if prefix == 0 else "%s/%d" % (dest, prefix)))
        return out

    def _ipv6_routes(self) -> List[Tuple[str, str]]:
        out = []
        for line in (read_text(self.roots.proc("net", "ipv6_route")) or "").splitlines():
            fields = line.split()
            if len(fields) < 10:
                continue
            try:
                dest, prefix = ipaddress.IPv6Address(int(fields[0], 16)), int(fields[1], 16)
            except ValueError:
                continue
            # Every interface that is up has fe80::/64 and multicast routes: they carry no host traffic.
            if dest.is_link_local or dest.is_multicast or fields[-1] == "lo":
                continue
            out.append((fields[-1], "IPv6 default" if prefix == 0 else "%s/%d" % (dest, prefix)))
        return out

    def global_addresses(self) -> Dict[str, List[str]]:
        """IPv6 addresses of scope global per interface (/proc/net/if_inet6)."""
        if self._addresses is None:
            addresses: Dict[str, List[str]] = {}
            for line in (read_text(self.roots.proc("net", "if_inet6")) or "").splitlines():
                fields = line.split()
                if len(fields) < 6 or fields[3] != "00":
                    continue
                try:
                    address = ipaddress.IPv6Address(int(fields[0], 16))
                except ValueError:
                    continue
                addresses.setdefault(fields[5], []).append("%s/%d" % (address, int(fields[2], 16)))
            self._addresses = addresses
        return self._addresses

    # -- block devices --------------------------------------------------------------------
    def block_dir(self, name: str) -> str:
        """/sys/class/block/<name> (disks, partitions and holders alike); the directory the
        walk found when the class link is missing."""
        path = self.roots.sys("class", "block", name)
        if os.path.isdir(path):
            return path
        return self._block_paths.get(name, path)

    def block_label(self, name: str) -> str:
        """``dm-0 (vg-root)``: the device-mapper name is what the admin knows."""
        dm_name = read_attr(os.path.join(self.block_dir(name), "dm", "name"))
        return "%s (%s)" % (name, dm_name) if dm_name else name

    def block_names(self, name: str) -> Set[str]:
        """The /dev paths a mount or swap line may name the device by."""
        names = {"/dev/" + name}
        dm_name = read_attr(os.path.join(self.block_dir(name), "dm", "name"))
        if dm_name:
            names.add("/dev/mapper/" + dm_name)
        return names

    def holders_closure(self, names: List[str]) -> Tuple[List[str], List[Tuple[str, str]]]:
        """Every device stacked on ``names`` (LVM, dm-crypt, md, ...), transitively, and the
        (device, holder) pairs found on the way."""
        seen: List[str] = []
        edges: List[Tuple[str, str]] = []
        queue = list(names)
        while queue and len(seen) < MAX_DIRS:
            name = queue.pop(0)
            if name in seen:
                continue
            seen.append(name)
            for holder in list_dir(os.path.join(self.block_dir(name), "holders")):
                edges.append((name, holder))
                queue.append(holder)
        return seen, edges

    def block_uses(self, name: str) -> List[Use]:
        uses: List[Use] = []
        label = self.block_label(name)
        paths = self.block_names(name)
        majmin = read_attr(os.path.join(self.block_dir(name), "dev"))
        for mount in self.mounts():
            if (majmin and mount.majmin == majmin) or mount.source in paths:
                where = "%s is mounted at %s" % (label, mount.target)
                if mount.target in HOST_MOUNTS:
                    uses.append(Use(where + " (a filesystem the host itself runs from)", True))
                else:
                    uses.append(Use(where))
        for path in sorted(paths & self.swaps()):
            uses.append(Use("%s is used as swap (%s)" % (label, path)))
        for path in sorted(paths & self.open_nodes()):
            uses.append(Use("%s is open by a process" % path))
        return uses

    # -- network interfaces ---------------------------------------------------------------
    def iface_traffic(self, iface: str) -> List[str]:
        """What the interface carries: the default route, other routes, global addresses."""
        out = []
        routes = self.routes().get(iface, [])
        for default in ("default", "IPv6 default"):
            if default in routes:
                out.append("carries the %s route" % default)
        others = [r for r in routes if r not in ("default", "IPv6 default")]
        if others:
            out.append("carries routes to %s" % ", ".join(others[:3]) + (" and more" if len(others) > 3 else ""))
        addresses = self.global_addresses().get(iface, [])
        if addresses:
            out.append("has address %s" % ", ".join(addresses[:3]))
        return out

    def net_uses(self, iface: str, path: str) -> List[Use]:
        uses = [Use("%s %s" % (iface, what)) for what in self.iface_traffic(iface)]
        # A bridge or bond port has no address of its own: its master carries the traffic.
        port, master, depth = iface, link_name(os.path.join(path, "master")), 0
        while master and depth < MAX_MASTER_DEPTH:
            for what in self.iface_traffic(master):
                uses.append(Use("%s is a port of %s, which %s" % (port, master, what)))
            port, depth = master, depth + 1
            master = link_name(self.roots.sys("class", "net", master, "master"))
        if not uses and read_attr(os.path.join(path, "operstate")) == "up":
            uses.append(Use("network interface %s is up" % iface))
        return uses

    # -- the answer -----------------------------------------------------------------------
    def uses(self, base: str, extra_nodes: Optional[List[str]] = None) -> List[Use]:
        """Why the host uses the device at sysfs directory ``base`` (empty: it does not)."""
        found = self.scan(base)
        uses: List[Use] = []
        if found.truncated:
            uses.append(Use("its sysfs tree %s is larger than this check reads (%d directories, depth %d), "
                            "so its use could not be ruled out" % (base, MAX_DIRS, MAX_DEPTH)))
        nodes = sorted(set(found.nodes) | set(extra_nodes or []))
        uses.extend(Use("%s is open by a process" % n) for n in nodes if n in self.open_nodes())
        block, edges = self.holders_closure(sorted(found.block))
        for name, holder in edges:
            uses.append(Use("%s is held by %s" % (self.block_label(name), self.block_label(holder))))
        for name in block:
            uses.extend(self.block_uses(name))
        for iface in sorted(found.net):
            uses.extend(self.net_uses(iface, found.net[iface]))
        # A disk's own node is both in the subtree and a block device: report it once.
        return _unique(uses)


def _unique(uses: List[Use]) -> List[Use]:
    out: List[Use] = []
    for use in uses:
        if use not in out:
            out.append(use)
    return out
