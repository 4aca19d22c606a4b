#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: networks
short_description: A hypervisor's libvirt networks as one list (merged, replaced, overridden, deleted, gathered, rendered)
version_added: 0.3.0
description:
  - Declares many networks in one module call, with the states of Ansible's network resource
    modules. Each item goes through the same validation, guards, check mode and diff as
    M(mlinfra.kvm.network), on one libvirt connection and in one module process (a loop over
    M(mlinfra.kvm.network) starts one process per item).
options:
  config:
    description:
      - The networks, each with the options of M(mlinfra.kvm.network) (but O(state) and O(uri)).
      - "An option an item does not set: O(state=merged) keeps the existing object's value;
        O(state=replaced) and O(state=overridden) use M(mlinfra.kvm.network)'s default (so a
        field set earlier goes back to it)."
    type: list
    elements: dict
    # BEGIN generated config suboptions
    suboptions:
      name:
        description:
        - Network name - at most 64 letters, digits, C(.), C(_), C(+), C(-), starting with a letter or digit
          (it becomes libvirt's and dnsmasq's file names); checked before anything else.
        type: str
        required: true
      state:
        description:
        - V(active) defines and starts the object, V(present) defines it without changing whether it runs.
        - V(absent) removes it, with the same guards as M(mlinfra.kvm.network), whatever the list's O(state)
          (with O(state=deleted) every listed object is removed).
        - 'When the item does not set it: V(active) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - active
        - present
        - absent
      mode:
        description:
        - V(nat) - guests reach outside through NAT on the host.
        - V(route) - routed to the host's network, no NAT.
        - V(isolated) - guests and host only.
        - V(bridge) - guests join an existing host bridge (O(config[].bridge)); libvirt manages no addresses
          for it.
        - 'When the item does not set it: V(nat) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: str
        choices:
        - nat
        - route
        - isolated
        - bridge
      bridge:
        description:
        - Bridge device name. For V(bridge) mode, an existing host bridge (required).
        - For the other modes, the bridge libvirt creates; libvirt picks C(virbrN) when not set.
        - A Linux interface name - at most 15 letters, digits, C(.), C(_), C(+), C(-).
        type: str
      forward_dev:
        description:
        - Host interface that NAT or routed traffic leaves through (at most 15 characters).
        type: str
      domain:
        description:
        - DNS domain of the network; guests' names resolve as C(name.domain).
        - Labels of letters, digits and C(-), 1-63 characters each, 253 in all.
        type: str
      mtu:
        description:
        - MTU of the bridge, from 68 (IPv4's minimum) to 65535 (a Linux bridge's maximum).
        type: int
      address:
        description:
        - IPv4 address of the host on the network (the guests' gateway).
        type: str
      netmask:
        description:
        - IPv4 netmask, dotted, from V(255.0.0.0) to V(255.255.255.252). Use this or O(config[].prefix).
        type: str
      prefix:
        description:
        - IPv4 prefix length, from 8 to 30 (V(24) when not set). Use this or O(config[].netmask).
        type: int
      dhcp_range:
        description:
        - DHCP address range; both ends must lie inside the network.
        type: dict
        suboptions:
          start:
            description:
            - First address.
            type: str
            required: true
          end:
            description:
            - Last address.
            type: str
            required: true
      hosts:
        description:
        - Static DHCP host entries. When given, this is the complete list; entries not listed are removed.
          Changed live on an active network.
        type: list
        elements: dict
        suboptions:
          mac:
            description:
            - MAC address of the guest interface.
            type: str
            required: true
          ip:
            description:
            - Address to hand out; inside the network.
            type: str
            required: true
          name:
            description:
            - Host name handed out with the lease.
            type: str
      dns_hosts:
        description:
        - DNS host entries (like /etc/hosts lines). When given, this is the complete list. Changed live on
          an active network.
        type: list
        elements: dict
        suboptions:
          ip:
            description:
            - Address.
            type: str
            required: true
          hostnames:
            description:
            - Names for it (non-empty, at most 253 characters, no empty labels).
            type: list
            elements: str
            required: true
      autostart:
        description:
        - Start the network when libvirtd starts. Left as it is when not set.
        type: bool
      restart:
        description:
        - Restart an active network when a change needs it (see RV(mlinfra.kvm.network#module:restart_required)).
        - Running guests lose connectivity until their interfaces are reattached.
        - Before anything is stopped (or redefined), the new definition is checked to be able to start; the
          restart is refused, with nothing changed, when its subnet overlaps an active libvirt network or
          an address of a host interface, when its bridge name belongs to another libvirt network or is an
          existing host interface, or when its DHCP range is not inside the subnet (or holds the host address).
          Check mode reports the same refusal.
        - When the new definition still fails to start after the stop, the definition that was running is
          restored and started again, and the task fails with libvirt's message, C(changed=true) and C(restored=true).
        - 'When the item does not set it: V(false) (replaced, overridden, and a new object in merged; merged
          keeps an existing object''s value).'
        type: bool
    # END generated config suboptions
notes:
  - Every network the list starts is checked as M(mlinfra.kvm.network) checks it (its subnet
    against active networks, host interfaces and host routes; its bridge against other networks
    and host interfaces), in the check pass that runs before anything changes, against libvirt's
    networks as the earlier items of the list leave them. Two items that could not run together
    (overlapping subnets, one bridge) so fail the whole call before either is defined; an item
    removed earlier in the list frees its subnet and bridge for a later one.
  - When an item's new network still fails to start, its definition is undefined again; the
    failure reports the items done before it (C(objects), C(changed=true) when any changed).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt
  - mlinfra.kvm.libvirt.host_lock
  - mlinfra.kvm.resource_list
seealso:
  - module: mlinfra.kvm.network
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: The lab's networks, one call
  mlinfra.kvm.networks:
    config:
      - name: mlinfra-lab
        address: 192.168.150.1
        prefix: 24
        dhcp_range: {start: 192.168.150.100, end: 192.168.150.250}
        autostart: true
      - name: mlinfra-storage
        mode: isolated
        address: 10.77.0.1
        prefix: 24

- name: Exactly these networks among those named mlinfra-* (the others are stopped and removed)
  mlinfra.kvm.networks:
    state: overridden
    scope: {name_prefix: mlinfra-}
    config:
      - {name: mlinfra-lab, address: 192.168.150.1, prefix: 24}

- name: The host's networks as an inventory to start from
  mlinfra.kvm.networks:
    state: gathered
  register: found
'''

RETURN = r'''
objects:
  description:
    - Per network, keyed by name, what M(mlinfra.kvm.network) would return for it (without its XML
      and diff) - C(changed), C(actions), C(network), C(restart_required), C(pending).
    - Named C(objects), not C(results), which Ansible keeps for the results of a loop.
  returned: unless state is gathered or rendered
  type: dict
  sample: {"mlinfra-lab": {"changed": false, "actions": [], "restart_required": false, "pending": []}}
actions:
  description: "Every action taken (or, in check mode, that would be), as C(<name>: <action>)."
  returned: unless state is gathered or rendered
  type: list
  elements: str
gathered:
  description: The networks on the host (in O(scope) if set) as O(config) items.
  returned: when state is gathered
  type: list
  elements: dict
rendered:
  description: Per item, keyed by name, the XML it defines.
  returned: when state is rendered
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._network import LIST_KIND
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import list_argument_spec, run_list


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=list_argument_spec(LIST_KIND), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_list(module, LIST_KIND))


if __name__ == "__main__":
    main()
