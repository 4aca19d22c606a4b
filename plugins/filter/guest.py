# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn the guest role's VM list into the input of the resource-list modules."""
from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError


def guest_volumes(vms: List[Dict[str, Any]], pool: str, backing: str, default_size: str) -> List[Dict[str, Any]]:
    """One mlinfra.kvm.volumes item per VM: NAME.qcow2 in ``pool``, an overlay on ``backing``,
    of the VM's ``disk`` size (``default_size`` when it sets none)."""
    if not isinstance(vms, list):
        raise AnsibleFilterError("guest_volumes: the VM list is a %s, not a list of VMs" % type(vms).__name__)
    items = []
    for index, vm in enumerate(vms):
        if not isinstance(vm, dict) or not vm.get("name"):
            raise AnsibleFilterError("guest_volumes: VM %d (%r) has no name: give every VM a name" % (index, vm))
        items.append({"name": "%s.qcow2" % vm["name"], "pool": pool, "backing": backing,
                      "capacity": str(vm.get("disk") or default_size)})
    return items


class FilterModule:
    def filters(self):
        return {"guest_volumes": guest_volumes}
