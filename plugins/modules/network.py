#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: network
short_description: Declarative libvirt virtual networks (NAT, routed, isolated, bridged)
version_added: 0.1.0
description:
  - Defines, starts, autostarts and removes libvirt networks from structured options.
  - "Numeric options are bounded (ranges below) and free-text options refuse control characters
    (C(0x00)-C(0x1f), C(0x7f)); bad input fails naming the option, the value and the fix, before
    anything changes."
  - Compares the request with the network's persistent definition over the fields that were
    set and acts only on the difference.
  - Changes to static DHCP hosts and DNS host entries of an active network are applied live
    and to the persistent definition with libvirt's network update API; the network keeps
    running and guests keep their connectivity.
  - Any other change to an active network (mode, bridge, forward device, domain, MTU, address, prefix,
    DHCP range) is written to the persistent definition and reported with RV(restart_required=true); the
    running network is restarted only with O(restart=true), because a restart cuts running
    guests off the network until their interfaces are reattached.
options:
  name:
    description:
      - Network name - at most 64 letters, digits, C(.), C(_), C(+), C(-), starting with a letter or
        digit (it becomes libvirt's and dnsmasq's file names); checked before anything else.
    type: str
    required: true
  state:
    description:
      - V(active) defines and starts the network. V(present) defines it without changing
        whether it runs. V(absent) stops and undefines it.
      - Before a network is started (a new one, or an inactive one), it is checked to be able to
        start; the run is refused, with nothing defined or changed, when its subnet overlaps an
        active libvirt network, an address of a host interface or a route of the host
        (C(ip -4 route)), or when its bridge name belongs to another libvirt network or is an
        existing host interface. Check mode reports the same refusal.
      - When a new network's start still fails, the definition this run made is undefined again
        and the task fails with libvirt's message and C(undefined=true).
    type: str
    choices: [active, present, absent]
    default: active
  mode:
    description:
      - V(nat) - guests reach outside through NAT on the host.
      - V(route) - routed to the host's network, no NAT.
      - V(isolated) - guests and host only.
      - V(bridge) - guests join an existing host bridge (O(bridge)); libvirt manages no
        addresses for it.
    type: str
    choices: [nat, route, isolated, bridge]
    default: nat
  bridge:
    description:
      - Bridge device name. For V(bridge) mode, an existing host bridge (required).
      - For the other modes, the bridge libvirt creates; libvirt picks C(virbrN) when not set.
      - A Linux interface name - at most 15 letters, digits, C(.), C(_), C(+), C(-).
    type: str
  forward_dev:
    description: Host interface that NAT or routed traffic leaves through (at most 15 characters).
    type: str
  domain:
    description:
      - DNS domain of the network; guests' names resolve as C(name.domain).
      - Labels of letters, digits and C(-), 1-63 characters each, 253 in all.
    type: str
  mtu:
    description: MTU of the bridge, from 68 (IPv4's minimum) to 65535 (a Linux bridge's maximum).
    type: int
  address:
    description: IPv4 address of the host on the network (the guests' gateway).
    type: str
  netmask:
    description: IPv4 netmask, dotted, from V(255.0.0.0) to V(255.255.255.252). Use this or O(prefix).
    type: str
  prefix:
    description: IPv4 prefix length, from 8 to 30 (V(24) when not set). Use this or O(netmask).
    type: int
  dhcp_range:
    description: DHCP address range; both ends must lie inside the network.
    type: dict
    suboptions:
      start: {description: First address., type: str, required: true}
      end: {description: Last address., type: str, required: true}
  hosts:
    description:
      - Static DHCP host entries. When given, this is the complete list; entries not listed
        are removed. Changed live on an active network.
    type: list
    elements: dict
    suboptions:
      mac: {description: MAC address of the guest interface., type: str, required: true}
      ip: {description: Address to hand out; inside the network., type: str, required: true}
      name: {description: Host name handed out with the lease., type: str}
  dns_hosts:
    description:
      - DNS host entries (like /etc/hosts lines). When given, this is the complete list.
        Changed live on an active network.
    type: list
    elements: dict
    suboptions:
      ip: {description: Address., type: str, required: true}
      hostnames: {description: "Names for it (non-empty, at most 253 characters, no empty labels).", type: list, elements: str, required: true}
  autostart:
    description: Start the network when libvirtd starts. Left as it is when not set.
    type: bool
  restart:
    description:
      - Restart an active network when a change needs it (see RV(restart_required)).
      - Running guests lose connectivity until their interfaces are reattached.
      - Before anything is stopped (or redefined), the new definition is checked to be able to
        start; the restart is refused, with nothing changed, when its subnet overlaps an active
        libvirt network or an address of a host interface, when its bridge name belongs to
        another libvirt network or is an existing host interface, or when its DHCP range is not
        inside the subnet (or holds the host address). Check mode reports the same refusal.
      - When the new definition still fails to start after the stop, the definition that was
        running is restored and started again, and the task fails with libvirt's message,
        C(changed=true) and C(restored=true).
    type: bool
    default: false
notes:
  - The start and restart checks read the host's interfaces and routes (C(ip -j addr),
    C(ip -j route), C(/sys/class/net)) only for a local libvirt URI; for a remote one they check
    against libvirt's own networks only, and the restore (or undefine) after a failed start is the
    safety net.
  - Not everything that makes a start fail can be seen beforehand (an MTU the bridge refuses,
    a dnsmasq that cannot run); those are what the restore covers.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
  - mlinfra.kvm.libvirt.object
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Lab network with NAT, DHCP and fixed addresses for the workers
  mlinfra.kvm.network:
    name: mlinfra-lab
    mode: nat
    address: 192.168.150.1
    prefix: 24
    domain: lab.internal
    dhcp_range: {start: 192.168.150.100, end: 192.168.150.200}
    hosts:
      - {mac: "52:54:00:aa:00:01", ip: 192.168.150.11, name: worker-1}
    dns_hosts:
      - {ip: 192.168.150.5, hostnames: [mlflow.lab.internal]}
    autostart: true

- name: Guests on the host's existing bridge br0
  mlinfra.kvm.network:
    name: datacenter
    mode: bridge
    bridge: br0
'''

RETURN = r'''
network:
  description: The network after the run (predicted in check mode).
  returned: always
  type: dict
  contains:
    name: {description: Name., type: str}
    state: {description: "V(active), V(inactive) or V(absent).", type: str}
    autostart: {description: Autostart flag., type: bool}
    mode: {description: Forward mode., type: str}
    bridge: {description: Bridge device., type: str}
    address: {description: Host address., type: str}
    prefix: {description: Prefix length., type: int}
    dhcp_range: {description: DHCP range., type: dict}
    hosts: {description: Static DHCP hosts., type: list, elements: dict}
    dns_hosts: {description: DNS host entries., type: list, elements: dict}
restart_required:
  description: The persistent definition differs from the running network in a way only a restart applies.
  returned: always
  type: bool
pending:
  description: The fields that wait for a restart.
  returned: always
  type: list
  elements: str
xml:
  description: The persistent XML definition (empty when absent or in check mode).
  returned: always
  type: str
actions:
  description:
    - Side effects performed (or that would be, in check mode).
    - On a failed restart, the failure carries them too, ending with the restore.
  returned: always
  type: list
  elements: str
restored:
  description:
    - Only on a failed O(restart=true), in the failure - V(true) when the previous definition was
      put back and started again after the new one failed to start, V(false) when that failed
      too and the network is stopped.
  returned: on failure of a restart
  type: bool
blockers:
  description: Only on a refused start or restart, in the failure - every reason found why the definition could not start.
  returned: on a refused start or restart
  type: list
  elements: str
undefined:
  description:
    - Only when starting a network this run defined failed, in the failure - V(true) when the
      definition was undefined again (nothing of it remains), V(false) when that failed too and it
      stays defined and inactive.
  returned: on failure of a new network's start
  type: bool
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import connected_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._network import MUTUALLY_EXCLUSIVE, argument_spec, run_network


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True, mutually_exclusive=MUTUALLY_EXCLUSIVE)
    fail_without_lxml(module)
    run(module, connected_runner(module, run_network))


if __name__ == "__main__":
    main()
