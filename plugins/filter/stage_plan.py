# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why the workers of a distributed ml_stage do not agree: which input of the cache key differs.

Every worker plans the stage in check mode (mlinfra.kvm.ml_stage returns ``key``,
``inputs_digest`` and ``code_python``). One job needs one key: a worker that would train on
other data, other code or another torch than the first worker is refused before any process
starts, and the message names the worker and the input.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleFilterError

_SHOWN_DISTS = 6


def _python_differences(ref: Mapping[str, Any], other: Mapping[str, Any], ref_host: str,
                        host: str) -> List[str]:
    out: List[str] = []
    for field in ("implementation", "python"):
        if ref.get(field) != other.get(field):
            out.append("%s %s on %s, %s on %s" % (field, other.get(field), host, ref.get(field), ref_host))
    ref_d, other_d = ref.get("dists") or {}, other.get("dists") or {}
    names = sorted(n for n in set(ref_d) | set(other_d) if ref_d.get(n) != other_d.get(n))
    # torch first: the version users ask about.
    names.sort(key=lambda n: (n != "torch", n))
    for name in names[:_SHOWN_DISTS]:
        out.append("%s %s on %s, %s on %s" % (name, other_d.get(name, "(absent)"), host,
                                              ref_d.get(name, "(absent)"), ref_host))
    if len(names) > _SHOWN_DISTS:
        out.append("and %d more distributions" % (len(names) - _SHOWN_DISTS))
    return out


def stage_plan_differences(plans: Mapping[str, Any], reference: str) -> List[str]:
    """One line per worker whose planned key differs from ``reference``'s, naming the inputs.

    ``plans`` maps a host to its ml_stage result (check mode). An empty list means one key.
    """
    if not isinstance(plans, Mapping) or reference not in plans:
        raise AnsibleFilterError("stage_plan_differences: plans must map hosts to ml_stage results "
                                 "and include the reference host %r" % (reference,))
    ref = plans[reference]
    lines: List[str] = []
    for host in sorted(plans):
        plan = plans[host]
        if host == reference or plan.get("key") == ref.get("key"):
            continue
        ref_parts: Dict[str, str] = ref.get("inputs_digest") or {}
        parts: Dict[str, str] = plan.get("inputs_digest") or {}
        differ = sorted(p for p in set(ref_parts) | set(parts) if ref_parts.get(p) != parts.get(p))
        details: List[str] = []
        for part in differ:
            if part == "code/python" and ref.get("code_python") and plan.get("code_python"):
                details += _python_differences(ref["code_python"], plan["code_python"], reference, host)
            else:
                details.append(part)
        lines.append("%s: key %s differs from %s's %s in %s" % (
            host, str(plan.get("key"))[:12], reference, str(ref.get("key"))[:12],
            "; ".join(details) or "an input ml_stage does not itemise (upgrade ml_stage on both)"))
    return lines


class FilterModule:
    def filters(self):
        return {"stage_plan_differences": stage_plan_differences}
