# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Libvirt domains: the runner that mlinfra.kvm.domain and mlinfra.kvm.domains share, the
argument spec, and the resource-list hooks (gathered: a domain's definition as the module's own
input, rendered: the XML a definition would have).

The request (``_domain_request``) validates and turns options into field values, the field table
(``_domain_spec``) reads and writes them in the XML, the service (``_domain_service``) is the only
code that calls libvirt; the runner decides what to do with the difference."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from .._core._runner import ObjectRunner
from ._domain_read import ACTIVE_STATES, sizes
from ._domain_request import DomainRequest
from ._storage_paths import ALLOWED_PATHS_SPEC
from ._domain_service import DomainService, unexpected_reason
from ._domain_spec import (
    FIELDS, LIVE_FIELDS, apply_fields, build_new, differing_fields, disk_element, field_option_specs,
    format_cpuset, hostdev_element, read_fields, read_memballoon)
from .._core._errors import ConflictError, InvalidInputError, KvmError
from .._core._host_lock import local_object_lock
from ._connection import LIBVIRT_ARGSPEC
from ._resource_list import ResourceKind, list_call_cache, read_listed
from .._core._validate import object_name
from .._core._xml import to_string

SUMMARY_FIELDS = ("virt_type", "machine", "vcpus", "max_vcpus", "memory_kib", "max_memory_kib",
                  "interfaces", "disks", "cdroms", "hostdevs", "metadata")


class DomainRunner(ObjectRunner):
    """``replace``: the request declares the whole domain (mlinfra.kvm.domains with state
    replaced or overridden); options it leaves out take the value a new domain gets, and device
    lists it leaves out become empty."""

    def __init__(self, module: AnsibleModule, service: DomainService, replace: bool = False) -> None:
        super().__init__(module, service)
        self.replace = replace
        self.restart_required = False
        self.restarted = False
        self.ip_addresses: List[Dict[str, Any]] = []
        # " (it was shutoff: crashed)" when this run found the domain in a state nobody asked
        # for: the start or resume that undoes it says so.
        self.found_note = ""
        self.before: Dict[str, Any] = {}
        self.after: Dict[str, Any] = {}

    # ------------------------------------------------------------------ entry point
    def converge(self) -> Dict[str, Any]:
        # A failure after side effects (a start, then no IP in time) is reported by
        # ObjectRunner.run as the partial change it is.
        name = object_name("name", self.params["name"])
        dom = self.service.lookup(name)
        state, reason = self.service.state_and_reason(dom) if dom is not None else ("absent", "")
        found_unexpected = unexpected_reason(name, state, reason)
        if found_unexpected:
            # Said even when the requested state puts it back: a guest that crashed is news.
            self.module.warn(found_unexpected)
            self.found_note = " (it was %s: %s)" % (state, reason)
        if self.params["state"] == "absent":
            self.ensure_absent(dom, state)
            return self.result(None, "absent")
        existing = self.service.inactive_root(dom) if dom is not None else None
        # Shut off when the definition is written: not running now, or stopped first below.
        shut_off = state not in ACTIVE_STATES or self.params["state"] in ("shutdown", "destroyed")
        request = DomainRequest(self.params, self.service, existing, shut_off=shut_off)
        desired = request.build()
        if self.replace:
            request.replacement_defaults()
        if dom is None or self.replace:
            request.creation_defaults()
        if dom is None:
            dom = self.define_new(name, desired)
            self.ensure_autostart(dom)
            state = self.start_defined(dom, state)
        elif self.params["state"] in ("shutdown", "destroyed"):
            # Stop first, then change the definition: nothing is attempted live on a guest
            # that is about to stop anyway.
            state = self.ensure_state(dom, state)
            self.update(dom, self.service.inactive_root(dom) if not self.check else existing,
                        desired, state)
            self.ensure_autostart(dom)
        else:
            self.update(dom, existing, desired, state)
            self.ensure_autostart(dom)
            state = self.ensure_state(dom, state)
        return self.result(dom, state)

    # ------------------------------------------------------------------ definition
    def define_new(self, name: str, desired: Dict[str, Any]) -> Optional[Any]:
        root = build_new(name, desired)
        self.before["state"] = "absent"
        self.after["state"] = "shutoff"
        for field in desired:
            self.after[field] = desired[field]
        self.tracker.add("state", "absent", "shutoff")
        return self.tracker.act("define", self.service.define, root)

    def start_defined(self, dom: Any, state: str) -> str:
        """ensure_state for a domain this run has just defined. When its start fails, the
        definition is undone: a domain left defined would make the next run find it shut off
        and report ok (with a definition libvirt cannot start). A domain that existed before
        the run never comes here, so it is left as it was."""
        try:
            return self.ensure_state(dom, state)
        except KvmError as err:
            if self.check or dom is None or not (self.tracker.failed_action or "").startswith("start"):
                raise
            self.undo_define(dom, err)
            raise

    def undo_define(self, dom: Any, err: KvmError) -> None:
        """Undefine ``dom`` after its start failed, and say so in ``err``. When the undefine
        fails too, ``err`` is left for report_partial (changed, with what was done)."""
        done = self.tracker.performed
        try:
            self.tracker.act("undefine (the start failed)", self.service.undefine, dom)
        except KvmError as undo_err:
            err.msg = "%s; undefining the domain this run defined failed too: %s" % (err.msg, undo_err.msg)
            return
        err.details.update(changed=False, actions=self.tracker.performed, undone=done,
                           failed_action=self.tracker.failed_action)
        err.msg = ("%s (domain %s was defined by this run and is undefined again, so nothing is left "
                   "of it: undone %s)" % (err.msg, dom.name(), "; ".join(done)))

    def update(self, dom: Any, existing: Any, desired: Dict[str, Any], state: str) -> None:
        diffs = differing_fields(existing, desired)
        actual = read_fields(existing, diffs)
        for field in diffs:
            self.tracker.add(field, actual[field], desired[field])
            self.before[field], self.after[field] = actual[field], desired[field]
        if not diffs:
            return
        if state not in ACTIVE_STATES:
            self.tracker.act("redefine", self.service.define, apply_fields(existing, desired, diffs))
            return
        live = [f for f in diffs if self.can_apply_live(f, diffs, existing, desired)]
        for field in live:
            self.apply_live(dom, field, actual[field], desired[field])
        rest = [f for f in diffs if f not in live]
        if rest:
            self.tracker.act("redefine (%s; applied at the next start)" % ", ".join(rest),
                             self.redefine_rest, dom, desired, rest)
            self.restart_required = True

    def redefine_rest(self, dom: Any, desired: Dict[str, Any], rest: List[str]) -> None:
        # Re-read: the live changes made just before were written into the config too.
        self.service.define(apply_fields(self.service.inactive_root(dom), desired, rest))

    def can_apply_live(self, field: str, diffs: List[str], existing: Any, desired: Dict[str, Any]) -> bool:
        if field not in LIVE_FIELDS:
            return False
        if field == "vcpus":
            return "max_vcpus" not in diffs
        if field == "memory_kib":
            balloon = desired.get("memballoon", read_memballoon(existing))
            return "max_memory_kib" not in diffs and "memballoon" not in diffs and balloon
        if field == "disks":
            before = read_fields(existing, ["disks"])["disks"]
            changed = [d for d in before if d not in desired["disks"]] + \
                      [d for d in desired["disks"] if d not in before]
            # virtio disks hotplug on a PCIe port; other buses (SATA) cannot, and an in-place
            # change of a disk (same target) is not something to do under a running guest.
            targets = [d["target"] for d in changed]
            return all(d["bus"] == "virtio" for d in changed) and len(set(targets)) == len(targets)
        return True

    def apply_live(self, dom: Any, field: str, before: Any, after: Any) -> None:
        svc = self.service
        if field == "vcpus":
            self.tracker.act("set vcpus live", svc.set_vcpus, dom, after)
        elif field == "memory_kib":
            self.tracker.act("set memory live", svc.set_memory, dom, after)
        elif field == "metadata":
            self.tracker.act("set metadata live", svc.set_metadata, dom, after, live=True)
        elif field == "description":
            self.tracker.act("set description live", svc.set_description, dom, after, live=True)
        elif field == "hostdevs":
            self._swap_devices(dom, before, after, hostdev_element, "hostdev %s", "address")
        elif field == "disks":
            self._swap_devices(dom, before, after, lambda d: disk_element(d, "disk"), "disk %s", "target")

    def _swap_devices(self, dom: Any, before: List[Dict[str, Any]], after: List[Dict[str, Any]],
                      build: Any, label: str, key: str) -> None:
        for item in before:
            if item not in after:
                self.tracker.act("detach " + label % item[key] + " live", self.service.detach, dom, build(item))
        for item in after:
            if item not in before:
                self.tracker.act("attach " + label % item[key] + " live", self.service.attach, dom, build(item))

    def ensure_autostart(self, dom: Optional[Any]) -> None:
        wanted = self.params.get("autostart")
        if wanted is None and self.replace:
            wanted = False  # a new domain's autostart
        if wanted is None:
            return
        current = self.service.autostart(dom) if dom is not None else False
        if self.tracker.add("autostart", current, wanted):
            self.before["autostart"], self.after["autostart"] = current, wanted
            self.tracker.act("autostart %s" % ("on" if wanted else "off"), self.service.set_autostart, dom, wanted)

    # ------------------------------------------------------------------ run state
    def ensure_state(self, dom: Optional[Any], state: str) -> str:
        """Move the domain to the requested run state; returns the (predicted) state."""
        wanted = self.params["state"]
        current = "shutoff" if state == "absent" else state
        active = current in ACTIVE_STATES
        if wanted == "present":
            final = current
        elif wanted == "running":
            final = self._to_running(dom, current)
        elif wanted == "paused":
            final = self._to_paused(dom, current)
        elif wanted == "shutdown":
            final = self._stop(dom, current, graceful=True) if active else current
        else:  # destroyed
            final = self._stop(dom, current, graceful=False) if active else current
        if final not in ACTIVE_STATES or not active:
            # Not running now, or only started in this run: the definition applies as it is.
            self.restart_required = False
        elif self.restart_required and self.params["restart"]:
            self._stop(dom, final, graceful=True)
            self.tracker.act("start (restart)", self.service.start, dom, paused=final == "paused")
            self.restarted, self.restart_required = True, False
        if final != current and state != "absent":
            self.tracker.add("state", current, final)
        if state == "absent":
            self.after["state"] = final
        elif final != current:
            self.before["state"], self.after["state"] = current, final
        if wanted == "running" and self.params["wait_for_ip"]:
            if not self.check:
                self.ip_addresses = self.service.wait_for_ip(dom, self.params["wait_for_ip_timeout"])
            elif dom is not None and current == final == "running":
                # Check mode changes nothing, so a domain that already runs keeps its address: read
                # it once (read only, no wait), and the plays after this one can predict on it.
                self.ip_addresses = self.service.lease_ipv4(dom)
        return final

    def _to_running(self, dom: Optional[Any], current: str) -> str:
        if current == "paused":
            self.tracker.act("resume" + self.found_note, self.service.resume, dom)
        elif current not in ACTIVE_STATES:
            self.tracker.act("start" + self.found_note, self.service.start, dom)
        return "running"

    def _to_paused(self, dom: Optional[Any], current: str) -> str:
        if current == "running":
            self.tracker.act("pause", self.service.suspend, dom)
        elif current not in ACTIVE_STATES:
            self.tracker.act("start paused", self.service.start, dom, paused=True)
        return "paused"

    def _stop(self, dom: Any, current: str, graceful: bool) -> str:
        if not graceful:
            self.tracker.act("destroy", self.service.destroy, dom)
            return "shutoff"
        if current == "paused":
            # A paused guest cannot see the ACPI request.
            self.tracker.act("resume (to shut down)", self.service.resume, dom)
        self.tracker.act("shutdown", self.service.request_shutdown, dom)
        if self.check:
            return "shutoff"  # nothing to wait for
        timeout = self.params["shutdown_timeout"]
        if self.service.wait_shutoff(dom, timeout):
            return "shutoff"
        if not self.params["force"]:
            raise KvmError(
                "domain %s did not shut down within %s s (option shutdown_timeout); the guest may "
                "ignore ACPI. Set force: true to force it off after the timeout, or raise "
                "shutdown_timeout" % (dom.name(), timeout), name=dom.name())
        self.tracker.act("destroy (shutdown timed out)", self.service.destroy, dom)
        return "shutoff"

    # ------------------------------------------------------------------ absent
    def ensure_absent(self, dom: Optional[Any], state: str) -> None:
        if dom is None:
            return
        self.before["state"], self.after["state"] = state, "absent"
        self.tracker.add("state", state, "absent")
        if state in ACTIVE_STATES:
            self.tracker.act("destroy", self.service.destroy, dom)
        self.tracker.act("undefine", self.service.undefine, dom)

    # ------------------------------------------------------------------ result
    def summary(self, dom: Optional[Any], state: str) -> Dict[str, Any]:
        name = self.params["name"]
        if state == "absent":
            return {"name": name, "state": "absent"}
        if dom is None:  # check mode, not defined yet
            values = {f: self.after.get(f) for f in SUMMARY_FIELDS}
            uuid, autostart = "", bool(self.params.get("autostart"))
        else:
            root = self.service.inactive_root(dom)
            values = read_fields(root, SUMMARY_FIELDS)
            if self.check:
                values.update({f: v for f, v in self.after.items() if f in FIELDS})
            uuid = dom.UUIDString()
            autostart = self.after.get("autostart", self.service.autostart(dom))
        return {
            "name": name, "uuid": uuid, "state": state, "autostart": autostart,
            "virt_type": values["virt_type"], "machine": values["machine"], **sizes(values),
            "interfaces": values["interfaces"], "disks": values["disks"], "cdroms": values["cdroms"],
            "hostdevs": values["hostdevs"], "metadata": values["metadata"],
            "ip_addresses": self.ip_addresses,
        }

    def result(self, dom: Optional[Any], state: str) -> Dict[str, Any]:
        out = {
            "changed": self.tracker.changed,
            "actions": self.tracker.actions,
            "restart_required": self.restart_required,
            "restarted": self.restarted,
            "domain": self.summary(dom, state),
            "xml": "" if self.check or dom is None or state == "absent"
            else to_string(self.service.inactive_root(dom)),
        }
        return self.with_diff(out, self.before, self.after)


def argument_spec() -> Dict[str, Any]:
    """The domain's own options come from its field table (``_domain_spec.FIELD_TABLE``); these
    are the ones that say what to do with it."""
    spec: Dict[str, Any] = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="present",
                   choices=["present", "running", "paused", "shutdown", "destroyed", "absent"]),
        **field_option_specs(),
        autostart=dict(type="bool"),
        restart=dict(type="bool", default=False),
        shutdown_timeout=dict(type="int", default=120),
        force=dict(type="bool", default=False),
        wait_for_ip=dict(type="bool", default=False),
        wait_for_ip_timeout=dict(type="int", default=300),
        sysfs_root=dict(type="path", default="/sys"),
        **ALLOWED_PATHS_SPEC,
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_domain(module: AnsibleModule, conn: Any, local: bool, replace: bool = False) -> Dict[str, Any]:
    """One domain, on an open connection (mlinfra.kvm.domain), under the domain's host lock
    (_host_lock)."""
    with local_object_lock(local, "domain", module.params["name"]):
        return _run_locked_domain(module, conn, replace)


def _run_locked_domain(module: AnsibleModule, conn: Any, replace: bool) -> Dict[str, Any]:
    service = DomainService(conn, module.params["uri"], module.params["sysfs_root"])
    shared = list_call_cache(module)  # a domains list: one PCI scan for the whole call
    if shared is not None:
        service.share_pci(shared.setdefault(("pci", module.params["sysfs_root"]), service.pci()))
    return DomainRunner(module, service, replace=replace).run()


# -- resource list (mlinfra.kvm.domains) -------------------------------------------------------

def run_listed_domain(module: AnsibleModule, conn: Any, local: bool, replace: bool = False) -> Dict[str, Any]:
    """A domains item. Removing a running domain (an item's state absent, state deleted, or a
    domain that overridden finds in scope and unlisted) needs force: a list removes many
    objects at once, and a typo in a name or a scope must not destroy a running guest. The
    guard reads the state under the same lock as the change."""
    params = module.params
    with local_object_lock(local, "domain", params["name"]):
        if params["state"] == "absent" and not params["force"]:
            service = DomainService(conn, params["uri"], params["sysfs_root"])
            dom = service.lookup(params["name"])
            state = service.state(dom) if dom is not None else "absent"
            if state in ACTIVE_STATES:
                raise ConflictError(
                    "domain %s is %s: a domains list removes a running domain only with force: true (on the "
                    "item, or on the call for deleted and overridden); shut it down first, or set force"
                    % (params["name"], state), name=params["name"], option="force")
        return _run_locked_domain(module, conn, replace)


def run_replaced_domain(module: AnsibleModule, conn: Any, local: bool) -> Dict[str, Any]:
    return run_listed_domain(module, conn, local, replace=True)


def _size(kib: int) -> str:
    return "%dM" % (kib // 1024) if kib % 1024 == 0 else "%dK" % kib


def _without_none(value: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in value.items() if v is not None}


def domain_item(name: str, root: Any, state: str, autostart: bool) -> Dict[str, Any]:
    """A defined domain as a domains item: the options of mlinfra.kvm.domain that produce it.
    A device the options cannot express (an IDE disk, a user-mode NIC) is kept as it is, so
    that feeding the item back fails naming it rather than dropping the device."""
    values = read_fields(root, FIELDS)
    item: Dict[str, Any] = {
        "name": name, "state": state if state in ("running", "paused") else "present", "autostart": autostart,
        "virt_type": values["virt_type"], "machine": values["machine"], "arch": values["arch"],
        "memory": _size(values["memory_kib"]), "max_memory": _size(values["max_memory_kib"]),
        "vcpus": values["vcpus"], "max_vcpus": values["max_vcpus"],
        "disks": [_without_none(d) for d in values["disks"]],
        "cdroms": [_without_none(d) for d in values["cdroms"]],
        "interfaces": [_without_none(i) for i in values["interfaces"]],
        "hostdevs": values["hostdevs"], "metadata": values["metadata"],
        "rng": values["rng"], "guest_agent": values["guest_agent"], "memballoon": values["memballoon"],
    }
    for disk in item["cdroms"]:
        disk.pop("format", None)  # a cdrom's format is not an option (always raw)
    cpu = values["cpu"]
    if cpu["mode"] not in (None, "custom"):
        item["cpu"] = cpu
    elif any(cpu[k] for k in ("sockets", "cores", "threads")):
        item["cpu"] = dict(cpu, mode=None)
    tune = values["cputune"]
    if tune["vcpupin"] or tune["emulatorpin"]:
        item["cpu_pinning"] = {"vcpupin": [{"vcpu": p["vcpu"], "cpuset": format_cpuset(p["cpuset"])}
                                           for p in tune["vcpupin"]],
                               "emulatorpin": format_cpuset(tune["emulatorpin"]) if tune["emulatorpin"] else None}
    numa = values["numatune"]
    if numa["mode"]:
        item["numa_tuning"] = {"mode": numa["mode"], "nodeset": format_cpuset(numa["nodeset"] or [])}
    huge = values["hugepages"]
    if huge["enabled"]:
        item["hugepages"] = True
        if huge["page_size_kib"]:
            item["hugepage_size"] = "%dK" % huge["page_size_kib"]
    firmware = values["firmware"]
    item["firmware"] = firmware["type"]
    if firmware["type"] == "kernel":
        item.update(_without_none({k: firmware[k] for k in ("kernel", "initrd", "cmdline")}))
    elif firmware["type"] == "uefi":
        item.update(_without_none({"ovmf_code": firmware["loader"], "ovmf_vars": firmware["nvram_template"]}))
    if values["boot"]:
        item["boot"] = values["boot"]
    console = values["console"]
    item["console"] = console["enabled"]
    if console["log"]:
        item["console_log"] = console["log"]
    hidden = values["hide_hypervisor"]
    if hidden["kvm_hidden"] or hidden["vendor_id"]:
        item["hide_hypervisor"] = hidden["kvm_hidden"]
        if hidden["vendor_id"]:
            item["hypervisor_vendor_id"] = hidden["vendor_id"]
    if values["description"] is not None:
        item["description"] = values["description"]
    return item


def gather_domains(conn: Any) -> List[Dict[str, Any]]:
    """Every defined domain as a domains item (the module's own input format)."""
    # The URI matters only to the host checks (local paths, PCI, limits): a gathered read makes none.
    service = DomainService(conn, "")

    def read(dom: Any) -> Dict[str, Any]:
        root = service.inactive_root(dom, secure=False)
        state = service.state(dom)
        return domain_item(dom.name(), root, state, service.autostart_uncaught(dom))

    return sorted(read_listed(service.list_all(), read), key=lambda i: i["name"])


class OfflineDomainService:
    """What DomainRequest asks of the hypervisor, answered without one (state rendered): names
    of networks and pools are taken as given, files as present, a volume's format from its name."""

    def kvm_available(self) -> bool:
        return True  # rendered XML is for a KVM hypervisor unless the item sets virt_type

    def host_limits(self) -> Optional[Dict[str, Any]]:
        return None  # no host: memory and CPU pins are checked when the item is applied

    def network_exists(self, name: str) -> bool:
        return True

    def pool_exists(self, name: str) -> bool:
        return True

    def volume_format(self, pool_name: str, volume: str) -> Optional[str]:
        return "qcow2" if volume.endswith(".qcow2") else "raw"

    def path_exists(self, path: str) -> Optional[bool]:
        return None

    def storage_policy(self, allowed_paths: Any) -> None:
        return None  # no host, no pools: a disk's path is checked when the item is applied

    def pci(self) -> "OfflineDomainService":
        return self  # an empty PCI source: render_domain refuses hostdevs before they are resolved

    def devices(self) -> Dict[str, Any]:
        return {}


def render_domain(params: Dict[str, Any]) -> str:
    if params.get("hostdevs"):
        raise InvalidInputError("hostdevs", params["hostdevs"],
                                "cannot be rendered: a passthrough device is checked against the hypervisor's "
                                "IOMMU groups and drivers", "leave hostdevs out of rendered items, or run "
                                "state merged in check mode against the hypervisor")
    request = DomainRequest(params, OfflineDomainService(), None)
    desired = request.build()
    request.creation_defaults()
    return to_string(build_new(object_name("name", params["name"]), desired))


def precheck_domain(params: Dict[str, Any]) -> None:
    object_name("name", params["name"])


LIST_KIND = ResourceKind("domain", argument_spec(), [], run_listed_domain, gather_domains, render_domain,
                         precheck_domain, item_states=("present", "running", "paused", "shutdown", "destroyed"),
                         apply_replaced=run_replaced_domain, merge_onto_current=False,
                         required_when_replaced=("memory", "vcpus"))
