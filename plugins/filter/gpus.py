# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn the GPU entries of an inventory into hostdev options of mlinfra.kvm.domain, with the
GPU's other functions (its HDMI audio). An entry is written in the collection's one PCI
selector grammar (module_utils/_host/_pci_select), which vfio_pci and domain parse too."""
from __future__ import annotations

from typing import Any, Dict

from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci_select import FORMS, parse_selector


def gpu_hostdev(gpu: Any, include_functions: bool = True) -> Dict[str, Any]:
    entry = gpu
    if isinstance(gpu, dict) and "include_functions" not in gpu:
        entry = dict(gpu, include_functions=include_functions)
    try:
        selector = parse_selector("gpu entry", entry)
    except InvalidInputError as err:
        raise AnsibleFilterError("%s (an entry is %s)" % (err.msg, FORMS))
    if isinstance(gpu, str):
        selector.include_functions = include_functions
    return selector.as_hostdev()


def pci_selector(entry: Any, option: str = "entry") -> Dict[str, Any]:
    """One entry of the selector grammar, checked and written out in full (a dict); bad input
    fails with the option, the value and the forms the grammar takes."""
    try:
        selector = parse_selector(option, entry)
    except InvalidInputError as err:
        raise AnsibleFilterError("%s (an entry is %s)" % (err.msg, FORMS))
    if selector.address:
        return {"address": selector.address, "include_functions": selector.include_functions}
    out = {"vendor": selector.vendor, "device": selector.device, "include_functions": selector.include_functions}
    if selector.index is not None:
        out["index"] = selector.index
    return out


class FilterModule:
    def filters(self):
        return {"gpu_hostdev": gpu_hostdev, "pci_selector": pci_selector}
