# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rendezvous port's firewall on the first worker, as nftables JSON (``nft -j``).

torchrun's c10d TCP store listens on every address of the first worker, and anyone who reaches
it can join or disturb the job. The pipeline role keeps one table of its own,
``inet mlinfra_rendezvous``: the port accepts the job's workers and rejects every other source.
Its one base chain has policy accept and matches only that port, so the rest of the host's
traffic and its own firewall stay as they are (an accept here never overrides another table's
drop).

``rendezvous_firewall_ruleset`` builds the ruleset as data (no rule text is assembled from
strings). It replaces the table in one transaction (add, delete, add: nft applies the batch
atomically, and the first add makes the delete valid when the table is new). Every rule carries
a comment with a digest of what the table should hold, so ``rendezvous_firewall_differences``
can compare the live table (``nft -j list table``) without normalising nft's output: a rule
added by hand, a changed port or a changed worker address all show up as a difference.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible.errors import AnsibleFilterError

TABLE = "mlinfra_rendezvous"
FAMILY = "inet"
CHAIN = {"name": "input", "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}
# Bumped when the shape of the rules changes, so that tables made by an older role are replaced.
RULESET_VERSION = 1


def _addresses(addresses: Any) -> Dict[str, List[str]]:
    if isinstance(addresses, (str, bytes)) or not isinstance(addresses, Sequence) or not addresses:
        raise AnsibleFilterError(
            "rendezvous_firewall_ruleset: the workers' addresses must be a non-empty list of IP "
            "addresses, got %r" % (addresses,))
    by_family: Dict[str, List[str]] = {"ip": [], "ip6": []}
    for value in addresses:
        try:
            address = ipaddress.ip_address(str(value).strip())
        except ValueError:
            raise AnsibleFilterError(
                "rendezvous_firewall_ruleset: worker address %r is not an IP address; the firewall "
                "admits the workers by address, so set pipeline_collective_address (or "
                "ansible_host) to the worker's IP address on the workers' network, or turn the "
                "firewall off (pipeline_rendezvous_firewall: false)" % (value,)) from None
        family = "ip" if address.version == 4 else "ip6"
        if str(address) not in by_family[family]:
            by_family[family].append(str(address))
    return {family: sorted(values, key=ipaddress.ip_address) for family, values in by_family.items()}


def _port(port: Any) -> int:
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = -1
    if not 1024 <= number <= 65535 or isinstance(port, bool):
        raise AnsibleFilterError("rendezvous_firewall_ruleset: port %r is not a port number in "
                                 "1024-65535 (pipeline_rendezvous_port)" % (port,))
    return number


def _dport(port: int) -> Dict[str, Any]:
    return {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": port}}


def _saddr(family: str, values: List[str]) -> Dict[str, Any]:
    return {"match": {"op": "==", "left": {"payload": {"protocol": family, "field": "saddr"}},
                      "right": {"set": values}}}


def rendezvous_firewall_ruleset(addresses: Sequence[str], port: Any, table: str = TABLE) -> Dict[str, Any]:
    """nft JSON that makes TABLE admit PORT from ADDRESSES only (TCP reset for anyone else)."""
    allowed = _addresses(addresses)
    number = _port(port)
    digest = hashlib.sha256(json.dumps({"version": RULESET_VERSION, "port": number, "allowed": allowed},
                                       sort_keys=True).encode("utf-8")).hexdigest()[:16]
    exprs = [[_dport(number), _saddr(family, values), {"accept": None}]
             for family, values in allowed.items() if values]
    # counter: how many connections from elsewhere were refused (nft list table shows it).
    exprs.append([_dport(number), {"counter": {"packets": 0, "bytes": 0}}, {"reject": {"type": "tcp reset"}}])
    ident = {"family": FAMILY, "table": table}
    commands: List[Dict[str, Any]] = [
        {"add": {"table": {"family": FAMILY, "name": table}}},
        {"delete": {"table": {"family": FAMILY, "name": table}}},
        {"add": {"table": {"family": FAMILY, "name": table}}},
        {"add": {"chain": dict(ident, **CHAIN)}},
    ]
    for index, expr in enumerate(exprs, start=1):
        comment = "mlinfra.kvm rendezvous %s %d/%d" % (digest, index, len(exprs))
        commands.append({"add": {"rule": dict(ident, chain=CHAIN["name"], expr=expr, comment=comment)}})
    return {"nftables": commands}


def _wanted(ruleset: Mapping[str, Any]) -> Dict[str, Any]:
    chains, comments, table = [], [], None
    for command in ruleset.get("nftables", []):
        body = command.get("add", {})
        if "table" in body:
            table = body["table"]["name"]
        elif "chain" in body:
            chains.append({k: body["chain"][k] for k in CHAIN})
        elif "rule" in body:
            comments.append(body["rule"]["comment"])
    return {"table": table, "chains": chains, "comments": comments}


def rendezvous_firewall_differences(live: Optional[Any], wanted: Optional[Mapping[str, Any]]) -> List[str]:
    """What differs between the live table (``nft -j list table`` output, parsed or as text;
    None or '' when the table is missing) and the wanted ruleset (None: the table should not
    exist). An empty list means the table is as wanted."""
    if isinstance(live, str):
        live = json.loads(live) if live.strip() else None
    objects = (live or {}).get("nftables", []) if isinstance(live, Mapping) else []
    present = any("table" in obj for obj in objects)
    if wanted is None:
        return ["the table is present and should not be"] if present else []
    want = _wanted(wanted)
    if not present:
        return ["table %s %s is missing" % (FAMILY, want["table"])]
    differences = []
    chains = [{k: obj["chain"].get(k) for k in CHAIN} for obj in objects if "chain" in obj]
    if chains != want["chains"]:
        differences.append("chains %s, wanted %s" % (json.dumps(chains, sort_keys=True),
                                                     json.dumps(want["chains"], sort_keys=True)))
    comments = [obj["rule"].get("comment") for obj in objects if "rule" in obj]
    if comments != want["comments"]:
        differences.append("%d rule(s) that are not the wanted %d (ports, addresses or a rule added "
                           "by hand)" % (len(comments), len(want["comments"])))
    return differences


class FilterModule:
    def filters(self):
        return {"rendezvous_firewall_ruleset": rendezvous_firewall_ruleset,
                "rendezvous_firewall_differences": rendezvous_firewall_differences}
