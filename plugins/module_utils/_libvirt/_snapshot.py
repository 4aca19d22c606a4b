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
that talks to libvirt; :func:`load_domain` and :func:`listing` are what both modules report;
:class:`SnapshotRunner` reads, compares and acts for mlinfra.kvm.snapshot.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from .._core import _xml as X
from .._core._runner import ObjectRunner
from .._core._errors import ConflictError, InvalidInputError
from .._core._host_lock import local_object_lock
from .._core._validate import object_name, plain_texts
from ._domain_service import state_name
from ._fields import REDEFINE, Field, compare, option_specs
from ._connection import LIBVIRT_ARGSPEC, call, libvirt, lookup

METADATA_MARKER = "-- mlinfra.kvm metadata --"

# A snapshot's fields, declared once. Both are stored in the snapshot's description and changed by
# redefining the snapshot's XML (VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE); the disks and memory it
# captured never change.
FIELD_TABLE: Tuple[Field, ...] = (
    Field("description", dict(description=dict(type="str")), REDEFINE, "description"),
    Field("metadata", dict(metadata=dict(type="dict")), REDEFINE, "metadata"),
)


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


class SnapshotRunner(ObjectRunner):
    def __init__(self, module: AnsibleModule, service: SnapshotService) -> None:
        super().__init__(module, service)

    # -- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        p = self.params
        object_name("domain", p["domain"])
        object_name("name", p["name"])  # required by the argspec
        # Both end in the snapshot's XML: a control character would make lxml raise ("All strings
        # must be XML compatible") instead of the module naming the option.
        plain_texts(p, ("description", "metadata{}"), multiline=("description",))
        p["metadata"] = normalise_metadata(p["metadata"]) if p["metadata"] is not None else None
        if p["description"] is not None and METADATA_MARKER in p["description"]:
            raise InvalidInputError("description", p["description"], "contains the metadata marker line",
                                    "remove '%s' from the description" % METADATA_MARKER)

    # -- converge ---------------------------------------------------------------------------
    def converge(self) -> Dict[str, Any]:
        dom = load_domain(self.service, self.params["domain"])
        name = self.params["name"]
        snap = self.service.get(dom, name)
        before = self.service.describe(snap) if snap is not None else None
        state = self.params["state"]
        predicted: Optional[Dict[str, Any]] = before
        if state == "present":
            predicted = self.ensure_present(dom, snap, before)
        elif state == "absent":
            predicted = self.ensure_absent(snap, before)
        elif state == "reverted":
            self.ensure_reverted(snap)
        return self.result(dom, name, before, predicted)

    def ensure_present(self, dom: Any, snap: Optional[Any], before: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        p = self.params
        if snap is None:
            return self.create(dom)
        # A field left unset keeps its value; both live in the snapshot's description (see above).
        wanted = {f.key: p[f.key] if p[f.key] is not None else before[f.key] for f in FIELD_TABLE}
        changed = compare(self.tracker, before, wanted)
        after = dict(before, **wanted)
        if changed:
            self.tracker.act("update description/metadata", self.redefine_description, dom, snap, wanted,
                             before["current"])
        return after

    def redefine_description(self, dom: Any, snap: Any, wanted: Dict[str, Any], current: bool) -> None:
        xml = with_description(self.service.xml(snap), encode_description(wanted["description"], wanted["metadata"]))
        self.service.redefine(dom, xml, current)

    def create(self, dom: Any) -> Dict[str, Any]:
        p = self.params
        domain_state = self.service.domain_state(dom)
        domain_xml = self.service.domain_xml(dom)
        plan, blockers = snapshot_plan(domain_disks(domain_xml))
        if blockers:
            raise ConflictError(
                "domain %s has writable disks that cannot hold an internal snapshot: %s. Internal "
                "snapshots (the only kind libvirt 9.0 can revert) need qcow2; convert the disks "
                "(qemu-img convert -O qcow2) or mark them read-only"
                % (dom.name(), ", ".join("%s (%s)" % (d["target"], d["format"] or "unknown format") for d in blockers)),
                domain=dom.name(), disks=blockers)
        if not any(d["snapshot"] == "internal" for d in plan):
            raise ConflictError("domain %s has no writable qcow2 disk to snapshot" % dom.name(), domain=dom.name())
        live = domain_state in ("running", "paused", "blocked")
        if live and has_hostdevs(domain_xml):
            raise ConflictError(
                "domain %s is %s and has PCI host devices: libvirt cannot save their state, so a "
                "live snapshot is impossible. Shut the domain down and snapshot it then (a disk "
                "snapshot)" % (dom.name(), domain_state), domain=dom.name(), domain_state=domain_state)
        if domain_state not in ("shutoff", "running", "paused", "blocked"):
            raise ConflictError("domain %s is %s; snapshot it running, paused or shut off"
                                % (dom.name(), domain_state), domain=dom.name(), domain_state=domain_state)
        description = encode_description(p["description"], p["metadata"] or {})
        kind = "internal checkpoint (disks + RAM)" if live else "internal disk snapshot"
        self.tracker.add("state", "absent", "present")
        # A checkpoint covers every writable disk by itself (qemu savevm); only the inactive
        # (qemu-img) path needs the per-disk list to skip cdroms.
        xml = build_snapshot_xml(p["name"], description, None if live else plan, with_memory=live)
        snap = self.tracker.act("create %s" % kind, self.service.create, dom, xml)
        if snap is not None:
            return self.service.describe(snap)
        # Check mode: what the snapshot will be.
        predicted = describe_snapshot_xml(xml)
        predicted.update(domain_state=domain_state, current=True, memory="internal" if live else "no")
        return predicted

    def ensure_absent(self, snap: Optional[Any], before: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if snap is None:
            return None
        self.tracker.add("state", "present", "absent")
        children = self.params["children"]
        self.tracker.act("delete snapshot%s" % (" and its children" if children else ""),
                         self.service.delete, snap, children)
        return None

    def ensure_reverted(self, snap: Optional[Any]) -> None:
        p = self.params
        if snap is None:
            raise InvalidInputError("name", p["name"], "is not a snapshot of domain %s" % p["domain"],
                                    "create it first (state=present) or pick one from mlinfra.kvm.snapshot_info")
        # Always an action: see DOCUMENTATION (the disks may have changed since any revert).
        self.tracker.act("revert to %s (then %s)" % (p["name"], p["after_revert"]),
                         self.service.revert, snap, p["after_revert"], p["force"])

    # -- result -----------------------------------------------------------------------------
    def result(self, dom: Any, name: str, before: Optional[Dict[str, Any]],
               predicted: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        snapshots, current = listing(self.service, dom)
        if self.check:
            after = predicted
            snapshots = [s for s in snapshots if s["name"] != name] + ([after] if after else [])
            current = current_name(snapshots)
        else:
            after = next((s for s in snapshots if s["name"] == name), None)
        out: Dict[str, Any] = {"changed": self.tracker.changed, "actions": self.tracker.actions,
                               "snapshot": after, "snapshots": snapshots, "current": current,
                               "domain_state": self.service.domain_state(dom)}
        return self.with_diff(out, self.diff_view(before), self.diff_view(after))

    @staticmethod
    def diff_view(snap: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        if snap is None:
            return {"state": "absent"}
        view = {"state": "present"}
        view.update({f.key: snap.get(f.key) for f in FIELD_TABLE})
        return view


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        domain=dict(type="str", required=True),
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent", "reverted"], default="present"),
        **option_specs(FIELD_TABLE),
        after_revert=dict(type="str", choices=["snapshot", "running", "paused"], default="snapshot"),
        force=dict(type="bool", default=False),
        children=dict(type="bool", default=False),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_snapshot(module: AnsibleModule, conn: Any, local: bool) -> Dict[str, Any]:
    """One snapshot, on an open connection, under its domain's host lock: a revert and a
    domain run on the same guest take turns."""
    with local_object_lock(local, "domain", module.params["domain"], option="domain"):
        return SnapshotRunner(module, SnapshotService(conn)).run()
