#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: snapshot
short_description: Create, revert to and delete internal libvirt snapshots of a domain
version_added: 0.1.0
description:
  - Creates named snapshots of a domain with a description and metadata, reverts the domain to
    one, and deletes them.
  - To list a domain's snapshots, use M(mlinfra.kvm.snapshot_info). (Up to 0.1.x this module
    listed them with C(state=info); that state was removed in 0.2.0.)
  - B(Which snapshots, and why.) The module makes only I(internal) snapshots, because they are
    the only kind libvirt 9.0 can revert to (it cannot revert external snapshots), and because
    libvirt refuses memory state for domains with PCI host devices (a passed-through GPU cannot
    be saved). In detail, see the next three points.
  - A B(shut off) domain gets an internal disk snapshot of every writable qcow2 disk; read-only
    disks and cdroms (seed ISOs) are left out. This is the mode for GPU domains (shut them down
    first).
  - A B(running or paused) domain B(without host devices) gets an internal system checkpoint
    (disks and RAM, qemu C(savevm)); reverting to it resumes the guest where it was. The guest
    is paused while RAM is written.
  - A running or paused domain B(with host devices) is refused, with nothing changed; shut it
    down and snapshot it then. A writable disk that is not qcow2 (raw, block device) is refused
    too, since it cannot hold an internal snapshot.
  - B(Idempotence.) O(state=present) with an existing snapshot of that name changes nothing,
    except its description and metadata when those options are given and differ (the snapshot
    is redefined; its disk state is never retaken). O(state=absent) with no such snapshot
    changes nothing.
  - O(state=reverted) is an action, not a state that can be read back; the disks may have been
    written since the last revert, and libvirt's "current snapshot" marker does not say so. So a
    revert always reverts and always reports C(changed=true), in check mode too. Put it behind
    a C(when:) if it should only run sometimes.
  - libvirt keeps C(metadata) nowhere in a snapshot, so the module stores it as a JSON trailer
    after a marker line in the snapshot's description; C(virsh snapshot-info) shows it, and it
    survives reverts (domain metadata would be rolled back by one).
options:
  domain:
    description: Name of the domain.
    type: str
    required: true
  name:
    description: Snapshot name.
    type: str
    required: true
  state:
    description:
      - V(present) creates the snapshot when it does not exist.
      - V(absent) deletes it (its internal data in the qcow2 files and libvirt's metadata).
      - V(reverted) reverts the domain to it (always an action, see above).
      - There is no V(info) (removed in 0.2.0); use M(mlinfra.kvm.snapshot_info) to list.
    type: str
    choices: [present, absent, reverted]
    default: present
  description:
    description:
      - Free text kept with the snapshot. When not set, an existing snapshot's description is
        left as it is.
    type: str
  metadata:
    description:
      - String keys and scalar values (stored as strings) kept with the snapshot, such as the
        dataset version or commit an experiment ran on.
      - When not set, an existing snapshot's metadata is left as it is; V({}) removes it.
    type: dict
  after_revert:
    description:
      - The domain's state after O(state=reverted). V(snapshot) leaves it as the snapshot was
        taken (shut off for a disk snapshot, running for a checkpoint); V(running) and V(paused)
        start or pause it after the revert.
    type: str
    choices: [snapshot, running, paused]
    default: snapshot
  force:
    description:
      - With O(state=reverted), pass libvirt's REVERT_FORCE flag, needed for risky reverts
        (for example to a checkpoint whose domain configuration no longer matches).
    type: bool
    default: false
  children:
    description: With O(state=absent), delete the snapshot's descendants too.
    type: bool
    default: false
extends_documentation_fragment:
  - mlinfra.kvm.libvirt
  - mlinfra.kvm.libvirt.host_lock
seealso:
  - module: mlinfra.kvm.snapshot_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Shut the GPU worker down before snapshotting it (hostdevs rule out memory snapshots)
  mlinfra.kvm.domain:
    name: worker1
    state: shutdown

- name: Snapshot it before an experiment
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    description: Driver 535, CUDA 11.8, dataset v3
    metadata:
      commit: 4f2a9c1
      dataset: imagenet-v3

- name: List snapshots (a module of its own)
  mlinfra.kvm.snapshot_info:
    domain: worker1
  register: snaps

- name: Roll back and boot
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    state: reverted
    after_revert: running

- name: Drop it
  mlinfra.kvm.snapshot:
    domain: worker1
    name: before-cuda-upgrade
    state: absent
'''

RETURN = r'''
snapshot:
  description: The snapshot after the run (what it would be, in check mode); null when absent.
  returned: always
  type: dict
  contains:
    name: {description: Snapshot name., type: str}
    description: {description: Its description (without the metadata trailer)., type: str}
    metadata: {description: Its metadata., type: dict}
    domain_state: {description: "State of the domain when taken (V(shutoff), V(running), ...).", type: str}
    creation_time: {description: Unix time it was taken., type: int}
    parent: {description: "Parent snapshot name, or null.", type: str}
    current: {description: Whether it is the domain's current snapshot., type: bool}
    location: {description: Always V(internal) for snapshots this module makes., type: str}
    memory: {description: "V(internal) for a checkpoint with RAM, V(no) for a disk snapshot.", type: str}
    disks: {description: "Per disk target, V(internal) or V(no).", type: list, elements: dict}
  sample: {name: before-cuda-upgrade, description: Driver 535, metadata: {commit: 4f2a9c1},
           domain_state: shutoff, current: true, location: internal, memory: "no", parent: null}
snapshots:
  description: All snapshots of the domain after the run, oldest first.
  returned: always
  type: list
  elements: dict
current:
  description: Name of the domain's current snapshot, or null.
  returned: always
  type: str
domain_state:
  description: State of the domain after the run.
  returned: always
  type: str
  sample: shutoff
actions:
  description: The side effects performed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["create internal disk snapshot"]
'''

from typing import Any, Dict, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils import _snapshot as S
from ansible_collections.mlinfra.kvm.plugins.module_utils._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._errors import ConflictError, InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._host_lock import local_object_lock
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import LIBVIRT_ARGSPEC, Connection
from ansible_collections.mlinfra.kvm.plugins.module_utils._module import run
from ansible_collections.mlinfra.kvm.plugins.module_utils._uri import is_local
from ansible_collections.mlinfra.kvm.plugins.module_utils._validate import object_name


class SnapshotRunner:
    def __init__(self, module: AnsibleModule, service: S.SnapshotService) -> None:
        self.module = module
        self.params = module.params
        self.service = service
        self.tracker = DifferenceTracker()
        self.check = module.check_mode

    # -- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        p = self.params
        object_name("domain", p["domain"])
        object_name("name", p["name"])  # required by the argspec
        p["metadata"] = S.normalise_metadata(p["metadata"]) if p["metadata"] is not None else None
        if p["description"] is not None and S.METADATA_MARKER in p["description"]:
            raise InvalidInputError("description", p["description"], "contains the metadata marker line",
                                    "remove '%s' from the description" % S.METADATA_MARKER)

    # -- run --------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        self.validate()
        dom = S.load_domain(self.service, self.params["domain"])
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
        description = p["description"] if p["description"] is not None else before["description"]
        metadata = p["metadata"] if p["metadata"] is not None else before["metadata"]
        changed = [self.tracker.add("description", before["description"], description),
                   self.tracker.add("metadata", before["metadata"], metadata)]
        after = dict(before, description=description, metadata=metadata)
        if any(changed):
            self.tracker.action("update description/metadata")
            if not self.check:
                xml = S.with_description(self.service.xml(snap), S.encode_description(description, metadata))
                self.service.redefine(dom, xml, before["current"])
        return after

    def create(self, dom: Any) -> Dict[str, Any]:
        p = self.params
        domain_state = self.service.domain_state(dom)
        domain_xml = self.service.domain_xml(dom)
        plan, blockers = S.snapshot_plan(S.domain_disks(domain_xml))
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
        if live and S.has_hostdevs(domain_xml):
            raise ConflictError(
                "domain %s is %s and has PCI host devices: libvirt cannot save their state, so a "
                "live snapshot is impossible. Shut the domain down and snapshot it then (a disk "
                "snapshot)" % (dom.name(), domain_state), domain=dom.name(), domain_state=domain_state)
        if domain_state not in ("shutoff", "running", "paused", "blocked"):
            raise ConflictError("domain %s is %s; snapshot it running, paused or shut off"
                                % (dom.name(), domain_state), domain=dom.name(), domain_state=domain_state)
        description = S.encode_description(p["description"], p["metadata"] or {})
        kind = "internal checkpoint (disks + RAM)" if live else "internal disk snapshot"
        self.tracker.add("state", "absent", "present")
        self.tracker.action("create %s" % kind)
        # A checkpoint covers every writable disk by itself (qemu savevm); only the inactive
        # (qemu-img) path needs the per-disk list to skip cdroms.
        xml = S.build_snapshot_xml(p["name"], description, None if live else plan, with_memory=live)
        if self.check:
            predicted = S.describe_snapshot_xml(xml)
            predicted.update(domain_state=domain_state, current=True, memory="internal" if live else "no")
            return predicted
        snap = self.service.create(dom, xml)
        return self.service.describe(snap)

    def ensure_absent(self, snap: Optional[Any], before: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if snap is None:
            return None
        self.tracker.add("state", "present", "absent")
        self.tracker.action("delete snapshot%s" % (" and its children" if self.params["children"] else ""))
        if not self.check:
            self.service.delete(snap, self.params["children"])
        return None

    def ensure_reverted(self, snap: Optional[Any]) -> None:
        p = self.params
        if snap is None:
            raise InvalidInputError("name", p["name"], "is not a snapshot of domain %s" % p["domain"],
                                    "create it first (state=present) or pick one from mlinfra.kvm.snapshot_info")
        # Always an action: see DOCUMENTATION (the disks may have changed since any revert).
        self.tracker.action("revert to %s (then %s)" % (p["name"], p["after_revert"]))
        if not self.check:
            self.service.revert(snap, p["after_revert"], p["force"])

    # -- result -----------------------------------------------------------------------------
    def result(self, dom: Any, name: str, before: Optional[Dict[str, Any]],
               predicted: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        snapshots, current = S.listing(self.service, dom)
        if self.check:
            after = predicted
            snapshots = [s for s in snapshots if s["name"] != name] + ([after] if after else [])
            current = S.current_name(snapshots)
        else:
            after = next((s for s in snapshots if s["name"] == name), None)
        out: Dict[str, Any] = {"changed": self.tracker.changed, "actions": self.tracker.actions,
                               "snapshot": after, "snapshots": snapshots, "current": current,
                               "domain_state": self.service.domain_state(dom)}
        if self.module._diff:
            out["diff"] = self.tracker.diff(self.diff_view(before), self.diff_view(after))
        return out

    @staticmethod
    def diff_view(snap: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        if snap is None:
            return {"state": "absent"}
        return {"state": "present", "description": snap.get("description"), "metadata": snap.get("metadata")}


def main() -> None:
    argument_spec: Dict[str, Any] = dict(
        domain=dict(type="str", required=True),
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent", "reverted"], default="present"),
        description=dict(type="str"),
        metadata=dict(type="dict"),
        after_revert=dict(type="str", choices=["snapshot", "running", "paused"], default="snapshot"),
        force=dict(type="bool", default=False),
        children=dict(type="bool", default=False),
    )
    argument_spec.update(LIBVIRT_ARGSPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)

    def runner() -> Dict[str, Any]:
        with Connection(module.params["uri"]) as conn:
            # The domain's host lock: a revert and a domain run on the same guest take turns.
            with local_object_lock(is_local(conn.uri), "domain", module.params["domain"]):
                return SnapshotRunner(module, S.SnapshotService(conn.conn)).run()

    run(module, runner)


if __name__ == "__main__":
    main()
