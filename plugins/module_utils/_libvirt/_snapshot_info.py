# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The snapshot_info report: a domain's snapshots, oldest first, its current one, and one by name.

snapshot_info changes nothing, so this is a reader, not an ObjectRunner. It reports with
``_snapshot.load_domain`` and ``_snapshot.listing``, through ``_snapshot.SnapshotService``, the
same code mlinfra.kvm.snapshot reports with, so the two modules describe a snapshot alike.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .._core._errors import InvalidInputError
from .._core._validate import object_name
from ._connection import LIBVIRT_ARGSPEC, Connection
from ._snapshot import SnapshotService, listing, load_domain


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        domain=dict(type="str", required=True),
        name=dict(type="str"),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_snapshot_info(module: Any) -> Dict[str, Any]:
    with Connection(module.params["uri"]) as conn:
        return snapshot_report(SnapshotService(conn.conn), module.params["domain"], module.params["name"])


def snapshot_report(service: SnapshotService, domain: str, name: Optional[str]) -> Dict[str, Any]:
    """All snapshots of ``domain`` and, with ``name``, that one (names checked before libvirt is asked)."""
    object_name("domain", domain)
    if name is not None:
        object_name("name", name)
    dom = load_domain(service, domain)
    snapshots, current = listing(service, dom)
    snapshot = None if name is None else named_snapshot(snapshots, domain, name)
    return {"changed": False, "snapshot": snapshot, "snapshots": snapshots, "current": current,
            "domain_state": service.domain_state(dom)}


def named_snapshot(snapshots: List[Dict[str, Any]], domain: str, name: str) -> Dict[str, Any]:
    found = next((s for s in snapshots if s["name"] == name), None)
    if found is None:
        raise InvalidInputError("name", name, "is not a snapshot of domain %s" % domain,
                                "pick one of: %s" % (", ".join(s["name"] for s in snapshots) or "(none)"))
    return found
