# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why a distributed train cannot start on these workers: the pipeline role's preflight.

Input: each worker's facts as ``roles/pipeline/files/worker_facts.py`` prints them (python,
torch, gpus, interface, and on the first worker port_free/port_holder). Every problem is one
sentence naming the worker, the value and the fix; an empty list means the job may start.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ansible.errors import AnsibleFilterError


def _spread(facts: Mapping[str, Mapping[str, Any]], field: str) -> Optional[str]:
    values = {host: f.get(field) for host, f in facts.items()}
    if len(set(map(str, values.values()))) <= 1:
        return None
    return ", ".join("%s %s" % (host, values[host]) for host in facts)


def distributed_train_problems(facts: Mapping[str, Mapping[str, Any]], rank0: str,
                               port: int = 29400, batch_size: int = 0, forks: int = 0,
                               interface: str = "") -> List[str]:
    if not isinstance(facts, Mapping) or rank0 not in facts:
        raise AnsibleFilterError("distributed_train_problems: facts must map the workers to their "
                                 "facts and include the first worker %r" % (rank0,))
    problems: List[str] = []
    workers = list(facts)
    if forks and forks < len(workers):
        problems.append("forks %d < %d workers: every worker runs the train task at the same time "
                        "(the rendezvous waits for all of them); raise forks (-f, or forks in "
                        "ansible.cfg)" % (forks, len(workers)))
    no_torch = [h for h in workers if not facts[h].get("torch")]
    if no_torch:
        problems.append("no torch in pipeline_python on %s: run the ml_runtime role there"
                        % ", ".join(no_torch))
    for field, what in (("python", "Python versions differ"), ("torch", "torch versions differ"),
                        ("gpus", "GPU counts differ (one process per GPU needs the same count on "
                                 "every worker)")):
        spread = _spread(facts, field)
        if spread:
            problems.append("%s: %s; make the workers' ML runtime the same, or train on fewer "
                            "workers (pipeline_workers)" % (what, spread))
    if len(workers) > 1 and not interface:
        for host in workers:
            if not facts[host].get("interface"):
                problems.append("%s: no network interface holds its collective address "
                                "(pipeline_collective_address, default its ansible_host); set "
                                "pipeline_collective_address to its address on the workers' "
                                "network, or pipeline_collective_interface" % host)
    ref = facts[rank0]
    if len(workers) > 1 and ref.get("port_free") is False:
        problems.append("pipeline_rendezvous_port %s is in use on %s (%s): stop that listener or "
                        "choose another port" % (port, rank0, ref.get("port_holder") or "ss shows no owner"))
    world = len(workers) * max(int(ref.get("gpus") or 0), 1)
    if batch_size and 0 < batch_size < world:
        problems.append("pipeline_train_params.batch_size %d over %d processes leaves %d rows per "
                        "process and step: give at least %d, or 0 for full batches"
                        % (batch_size, world, batch_size // world, world))
    return problems


class FilterModule:
    def filters(self):
        return {"distributed_train_problems": distributed_train_problems}
