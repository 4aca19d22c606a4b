# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn the GPU entries of an inventory (a PCI address or a vendor/device selector) into
hostdev options of mlinfra.kvm.domain, with the GPU's other functions (its HDMI audio)."""
from __future__ import annotations

from typing import Any, Dict

from ansible.errors import AnsibleFilterError


def gpu_hostdev(gpu: Any, include_functions: bool = True) -> Dict[str, Any]:
    if isinstance(gpu, str):
        return {"address": gpu, "include_functions": include_functions}
    if isinstance(gpu, dict) and gpu.get("address"):
        return {"address": gpu["address"], "include_functions": gpu.get("include_functions", include_functions)}
    if isinstance(gpu, dict) and gpu.get("vendor") and gpu.get("device"):
        return {"vendor": gpu["vendor"], "device": gpu["device"], "index": int(gpu.get("index", 0)),
                "include_functions": gpu.get("include_functions", include_functions)}
    raise AnsibleFilterError(
        "gpu entry %r is neither a PCI address ('0000:3b:00.0') nor a selector "
        "({vendor: '10de', device: '2335', index: 0})" % (gpu,))


class FilterModule:
    def filters(self):
        return {"gpu_hostdev": gpu_hostdev}
