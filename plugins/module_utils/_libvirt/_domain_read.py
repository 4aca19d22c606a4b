# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one read model of a domain, as ``domain`` (its result), ``domain_info`` and the
``mlinfra.kvm.libvirt`` inventory plugin report it: which states count as active, the sizes
(vCPUs, MiB) and the interfaces with their addresses.

State names and the DHCP lease map come from ``_domain_service`` (``state_name``,
``state_reason``, ``DomainService.lease_map``), the XML readers from ``_domain_spec``; this module only puts
them together, so the three reports cannot drift apart."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ._domain_spec import read_interfaces, read_max_memory, read_max_vcpus, read_memory, read_vcpus

# States in which the domain has a QEMU process (its live XML, statistics and agent exist).
ACTIVE_STATES = ("running", "paused", "blocked", "pmsuspended")
ADDRESS_KEYS = ("address", "prefix", "type", "source")


def sizes(values: Mapping[str, Any]) -> Dict[str, Any]:
    """vCPUs and memory in MiB from field values (``vcpus``, ``max_vcpus``, ``memory_kib``,
    ``max_memory_kib``), which a check-mode prediction has as well as a read."""
    return {"vcpus": values.get("vcpus"), "max_vcpus": values.get("max_vcpus"),
            "memory_mib": (values.get("memory_kib") or 0) // 1024,
            "max_memory_mib": (values.get("max_memory_kib") or 0) // 1024}


def read_sizes(root: Any) -> Dict[str, Any]:
    return sizes({"vcpus": read_vcpus(root), "max_vcpus": read_max_vcpus(root),
                  "memory_kib": read_memory(root), "max_memory_kib": read_max_memory(root)})


def interfaces_with_addresses(root: Any, leases: Mapping[str, List[Dict[str, Any]]],
                              agent: Optional[Mapping[str, List[Dict[str, Any]]]] = None) -> List[Dict[str, Any]]:
    """Each interface of the XML with ``ip_addresses``: its DHCP leases first, then what the
    guest agent reports besides (both keyed by MAC)."""
    out = []
    for iface in read_interfaces(root):
        mac = iface["mac"] or ""
        ips = [{k: lease[k] for k in ADDRESS_KEYS} for lease in leases.get(mac, [])]
        seen = {ip["address"] for ip in ips}
        ips += [{k: a[k] for k in ADDRESS_KEYS} for a in (agent or {}).get(mac, []) if a["address"] not in seen]
        out.append(dict(iface, ip_addresses=ips))
    return out


def first_ipv4(interfaces: List[Dict[str, Any]]) -> Optional[str]:
    """The address to reach the domain at: the first IPv4 address of the first interface with one."""
    for iface in interfaces:
        for ip in iface["ip_addresses"]:
            if ip["type"] == "ipv4":
                return ip["address"]
    return None
