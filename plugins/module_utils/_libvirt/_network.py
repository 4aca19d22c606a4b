# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Libvirt networks: the request (validation), the XML both ways, the service (the only code
that calls libvirt for networks) and the runner (read, compare, act, report) that mlinfra.kvm.network
and mlinfra.kvm.networks share."""
from __future__ import annotations

import ipaddress
import os
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from .._core._runner import ObjectRunner
from .._core._errors import InvalidInputError, KvmError, LibvirtCallError
from .._core._command import run_bounded
from .._core._host_lock import local_object_lock
from ._connection import LIBVIRT_ARGSPEC, call, libvirt, lookup
from ._libvirt_guards import (IP_TIMEOUT_S, host_addresses, host_routes, network_start_blockers, other_networks)
from ._network_leftovers import Leftovers
from .._core._validate import (int_range, ipv4_address, mac_address, object_name, plain_texts)
from ._fields import LIVE, RESTART, Field, changed_with, compare, keys_with_change, option_specs
from ._resource_list import ItemModule, ResourceKind, list_call_cache, read_listed
from .._core import _xml as X

# A network's fields, declared once: the options each is made from (with their argument spec
# entries) and what a change costs on a running network. LIVE fields go in through
# virNetworkUpdate; a RESTART field is written to the definition and waits for a restart
# (restart: true). The XML is read and written as a whole (spec_from_xml, build_xml): the fields
# share elements (<forward> holds mode and forward_dev, <ip> address, prefix, range and hosts).
FIELD_TABLE: Tuple[Field, ...] = (
    Field("mode", dict(mode=dict(type="str", default="nat", choices=["nat", "route", "isolated", "bridge"])),
          RESTART, "mode"),
    Field("bridge", dict(bridge=dict(type="str")), RESTART, "bridge"),
    Field("forward_dev", dict(forward_dev=dict(type="str")), RESTART, "forward device"),
    Field("domain", dict(domain=dict(type="str")), RESTART, "domain"),
    Field("mtu", dict(mtu=dict(type="int")), RESTART, "MTU"),
    Field("address", dict(address=dict(type="str")), RESTART, "address"),
    Field("prefix", dict(netmask=dict(type="str"), prefix=dict(type="int")), RESTART, "prefix"),
    Field("dhcp_range", dict(dhcp_range=dict(type="dict", options=dict(
        start=dict(type="str", required=True), end=dict(type="str", required=True)))), RESTART, "DHCP range"),
    Field("hosts", dict(hosts=dict(type="list", elements="dict", options=dict(
        mac=dict(type="str", required=True), ip=dict(type="str", required=True), name=dict(type="str")))),
        LIVE, "static DHCP hosts"),
    Field("dns_hosts", dict(dns_hosts=dict(type="list", elements="dict", options=dict(
        ip=dict(type="str", required=True), hostnames=dict(type="list", elements="str", required=True)))),
        LIVE, "DNS host entries"),
)
LIVE_FIELDS = keys_with_change(FIELD_TABLE, LIVE)
RESTART_FIELDS = keys_with_change(FIELD_TABLE, RESTART)
ALL_FIELDS = RESTART_FIELDS + LIVE_FIELDS

# Every free-text option that ends in the network XML (and dnsmasq's configuration): a control
# character in one would make lxml raise instead of the module naming the option.
TEXT_OPTIONS = ("bridge", "forward_dev", "domain", "address", "netmask", "dhcp_range.start",
                "dhcp_range.end", "hosts[].mac", "hosts[].ip", "hosts[].name", "dns_hosts[].ip",
                "dns_hosts[].hostnames[]")
# IPv4's minimum MTU (RFC 791) to the largest a Linux bridge takes (ETH_MAX_MTU).
MTU_MIN = 68
MTU_MAX = 65535
# Linux interface names are at most 15 characters (IFNAMSIZ - 1).
IFNAME_MAX = 15
# /8 is the widest network libvirt's dnsmasq is given here; /31 and /32 leave no guest address.
PREFIX_MIN = 8
PREFIX_MAX = 30
# A DNS name is at most 253 characters, in labels of at most 63 (RFC 1035).
DNS_NAME_MAX = 253
DNS_LABEL_MAX = 63


# -- the request ------------------------------------------------------------------------------

def _host_key(host: Dict[str, Any]) -> Tuple:
    return (host["mac"], host["ip"], host.get("name") or "")


def _dns_key(host: Dict[str, Any]) -> Tuple:
    return (host["ip"], tuple(host["hostnames"]))


def sort_hosts(hosts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(hosts, key=_host_key)


def sort_dns(hosts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(hosts, key=_dns_key)


def validated_request(params: Dict[str, Any], local: bool) -> Dict[str, Any]:
    """The normalised spec of the fields the user set; raises InvalidInputError."""
    object_name("name", params["name"])
    plain_texts(params, TEXT_OPTIONS)
    mode = params["mode"]
    spec: Dict[str, Any] = {"mode": mode}
    for field in ("bridge", "forward_dev", "domain", "mtu"):
        if params[field] is not None:
            spec[field] = params[field]
    if params["bridge"] is not None:
        object_name("bridge", params["bridge"])
    for field in ("bridge", "forward_dev"):
        if params[field] is not None:
            _interface_name(field, params[field])
    if params["mtu"] is not None:
        int_range("mtu", params["mtu"], MTU_MIN, MTU_MAX, "IPv4's minimum to a Linux bridge's maximum")
    if params["domain"] is not None:
        dns_name("domain", params["domain"])
    if mode == "bridge":
        return _bridge_request(params, spec, local)
    network = _ip_request(params, spec)
    if params["hosts"] is not None:
        spec["hosts"] = _hosts_request(params["hosts"], network)
    if params["dns_hosts"] is not None:
        spec["dns_hosts"] = _dns_request(params["dns_hosts"])
    return spec


def _interface_name(option: str, value: str) -> str:
    """A Linux interface name as the kernel takes it (dev_valid_name): 1-15 characters
    (IFNAMSIZ - 1), no '/', ':' or whitespace, not '.' or '..'. The bridge libvirt creates
    is also held to the object-name characters (checked by the caller)."""
    if not value or value in (".", "..") or any(c in value for c in "/:") or any(c.isspace() for c in value):
        raise InvalidInputError(option, value, "is not a Linux interface name",
                                "give the name as `ip link` shows it (no '/', ':' or spaces)")
    if len(value) > IFNAME_MAX:
        raise InvalidInputError(option, value, "is longer than %d characters" % IFNAME_MAX,
                                "Linux interface names have at most %d characters; use a shorter one"
                                % IFNAME_MAX)
    return value


def dns_name(option: str, value: str) -> str:
    """A DNS name: labels of letters, digits and '-', at most 63 each and 253 in all."""
    labels = value.split(".")
    if len(value) > DNS_NAME_MAX or not all(
            label and len(label) <= DNS_LABEL_MAX and label.replace("-", "").isalnum() for label in labels):
        raise InvalidInputError(option, value, "is not a DNS name",
                                "use dot-separated labels of letters, digits and '-' (1-63 characters "
                                "each, %d in all)" % DNS_NAME_MAX)
    return value


def _bridge_request(params: Dict[str, Any], spec: Dict[str, Any], local: bool) -> Dict[str, Any]:
    if not params["bridge"]:
        raise InvalidInputError("bridge", None, "is required with mode: bridge",
                                "name the existing host bridge, e.g. bridge: br0")
    for field in ("address", "netmask", "prefix", "dhcp_range", "hosts", "dns_hosts", "forward_dev", "domain"):
        if params[field]:
            raise InvalidInputError(field, params[field], "does not apply to mode: bridge",
                                    "remove it (the host bridge's own network serves addresses)")
    if local and not os.path.isdir("/sys/class/net/%s/bridge" % params["bridge"]):
        raise InvalidInputError("bridge", params["bridge"], "is not a bridge on this host",
                                "create the bridge first (e.g. with the host's network configuration)")
    return spec


def _ip_request(params: Dict[str, Any], spec: Dict[str, Any]) -> Optional[ipaddress.IPv4Network]:
    if params["address"] is None:
        for field in ("netmask", "prefix", "dhcp_range", "hosts"):
            if params[field]:
                raise InvalidInputError(field, params[field], "needs an address",
                                        "set address (and prefix) for the network")
        return None
    address = ipv4_address("address", params["address"])
    if params["netmask"] is not None:
        try:
            prefix = ipaddress.IPv4Network("0.0.0.0/%s" % params["netmask"]).prefixlen
        except ValueError:
            raise InvalidInputError("netmask", params["netmask"], "is not a netmask", "write e.g. 255.255.255.0")
        if not PREFIX_MIN <= prefix <= PREFIX_MAX:
            raise InvalidInputError("netmask", params["netmask"], "is a /%d network" % prefix,
                                    "use a netmask from 255.0.0.0 (/8) to 255.255.255.252 (/30)")
    else:
        prefix = params["prefix"] if params["prefix"] is not None else 24
        int_range("prefix", prefix, PREFIX_MIN, PREFIX_MAX, "a /31 or /32 leaves no address for guests")
    network = ipaddress.IPv4Network("%s/%d" % (address, prefix), strict=False)
    if address in (network.network_address, network.broadcast_address):
        raise InvalidInputError("address", params["address"],
                                "is the network or broadcast address of %s" % network,
                                "use a host address such as %s" % next(network.hosts()))
    spec.update(address=str(address), prefix=prefix)
    if params["dhcp_range"]:
        start = _inside(network, "dhcp_range.start", params["dhcp_range"]["start"])
        end = _inside(network, "dhcp_range.end", params["dhcp_range"]["end"])
        if start > end:
            raise InvalidInputError("dhcp_range", params["dhcp_range"], "starts after it ends",
                                    "swap start and end")
        if start <= address <= end:
            raise InvalidInputError("dhcp_range", params["dhcp_range"], "contains the host address %s" % address,
                                    "start the range after the host address")
        spec["dhcp_range"] = {"start": str(start), "end": str(end)}
    return network


def _inside(network: ipaddress.IPv4Network, option: str, value: Any) -> ipaddress.IPv4Address:
    ip = ipv4_address(option, value)
    if ip not in network or ip in (network.network_address, network.broadcast_address):
        raise InvalidInputError(option, value, "is outside the network %s" % network,
                                "use an address between %s and %s" % (network.network_address + 1,
                                                                      network.broadcast_address - 1))
    return ip


def _hosts_request(hosts: List[Dict[str, Any]], network: Optional[ipaddress.IPv4Network]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    seen: Dict[str, Dict[str, int]] = {"mac": {}, "ip": {}, "name": {}}
    for index, host in enumerate(hosts):
        option = "hosts[%d]" % index
        entry = {"mac": mac_address(option + ".mac", host["mac"]),
                 "ip": str(_inside(network, option + ".ip", host["ip"]))}
        if host.get("name"):
            object_name(option + ".name", host["name"])
            entry["name"] = host["name"]
        for key in ("mac", "ip", "name"):
            value = entry.get(key)
            if value is None:
                continue
            if value in seen[key]:
                raise InvalidInputError(option + "." + key, value,
                                        "is already used by hosts[%d]" % seen[key][value],
                                        "give every host entry its own %s" % key.upper() if key != "name"
                                        else "give every host entry its own name")
            seen[key][value] = index
        out.append(entry)
    return sort_hosts(out)


def _dns_request(hosts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for index, host in enumerate(hosts):
        option = "dns_hosts[%d]" % index
        ip = ipv4_address(option + ".ip", host["ip"])
        if not host["hostnames"]:
            raise InvalidInputError(option + ".hostnames", host["hostnames"], "is empty", "give at least one name")
        for position, name in enumerate(host["hostnames"]):
            # Only what DNS cannot hold: dnsmasq serves other characters ('_') as given.
            if not name or len(name) > DNS_NAME_MAX or "" in name.rstrip(".").split("."):
                raise InvalidInputError("%s.hostnames[%d]" % (option, position), name, "is not a DNS name",
                                        "give a non-empty name of at most %d characters without empty "
                                        "labels ('..')" % DNS_NAME_MAX)
        out.append({"ip": str(ip), "hostnames": sorted(host["hostnames"])})
    return sort_dns(out)


# -- XML ----------------------------------------------------------------------------------------

def spec_from_xml(xml: str) -> Dict[str, Any]:
    root = X.parse(xml)
    forward = root.find("forward")
    spec: Dict[str, Any] = {
        "mode": forward.get("mode", "nat") if forward is not None else "isolated",
        "bridge": X.attr(root, "bridge", "name"),
        "forward_dev": forward.get("dev") if forward is not None else None,
        "domain": X.attr(root, "domain", "name"),
        "mtu": int(X.attr(root, "mtu", "size")) if root.find("mtu") is not None else None,
        "address": None, "prefix": None, "dhcp_range": None, "hosts": [], "dns_hosts": [],
    }
    for ip in root.findall("ip"):
        if ip.get("family", "ipv4") != "ipv4":
            continue
        spec["address"] = ip.get("address")
        if ip.get("prefix"):
            spec["prefix"] = int(ip.get("prefix"))
        elif ip.get("netmask"):
            spec["prefix"] = ipaddress.IPv4Network("0.0.0.0/%s" % ip.get("netmask")).prefixlen
        rng = ip.find("dhcp/range")
        if rng is not None:
            spec["dhcp_range"] = {"start": rng.get("start"), "end": rng.get("end")}
        hosts = []
        for host in ip.findall("dhcp/host"):
            entry = {"mac": (host.get("mac") or "").lower(), "ip": host.get("ip")}
            if host.get("name"):
                entry["name"] = host.get("name")
            hosts.append(entry)
        spec["hosts"] = sort_hosts(hosts)
        break
    spec["dns_hosts"] = sort_dns([{"ip": h.get("ip"), "hostnames": sorted(n.text for n in h.findall("hostname"))}
                                  for h in root.findall("dns/host")])
    return spec


def host_element(host: Dict[str, Any]) -> Any:
    return X.element("host", {"mac": host["mac"], "ip": host["ip"], "name": host.get("name")})


def dns_host_element(host: Dict[str, Any]) -> Any:
    el = X.element("host", {"ip": host["ip"]})
    for name in host["hostnames"]:
        X.sub(el, "hostname", text=name)
    return el


# virNetworkUpdate takes one entry as an XML string.
def host_xml(host: Dict[str, Any]) -> str:
    return X.to_string(host_element(host))


def dns_host_xml(host: Dict[str, Any]) -> str:
    return X.to_string(dns_host_element(host))


def build_xml(name: str, spec: Dict[str, Any], uuid: Optional[str] = None, mac: Optional[str] = None) -> str:
    root = X.element("network")
    X.sub(root, "name", text=name)
    if uuid:
        X.sub(root, "uuid", text=uuid)
    mode = spec["mode"]
    if mode != "isolated":
        X.sub(root, "forward", {"mode": mode, "dev": spec.get("forward_dev")})
    if mode == "bridge":
        X.sub(root, "bridge", {"name": spec["bridge"]})
        return X.to_string(root)
    X.sub(root, "bridge", {"name": spec.get("bridge"), "stp": True, "delay": 0})
    if spec.get("mtu"):
        X.sub(root, "mtu", {"size": spec["mtu"]})
    if mac:
        X.sub(root, "mac", {"address": mac})
    if spec.get("domain"):
        X.sub(root, "domain", {"name": spec["domain"], "localOnly": True})
    if spec.get("dns_hosts"):
        dns = X.sub(root, "dns")
        for host in spec["dns_hosts"]:
            dns.append(dns_host_element(host))
    if spec.get("address"):
        ip = X.sub(root, "ip", {"address": spec["address"], "prefix": spec["prefix"]})
        if spec.get("dhcp_range") or spec.get("hosts"):
            dhcp = X.sub(ip, "dhcp")
            if spec.get("dhcp_range"):
                X.sub(dhcp, "range", {"start": spec["dhcp_range"]["start"], "end": spec["dhcp_range"]["end"]})
            for host in spec.get("hosts") or []:
                dhcp.append(host_element(host))
    return X.to_string(root)


# -- libvirt ------------------------------------------------------------------------------------

class NetworkService:
    """The only code that talks to libvirt for networks."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def get(self, name: str) -> Optional[Any]:
        return lookup("looking up network %s" % name, self.conn.networkLookupByName, name,
                      (libvirt.VIR_ERR_NO_NETWORK,))

    def list_all(self) -> List[Any]:
        return call("listing networks", self.conn.listAllNetworks, 0)

    @staticmethod
    def is_active(net: Any) -> bool:
        # Uncaught, as ever: read_listed skips a network that vanished, run() reports the rest.
        return bool(net.isActive())

    @staticmethod
    def autostart(net: Any) -> bool:
        return bool(net.autostart())

    def xml(self, net: Any, inactive: bool) -> str:
        return call("reading network XML", net.XMLDesc, libvirt.VIR_NETWORK_XML_INACTIVE if inactive else 0)

    def define(self, xml: str) -> Any:
        return call("defining network", self.conn.networkDefineXML, xml)

    def start(self, net: Any) -> None:
        call("starting network %s" % net.name(), net.create)

    def stop(self, net: Any) -> None:
        call("stopping network %s" % net.name(), net.destroy)

    def undefine(self, net: Any) -> None:
        call("undefining network %s" % net.name(), net.undefine)

    def other_networks(self, name: str) -> List[Dict[str, Any]]:
        return other_networks(self, name)

    def set_autostart(self, net: Any, value: bool) -> None:
        call("setting autostart of network %s" % net.name(), net.setAutostart, int(value))

    def update(self, net: Any, command: int, section: int, xml: str, live: bool) -> None:
        flags = libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG
        if live:
            flags |= libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE
        call("updating network %s" % net.name(), net.update, command, section, -1, xml, flags)

    def describe(self, net: Optional[Any], name: str) -> Dict[str, Any]:
        if net is None:
            return {"name": name, "state": "absent"}
        out = {"name": name, "uuid": net.UUIDString(), "state": "active" if self.is_active(net) else "inactive",
               "autostart": self.autostart(net)}
        out.update(spec_from_xml(self.xml(net, inactive=True)))
        return out


# -- decisions --------------------------------------------------------------------------------

class NetworkRunner(ObjectRunner):
    def __init__(self, module: AnsibleModule, service: NetworkService, local: bool) -> None:
        super().__init__(module, service, local)
        # Check mode cannot read the result back: ensure_defined predicts what waits for a restart.
        self.predicted_pending: List[str] = []
        self.request: Dict[str, Any] = {}

    def validate(self) -> None:
        object_name("name", self.params["name"])
        self.request = validated_request(self.params, self.local) if self.params["state"] != "absent" else {}

    def converge(self) -> Dict[str, Any]:
        p = self.params
        name = p["name"]
        request = self.request
        net = self.service.get(name)
        before = self.service.describe(net, name)
        if p["state"] == "absent":
            self.ensure_absent(net)
        else:
            if p["state"] == "active" and (net is None or not self.service.is_active(net)):
                self.guard_start(net, before, request)
            net = self.ensure_defined(net, before, request)
            self.ensure_running_state(net, before)
            self.ensure_autostart(net)
        if self.check:
            after = dict(before)
            after.update(self.tracker.get_after())
            if after.get("state") == "absent":
                after = {"name": name, "state": "absent"}
            # Nothing to change: what waits for a restart is what libvirt has now, not a prediction.
            pending = self.predicted_pending if self.tracker.changed else self.pending(net)
            self.record_prediction(name, before, after, pending)
            xml = ""
        else:
            net = self.service.get(name)
            after = self.service.describe(net, name)
            pending = self.pending(net)
            xml = self.service.xml(net, inactive=True) if net is not None else ""
        fields = ["state", "autostart"] + [f for f in ALL_FIELDS if f in request]
        result = {"changed": self.tracker.changed, "actions": self.tracker.actions, "network": after,
                  "restart_required": bool(pending), "pending": pending, "xml": xml}
        return self.with_diff(result, {f: before.get(f) for f in fields if f in before or f == "state"},
                              {f: after.get(f) for f in fields if f in after or f == "state"})

    def pending(self, net: Optional[Any]) -> List[str]:
        """Fields whose persistent value differs from the running network."""
        if net is None or not self.service.is_active(net):
            return []
        live = spec_from_xml(self.service.xml(net, inactive=False))
        config = spec_from_xml(self.service.xml(net, inactive=True))
        return [f for f in RESTART_FIELDS if live.get(f) != config.get(f)]

    def ensure_absent(self, net: Optional[Any]) -> None:
        if net is None:
            return
        active = self.service.is_active(net)
        self.tracker.add("state", "active" if active else "inactive", "absent")
        if active:
            self.tracker.act("stop", self.service.stop, net)
        # An inactive network may still have what an unfinished start left (its dnsmasq, its
        # bridge): once undefined, nothing in libvirt could find them again.
        leftovers = self.leftovers(net).own() if self.local and not active else []
        self.tracker.act("undefine", self.service.undefine, net)
        for description, clear in leftovers:
            self.tracker.act(description, clear)

    def ensure_defined(self, net: Optional[Any], before: Dict[str, Any], request: Dict[str, Any]) -> Optional[Any]:
        name = self.params["name"]
        if net is None:
            compare(self.tracker, {}, request)
            return self.tracker.act("define", self.service.define, build_xml(name, request))
        changed = compare(self.tracker, before, request)
        if not changed:
            self.predicted_pending = self.pending(net)
            if self.predicted_pending and self.params["restart"]:
                self.guard_restart(net, {f: before.get(f) for f in ALL_FIELDS})
                self.restart(net)
            return net
        active = self.service.is_active(net)
        restart_fields = changed_with(FIELD_TABLE, changed, RESTART)
        live_only = not restart_fields
        if active and live_only:
            self.update_hosts_live(net, before, request)
            self.predicted_pending = self.pending(net)
            return net
        merged = {f: before.get(f) for f in ALL_FIELDS}
        merged.update(request)
        if active and self.params["restart"]:
            # Before the redefine: a refused restart must leave the definition untouched too.
            self.guard_restart(net, merged)
        root = X.parse(self.service.xml(net, inactive=True))
        defined = self.tracker.act("redefine", self.service.define,
                                   build_xml(name, merged, net.UUIDString(), X.attr(root, "mac", "address")))
        net = defined if defined is not None else net  # check mode: nothing was redefined
        if active and self.params["restart"]:
            self.restart(net)
        elif active:
            live = spec_from_xml(self.service.xml(net, inactive=False))
            self.predicted_pending = [f for f in RESTART_FIELDS if live.get(f) != merged.get(f)] or restart_fields
        return net

    def guard_restart(self, net: Any, spec: Dict[str, Any]) -> None:
        """Refuse a restart into a definition that cannot start, while the old one still runs."""
        own_bridge = X.attr(X.parse(self.service.xml(net, inactive=False)), "bridge", "name")
        blockers = network_start_blockers(spec, own_bridge, self.other_networks(net.name()),
                                          self.host_addresses(), self.host_links(), self.host_routes())
        if not blockers:
            return
        option, value, problem, fix = blockers[0]
        raise InvalidInputError(
            option, value, "%s, so network %s could not start again after the restart" % (problem, net.name()),
            "%s. Nothing was changed: the network keeps running with its current definition" % fix,
            blockers=["option %s: value %r %s" % (b[0], b[1], b[2]) for b in blockers])

    def guard_start(self, net: Optional[Any], before: Dict[str, Any], request: Dict[str, Any]) -> None:
        """Refuse, before anything is defined, a network this run would start but libvirt could
        not: its subnet overlaps an active network's (in a list, also one an earlier item makes
        or starts), a host interface's or a route of the host; its bridge is another network's
        or an existing host interface. A network's own bridge left by an unfinished start of it
        is no conflict (start_clearing_a_stale_bridge clears it)."""
        name = self.params["name"]
        spec = dict(request)
        own_bridge = None
        if net is not None:
            spec = {f: before.get(f) for f in ALL_FIELDS}
            spec.update(request)
            leftovers = self.leftovers(net) if self.local else None
            if leftovers is not None and leftovers.own_bridge and leftovers.bridge_is_stale():
                own_bridge = leftovers.own_bridge
        blockers = network_start_blockers(spec, own_bridge, self.other_networks(name), self.host_addresses(),
                                          self.host_links(), self.host_routes())
        if not blockers:
            return
        option, value, problem, fix = blockers[0]
        raise InvalidInputError(
            option, value, "%s, so network %s could not start" % (problem, name),
            "%s. Nothing was changed%s" % (fix, "" if net is None else ": the network stays as it was"),
            blockers=["option %s: value %r %s" % (b[0], b[1], b[2]) for b in blockers])

    def other_networks(self, name: str) -> List[Dict[str, Any]]:
        """Every other network as the guards see it: libvirt's, and in a list's check pass what
        the earlier items would make, start or remove (record_prediction), so that two items
        that could not run together are refused before the first is made."""
        others = self.service.other_networks(name)
        predicted = self.predictions()
        if not self.check or predicted is None:
            return others
        out = [other for other in others if other["name"] not in predicted]
        out += [other for key, other in sorted(predicted.items()) if key != name and other is not None]
        return out

    def predictions(self) -> Optional[Dict[str, Optional[Dict[str, Any]]]]:
        """name -> the network an earlier item of this check pass leaves (None: removed)."""
        shared = list_call_cache(self.module)
        return None if shared is None else shared.setdefault(("network", "check pass"), {})

    def removed_bridges(self) -> List[str]:
        """Bridges of networks an earlier item of this check pass removes: still host interfaces
        now, gone by the time this item runs for real."""
        shared = list_call_cache(self.module)
        if not self.check or shared is None:
            return []
        return shared.setdefault(("network", "check pass removed bridges"), [])

    def record_prediction(self, name: str, before: Dict[str, Any], after: Dict[str, Any], pending: List[str]) -> None:
        """Check pass of a list: what this item leaves, for the guards of the items after it."""
        predicted = self.predictions()
        if predicted is None:
            return
        if after.get("state") == "absent":
            predicted[name] = None
            if before.get("bridge"):
                self.removed_bridges().append(before["bridge"])
            return
        if pending and after.get("state") == "active":
            return  # the running network keeps its live definition: libvirt's view stays right
        address, prefix = after.get("address"), after.get("prefix")
        subnets = [ipaddress.IPv4Interface("%s/%s" % (address, prefix)).network] if address and prefix else []
        predicted[name] = {"name": name, "active": after.get("state") == "active", "bridge": after.get("bridge"),
                           "subnets": subnets}

    def read_host(self, argv: List[str]) -> Any:
        """A read-only host command, bounded (and kept for the call in a list: ItemModule)."""
        if isinstance(self.module, ItemModule):
            return self.module.run_command(argv, timeout_s=IP_TIMEOUT_S)
        return run_bounded(argv, timeout_s=IP_TIMEOUT_S)

    def host_addresses(self) -> Optional[Dict[str, List[Any]]]:
        # A remote libvirt host's interfaces cannot be read from here: libvirt's networks only.
        found = host_addresses(self.read_host) if self.local else None
        gone = self.removed_bridges()
        return None if found is None else {dev: addrs for dev, addrs in found.items() if dev not in gone}

    def host_routes(self) -> Optional[List[Any]]:
        found = host_routes(self.read_host) if self.local else None
        gone = self.removed_bridges()
        return None if found is None else [(dst, dev) for dst, dev in found if dev not in gone]

    def host_links(self) -> Optional[List[str]]:
        if not self.local or not os.path.isdir("/sys/class/net"):
            return None
        gone = self.removed_bridges()
        return [link for link in os.listdir("/sys/class/net") if link not in gone]

    def restart(self, net: Any) -> None:
        self.predicted_pending = []
        self.tracker.act("restart", self.stop_and_start, net)

    def stop_and_start(self, net: Any) -> None:
        """Stop, start with the new definition; if that start fails, the previous one comes back."""
        # What runs now, to come back to if the new definition fails to start after the stop.
        running_xml = self.service.xml(net, inactive=False)
        try:
            self.service.stop(net)
        except KvmError as err:
            err.msg = "%s; the network still runs its previous definition" % err.msg
            raise
        try:
            self.service.start(net)
        except LibvirtCallError as err:
            self.roll_back(net, running_xml, err)

    def roll_back(self, net: Any, running_xml: str, err: LibvirtCallError) -> None:
        """Put the previous definition back and start it; then fail with libvirt's message."""
        name, why = self.params["name"], err.details.get("libvirt_message")
        done = self.tracker.performed + ["stop", "start (failed)", "restore previous definition"]
        try:
            net = self.service.define(running_xml)
            self.service.start(net)
        except KvmError as again:
            raise KvmError(
                "network %s did not start with the new definition (libvirt: %s), and restoring and starting "
                "the previous definition failed too (%s): the network is stopped. Start it by hand "
                "(virsh net-start %s) after fixing the cause." % (name, why, again.msg, name),
                changed=True, restored=False, actions=done, libvirt_code=err.code, libvirt_message=why)
        raise KvmError(
            "network %s did not start with the new definition (libvirt: %s). The previous definition was "
            "restored and started again, so guests keep their network; fix the request and run again."
            % (name, why), changed=True, restored=True, actions=done + ["start"],
            libvirt_code=err.code, libvirt_message=why)

    def update_hosts_live(self, net: Any, before: Dict[str, Any], request: Dict[str, Any]) -> None:
        sections = (("hosts", libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST, host_xml, "DHCP host"),
                    ("dns_hosts", libvirt.VIR_NETWORK_SECTION_DNS_HOST, dns_host_xml, "DNS host"))
        for field, section, to_xml, label in sections:
            if field not in request:
                continue
            old = {to_xml(h): h for h in before.get(field) or []}
            new = {to_xml(h): h for h in request[field]}
            # Deletions first: a modified entry may reuse the IP or name of a removed one.
            for xml in [x for x in old if x not in new]:
                self.tracker.act("live delete %s %s" % (label, old[xml].get("mac") or old[xml]["ip"]),
                                 self.service.update, net, libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE, section, xml,
                                 live=True)
            for xml in [x for x in new if x not in old]:
                self.tracker.act("live add %s %s" % (label, new[xml].get("mac") or new[xml]["ip"]),
                                 self.service.update, net, libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, section, xml,
                                 live=True)

    def ensure_running_state(self, net: Optional[Any], before: Dict[str, Any]) -> None:
        active = net is not None and self.service.is_active(net)
        if self.params["state"] == "active" and not active:
            self.tracker.add("state", before["state"] if before["state"] != "absent" else "absent", "active")
            try:
                self.tracker.act("start", self.start_clearing_a_stale_bridge, net)
            except KvmError as err:
                if before["state"] != "absent" or self.check:
                    raise
                self.undo_define(net, err)
        elif before["state"] == "absent":
            self.tracker.add("state", "absent", "inactive")

    def start_clearing_a_stale_bridge(self, net: Any) -> None:
        """Start the network. A start that libvirtd did not finish (libvirtd killed in the middle)
        leaves the network's bridge (with or without its address) and its dnsmasq behind, and
        every later start fails: "error creating bridge interface NAME: File exists", "Network
        is already in use by interface NAME", or dnsmasq's "Address already in use". On such a
        failure the leftovers (_network_leftovers: only ever this network's own, or a dnsmasq
        whose network libvirt no longer has) are cleared, each reported, and the start is tried
        once more; anything else is left as it is and the failure reported."""
        try:
            self.service.start(net)
        except LibvirtCallError as err:
            if not self.local:
                raise
            leftovers = self.leftovers(net).blocking(str(err.details.get("libvirt_message")))
            if not leftovers:
                raise
            # What is cleared stays cleared: a failure from here on is a partial change, which
            # run() reports with the actions the tracker saw complete.
            for description, clear in leftovers + [("start again", lambda: self.service.start(net))]:
                self.tracker.act(description, clear)

    def undo_define(self, net: Any, err: KvmError) -> None:
        """A network this run defined and then failed to start is undefined again: a failed task
        leaves no half-made network behind. The failure says so, and changed says whether
        anything else this run did remains (a cleared leftover)."""
        name = self.params["name"]
        try:
            self.service.undefine(net)
        except KvmError as again:
            err.msg = ("%s; undefining network %s again (this run had defined it) failed too (%s): it stays "
                       "defined and inactive" % (err.msg, name, again.msg))
            err.details["undefined"] = False
            raise err
        remaining = [action for action in self.tracker.performed if action != "define"]
        details = {k: v for k, v in err.details.items() if k in ("libvirt_code", "libvirt_message", "libvirt_domain")}
        raise KvmError(
            "network %s did not start (%s). This run had defined it, and undefined it again: the network does not "
            "exist%s. Fix the cause and run again."
            % (name, err.msg, "; still done: %s" % "; ".join(remaining) if remaining else ", nothing was changed"),
            changed=bool(remaining), undefined=True, failed_action=self.tracker.failed_action,
            actions=self.tracker.performed + ["start (failed)", "undefine"], **details)

    def leftovers(self, net: Any) -> Leftovers:
        others = self.service.other_networks(net.name())
        own = X.attr(X.parse(self.service.xml(net, inactive=True)), "bridge", "name")
        return Leftovers(net.name(), own, others)  # its `ip` runs bounded (module_runner)

    def ensure_autostart(self, net: Optional[Any]) -> None:
        wanted = self.params["autostart"]
        if wanted is None:
            return
        current = self.service.autostart(net) if net is not None else False
        if self.tracker.add("autostart", current, wanted):
            self.tracker.act("autostart %s" % ("on" if wanted else "off"), self.service.set_autostart, net, wanted)


def argument_spec() -> Dict[str, Any]:
    """The network's own options come from FIELD_TABLE; these say what to do with it."""
    spec: Dict[str, Any] = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="active", choices=["active", "present", "absent"]),
        **option_specs(FIELD_TABLE),
        autostart=dict(type="bool"),
        restart=dict(type="bool", default=False),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


MUTUALLY_EXCLUSIVE = [("netmask", "prefix")]


def run_network(module: AnsibleModule, conn: Any, local: bool) -> Dict[str, Any]:
    """One network, on an open connection (mlinfra.kvm.network, and each item of mlinfra.kvm.networks),
    under the network's host lock (_host_lock)."""
    with local_object_lock(local, "network", module.params["name"]):
        return NetworkRunner(module, NetworkService(conn), local).run()


# -- resource list (mlinfra.kvm.networks) ------------------------------------------------------

def gather_networks(conn: Any) -> List[Dict[str, Any]]:
    """Every network as a networks item (the module's own input format): fed back, no change."""
    service = NetworkService(conn)

    def read(net: Any) -> Dict[str, Any]:
        spec = spec_from_xml(service.xml(net, inactive=True))
        item: Dict[str, Any] = {"name": net.name(), "state": "active" if service.is_active(net) else "present",
                                "autostart": service.autostart(net)}
        item.update({k: v for k, v in spec.items() if v is not None and v != []})
        return item

    return sorted(read_listed(service.list_all(), read), key=lambda i: i["name"])


def render_network(params: Dict[str, Any]) -> str:
    """The XML a networks item defines (a new network's; libvirt adds its UUID and MAC)."""
    return build_xml(params["name"], validated_request(params, local=False))


def precheck_network(params: Dict[str, Any]) -> None:
    """What needs neither libvirt nor the host: the runner checks the rest in the check pass."""
    validated_request(params, local=False)


LIST_KIND = ResourceKind("network", argument_spec(), MUTUALLY_EXCLUSIVE, run_network, gather_networks,
                         render_network, precheck_network, item_states=("active", "present"), delete_options=())
