# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Guards that run before a destructive action: who uses a volume, can a network start.

The volume and pool modules ask :class:`DiskUsage` which defined domains (running or not)
use a volume before they delete it; the network module asks :func:`network_start_blockers`
whether a definition can start before it stops the running network. Both only read: a
guard never changes anything, so a refusal leaves the host exactly as it was.
"""
from __future__ import annotations

import ipaddress
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from .._core._command import CommandNotFoundError
from .._core._errors import LibvirtCallError
from ._connection import call, error_of, libvirt, lookup
from ._resource_list import read_listed
from .._core import _xml as X

# A backing chain longer than this is a loop (or not worth following for a guard).
MAX_CHAIN = 16


def _norm(path: Optional[str]) -> Optional[str]:
    return os.path.normpath(path) if path else None


class DiskUsageService:
    """The libvirt reads of :class:`DiskUsage`, the only libvirt calls of the guards (the network
    guard reads through ``_network.NetworkService``). It only reads."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def domains(self) -> List[Any]:
        return call("listing domains", self.conn.listAllDomains, 0)

    @staticmethod
    def is_active(dom: Any) -> bool:
        # Uncaught, as ever: the caller's run() reports libvirt's own words.
        return bool(dom.isActive())

    @staticmethod
    def domain_xml(dom: Any, inactive: bool) -> Optional[str]:
        """The persistent (``inactive``) or the live XML; None when the domain went away while we
        listed: it uses nothing."""
        try:
            return dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            err = error_of(exc)
            raise LibvirtCallError("reading the XML of domain %s" % dom.name(), err["code"], err["message"],
                                   err["domain"])

    def pool_volume_path(self, pool_name: str, vol_name: str) -> Optional[str]:
        """The path of a volume of an active pool; None when either is not there (or the pool is inactive)."""
        pool = lookup("looking up pool %s" % pool_name, self.conn.storagePoolLookupByName, pool_name,
                      (libvirt.VIR_ERR_NO_STORAGE_POOL,))
        if pool is None or not pool.isActive():
            return None
        vol = lookup("looking up volume %s" % vol_name, pool.storageVolLookupByName, vol_name,
                     (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        return vol.path() if vol is not None else None

    def volume_at(self, path: str) -> Optional[Any]:
        """The volume libvirt knows at ``path``; None when it knows none."""
        return lookup("looking up volume %s" % path, self.conn.storageVolLookupByPath, path,
                      (libvirt.VIR_ERR_NO_STORAGE_VOL,))

    @staticmethod
    def volume_xml(vol: Any) -> str:
        return call("reading volume XML", vol.XMLDesc, 0)


class DiskUsage:
    """Every disk of every defined domain, read once: who uses which path or pool volume.

    ``direct`` maps a path, and ``refs`` a (pool, volume) pair, to the domains whose disks
    name it. ``backing`` maps a path to (domain, disk path) pairs for images that are not a
    domain's disk themselves but sit under one in its backing chain: deleting those breaks
    the overlay just as surely.
    """

    def __init__(self, conn: Any) -> None:
        self.service = DiskUsageService(conn)
        self.direct: Dict[str, Set[str]] = {}
        self.refs: Dict[Tuple[str, str], Set[str]] = {}
        self.backing: Dict[str, Set[Tuple[str, str]]] = {}
        for dom in self.service.domains():
            self._read_domain(dom)

    def _read_domain(self, dom: Any) -> None:
        name = dom.name()
        # The persistent definition and, for a running domain, the live one (a disk may have
        # been hot-plugged or removed); libvirt's live XML also carries the backing chain.
        xmls = [self.service.domain_xml(dom, inactive=True)]
        if self.service.is_active(dom):
            xmls.append(self.service.domain_xml(dom, inactive=False))
        for xml in filter(None, xmls):
            for disk in X.parse(xml).findall("devices/disk"):
                self._read_disk(name, disk)

    def _read_disk(self, domain: str, disk: Any) -> None:
        source = disk.find("source")
        if source is None:
            return
        path = _norm(source.get("file") or source.get("dev"))
        if source.get("pool") and source.get("volume"):
            self.refs.setdefault((source.get("pool"), source.get("volume")), set()).add(domain)
            path = path or _norm(self.service.pool_volume_path(source.get("pool"), source.get("volume")))
        if not path:
            return
        self.direct.setdefault(path, set()).add(domain)
        for below in self._chain_from_xml(disk) | self._chain_from_volumes(path):
            if below != path:
                self.backing.setdefault(below, set()).add((domain, path))

    @staticmethod
    def _chain_from_xml(disk: Any) -> Set[str]:
        # A running domain's live XML nests <backingStore><source file=.../> per layer.
        found = set()
        for store in disk.iter("backingStore"):
            src = store.find("source")
            if src is not None and (src.get("file") or src.get("dev")):
                found.add(_norm(src.get("file") or src.get("dev")))
        return found

    def _chain_from_volumes(self, path: str) -> Set[str]:
        # An inactive domain's XML has no chain: follow the images libvirt knows as volumes
        # (one lookup and one XML read per layer, which keeps this cheap).
        found: Set[str] = set()
        current: Optional[str] = path
        while current and len(found) < MAX_CHAIN:
            vol = self.service.volume_at(current)
            if vol is None:
                break
            below = _norm(X.text(X.parse(self.service.volume_xml(vol)), "backingStore/path"))
            if not below or below in found or below == path:
                break
            found.add(below)
            current = below
        return found

    def users(self, pool: str, volume: str, path: Optional[str]) -> List[str]:
        """One line per use of the volume: 'domain X uses it as a disk' or '... under Y'."""
        path = _norm(path)
        direct = set(self.refs.get((pool, volume), set())) | set(self.direct.get(path, set()) if path else set())
        lines = ["domain %s (disk)" % dom for dom in sorted(direct)]
        for dom, top in sorted(self.backing.get(path, set()) if path else set()):
            if dom not in direct:
                lines.append("domain %s (backing image of its disk %s)" % (dom, top))
        return lines

    def users_under(self, pool: str, target: Optional[str]) -> Dict[str, List[str]]:
        """Volume name -> users, for every used path directly in ``target`` or pool reference.

        Works for an inactive pool too (its volumes cannot be listed without starting it):
        a volume of a dir, netfs or logical pool is always ``target/<name>``.
        """
        target = _norm(target)
        names = {vol for (pname, vol) in self.refs if pname == pool}
        if target:
            names |= {os.path.basename(p) for p in list(self.direct) + list(self.backing)
                      if os.path.dirname(p) == target}
        out = {}
        for name in sorted(names):
            lines = self.users(pool, name, os.path.join(target, name) if target else None)
            if lines:
                out[name] = lines
        return out


# -- networks -----------------------------------------------------------------------------------

# Seconds for one `ip -j` read: it answers at once; the bound only keeps a wedged netlink
# from holding the task.
IP_TIMEOUT_S = 30

Run = Callable[[List[str]], Tuple[int, str, str]]


def _ip_json(run: Run, argv: List[str]) -> Optional[List[Dict[str, Any]]]:
    """``ip -j ...`` parsed; None when it cannot be read (no `ip`, an error, not JSON)."""
    try:
        rc, out, _err = run(argv)
    except CommandNotFoundError:
        return None
    if rc != 0:
        return None
    try:
        found = json.loads(out or "[]")
    except ValueError:
        return None
    return found if isinstance(found, list) else None


def host_addresses(run: Run) -> Optional[Dict[str, List[Any]]]:
    """IPv4 interfaces of the host per device (from ``ip -j``); None when unreadable.
    ``run``: a bounded command runner (run_bounded's shape, ``argv -> (rc, out, err)``)."""
    links = _ip_json(run, ["ip", "-j", "-4", "addr", "show"])
    if links is None:
        return None
    found: Dict[str, List[Any]] = {}
    for link in links:
        for info in link.get("addr_info") or []:
            if info.get("family") == "inet" and info.get("local"):
                found.setdefault(link.get("ifname"), []).append(
                    ipaddress.IPv4Interface("%s/%s" % (info["local"], info.get("prefixlen", 32))))
    return found


def host_routes(run: Run) -> Optional[List[Tuple[Any, str]]]:
    """(destination network, device) of every IPv4 route of the host's main table but the
    default route (from ``ip -j -4 route show``); None when unreadable. libvirt refuses to start a
    network whose subnet the host already routes ("Network is already in use by interface")."""
    routes = _ip_json(run, ["ip", "-j", "-4", "route", "show"])
    if routes is None:
        return None
    found = []
    for route in routes:
        dst = route.get("dst")
        if not dst or dst == "default":
            continue
        try:
            network = ipaddress.IPv4Network(dst if "/" in dst else dst + "/32", strict=False)
        except ValueError:
            continue
        if network.prefixlen:
            found.append((network, route.get("dev") or route.get("gateway") or "?"))
    return found


def _network_ipv4(xml: str) -> Tuple[Optional[str], List[Any]]:
    root = X.parse(xml)
    nets = []
    for ip in root.findall("ip"):
        if ip.get("family", "ipv4") != "ipv4" or not ip.get("address"):
            continue
        mask = ip.get("prefix") or ip.get("netmask") or "24"
        nets.append(ipaddress.IPv4Interface("%s/%s" % (ip.get("address"), mask)).network)
    return X.attr(root, "bridge", "name"), nets


def other_networks(service: Any, name: str) -> List[Dict[str, Any]]:
    """Bridge and subnets of every other libvirt network (live XML when active), read through
    ``service`` (``_network.NetworkService``, which this module cannot import: it imports this one)."""
    def read(net: Any) -> Optional[Dict[str, Any]]:
        if net.name() == name:
            return None
        active = service.is_active(net)
        bridge, subnets = _network_ipv4(service.xml(net, inactive=not active))
        return {"name": net.name(), "active": active, "bridge": bridge, "subnets": subnets}

    # A network removed by another run between the listing and its read is left out: it takes
    # no subnet and no bridge any more.
    return read_listed(service.list_all(), read)


def network_start_blockers(spec: Dict[str, Any], own_bridge: Optional[str], others: Iterable[Dict[str, Any]],
                           host_addrs: Optional[Dict[str, List[Any]]],
                           host_links: Optional[Iterable[str]],
                           host_routes: Optional[List[Tuple[Any, str]]] = None) -> List[Tuple[str, Any, str, str]]:
    """Why ``spec`` could not start: (option, value, problem, fix) tuples, empty when none known.

    ``own_bridge`` is the bridge that belongs to this network already (the running network about
    to be stopped, or what an unfinished start of it left): its address, routes and name go away
    with it, so they are no conflict. ``host_addrs``/``host_links``/``host_routes`` are None when
    the host cannot be inspected (a remote URI): only libvirt's own networks are checked then.
    """
    blockers: List[Tuple[str, Any, str, str]] = []
    others = list(others)
    if spec.get("mode") != "bridge" and spec.get("bridge") and spec["bridge"] != own_bridge:
        blockers += _bridge_blockers(spec["bridge"], others, host_links)
    if spec.get("address") and spec.get("prefix"):
        subnet = ipaddress.IPv4Interface("%s/%s" % (spec["address"], spec["prefix"])).network
        blockers += _subnet_blockers(subnet, own_bridge, others, host_addrs, host_routes)
        blockers += _dhcp_blockers(spec, subnet)
    return blockers


def _bridge_blockers(bridge: str, others: List[Dict[str, Any]], host_links: Optional[Iterable[str]]) -> List[Tuple]:
    for other in others:
        if other["bridge"] == bridge:
            return [("bridge", bridge, "is the bridge of libvirt network %s" % other["name"],
                     "choose another bridge name, or leave bridge unset for libvirt to pick one")]
    if host_links is not None and bridge in host_links:
        return [("bridge", bridge, "is already an interface of this host",
                 "choose another bridge name, or leave bridge unset for libvirt to pick one")]
    return []


def _subnet_blockers(subnet: Any, own_bridge: Optional[str], others: List[Dict[str, Any]],
                     host_addrs: Optional[Dict[str, List[Any]]],
                     host_routes: Optional[List[Tuple[Any, str]]] = None) -> List[Tuple]:
    found = []
    for other in others:
        clash = [str(s) for s in other["subnets"] if s.overlaps(subnet)]
        if other["active"] and clash:
            found.append(("address", str(subnet), "overlaps %s of active libvirt network %s" % (", ".join(clash), other["name"]),
                          "choose a subnet that no other network uses"))
    # The bridges of libvirt's networks are host interfaces too: reported above already.
    skip = {own_bridge} | {other["bridge"] for other in others}
    for dev, ifaces in sorted((host_addrs or {}).items()):
        clash = [str(i) for i in ifaces if i.network.overlaps(subnet)]
        if dev not in skip and clash:
            found.append(("address", str(subnet), "overlaps %s on host interface %s" % (", ".join(clash), dev),
                          "choose a subnet that the host does not use"))
            skip.add(dev)  # its own (kernel) route says the same again
    for destination, dev in host_routes or []:
        if dev not in skip and destination.overlaps(subnet):
            found.append(("address", str(subnet), "overlaps %s, which the host routes through %s" % (destination, dev),
                          "choose a subnet that the host does not route (see `ip -4 route`)"))
    return found


def _dhcp_blockers(spec: Dict[str, Any], subnet: Any) -> List[Tuple]:
    rng = spec.get("dhcp_range")
    if not rng:
        return []
    start, end = ipaddress.IPv4Address(rng["start"]), ipaddress.IPv4Address(rng["end"])
    hosts = (subnet.network_address, subnet.broadcast_address)
    if start not in subnet or end not in subnet or start in hosts or end in hosts:
        return [("dhcp_range", rng, "is not inside the network %s" % subnet,
                 "give a range between %s and %s" % (subnet.network_address + 1, subnet.broadcast_address - 1))]
    if start > end:
        return [("dhcp_range", rng, "starts after it ends", "swap start and end")]
    if start <= ipaddress.IPv4Address(spec["address"]) <= end:
        return [("dhcp_range", rng, "contains the host address %s" % spec["address"],
                 "start the range after the host address")]
    return []
