#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: domain_info
short_description: What an operator needs to see that libvirt domains are healthy
attributes:
  check_mode:
    support: full
  diff_mode:
    support: N/A
    details: Reads only; there is nothing to show a difference of.
  platform:
    platforms: posix
version_added: 0.1.0
description:
  - Reports one domain (O(name)) or all of them - state, vCPUs, memory, interfaces with MACs and
    IP addresses, disks, hostdevs, mlinfra metadata and statistics (CPU time, memory, block
    read/write bytes).
  - IP addresses come from the DHCP leases of libvirt's networks (no guest agent needed) and,
    when the guest agent's channel is connected, from the guest agent as well.
  - Statistics of all reported domains are read in one call; leases in one call per network.
options:
  name:
    description: Domain to report; all domains when not set.
    type: str
  guest_agent:
    description: Also ask the guest agent of running domains (when its channel is connected) for addresses.
    type: bool
    default: true
  stats:
    description: Include statistics (CPU time, memory, block I/O).
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.libvirt
notes:
  - Never changes anything; runs in check mode too.
seealso:
  - module: mlinfra.kvm.domain
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Is the worker healthy?
  mlinfra.kvm.domain_info:
    name: gpu-worker-1
  register: info

- name: Its address
  ansible.builtin.debug:
    msg: "{{ info.domains[0].interfaces[0].ip_addresses[0].address }}"

- name: Every domain of a remote host, without statistics
  mlinfra.kvm.domain_info:
    uri: qemu+ssh://root@gpu-host-1/system
    stats: false
'''

RETURN = r'''
exists:
  description: With O(name), whether that domain exists.
  returned: always
  type: bool
domains:
  description: The domains, sorted by name (empty when O(name) does not exist).
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Name., type: str}
    uuid: {description: UUID., type: str}
    state: {description: "V(running), V(paused), V(shutoff), ...", type: str}
    state_reason:
      description: >-
        Why the domain is in its state, as libvirt gives it: for V(shutoff) V(shutdown),
        V(destroyed), V(crashed) (its QEMU process ended without a shutdown), V(failed), ...; for
        V(paused) V(user), V(ioerror), ...; for V(running) V(booted), V(unpaused), ...
      type: str
    persistent: {description: Whether the domain is defined (not transient)., type: bool}
    autostart: {description: Whether it autostarts., type: bool}
    vcpus: {description: Current vCPUs (live when running)., type: int}
    max_vcpus: {description: Maximum vCPUs., type: int}
    memory_mib: {description: Current memory in MiB (balloon target when running)., type: int}
    max_memory_mib: {description: Maximum memory in MiB., type: int}
    interfaces:
      description: >-
        Interfaces with C(mac), C(network), C(bridge), C(model) and C(ip_addresses)
        (each with C(address), C(prefix), C(type), C(source) V(lease) or V(agent)).
      type: list
      elements: dict
    disks: {description: "Disks and cdroms (device, target, bus, format, pool, volume, path).", type: list, elements: dict}
    hostdevs: {description: "PCI hostdevs (address, managed).", type: list, elements: dict}
    metadata: {description: The mlinfra metadata key/values., type: dict}
    stats:
      description: "C(cpu_time_ns), C(memory_actual_kib), C(memory_rss_kib), C(block) (target, rd_bytes, wr_bytes); running domains only."
      type: dict
  sample:
    - name: gpu-worker-1
      state: running
      vcpus: 8
      memory_mib: 32768
      interfaces: [{mac: "52:54:00:3c:11:9a", network: ml, model: virtio,
                    ip_addresses: [{address: 192.168.100.23, prefix: 24, type: ipv4, source: lease}]}]
      stats: {cpu_time_ns: 1203000000, memory_actual_kib: 33554432, block: [{target: vda, rd_bytes: 1024, wr_bytes: 0}]}
'''

from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_read import (
    ACTIVE_STATES, interfaces_with_addresses, read_sizes)
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import DomainService, lease_map
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_spec import (
    hostdev_addresses, read_cdroms, read_disks, read_metadata)
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._libvirt import LIBVIRT_ARGSPEC, Connection, call, libvirt
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import object_name


class DomainInfoRunner:
    def __init__(self, module: AnsibleModule, service: DomainService) -> None:
        self.params = module.params
        self.service = service
        self.conn = service.conn

    def run(self) -> Dict[str, Any]:
        name = self.params.get("name")
        if name:
            dom = self.service.lookup(object_name("name", name))
            doms = [dom] if dom is not None else []
        else:
            doms = call("listing domains", self.conn.listAllDomains, 0)
        stats = self.all_stats(doms) if self.params["stats"] and doms else {}
        leases = lease_map(self.conn) if doms else {}
        out = [self.describe(dom, stats.get(dom.UUIDString(), {}), leases) for dom in doms]
        return {"changed": False, "exists": bool(doms) if name else bool(out),
                "domains": sorted(out, key=lambda d: d["name"])}

    def all_stats(self, doms: List[Any]) -> Dict[str, Dict[str, Any]]:
        """Statistics of all domains in one call (inactive domains report no values)."""
        wanted = (libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL
                  | libvirt.VIR_DOMAIN_STATS_BALLOON | libvirt.VIR_DOMAIN_STATS_BLOCK)
        found = call("reading domain statistics", self.conn.domainListGetStats, doms, wanted, 0)
        return {dom.UUIDString(): values for dom, values in found}

    def describe(self, dom: Any, raw: Dict[str, Any], leases: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        state, reason = self.service.state_and_reason(dom)
        active = state in ACTIVE_STATES
        # The live XML when running (hot-plugged devices, live vCPUs), the persistent otherwise.
        root = self.service.live_root(dom) if active else self.service.inactive_root(dom)
        agent: Dict[str, List[Dict[str, Any]]] = {}
        if active and self.params["guest_agent"]:
            for addr in self.service.agent_addresses(dom, root):
                agent.setdefault(addr["mac"], []).append(addr)
        interfaces = interfaces_with_addresses(root, leases, agent)
        disks = [dict(d, device="disk") for d in read_disks(root)] + \
                [dict(d, device="cdrom") for d in read_cdroms(root)]
        persistent = bool(call("reading %s" % dom.name(), dom.isPersistent))
        return {
            "name": dom.name(), "uuid": dom.UUIDString(), "state": state, "state_reason": reason,
            "persistent": persistent,
            "autostart": self.service.autostart(dom) if persistent else False,
            **read_sizes(root),
            "interfaces": interfaces, "disks": disks, "hostdevs": hostdev_addresses(root),
            "metadata": read_metadata(root),
            "stats": self.stats(raw) if active and self.params["stats"] else {},
        }

    @staticmethod
    def stats(raw: Dict[str, Any]) -> Dict[str, Any]:
        blocks = []
        for index in range(int(raw.get("block.count", 0))):
            key = "block.%d." % index
            blocks.append({"target": raw.get(key + "name"), "rd_bytes": raw.get(key + "rd.bytes", 0),
                           "wr_bytes": raw.get(key + "wr.bytes", 0)})
        return {"cpu_time_ns": raw.get("cpu.time"), "memory_actual_kib": raw.get("balloon.current"),
                "memory_rss_kib": raw.get("balloon.rss"), "block": blocks}


def main() -> None:
    spec = dict(name=dict(type="str"), guest_agent=dict(type="bool", default=True),
                stats=dict(type="bool", default=True))
    spec.update(LIBVIRT_ARGSPEC)
    module = new_module(AnsibleModule, argument_spec=spec, supports_check_mode=True)
    fail_without_lxml(module)

    def runner() -> Dict[str, Any]:
        # Read-write: the persistent XML with SECURE is not offered to read-only connections.
        with Connection(module.params["uri"]) as connection:
            service = DomainService(connection.conn, connection.uri)
            return DomainInfoRunner(module, service).run()

    run(module, runner)


if __name__ == "__main__":
    main()
