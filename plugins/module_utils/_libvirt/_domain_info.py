# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The domain_info report: one domain or all, with addresses, disks, metadata and statistics.

domain_info changes nothing, so this is a reader, not an ObjectRunner: it reads through
:class:`._domain_service.DomainService` (the only code talking to libvirt for domains) and puts
the parts together with the read model of ``_domain_read``, the one that ``domain`` and the
inventory plugin report too. Check mode and a real run give the same answer.

Calls are batched because a host can have many domains: the statistics of all reported domains
come from one call, the DHCP leases from one call per network.
"""
from __future__ import annotations

from typing import Any, Dict, List

from .._core._validate import object_name
from ._domain_read import ACTIVE_STATES, interfaces_with_addresses, read_sizes
from ._domain_service import DomainService
from ._domain_spec import hostdev_addresses, read_cdroms, read_disks, read_metadata
from ._connection import LIBVIRT_ARGSPEC, Connection


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(name=dict(type="str"), guest_agent=dict(type="bool", default=True),
                                stats=dict(type="bool", default=True))
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_domain_info(module: Any) -> Dict[str, Any]:
    # Read-write: the persistent XML with SECURE is not offered to read-only connections.
    with Connection(module.params["uri"]) as connection:
        service = DomainService(connection.conn, connection.uri)
        return DomainInfoReader(module.params, service).run()


class DomainInfoReader:
    def __init__(self, params: Dict[str, Any], service: DomainService) -> None:
        self.params = params
        self.service = service

    def run(self) -> Dict[str, Any]:
        name = self.params.get("name")
        if name:
            dom = self.service.lookup(object_name("name", name))
            doms = [dom] if dom is not None else []
        else:
            doms = self.service.list_all()
        stats = self.all_stats(doms) if self.params["stats"] and doms else {}
        leases = self.service.lease_map() if doms else {}
        out = [self.describe(dom, stats.get(dom.UUIDString(), {}), leases) for dom in doms]
        return {"changed": False, "exists": bool(doms) if name else bool(out),
                "domains": sorted(out, key=lambda d: d["name"])}

    def all_stats(self, doms: List[Any]) -> Dict[str, Dict[str, Any]]:
        """Statistics of all domains in one call (inactive domains report no values)."""
        return {dom.UUIDString(): values for dom, values in self.service.stats(doms)}

    def describe(self, dom: Any, raw: Dict[str, Any], leases: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        state, reason = self.service.state_and_reason(dom)
        active = state in ACTIVE_STATES
        # The live XML when running (hot-plugged devices, live vCPUs), the persistent otherwise.
        root = self.service.live_root(dom) if active else self.service.inactive_root(dom)
        interfaces = interfaces_with_addresses(root, leases, self.agent_addresses(dom, root, active))
        disks = [dict(d, device="disk") for d in read_disks(root)] + \
                [dict(d, device="cdrom") for d in read_cdroms(root)]
        persistent = self.service.is_persistent(dom)
        return {
            "name": dom.name(), "uuid": dom.UUIDString(), "state": state, "state_reason": reason,
            "persistent": persistent,
            "autostart": self.service.autostart(dom) if persistent else False,
            **read_sizes(root),
            "interfaces": interfaces, "disks": disks, "hostdevs": hostdev_addresses(root),
            "metadata": read_metadata(root),
            "stats": stats_report(raw) if active and self.params["stats"] else {},
        }

    def agent_addresses(self, dom: Any, root: Any, active: bool) -> Dict[str, List[Dict[str, Any]]]:
        """What the guest agent reports, keyed by MAC (asked only of a running domain, when wanted)."""
        agent: Dict[str, List[Dict[str, Any]]] = {}
        if active and self.params["guest_agent"]:
            for addr in self.service.agent_addresses(dom, root):
                agent.setdefault(addr["mac"], []).append(addr)
        return agent


def stats_report(raw: Dict[str, Any]) -> Dict[str, Any]:
    """libvirt's flat statistics keys (``block.0.rd.bytes``) as the report's nested form."""
    blocks = []
    for index in range(int(raw.get("block.count", 0))):
        key = "block.%d." % index
        blocks.append({"target": raw.get(key + "name"), "rd_bytes": raw.get(key + "rd.bytes", 0),
                       "wr_bytes": raw.get(key + "wr.bytes", 0)})
    return {"cpu_time_ns": raw.get("cpu.time"), "memory_actual_kib": raw.get("balloon.current"),
            "memory_rss_kib": raw.get("balloon.rss"), "block": blocks}
