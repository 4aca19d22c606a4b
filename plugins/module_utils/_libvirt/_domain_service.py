# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The only code of the domain modules that talks to libvirt (and, through the PCI
sources, to sysfs). Runners decide; this class performs."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._domain_pci import NodeDevPci, SysfsPci
from ._domain_read import ACTIVE_STATES
from ._domain_spec import GUEST_AGENT_CHANNEL, MLINFRA_NS, MLINFRA_PREFIX, hostdev_addresses, metadata_element
from .._core._errors import KvmError
from ._connection import call, libvirt, lookup
from ._storage_paths import StoragePolicy
from ._uri import is_local
from .._core._xml import etree, parse, to_string

STATE_NAMES = {0: "nostate", 1: "running", 2: "blocked", 3: "paused", 4: "shutdown",
               5: "shutoff", 6: "crashed", 7: "pmsuspended"}


# Why a domain is in its state (the reason libvirt gives with it: virDomainShutoffReason,
# virDomainPausedReason, virDomainRunningReason, virDomainCrashedReason), by state name.
STATE_REASONS = {
    "shutoff": {0: "unknown", 1: "shutdown", 2: "destroyed", 3: "crashed", 4: "migrated", 5: "saved",
                6: "failed", 7: "from_snapshot", 8: "daemon"},
    "paused": {0: "unknown", 1: "user", 2: "migration", 3: "save", 4: "dump", 5: "ioerror", 6: "watchdog",
               7: "from_snapshot", 8: "shutting_down", 9: "snapshot", 10: "crashed", 11: "starting_up",
               12: "postcopy", 13: "postcopy_failed"},
    "running": {0: "unknown", 1: "booted", 2: "migrated", 3: "restored", 4: "from_snapshot", 5: "unpaused",
                6: "migration_canceled", 7: "save_canceled", 8: "wakeup", 9: "crashed", 10: "postcopy",
                11: "postcopy_failed"},
    "crashed": {0: "unknown", 1: "panicked"},
}
# (state, reason) pairs that mean the guest did not get there by anyone's request: what an
# operator must hear about even when the module puts the domain back as asked.
UNEXPECTED_REASONS = {
    ("shutoff", "crashed"): "its QEMU process ended without a shutdown (killed, or QEMU failed)",
    ("shutoff", "failed"): "libvirt failed to start or restore it",
    ("crashed", "panicked"): "the guest kernel panicked",
    ("crashed", "unknown"): "the guest crashed",
    ("paused", "ioerror"): "a disk I/O error paused it (a full or failed storage pool?)",
    ("paused", "watchdog"): "its watchdog fired",
    ("paused", "crashed"): "the guest crashed",
}


def state_name(code: int) -> str:
    return STATE_NAMES.get(code, "unknown")


def state_reason(state: str, code: Optional[int]) -> str:
    """The reason's name for a state name and libvirt's reason code ('' when none is known)."""
    return STATE_REASONS.get(state, {}).get(code, "") if code is not None else ""


def unexpected_reason(dom_name: str, state: str, reason: str) -> str:
    """A sentence for a state that nobody asked for (empty when the state is an ordinary one)."""
    why = UNEXPECTED_REASONS.get((state, reason))
    if not why:
        return ""
    return ("domain %s was found %s (%s): %s; libvirt's log of it is /var/log/libvirt/qemu/%s.log "
            "on the hypervisor" % (dom_name, state, reason, why, dom_name))


class DomainService:
    def __init__(self, conn: Any, uri: str, sysfs_root: str = "/sys",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.conn = conn
        self.uri = uri
        self.sysfs_root = sysfs_root
        self.sleep = sleep
        self._pci: Any = None
        self._host: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ lookups
    def lookup(self, name: str) -> Any:
        return lookup("looking up domain %s" % name, self.conn.lookupByName, name,
                      (libvirt.VIR_ERR_NO_DOMAIN,))

    def list_all(self) -> List[Any]:
        return call("listing domains", self.conn.listAllDomains, 0)

    def inactive_root(self, dom: Any, secure: bool = True) -> Any:
        # SECURE keeps secrets (e.g. VNC passwords) that a redefinition must not lose; a
        # gathered domains item asks without it (secure=False).
        flags = libvirt.VIR_DOMAIN_XML_INACTIVE | (libvirt.VIR_DOMAIN_XML_SECURE if secure else 0)
        return parse(call("reading the inactive XML of %s" % dom.name(), dom.XMLDesc, flags))

    def live_root(self, dom: Any) -> Any:
        return parse(call("reading the XML of %s" % dom.name(), dom.XMLDesc, 0))

    def state(self, dom: Any) -> str:
        return self.state_and_reason(dom)[0]

    def state_and_reason(self, dom: Any) -> Tuple[str, str]:
        code, reason = call("reading the state of %s" % dom.name(), dom.state)[:2]
        name = state_name(code)
        return name, state_reason(name, reason)

    def is_active(self, dom: Any) -> bool:
        return bool(call("reading the state of %s" % dom.name(), dom.isActive))

    def autostart(self, dom: Any) -> bool:
        return bool(call("reading autostart of %s" % dom.name(), dom.autostart))

    @staticmethod
    def autostart_uncaught(dom: Any) -> bool:
        """autostart without call(), as the domains list's gathered read has always asked it: a
        libvirtError goes up as libvirt raised it (read_listed skips a domain that vanished)."""
        return bool(dom.autostart())

    def is_persistent(self, dom: Any) -> bool:
        return bool(call("reading %s" % dom.name(), dom.isPersistent))

    def stats(self, doms: List[Any]) -> List[Tuple[Any, Dict[str, Any]]]:
        """(domain, statistics) of all ``doms`` in one call: state, CPU time, balloon, block
        devices (inactive domains report no values)."""
        wanted = (libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL
                  | libvirt.VIR_DOMAIN_STATS_BALLOON | libvirt.VIR_DOMAIN_STATS_BLOCK)
        return call("reading domain statistics", self.conn.domainListGetStats, doms, wanted, 0)

    def kvm_available(self) -> bool:
        try:
            self.conn.getDomainCapabilities(None, "x86_64", None, "kvm", 0)
            return True
        except libvirt.libvirtError:
            return False

    def host_limits(self) -> Dict[str, Any]:
        """The hypervisor's memory (KiB) and CPU count as libvirt reports them for this
        connection (the remote host's for a remote URI, the fake node of test:///): what a
        domain's memory and CPU pinning must fit into. Read once per run."""
        if self._host is None:
            info = call("reading the node info of %s" % self.uri, self.conn.getInfo)
            try:
                # The CPU map counts every CPU index the host has (offline ones too): the
                # indexes a cpuset may name.
                cpus = int(self.conn.getCPUMap(0)[0])
            except libvirt.libvirtError:
                cpus = int(info[2])
            self._host = {"memory_kib": int(info[1]) * 1024, "cpus": cpus, "uri": self.uri}
        return self._host

    def network_exists(self, name: str) -> bool:
        return lookup("looking up network %s" % name, self.conn.networkLookupByName, name,
                      (libvirt.VIR_ERR_NO_NETWORK,)) is not None

    def pool_exists(self, name: str) -> bool:
        return lookup("looking up storage pool %s" % name, self.conn.storagePoolLookupByName, name,
                      (libvirt.VIR_ERR_NO_STORAGE_POOL,)) is not None

    def volume_format(self, pool_name: str, volume: str) -> Optional[str]:
        """The format of a pool volume; None when the volume does not exist."""
        pool = self.conn.storagePoolLookupByName(pool_name)
        if not pool.isActive():
            return None
        vol = lookup("looking up volume %s in pool %s" % (volume, pool_name),
                     pool.storageVolLookupByName, volume, (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        if vol is None:
            return None
        root = parse(call("reading volume %s" % volume, vol.XMLDesc, 0))
        fmt = root.find("target/format")
        return fmt.get("type") if fmt is not None else "raw"

    def path_exists(self, path: str) -> Optional[bool]:
        """Whether a file exists; None when libvirt is remote and the module cannot tell."""
        if not is_local(self.uri):
            return None
        return os.path.exists(path)

    def storage_policy(self, allowed_paths: Any) -> StoragePolicy:
        """Where a disk image may lie on this host: its storage pools, plus allowed_paths."""
        return StoragePolicy.of_host(self.conn, allowed_paths, is_local(self.uri))

    def pci(self) -> Any:
        """The PCI source: sysfs for local URIs (the test seam), libvirt's nodedev API otherwise."""
        if self._pci is None:
            self._pci = SysfsPci(self.sysfs_root) if is_local(self.uri) else NodeDevPci(self.conn)
        return self._pci

    def share_pci(self, source: Any) -> None:
        """Use a PCI source another item of the same list call has read (it keeps its scan)."""
        self._pci = source

    def hostdevs_in_use(self, exclude_uuid: Optional[str]) -> Dict[str, str]:
        """PCI address -> name of the *running* domain (other than ours) that holds it."""
        used: Dict[str, str] = {}
        for dom in call("listing running domains", self.conn.listAllDomains,
                        libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            if exclude_uuid and dom.UUIDString() == exclude_uuid:
                continue
            root = parse(call("reading the XML of %s" % dom.name(), dom.XMLDesc, 0))
            for item in hostdev_addresses(root):
                used[item["address"]] = dom.name()
        return used

    # ------------------------------------------------------------------ changes
    def define(self, root: Any) -> Any:
        dom = call("defining domain %s" % root.findtext("name"), self.conn.defineXML,
                   to_string(root))
        return dom

    def undefine(self, dom: Any) -> None:
        flags = (libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                 | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                 | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
        call("undefining %s" % dom.name(), dom.undefineFlags, flags)

    def set_autostart(self, dom: Any, value: bool) -> None:
        call("setting autostart of %s" % dom.name(), dom.setAutostart, 1 if value else 0)

    def start(self, dom: Any, paused: bool = False) -> None:
        flags = libvirt.VIR_DOMAIN_START_PAUSED if paused else 0
        call("starting %s" % dom.name(), dom.createWithFlags, flags)

    def resume(self, dom: Any) -> None:
        call("resuming %s" % dom.name(), dom.resume)

    def suspend(self, dom: Any) -> None:
        call("pausing %s" % dom.name(), dom.suspend)

    def destroy(self, dom: Any) -> None:
        call("forcing %s off" % dom.name(), dom.destroy)

    def request_shutdown(self, dom: Any) -> None:
        call("asking %s to shut down" % dom.name(), dom.shutdown)

    def wait_shutoff(self, dom: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_active(dom):
                return True
            if time.monotonic() >= deadline:
                return False
            self.sleep(0.5)

    @staticmethod
    def live_flags() -> int:
        return libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG

    def set_vcpus(self, dom: Any, count: int) -> None:
        call("setting %d vCPUs on %s" % (count, dom.name()), dom.setVcpusFlags, count,
             self.live_flags())

    def set_memory(self, dom: Any, kib: int) -> None:
        call("setting the memory of %s to %d KiB" % (dom.name(), kib), dom.setMemoryFlags, kib,
             self.live_flags())

    def attach(self, dom: Any, el: Any) -> None:
        call("attaching a device to %s" % dom.name(), dom.attachDeviceFlags, to_string(el),
             self.live_flags())

    def detach(self, dom: Any, el: Any) -> None:
        call("detaching a device from %s" % dom.name(), dom.detachDeviceFlags, to_string(el),
             self.live_flags())

    def set_metadata(self, dom: Any, value: Dict[str, str], live: bool) -> None:
        flags = self.live_flags() if live else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        # libvirt puts the element into the namespace itself; an element that already
        # declares it makes libvirt fail with "failed to create a new XML namespace".
        xml = None
        if value:
            plain = etree.Element("vm")
            for child in metadata_element(value):
                etree.SubElement(plain, child.tag).text = child.text
            xml = etree.tostring(plain, encoding="unicode")
        call("setting the metadata of %s" % dom.name(), dom.setMetadata,
             libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, MLINFRA_PREFIX if value else None,
             MLINFRA_NS, flags)

    def set_description(self, dom: Any, value: Optional[str], live: bool) -> None:
        flags = self.live_flags() if live else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        call("setting the description of %s" % dom.name(), dom.setMetadata,
             libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, value or None, None, None, flags)

    # ------------------------------------------------------------------ addresses
    def lease_addresses(self, dom: Any) -> List[Dict[str, str]]:
        """Addresses from the networks' DHCP leases (needs no guest agent)."""
        try:
            found = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
        except libvirt.libvirtError:
            return []
        return _flatten_addresses(found, "lease")

    def agent_addresses(self, dom: Any, live_root: Any) -> List[Dict[str, str]]:
        """Addresses from the guest agent, only when its channel is connected (else libvirt
        would wait for an agent that is not there)."""
        connected = any(t.get("name") == GUEST_AGENT_CHANNEL and t.get("state") == "connected"
                        for t in live_root.findall("devices/channel/target"))
        if not connected:
            return []
        try:
            found = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
        except libvirt.libvirtError:
            return []
        return [a for a in _flatten_addresses(found, "agent") if a["name"] != "lo"]

    def lease_ipv4(self, dom: Any) -> List[Dict[str, str]]:
        """The IPv4 addresses of the domain's DHCP leases, as they are now (no wait)."""
        return [a for a in self.lease_addresses(dom) if a["type"] == "ipv4"]

    def wait_for_ip(self, dom: Any, timeout: float) -> List[Dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.lease_ipv4(dom)
            if found:
                return found
            self._fail_if_stopped_while_waiting(dom)
            if time.monotonic() >= deadline:
                raise KvmError("domain %s got no IPv4 address from its networks' DHCP leases within "
                               "%s s (option wait_for_ip_timeout); check that the guest boots and "
                               "runs a DHCP client" % (dom.name(), timeout), name=dom.name())
            self.sleep(1.0)

    def _fail_if_stopped_while_waiting(self, dom: Any) -> None:
        """A domain that stopped (its QEMU crashed, the guest powered off) will get no address:
        say so now rather than after wait_for_ip_timeout."""
        state, reason = self.state_and_reason(dom)
        if state in ACTIVE_STATES:
            return
        why = unexpected_reason(dom.name(), state, reason) or (
            "domain %s is %s%s" % (dom.name(), state, " (%s)" % reason if reason else ""))
        again = "; running the task again starts it again" if state == "shutoff" else ""
        raise KvmError("domain %s stopped while waiting for its IPv4 address (option wait_for_ip): %s%s"
                       % (dom.name(), why, again), name=dom.name())

    def lease_map(self) -> Dict[str, List[Dict[str, Any]]]:
        """MAC -> DHCP leases over every active network: one call per network, however many
        domains there are (the inventory plugin and domain_info both rely on that)."""
        leases: Dict[str, List[Dict[str, Any]]] = {}
        for net in call("listing active networks", self.conn.listAllNetworks,
                        libvirt.VIR_CONNECT_LIST_NETWORKS_ACTIVE):
            try:
                found = net.DHCPLeases()
            except libvirt.libvirtError:  # a network without DHCP has no leases to give
                continue
            for lease in found or []:
                mac = (lease.get("mac") or "").lower()
                leases.setdefault(mac, []).append({
                    "address": lease.get("ipaddr"), "prefix": lease.get("prefix"),
                    "type": "ipv4" if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 else "ipv6",
                    "hostname": lease.get("hostname"), "network": net.name(), "source": "lease"})
        return leases


def _flatten_addresses(found: Dict[str, Any], source: str) -> List[Dict[str, str]]:
    out = []
    for ifname, data in (found or {}).items():
        for addr in data.get("addrs") or []:
            kind = "ipv4" if addr.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 else "ipv6"
            out.append({"name": ifname, "mac": (data.get("hwaddr") or "").lower(),
                        "address": addr.get("addr"), "prefix": addr.get("prefix"),
                        "type": kind, "source": source})
    return out
