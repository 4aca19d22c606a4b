#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: domain_info
short_description: What an operator needs to see that libvirt domains are healthy
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
  - mlinfra.kvm.attributes.info
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import fail_without_lxml
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_info import argument_spec, run_domain_info


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    fail_without_lxml(module)
    run(module, lambda: run_domain_info(module))


if __name__ == "__main__":
    main()
