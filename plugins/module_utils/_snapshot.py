# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Snapshot XML and the policy of which snapshots mlinfra.kvm.snapshot makes.

Policy (why): libvirt 9.0 cannot revert to external snapshots, and refuses memory state for
domains with PCI hostdevs (a GPU cannot be migrated/saved). So the module only makes
*internal* snapshots, which libvirt reverts both ways:

* domain shut off: an internal disk snapshot of every writable qcow2 disk (qemu-img
  snapshot); read-only disks and cdroms (seed ISOs) are left out (``snapshot='no'``).
* domain running or paused, without hostdevs: an internal system checkpoint (disks + RAM,
  qemu's savevm); reverting resumes the guest where it was.
* domain running with hostdevs: refused up front with the fix (shut it down first), instead of
  libvirt's late error.

libvirt snapshots have no metadata element; ``metadata`` is kept as a JSON trailer in the
description, behind a marker line, so ``virsh snapshot-info``/``snapshot-dumpxml`` show it and
it survives reverts (domain metadata would be rolled back by a revert).

:class:`SnapshotService` is the only code of mlinfra.kvm.snapshot and mlinfra.kvm.snapshot_info
that talks to libvirt; :func:`load_domain` and :func:`listing` are what both modules report.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from . import _xml as X
from ._domain_service import state_name
from ._errors import InvalidInputError
from ._libvirt import call, libvirt, lookup

METADATA_MARKER = "-- mlinfra.kvm metadata --"


def encode_description(description: Optional[str], metadata: Dict[str, str]) -> str:
    text = description or ""
    if metadata:
        trailer = json.dumps(metadata, sort_keys=True, separators=(",", ":"))
        text = "%s\n%s\n%s" % (text, METADATA_MARKER, trailer) if text else "%s\n%s" % (METADATA_MARKER, trailer)
    return text


def decode_description(text: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """(description, metadata) from a stored description; foreign text is all description."""
    text = text or ""
    head, sep, tail = text.rpartition(METADATA_MARKER)
    if not sep:
        return text, {}
    try:
        metadata = json.loads(tail.strip())
    except ValueError:
        return text, {}
    if not isinstance(metadata, dict):
        return text, {}
    return head.rstrip("\n"), {str(k): str(v) for k, v in metadata.items()}


def normalise_metadata(value: Any) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError("metadata", value, "is not a mapping",
                                "give a dict of string keys to scalar values, e.g. {commit: abc123, run: '7'}")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or "\n" in key:
            raise InvalidInputError("metadata", key, "is not a usable key", "use non-empty single-line strings")
        if isinstance(item, (dict, list)):
            raise InvalidInputError("metadata.%s" % key, item, "is not a scalar",
                                    "give strings, numbers or booleans (they are stored as strings)")
        out[key] = "" if item is None else str(item)
    return out


def domain_disks(domain_xml: str) -> List[Dict[str, Any]]:
    """Disks of a domain: target, device, format, read-only (what the snapshot policy needs)."""
    root = X.parse(domain_xml)
    disks = []
    for disk in root.findall("devices/disk"):
        disks.append({
            "target": X.attr(disk, "target", "dev"),
            "device": disk.get("device", "disk"),
            "format": X.attr(disk, "driver", "type"),
            "readonly": disk.find("readonly") is not None,
            "source": X.attr(disk, "source", "file") or X.attr(disk, "source", "dev")
            or X.attr(disk, "source", "name"),
        })
    return disks


def has_hostdevs(domain_xml: str) -> bool:
    return X.parse(domain_xml).find("devices/hostdev") is not None


def snapshot_plan(disks: List[Dict[str, Any]]) -> Tuple[List[Dict[str, str]], List[Dict[str, Any]]]:
    """(per-disk snapshot modes, disks that make an internal snapshot impossible)."""
    plan, blockers = [], []
    for disk in disks:
        if disk["readonly"] or disk["device"] in ("cdrom", "floppy"):
            plan.append({"name": disk["target"], "snapshot": "no"})
        elif disk["format"] == "qcow2":
            plan.append({"name": disk["target"], "snapshot": "internal"})
        else:
            blockers.append(disk)
    return plan, blockers


def build_snapshot_xml(name: str, description: str, plan: Optional[List[Dict[str, str]]],
                       with_memory: bool) -> str:
    root = X.element("domainsnapshot")
    X.sub(root, "name", text=name)
    if description:
        X.sub(root, "description", text=description)
    if with_memory:
        X.sub(root, "memory", {"snapshot": "internal"})
    if plan:
        disks = X.sub(root, "disks")
        for disk in plan:
            X.sub(disks, "disk", {"name": disk["name"], "snapshot": disk["snapshot"]})
    return X.to_string(root)


def with_description(snapshot_xml: str, description: str) -> str:
    """The snapshot's full XML with its description replaced (for a REDEFINE)."""
    root = X.parse(snapshot_xml)
    old = root.find("description")
    if old is not None:
        root.remove(old)
    if description:
        el = X.element("description", text=description)
        root.insert(1, el)  # after <name>, where libvirt writes it
    return X.to_string(root)


def describe_snapshot_xml(snapshot_xml: str) -> Dict[str, Any]:
    root = X.parse(snapshot_xml)
    description, metadata = decode_description(X.text(root, "description", ""))
    disks = [{"name": d.get("name"), "snapshot": d.get("snapshot")} for d in root.findall("disks/disk")]
    memory = X.attr(root, "memory", "snapshot")
    external = memory == "external" or any(d["snapshot"] == "external" for d in disks)
    created = X.text(root, "creationTime")
    return {
        "name": X.text(root, "name"),
        "description": description,
        "metadata": metadata,
        "domain_state": X.text(root, "state"),
        "creation_time": int(created) if created and created.isdigit() else None,
        "parent": X.text(root, "parent/name"),
        "memory": memory,
        "location": "external" if external else "internal",
        "disks": disks,
    }


class SnapshotService:
    """The only code that talks to libvirt for snapshots."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def domain(self, name: str) -> Optional[Any]:
        return lookup("looking up domain %s" % name, self.conn.lookupByName, name, (libvirt.VIR_ERR_NO_DOMAIN,))

    def domain_state(self, dom: Any) -> str:
        state = call("reading the state of domain %s" % dom.name(), dom.state)[0]
        return state_name(state)

    def domain_xml(self, dom: Any) -> str:
        # The inactive definition lists every configured disk and hostdev.
        return call("reading the XML of domain %s" % dom.name(), dom.XMLDesc, libvirt.VIR_DOMAIN_XML_INACTIVE)

    def get(self, dom: Any, name: str) -> Optional[Any]:
        return lookup("looking up snapshot %s of %s" % (name, dom.name()), dom.snapshotLookupByName, name,
                      (libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT,))

    def all(self, dom: Any) -> List[Any]:
        return call("listing snapshots of %s" % dom.name(), dom.listAllSnapshots,
                    libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL)

    def xml(self, snap: Any) -> str:
        return call("reading snapshot %s" % snap.getName(), snap.getXMLDesc, 0)

    def is_current(self, snap: Any) -> bool:
        return bool(call("reading snapshot %s" % snap.getName(), snap.isCurrent, 0))

    def describe(self, snap: Any) -> Dict[str, Any]:
        out = describe_snapshot_xml(self.xml(snap))
        out["current"] = self.is_current(snap)
        return out

    def create(self, dom: Any, xml: str) -> Any:
        return call("creating a snapshot of %s" % dom.name(), dom.snapshotCreateXML, xml,
                    libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_VALIDATE)

    def redefine(self, dom: Any, xml: str, current: bool) -> None:
        # What `virsh snapshot-edit` does: same snapshot, new XML; keep the current marker.
        flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE
        if current:
            flags |= libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_CURRENT
        call("redefining snapshot of %s" % dom.name(), dom.snapshotCreateXML, xml, flags)

    def revert(self, snap: Any, after: str, force: bool) -> None:
        flags = {"snapshot": 0, "running": libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_RUNNING,
                 "paused": libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_PAUSED}[after]
        if force:
            flags |= libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_FORCE
        call("reverting to snapshot %s" % snap.getName(), snap.getDomain().revertToSnapshot, snap, flags)

    def delete(self, snap: Any, children: bool) -> None:
        flags = libvirt.VIR_DOMAIN_SNAPSHOT_DELETE_CHILDREN if children else 0
        call("deleting snapshot %s" % snap.getName(), snap.delete, flags)


def load_domain(service: SnapshotService, name: str) -> Any:
    """The domain called ``name`` (option ``domain``); a clear error when there is none."""
    dom = service.domain(name)
    if dom is None:
        raise InvalidInputError("domain", name, "does not exist",
                                "define the domain first (mlinfra.kvm.domain) or fix the name")
    return dom


def listing(service: SnapshotService, dom: Any) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """(every snapshot of ``dom`` described, parents before children; the current one's name)."""
    snapshots = [service.describe(s) for s in service.all(dom)]
    return snapshots, current_name(snapshots)


def current_name(snapshots: List[Dict[str, Any]]) -> Optional[str]:
    return next((s["name"] for s in snapshots if s.get("current")), None)
