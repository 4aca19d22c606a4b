# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn the guest role's VM list into the input of the resource-list modules."""
from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.gpus import gpu_hostdev

# What guest_domains needs from the guest role's settings (the role passes them as one dict).
DOMAIN_SETTINGS = ("virt_type", "cpu_mode", "default_memory", "default_vcpus", "firmware", "kernel", "initrd",
                   "cmdline", "pool", "state_dir", "network")


def _named(vms: Any, filter_name: str) -> List[Dict[str, Any]]:
    if not isinstance(vms, list):
        raise AnsibleFilterError("%s: the VM list is a %s, not a list of VMs" % (filter_name, type(vms).__name__))
    for index, vm in enumerate(vms):
        if not isinstance(vm, dict) or not vm.get("name"):
            raise AnsibleFilterError("%s: VM %d (%r) has no name: give every VM a name" % (filter_name, index, vm))
    return vms


def guest_domains(vms: List[Dict[str, Any]], settings: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One mlinfra.kvm.domains item per VM, running: its disk (NAME.qcow2 in the pool), its
    cloud-init seed as a cdrom, one NIC, its console log, and its GPUs passed through with their
    other functions. ``settings``: the guest role's values (DOMAIN_SETTINGS)."""
    missing = [key for key in DOMAIN_SETTINGS if key not in (settings or {})]
    if missing:
        raise AnsibleFilterError("guest_domains: settings lack %s" % ", ".join(missing))
    items = []
    for vm in _named(vms, "guest_domains"):
        name = vm["name"]
        item: Dict[str, Any] = {
            "name": name, "state": "running", "virt_type": settings["virt_type"],
            "cpu": {"mode": settings["cpu_mode"]},
            "memory": str(vm.get("memory") or settings["default_memory"]),
            "vcpus": int(vm.get("vcpus") or settings["default_vcpus"]),
            "firmware": settings["firmware"],
            "disks": [{"pool": settings["pool"], "volume": "%s.qcow2" % name}],
            "cdroms": [{"path": "%s/%s-seed.iso" % (settings["state_dir"], name)}],
            "interfaces": [{"network": vm.get("network") or settings["network"]}],
            "console_log": "%s/%s-console.log" % (settings["state_dir"], name),
            "rng": True, "guest_agent": True,
            "hostdevs": [gpu_hostdev(gpu) for gpu in vm.get("gpus") or []],
            "metadata": {"role": vm.get("role") or "worker", "managed_by": "mlinfra.kvm"},
        }
        if settings["firmware"] == "kernel":
            item.update(kernel=settings["kernel"], initrd=settings["initrd"], cmdline=settings["cmdline"])
        items.append(item)
    return items


def guest_volumes(vms: List[Dict[str, Any]], pool: str, backing: str, default_size: str) -> List[Dict[str, Any]]:
    """One mlinfra.kvm.volumes item per VM: NAME.qcow2 in ``pool``, an overlay on ``backing``,
    of the VM's ``disk`` size (``default_size`` when it sets none)."""
    items = []
    for vm in _named(vms, "guest_volumes"):
        items.append({"name": "%s.qcow2" % vm["name"], "pool": pool, "backing": backing,
                      "capacity": str(vm.get("disk") or default_size)})
    return items


class FilterModule:
    def filters(self):
        return {"guest_volumes": guest_volumes, "guest_domains": guest_domains}
