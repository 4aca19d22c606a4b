# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
name: libvirt
short_description: libvirt domains of one or many hosts as an Ansible inventory
version_added: 0.1.0
description:
  - Lists the domains of one or more libvirt URIs as hosts.
  - C(ansible_host) comes from the DHCP leases of libvirt's networks, matched by MAC, so no guest
    agent is needed; domains without a lease have no C(ansible_host).
  - Groups come from the mlinfra metadata that M(mlinfra.kvm.domain) writes (option C(metadata)) -
    the value of each key in O(metadata_groups) becomes a group (C(role=trainer) puts the host in
    group C(trainer)), and a C(groups) key holds a comma-separated list of further groups.
    Every host also lands in C(libvirt) and C(libvirt_<state>).
  - "Host variables: C(libvirt_name), C(libvirt_uuid), C(libvirt_uri), C(libvirt_state),
    C(libvirt_state_reason) (libvirt's reason for the state, for example V(crashed) for a domain
    whose QEMU process ended without a shutdown), C(libvirt_vcpus), C(libvirt_memory_mib),
    C(libvirt_interfaces) and C(mlinfra_metadata)."
  - "Per URI the plugin makes one domain listing call, one statistics call for all domains' states,
    one DHCP lease call per network and one XML read per domain (metadata and MACs live only in the
    XML); nothing else per domain."
  - Supports O(keyed_groups), O(groups) and O(compose) (constructed) and inventory caching.
  - The inventory file name must end in C(libvirt.yml) or C(libvirt.yaml).
options:
  plugin:
    description: Marks this file as an inventory for this plugin.
    type: str
    required: true
    choices: [mlinfra.kvm.libvirt]
  uri:
    description: libvirt URIs to list; each domain is a host.
    type: list
    elements: str
    default: [qemu:///system]
  name_filter:
    description: A regular expression; only domains whose name matches (re.search) are listed.
    type: str
  include_inactive:
    description: Also list domains that are not running (they have no C(ansible_host)).
    type: bool
    default: true
  metadata_groups:
    description: Metadata keys whose values become group names.
    type: list
    elements: str
    default: [role]
extends_documentation_fragment:
  - constructed
  - inventory_cache
'''

EXAMPLES = r'''
# inventories/lab.libvirt.yml
plugin: mlinfra.kvm.libvirt
uri:
  - qemu:///system
  - qemu+ssh://root@gpu-host-2/system
name_filter: '^gpu-'
include_inactive: false
keyed_groups:
  - key: mlinfra_metadata.gpu | default('none')
    prefix: gpu
compose:
  ansible_user: "'debian'"
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: /tmp/mlinfra-libvirt-inventory
cache_timeout: 60
'''

import re
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

from ansible.errors import AnsibleError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable

try:
    import libvirt  # type: ignore
    HAS_LIBVIRT = True
except ImportError:  # pragma: no cover - depends on the controller
    libvirt = None  # type: ignore
    HAS_LIBVIRT = False

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_read import (
    first_ipv4, interfaces_with_addresses, read_sizes)
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import DomainService, state_name, state_reason
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_spec import read_metadata
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import parse
_GROUP_RE = re.compile(r"[^A-Za-z0-9_]")


def group_name(value: str) -> str:
    """A valid Ansible group name from a metadata value ('ml-trainer' -> 'ml_trainer')."""
    name = _GROUP_RE.sub("_", value.strip())
    return name if not name[:1].isdigit() else "_" + name


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "mlinfra.kvm.libvirt"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(("libvirt.yml", "libvirt.yaml"))

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        hosts: Optional[List[Dict[str, Any]]] = None
        if use_cache:
            try:
                hosts = self._cache[cache_key]
            except KeyError:
                update_cache = True
        if hosts is None:
            hosts = self.fetch()
        if update_cache:
            self._cache[cache_key] = hosts
        self.populate(hosts)

    # ------------------------------------------------------------------ libvirt
    def fetch(self) -> List[Dict[str, Any]]:
        if not HAS_LIBVIRT:
            raise AnsibleError("the mlinfra.kvm.libvirt inventory needs libvirt-python on the controller")
        pattern = re.compile(self.get_option("name_filter")) if self.get_option("name_filter") else None
        hosts: List[Dict[str, Any]] = []
        for uri in self.get_option("uri"):
            hosts.extend(self.fetch_uri(uri, pattern))
        return hosts

    def fetch_uri(self, uri: str, pattern: Any) -> List[Dict[str, Any]]:
        try:
            conn = libvirt.openReadOnly(uri)
        except libvirt.libvirtError as exc:
            raise AnsibleError("mlinfra.kvm.libvirt: cannot connect to %s: %s" % (uri, exc))
        try:
            flags = 0 if self.get_option("include_inactive") else libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
            # One call for all domains and their states.
            stats = conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE, flags)
            leases = DomainService(conn, uri).lease_map()
            out = []
            for dom, values in stats:
                name = dom.name()  # cached in the object: no round trip
                if pattern is not None and not pattern.search(name):
                    continue
                root = parse(dom.XMLDesc(0))
                state = state_name(values.get("state.state"))
                item = self.describe(uri, dom, root, state, leases)
                item["state_reason"] = state_reason(state, values.get("state.reason"))
                out.append(item)
            return out
        except (libvirt.libvirtError, KvmError) as exc:
            raise AnsibleError("mlinfra.kvm.libvirt: listing %s failed: %s" % (uri, exc))
        finally:
            conn.close()

    @staticmethod
    def describe(uri: str, dom: Any, root: Any, state: str, leases: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        interfaces = interfaces_with_addresses(root, leases)
        # Host variables keep their documented shape: each interface's IPv4 lease addresses as strings.
        plain = [dict(iface, ip_addresses=[ip["address"] for ip in iface["ip_addresses"] if ip["type"] == "ipv4"])
                 for iface in interfaces]
        return {"name": dom.name(), "uuid": dom.UUIDString(), "uri": uri, "state": state, **read_sizes(root),
                "interfaces": plain, "address": first_ipv4(interfaces), "metadata": read_metadata(root)}

    # ------------------------------------------------------------------ inventory
    def populate(self, hosts: List[Dict[str, Any]]) -> None:
        strict = self.get_option("strict")
        seen: Dict[str, str] = {}
        self.inventory.add_group("libvirt")
        for item in hosts:
            hostname = item["name"]
            if hostname in seen and seen[hostname] != item["uri"]:
                # The same name on two hosts: keep both, tell them apart by libvirt host.
                hostname = "%s_%s" % (hostname, group_name(urlparse(item["uri"]).hostname or "local"))
            seen[hostname] = item["uri"]
            self.inventory.add_host(hostname, group="libvirt")
            state_group = self.inventory.add_group("libvirt_%s" % item["state"])
            self.inventory.add_child(state_group, hostname)
            hostvars = {
                "libvirt_name": item["name"], "libvirt_uuid": item["uuid"], "libvirt_uri": item["uri"],
                "libvirt_state": item["state"], "libvirt_state_reason": item.get("state_reason", ""),
                "libvirt_vcpus": item["vcpus"],
                "libvirt_memory_mib": item["memory_mib"], "libvirt_interfaces": item["interfaces"],
                "mlinfra_metadata": item["metadata"],
            }
            if item["address"]:
                hostvars["ansible_host"] = item["address"]
            for key, value in hostvars.items():
                self.inventory.set_variable(hostname, key, value)
            for group in self.metadata_groups(item["metadata"]):
                self.inventory.add_child(self.inventory.add_group(group), hostname)
            self._set_composite_vars(self.get_option("compose"), hostvars, hostname, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, hostname, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, hostname, strict=strict)

    def metadata_groups(self, metadata: Dict[str, str]) -> List[str]:
        groups = [metadata[k] for k in self.get_option("metadata_groups") if metadata.get(k)]
        groups += [g for g in (metadata.get("groups") or "").split(",") if g.strip()]
        return [group_name(g) for g in groups]
