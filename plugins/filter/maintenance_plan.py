# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of playbooks/hypervisor_maintenance.yml: what leaves a hypervisor, how, and what comes back.

The playbook reads state (libvirt's domains here and on the destinations of an earlier run's
record, Slurm's nodes, the results of the moves) and these filters decide from it; nothing here
talks to a daemon, so every decision is a plain function of its input and is unit-tested as such.

The record (STATE_DIR/HOST.json) is what makes a killed run finishable: its ``domains`` name what
left (``how``: live, cold or shutdown; ``destination_uri`` when it moved) and ``slurm_drained`` the
Slurm nodes the maintenance drained.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Mapping, Sequence

from ansible.errors import AnsibleFilterError

_HOWS = ("live", "cold", "shutdown")
_STOPPING = ("cold", "shutdown")
_RUNNING = ("running", "paused")
# sinfo appends these to a state for a flag (not responding, powered off, ...): the state is the word.
_SINFO_FLAGS = re.compile(r"[*~#!%$@^-]+$")
_SCONTROL_NODE = re.compile(r"^NodeName=(\S+) ")
_SCONTROL_STATE = re.compile(r" State=(\S+)")
_SCONTROL_SLURMD_START = re.compile(r" SlurmdStartTime=(\S+)")
_NOT_KNOWN = {"state": "not known to Slurm", "slurmd_started": "None"}


# ------------------------------------------------------------------------------------ input checks
def _list_of_mappings(value: Any, what: str, fix: str) -> List[Mapping[str, Any]]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) \
            or not all(isinstance(v, Mapping) and "name" in v for v in value):
        raise AnsibleFilterError("%s must be a list of mappings with a name (got %.200r): %s" % (what, value, fix))
    return list(value)


def _names(value: Any, what: str, fix: str) -> List[str]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
        raise AnsibleFilterError("%s must be a list of names (got %.200r): %s" % (what, value, fix))
    return list(value)


def _lines(value: Any, what: str) -> List[str]:
    # A skipped read gives no lines: an empty table, every node "not known to Slurm".
    if value is None:
        return []
    return _names(value, what, "pass the stdout_lines of the command's result")


def _recorded_domains(recorded: Any) -> List[Mapping[str, Any]]:
    if not isinstance(recorded, Mapping):
        raise AnsibleFilterError("the earlier run's record must be a mapping (got %.200r): pass __hm_recorded, "
                                 "{'domains': []} when there is none" % (recorded,))
    domains = _list_of_mappings(recorded.get("domains", []), "the record's domains",
                                "each names a domain that left (name, how, destination_uri)")
    for d in domains:
        if d.get("how") not in _HOWS or (d["how"] != "shutdown" and "destination_uri" not in d):
            raise AnsibleFilterError("the record's domain %.200r needs how: live, cold or shutdown, and a "
                                     "destination_uri when it moved: bring it back by hand, then remove the record" % (d,))
    return domains


def _unique(items: Iterable[str]) -> List[str]:
    return list(dict.fromkeys(items))


# ------------------------------------------------------------------------------------ Slurm's output
def _sinfo_table(lines: Iterable[str]) -> Dict[str, Dict[str, str]]:
    """`sinfo --noheader --Node --format %N|%T|%E` as NODE: {state, reason ('' when none)}."""
    table: Dict[str, Dict[str, str]] = {}
    for line in lines:
        fields = line.split("|", 2)
        if len(fields) < 3:
            continue
        table[fields[0]] = {"state": _SINFO_FLAGS.sub("", fields[1]),
                            "reason": "" if fields[2] == "none" else fields[2]}
    return table


def _scontrol_table(lines: Iterable[str]) -> Dict[str, Dict[str, str]]:
    """`scontrol show node --oneliner` as NODE: {state, slurmd_started ('None' when never)}."""
    table: Dict[str, Dict[str, str]] = {}
    for line in lines:
        node = _SCONTROL_NODE.match(line)
        if not node:
            continue
        state = _SCONTROL_STATE.search(line)
        started = _SCONTROL_SLURMD_START.search(line)
        table[node.group(1)] = {"state": state.group(1) if state else "?",
                                "slurmd_started": started.group(1) if started else "None"}
    return table


# ------------------------------------------------------------------------------------ the domains
def _pending(recorded: List[Mapping[str, Any]], here: Mapping[str, str],
             there: Mapping[str, List[str]]) -> Dict[str, list]:
    # away: on its recorded destination (on both hypervisors too: the move back then refuses, naming
    # the stale copy); start: here but not running; back: running here (a move that never happened or
    # already came back, a shutdown that never happened); gone: on neither.
    pending: Dict[str, list] = {"away": [], "start": [], "back": [], "gone": []}
    for d in recorded:
        if d["how"] != "shutdown" and d["name"] in there.get(d["destination_uri"], []):
            pending["away"].append(dict(d))
        elif d["name"] in here and here[d["name"]] not in _RUNNING:
            pending["start"].append(dict(d))
        elif d["name"] in here:
            pending["back"].append(d["name"])
        else:
            pending["gone"].append(d["name"])
    return pending


def _how_it_leaves(domain: Mapping[str, Any], stop_domains: Sequence[str], gpu: str) -> str:
    # A domain with PCI host devices cannot move live: it is moved cold or shut down (gpu).
    if domain["name"] in stop_domains:
        return "shutdown"
    if domain.get("hostdevs"):
        return "cold" if gpu == "migrate" else "shutdown"
    return "live"


def maintenance_plan(domains: Any, recorded: Any, recorded_there: Any = None, stop_domains: Any = (),
                     gpu: str = "shutdown", destination: str = "", destination_uri: str = "") -> Dict[str, Any]:
    """What leaves the hypervisor and how, and what is left to restore from an earlier run's record.

    ``domains``: domain_info's domains here; ``recorded``: the earlier run's record ({'domains': []}
    when none); ``recorded_there``: the results of domain_info looped over the record's destination
    URIs (each with ``item``, the URI, and ``domains``).
    """
    here_list = _list_of_mappings(domains, "domains", "pass domain_info's domains of this hypervisor")
    stop = _names(stop_domains or [], "stop_domains", "set hypervisor_maintenance_stop_domains to a list of domain names")
    if gpu not in ("shutdown", "migrate"):
        raise AnsibleFilterError("gpu must be shutdown or migrate (got %r): set hypervisor_maintenance_gpu" % (gpu,))
    record = _recorded_domains(recorded)
    there: Dict[str, List[str]] = {}
    for result in recorded_there or []:
        if not isinstance(result, Mapping) or "item" not in result:
            raise AnsibleFilterError("recorded_there must be the results of domain_info looped over the record's "
                                     "destination URIs (got %.200r)" % (result,))
        there[result["item"]] = [d["name"] for d in result.get("domains") or []]
    pending = _pending(record, {d["name"]: d.get("state") for d in here_list}, there)

    leaving: List[Dict[str, Any]] = []
    for d in (d for d in here_list if d.get("state") in _RUNNING):
        how = _how_it_leaves(d, stop, gpu)
        entry: Dict[str, Any] = {"name": d["name"], "how": how,
                                 "destination": destination if how != "shutdown" else "",
                                 "destination_uri": destination_uri if how != "shutdown" else ""}
        if how == "cold":
            entry["hostdevs"] = d.get("hostdevs")
        leaving.append(entry)
    # Live moves first, then cold, then shutdowns: the order the playbook acts in.
    leaving.sort(key=lambda e: _HOWS.index(e["how"]))
    mine = {e["name"] for e in leaving}
    stopping = [e["name"] for e in leaving if e["how"] in _STOPPING]
    return {
        "pending": pending,
        "leaving": leaving,
        "live": [e for e in leaving if e["how"] == "live"],
        "cold": [e for e in leaving if e["how"] == "cold"],
        "shutdown": [e for e in leaving if e["how"] == "shutdown"],
        "stopping": stopping,
        # The record to write before anything leaves: this run's and the earlier run's not yet back.
        "record_domains": leaving + [d for d in pending["away"] + pending["start"] if d["name"] not in mine],
        # The guests whose own alerts are silenced: those that stop now and those an earlier run stopped.
        "guests_down": sorted(set(stopping) | {d["name"] for d in pending["start"]}),
    }


def _moved(results: Any, mode: str) -> List[str]:
    # A result without `mode` did not move (failed, skipped, or already there).
    return [r["item"]["name"] for r in results or [] if isinstance(r, Mapping) and r.get("mode") == mode]


def maintenance_restore(plan: Any, moved_live: Any = None, moved_cold: Any = None, stopped: Any = None) -> Dict[str, list]:
    """What to bring back after the reboot: this run's moves as they went, and the earlier run's still away.

    ``moved_live``, ``moved_cold``, ``stopped``: the ``results`` of the loops that moved and shut down
    (in check mode, as predicted).
    """
    if not isinstance(plan, Mapping) or "leaving" not in plan or "pending" not in plan:
        raise AnsibleFilterError("maintenance_restore needs the result of maintenance_plan (got %.200r)" % (plan,))
    mine = {e["name"] for e in plan["leaving"]}
    live, cold = set(_moved(moved_live, "live")), set(_moved(moved_cold, "cold"))
    away = plan["pending"]["away"]

    def back(how: str, moved: set) -> List[Mapping[str, Any]]:
        return ([e for e in plan["leaving"] if e["how"] == how and e["name"] in moved]
                + [d for d in away if d["how"] == how and d["name"] not in mine])

    shut = [r["item"]["name"] for r in stopped or [] if isinstance(r, Mapping) and r.get("changed")]
    return {"live": back("live", live), "cold": back("cold", cold),
            "start": _unique(shut + [d["name"] for d in plan["pending"]["start"]])}


def maintenance_stage_guests(plan: Any, inventory: Any, guest_hosts: Any = None) -> Dict[str, list]:
    """The guests that stop whose ML stages are waited for: those that are inventory hosts.

    An ml_stage started over SSH runs as processes in the guest, outside Slurm: a shutdown or a cold
    move would kill it. ``guest_hosts`` maps a domain to its inventory host (default the domain's
    name); a domain that is no inventory host cannot be looked into and is named instead.
    """
    if not isinstance(plan, Mapping) or "stopping" not in plan:
        raise AnsibleFilterError("maintenance_stage_guests needs the result of maintenance_plan (got %.200r)" % (plan,))
    if not isinstance(guest_hosts or {}, Mapping):
        raise AnsibleFilterError("guest_hosts must map domain names to inventory hosts (got %.200r): set "
                                 "hypervisor_maintenance_guest_hosts" % (guest_hosts,))
    hosts = set(_names(inventory or [], "inventory", "pass groups['all']"))
    mapping = guest_hosts or {}
    wait: List[Dict[str, str]] = []
    not_inventory: List[str] = []
    for domain in plan["stopping"]:
        host = mapping.get(domain, domain)
        if host in hosts:
            wait.append({"domain": domain, "host": host})
        else:
            not_inventory.append(domain)
    return {"wait": wait, "not_inventory": not_inventory}


# ------------------------------------------------------------------------------------ Slurm
def maintenance_slurm_drain(sinfo_lines: Any, plan: Any, reason: str, nodes: Any = None,
                            recorded: Any = None) -> Dict[str, list]:
    """Sort the Slurm nodes of the domains that stop (shut down or moved cold) by what the drain does.

    ``nodes`` maps a domain to its Slurm node (default the domain's name); ``reason`` is this
    maintenance's drain Reason: a node drained with it is this maintenance's (an earlier run's).
    """
    if not isinstance(plan, Mapping) or "leaving" not in plan:
        raise AnsibleFilterError("maintenance_slurm_drain needs the result of maintenance_plan (got %.200r)" % (plan,))
    if not isinstance(nodes or {}, Mapping):
        raise AnsibleFilterError("nodes must map domain names to Slurm node names (got %.200r): set "
                                 "hypervisor_maintenance_slurm_nodes" % (nodes,))
    nodes = nodes or {}
    earlier = _names((recorded or {}).get("slurm_drained", []), "the record's slurm_drained",
                     "a list of Slurm node names; resume them by hand, then remove the record")
    table = _sinfo_table(_lines(sinfo_lines, "sinfo_lines"))
    wait: List[str] = []
    unknown: List[str] = []
    theirs: List[str] = []
    ours: List[str] = []
    drain: List[str] = []
    for entry in plan["leaving"]:
        if entry["how"] not in _STOPPING:
            continue
        node = nodes.get(entry["name"], entry["name"])
        if node not in table:
            unknown.append("%s (%s)" % (entry["name"], node))
            continue
        wait.append(node)
        now = table[node]
        if now["reason"] == reason:
            ours.append(node)
        elif now["reason"]:
            # Drained or down for another reason: waited for, but someone else's to resume.
            theirs.append("%s (%s: %s)" % (node, now["state"], now["reason"]))
        else:
            drain.append(node)
    return {"wait": _unique(wait), "unknown": unknown, "theirs": theirs, "already": _unique(ours),
            "drain": _unique(drain), "recorded": earlier, "drained": _unique(earlier + ours + drain)}


def maintenance_slurmd_started(scontrol_lines: Any, drained: Any, recorded: Any = None) -> Dict[str, str]:
    """When the slurmd of each node to drain last registered (SlurmdStartTime), read before the stop.

    An earlier run's times win: they were read before that run stopped the domains.
    """
    nodes = _names(drained or [], "drained", "pass maintenance_slurm_drain's drained")
    table = _scontrol_table(_lines(scontrol_lines, "scontrol_lines"))
    started = {n: table[n]["slurmd_started"] for n in nodes if n in table}
    earlier = (recorded or {}).get("slurmd_started") or {}
    if not isinstance(earlier, Mapping):
        raise AnsibleFilterError("the record's slurmd_started must map Slurm nodes to times (got %.200r): remove "
                                 "it from the record" % (earlier,))
    started.update(earlier)
    return started


def maintenance_slurm_resume(sinfo_lines: Any, drained: Any, reason: str, check_mode: bool = False,
                             drain: Any = None) -> Dict[str, List[str]]:
    """Which drained nodes are still this maintenance's: only those whose Reason is still ``reason``.

    A node someone drained meanwhile for another reason, or resumed already, is left as it is. In
    check mode the nodes the run would have drained (``drain``) count as this maintenance's.
    """
    table = _sinfo_table(_lines(sinfo_lines, "sinfo_lines"))
    would_drain = set(_names(drain or [], "drain", "pass maintenance_slurm_drain's drain")) if check_mode else set()
    resume: List[str] = []
    left: List[str] = []
    for node in _names(drained or [], "drained", "pass maintenance_slurm_drain's drained"):
        if node in table and table[node]["reason"] == reason or node in would_drain:
            resume.append(node)
        elif node in table:
            left.append("%s (%s)" % (node, table[node]["reason"] or "none"))
        else:
            left.append("%s (not known to Slurm)" % node)
    return {"resume": resume, "left": left}


def maintenance_slurmd_not_back(scontrol_lines: Any, resumed: Any, started_before: Any = None) -> List[str]:
    """The resumed nodes whose slurmd has not registered since their domains stopped, or that are not up.

    slurmctld's view of a dead slurmd lags by up to SlurmdTimeout, so a node that reads "idle" proves
    nothing: it is back when its SlurmdStartTime differs from the one read before the stop.
    """
    table = _scontrol_table(_lines(scontrol_lines, "scontrol_lines"))
    before = started_before or {}
    left: List[str] = []
    for node in _names(resumed or [], "resumed", "pass maintenance_slurm_resume's resume"):
        now = table.get(node, _NOT_KNOWN)
        stale = now["slurmd_started"] in ("None", before.get(node, ""))
        not_up = re.search("NOT_RESPONDING|INVALID_REG|FAIL", now["state"]) \
            or re.match("DOWN|UNKNOWN|not known", now["state"])
        if stale or not_up:
            left.append("%s (%s, slurmd started %s)" % (node, now["state"], now["slurmd_started"]))
    return left


class FilterModule:
    def filters(self):
        return {
            "maintenance_plan": maintenance_plan,
            "maintenance_restore": maintenance_restore,
            "maintenance_stage_guests": maintenance_stage_guests,
            "maintenance_slurm_drain": maintenance_slurm_drain,
            "maintenance_slurmd_started": maintenance_slurmd_started,
            "maintenance_slurm_resume": maintenance_slurm_resume,
            "maintenance_slurmd_not_back": maintenance_slurmd_not_back,
        }
