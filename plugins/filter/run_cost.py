# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cost of one training run, on premise and in the cloud, and as Prometheus textfile
metrics (module_utils/_ml/_cost)."""
from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Optional

from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._cost import cost_textfile as _cost_textfile
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._cost import run_cost as _run_cost

INPUTS = ("duration_s", "gpus", "gpu_model", "power_w", "energy_j", "pue", "electricity_price", "hardware_price",
          "lifetime_years", "utilisation", "cloud_rates", "currency")


def run_cost(inputs: Mapping[str, Any]) -> Dict[str, Any]:
    if not isinstance(inputs, Mapping):
        raise AnsibleFilterError("run_cost: expected a dict of inputs (%s), got %r" % (", ".join(INPUTS), inputs))
    unknown = sorted(set(inputs) - set(INPUTS))
    if unknown:
        raise AnsibleFilterError("run_cost: unknown inputs %s; the inputs are %s" % (unknown, ", ".join(INPUTS)))
    missing = [name for name in ("duration_s", "gpus", "electricity_price", "hardware_price", "lifetime_years",
                                 "utilisation") if inputs.get(name) in (None, "")]
    if missing:
        raise AnsibleFilterError("run_cost: missing inputs %s" % ", ".join(missing))
    args = dict(inputs)
    try:
        return _run_cost(args.pop("duration_s"), args.pop("gpus"), args.pop("gpu_model", None), **args)
    except InvalidInputError as err:
        raise AnsibleFilterError("run_cost: %s" % err.msg)


def run_cost_textfile(result: Mapping[str, Any], previous_text: Optional[str] = "", pipeline: str = "",
                      account: Optional[str] = "", mlflow_run_id: Optional[str] = "", timestamp: Any = None) -> str:
    if not isinstance(result, Mapping):
        raise AnsibleFilterError("run_cost_textfile: expected the dict of mlinfra.kvm.run_cost, got %r" % (result,))
    if previous_text is not None and not isinstance(previous_text, str):
        raise AnsibleFilterError("run_cost_textfile: previous_text must be the previous file's text, got %r"
                                 % (previous_text,))
    try:
        return _cost_textfile(previous_text, result, pipeline, account, mlflow_run_id,
                              time.time() if timestamp in (None, "") else timestamp)
    except InvalidInputError as err:
        raise AnsibleFilterError("run_cost_textfile: %s" % err.msg)


class FilterModule:
    def filters(self):
        return {"run_cost": run_cost, "run_cost_textfile": run_cost_textfile}
