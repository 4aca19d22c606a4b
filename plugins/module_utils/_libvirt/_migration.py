# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Moving a domain from one hypervisor to another: the runner of mlinfra.kvm.domain_migration,
its argument spec and its preflight.

Two ways, chosen from the domain, never guessed from the outcome:

* **live** (a running or paused domain without PCI host devices): libvirt's peer-to-peer migration
  (the source's libvirtd talks to the destination's; QEMU streams memory, and disks through NBD
  where storage is not shared), bounded by a maximum downtime and an overall timeout past which
  the job is aborted. The domain never stops; a failure leaves it running on the source.
* **cold** (a shut-off domain, or a running one with host devices and ``allow_cold``): a passed-
  through device's state cannot be migrated, so the guest is shut down cleanly, its disk images
  are copied through libvirt streams, it is defined on the destination with host devices chosen
  there (the selector grammar of mlinfra.kvm.domain), started if it ran, and undefined on the
  source. A failure after the shutdown undoes what was done and starts it on the source again.

Nothing moves before the **preflight** has passed: the destination has the domain's networks and
storage, room in its pools, enough free memory, a CPU that can run the domain's, no domain of that
name or UUID, and (cold) usable host devices. Every refusal names what is missing and the fix; all
problems are reported at once. Check mode runs the preflight and reports the planned actions.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from .._core._errors import ConflictError, InvalidInputError, KvmError
from .._core._host_lock import local_object_lock
from .._core._runner import ObjectRunner
from .._core._validate import int_range, object_name, plain_text
from .._core._xml import element, parse, sub, to_string
from .._host._pci import group_blockers
from .._host._pci_select import parse_selector
from ._connection import LIBVIRT_ARGSPEC, Connection, libvirt, resolve_uri
from ._domain_read import ACTIVE_STATES
from ._domain_spec import FIELDS as DOMAIN_FIELDS, hostdev_addresses, write_hostdevs
from ._fields import option_specs
from ._migration_service import SHARED_POOL_TYPES, MigrationService
from ._uri import is_local

MIB = 1024 * 1024
POLL_S = 0.5          # how often a running live migration's job statistics are read
PROGRESS_LINES = 120  # the most progress lines a result carries (first and last ones kept)
ABORT_WAIT_S = 60     # how long an aborted migration may take to give up
# A migration URI: where the source's QEMU sends the stream (and NBD the disks): tcp or rdma,
# a host or [IPv6] and an optional port, nothing else (it is passed to libvirt as it is).
MIGRATION_URI_RE = re.compile(r"^(tcp|rdma)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:\d{1,5})?$")
COPY_MODES = ("auto", "all", "incremental", "none")
# What the preflight does with a volume the destination already has at a copied disk's path.
STALE_DISKS = ("refuse", "replace")


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        name=dict(type="str", required=True),
        dest_uri=dict(type="str", required=True),
        migration_uri=dict(type="str"),
        copy_storage=dict(type="str", choices=list(COPY_MODES), default="auto"),
        max_downtime_ms=dict(type="int"),
        timeout=dict(type="int", default=600),
        allow_cold=dict(type="bool", default=False),
        shutdown_timeout=dict(type="int", default=120),
        remove_source_disks=dict(type="bool", default=True),
        stale_disks=dict(type="str", choices=list(STALE_DISKS), default="refuse"),
        # The selector grammar and suboptions of mlinfra.kvm.domain's hostdevs, declared once there.
        **option_specs((DOMAIN_FIELDS["hostdevs"],)),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


# ---------------------------------------------------------------------------------------------
# The domain's disks, read from its XML
# ---------------------------------------------------------------------------------------------
def read_disks(root: Any) -> List[Dict[str, Any]]:
    """Each ``<disk>``: target, device, type, path (file/dev), pool/volume, format, read-only,
    shareable; what decides whether a migration copies it."""
    disks = []
    for disk in root.findall("devices/disk"):
        source = disk.find("source")
        driver = disk.find("driver")
        path = None
        if source is not None:
            path = source.get("file") or source.get("dev")
        disks.append({
            "target": disk.find("target").get("dev") if disk.find("target") is not None else None,
            "device": disk.get("device", "disk"), "type": disk.get("type", "file"),
            "path": os.path.normpath(path) if path else None,
            "pool": source.get("pool") if source is not None else None,
            "volume": source.get("volume") if source is not None else None,
            "format": driver.get("type") if driver is not None else None,
            "readonly": disk.find("readonly") is not None, "shareable": disk.find("shareable") is not None,
        })
    return disks


def copyable(disk: Dict[str, Any]) -> bool:
    """A writable disk image in a file or pool volume: the kind a migration copies when storage is
    not shared. Read-only disks, cdroms and shareable disks are never copied (libvirt neither)."""
    return (disk["device"] == "disk" and not disk["readonly"] and not disk["shareable"]
            and disk["type"] in ("file", "volume") and bool(disk["path"]))


def network_names(root: Any) -> List[Tuple[str, str]]:
    """(network, MAC) of each interface on a libvirt network."""
    out = []
    for iface in root.findall("devices/interface[@type='network']"):
        source = iface.find("source")
        mac = iface.find("mac")
        if source is not None and source.get("network"):
            out.append((source.get("network"), mac.get("address") if mac is not None else "?"))
    return out


def memory_bytes(root: Any) -> int:
    """What the domain occupies when it runs: its current memory (else its maximum), in bytes."""
    el = root.find("currentMemory")
    if el is None:
        el = root.find("memory")
    if el is None or not (el.text or "").strip().isdigit():
        return 0
    units = {"b": 1, "bytes": 1, "kib": 1024, "k": 1024, "mib": MIB, "m": MIB, "gib": MIB * 1024, "g": MIB * 1024}
    return int(el.text.strip()) * units.get((el.get("unit") or "KiB").lower(), 1024)


def human(size: Optional[int]) -> str:
    return "?" if size is None else "%.1f MiB" % (size / MIB)


def progress_line(stats: Dict[str, Any]) -> str:
    """One line of a running job's statistics: what is left of memory and disks, and the rate."""
    elapsed = stats.get("time_elapsed", 0) / 1000.0
    parts = ["%.1f s" % elapsed]
    if stats.get("memory_total"):
        parts.append("memory %s of %s remaining" % (human(stats.get("memory_remaining")), human(stats["memory_total"])))
    if stats.get("disk_total"):
        parts.append("disks %s of %s remaining" % (human(stats.get("disk_remaining")), human(stats["disk_total"])))
    if not stats.get("memory_total") and not stats.get("disk_total") and "data_remaining" in stats:
        parts.append("%s remaining" % human(stats["data_remaining"]))
    if stats.get("memory_iteration"):
        parts.append("pass %d" % stats["memory_iteration"])
    if stats.get("memory_bps"):
        parts.append("%s/s" % human(stats["memory_bps"]))
    return ", ".join(parts)


def volume_xml(name: str, capacity: int, fmt: str, backing: Optional[str] = None,
               backing_format: Optional[str] = None) -> str:
    """A volume for the destination's pool (built with lxml, never from strings)."""
    root = element("volume")
    sub(root, "name", text=name)
    sub(root, "capacity", {"unit": "bytes"}, capacity)
    target = sub(root, "target")
    sub(target, "format", {"type": fmt})
    if backing:
        store = sub(root, "backingStore")
        sub(store, "path", text=backing)
        if backing_format:
            sub(store, "format", {"type": backing_format})
    return to_string(root)


class Preflight:
    """What a migration needs, checked on the destination before anything moves. ``passed``
    holds a line per check that passed (the result's ``preflight``), ``problems`` a sentence per
    refusal, each naming what is missing and the fix; ``notes`` what could not be checked."""

    def __init__(self) -> None:
        self.passed: List[str] = []
        self.problems: List[str] = []
        self.notes: List[str] = []

    def ok(self, line: str) -> None:
        self.passed.append(line)

    def refuse(self, line: str) -> None:
        self.problems.append(line)

    def note(self, line: str) -> None:
        self.notes.append(line)


def validate_request(params: Dict[str, Any], src_uri: str) -> List[Tuple[Any, bool]]:
    """Refuse bad input before any connection is opened (and again in the runner, which may be
    given a module directly); returns the parsed hostdevs selectors with their managed flags."""
    object_name("name", params["name"])
    dest_uri = plain_text("dest_uri", params["dest_uri"])
    if not isinstance(dest_uri, str) or not dest_uri.strip() or any(c.isspace() for c in dest_uri):
        raise InvalidInputError("dest_uri", dest_uri, "is not a libvirt URI",
                                "give the destination's URI, e.g. qemu+ssh://root@hv2/system or qemu+tcp://hv2/system")
    if dest_uri == src_uri:
        raise InvalidInputError("dest_uri", dest_uri, "is the source's URI (option uri)",
                                "give the other hypervisor's URI: a domain cannot move to where it is")
    if params["migration_uri"] is not None:
        plain_text("migration_uri", params["migration_uri"])
        if not MIGRATION_URI_RE.match(str(params["migration_uri"])):
            raise InvalidInputError("migration_uri", params["migration_uri"], "is not a migration URI",
                                    "give tcp://ADDRESS[:PORT] of the destination on the network the stream should take")
    if params["max_downtime_ms"] is not None:
        params["max_downtime_ms"] = int_range("max_downtime_ms", params["max_downtime_ms"], 1, 600000,
                                              "the pause allowed at the switch-over; QEMU's default is 300")
    if params.get("stale_disks", "refuse") not in STALE_DISKS:
        raise InvalidInputError("stale_disks", params["stale_disks"], "is not one of %s" % ", ".join(STALE_DISKS),
                                "give refuse (the default: a volume at a copied disk's path on the destination stops "
                                "the move) or replace (it is removed first when no domain there uses it)")
    params["timeout"] = int_range("timeout", params["timeout"], 1, 86400, "seconds for the whole move")
    params["shutdown_timeout"] = int_range("shutdown_timeout", params["shutdown_timeout"], 1, 3600,
                                           "seconds the guest may take to shut down cleanly")
    selectors = []
    for index, item in enumerate(params["hostdevs"] or []):
        selector = parse_selector("hostdevs[%d]" % index, item)
        if selector.index is None and selector.address is None:
            selector.index = 0
        selectors.append((selector, bool(item.get("managed", True))))
    return selectors


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------
class MigrationRunner(ObjectRunner):
    def __init__(self, module: AnsibleModule, service: MigrationService, monotonic: Any = time.monotonic) -> None:
        super().__init__(module, service)
        self.monotonic = monotonic
        self.src_uri = service.src_uri
        self.dst_uri = service.dst_uri
        self.progress: List[str] = []
        self.downtime_ms: Optional[int] = None
        self.undone: List[str] = []
        self.replaced: List[str] = []  # the destination's stale volumes removed (stale_disks: replace)
        self.selectors: List[Tuple[Any, bool]] = []
        self.dest_hostdevs: List[Dict[str, Any]] = []
        self._pools: Dict[str, List[Dict[str, Any]]] = {}
        self._dest_users: Optional[Dict[str, str]] = None  # path -> domain of the destination using it

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        self.selectors = validate_request(self.params, self.src_uri)

    # -- converge ------------------------------------------------------------------------------
    def converge(self) -> Dict[str, Any]:
        name = self.params["name"]
        src_dom = self.service.source.lookup(name)
        dst_dom = self.service.dest.lookup(name)
        if src_dom is None and dst_dom is not None:
            return self.already_there(dst_dom)
        if src_dom is None:
            raise InvalidInputError("name", name, "is a domain on neither the source (%s) nor the destination (%s)"
                                    % (self.src_uri, self.dst_uri), "check the name and both URIs")
        if dst_dom is not None:
            raise ConflictError(
                "domain %s exists on both the source (%s) and the destination (%s); a migration would leave two "
                "definitions. Undefine the stale one (a copy left by an interrupted move: check which one runs and "
                "holds the newer disks), then run again" % (name, self.src_uri, self.dst_uri), domain=name)
        state = self.service.source.state(src_dom)
        inactive = self.service.source.inactive_root(src_dom)
        live = self.service.source.live_root(src_dom) if state in ACTIVE_STATES else inactive
        mode = self.choose_mode(src_dom, state, live, inactive)
        disks = self.disk_plan(src_dom, live, mode)
        check = Preflight()
        self.preflight(check, src_dom, state, live, inactive, mode, disks)
        if check.problems:
            raise ConflictError(
                "domain %s cannot move to %s, nothing was changed: %s" % (name, self.dst_uri, " ".join(
                    "(%d) %s" % (n + 1, line) for n, line in enumerate(check.problems))),
                domain=name, problems=check.problems, preflight=check.passed)
        for line in check.notes:
            self.module.warn(line)
        autostart = self.service.source.autostart(src_dom)
        self.replace_stale(disks["plan"])
        if mode == "live":
            self.move_live(src_dom, disks["plan"], disks["copy_storage"])
        else:
            self.move_cold(src_dom, state, inactive, disks["plan"])
        if autostart:
            self.tracker.act("set autostart on the destination", self.set_dest_autostart, name)
        self.remove_source_disks(name, disks["plan"])
        return self.result(name, state, mode, disks, check, src_dom)

    def already_there(self, dst_dom: Any) -> Dict[str, Any]:
        state = self.service.dest.state(dst_dom)
        view = {"uri": self.dst_uri, "state": state}
        return self.with_diff({
            "changed": False, "actions": [], "mode": "none", "source": self.src_uri, "destination": self.dst_uri,
            "domain": {"name": dst_dom.name(), "uuid": dst_dom.UUIDString(), "state": state, "uri": self.dst_uri},
            "copy_storage": "none", "disks": [], "preflight": [], "progress": [], "downtime_ms": None,
            "hostdevs": [h["address"] for h in hostdev_addresses(self.service.dest.inactive_root(dst_dom))],
        }, view, view)

    # -- the way: live or cold -----------------------------------------------------------------
    def choose_mode(self, dom: Any, state: str, live: Any, inactive: Any) -> str:
        """live for a running domain without host devices; cold for a shut-off one, and for a
        running one with host devices only when allow_cold says so."""
        name = dom.name()
        hostdevs = sorted({h["address"] for root in (live, inactive) for h in hostdev_addresses(root)})
        if state == "shutoff":
            mode = "cold"
        elif state not in ("running", "paused", "blocked"):
            raise ConflictError("domain %s is %s on the source; migrate it running, paused or shut off (wait for it to "
                                "settle, or start or shut it down with mlinfra.kvm.domain)" % (name, state),
                                domain=name, domain_state=state)
        elif hostdevs and not self.params["allow_cold"]:
            raise ConflictError(
                "domain %s has PCI host devices (%s): a passed-through device's state cannot be migrated, so a live "
                "migration is impossible. Set allow_cold: true to shut the guest down, copy its disks and start it on "
                "the destination (downtime), with hostdevs: the destination's devices (the selectors of "
                "mlinfra.kvm.domain)" % (name, ", ".join(hostdevs)), domain=name, hostdevs=hostdevs)
        elif hostdevs:
            if state != "running":
                raise ConflictError("domain %s is %s and has PCI host devices: a cold move shuts the guest down, which a "
                                    "paused guest cannot do; resume it first" % (name, state), domain=name)
            mode = "cold"
        else:
            mode = "live"
        if self.params["hostdevs"] is not None:
            if mode == "live":
                raise InvalidInputError("hostdevs", self.params["hostdevs"], "applies to a cold move only",
                                        "leave it out: domain %s has no PCI host devices and moves live" % name)
            if not hostdevs:
                raise InvalidInputError("hostdevs", self.params["hostdevs"], "is for a domain with PCI host devices",
                                        "leave it out: domain %s has none to choose on the destination" % name)
        if mode == "cold" and not self.service.is_persistent(dom):
            raise ConflictError("domain %s is transient (not defined) on the source: a cold move shuts it down, which "
                                "would remove it; define it first (virsh dumpxml | virsh define)" % name, domain=name)
        return mode

    def disk_plan(self, dom: Any, root: Any, mode: str) -> Dict[str, Any]:
        """Each disk with what the move does with it (``copy``: the whole image, flattened;
        ``copy-top``: the top image only, its backing already on the destination; ``present``: not
        copied, must already be on the destination), and the copy_storage that results."""
        wanted = self.params["copy_storage"]
        plan = []
        for disk in read_disks(root):
            if disk["type"] == "volume" and disk["pool"] and disk["volume"]:
                disk["path"] = self.service.volume_path("source", disk["pool"], disk["volume"])
                if disk["path"] is None:
                    raise ConflictError("disk %s of domain %s is volume %s of pool %s, which the source does not have "
                                        "active: start the pool there (mlinfra.kvm.pool state=active)"
                                        % (disk["target"], dom.name(), disk["volume"], disk["pool"]), domain=dom.name())
            if not disk["path"] and disk["type"] != "network":
                continue  # an empty cdrom: nothing to find anywhere
            disk["source_volume"] = self.service.volume_at("source", disk["path"]) if disk["path"] else None
            disk["shared"] = disk["type"] == "network" or self.on_shared_pool(disk)
            disk["action"] = "copy" if copyable(disk) and not disk["shared"] and wanted != "none" else "present"
            plan.append(disk)
        copied = [d for d in plan if d["action"] == "copy"]
        for disk in copied:
            backing = (disk["source_volume"] or {}).get("backing")
            disk["backing"] = os.path.normpath(backing) if backing else None
            disk["backing_on_dest"] = bool(disk["backing"]) and self.service.volume_at("dest", disk["backing"]) is not None
        # libvirt cannot copy a type='volume' disk incrementally during a live migration: the
        # destination sees no path for it before the pool is asked, takes it for missing and
        # refuses ("pre-creation of storage targets for incremental storage migration").
        by_volume = [d["target"] for d in copied if d["type"] == "volume"]
        if not copied:
            effective = "none"
        elif mode == "cold" or wanted == "incremental" or (
                wanted == "auto" and not by_volume and all(not d["backing"] or d["backing_on_dest"] for d in copied)):
            # A cold copy moves the image file as it is (its backing must be there): the top only.
            effective = "incremental"
        else:
            effective = "all"
        if mode == "live" and effective == "incremental" and by_volume:
            raise InvalidInputError("copy_storage", wanted, "cannot copy disks of type volume (%s) live: libvirt copies "
                                    "those only whole" % ", ".join(by_volume),
                                    "use copy_storage: all (or auto), or none where the storage is shared")
        for disk in copied:
            if effective == "incremental" and disk["backing"]:
                disk["action"] = "copy-top"
            if mode == "live" and disk["source_volume"] is None:
                disk["block"] = self.service.block_info(dom, disk["target"])
        return {"plan": plan, "copy_storage": effective}

    def on_shared_pool(self, disk: Dict[str, Any]) -> bool:
        vol = disk.get("source_volume")
        if vol is None:
            return False
        pools = {p["name"]: p for p in self.source_pools()}
        return (pools.get(vol["pool"]) or {}).get("type") in SHARED_POOL_TYPES

    def source_pools(self) -> List[Dict[str, Any]]:
        return self.pools("source")

    def dest_pools(self) -> List[Dict[str, Any]]:
        return self.pools("dest")

    def pools(self, which: str) -> List[Dict[str, Any]]:
        """A side's storage pools, read once per run."""
        if which not in self._pools:
            self._pools[which] = self.service.pools(which)
        return self._pools[which]

    # -- the preflight -------------------------------------------------------------------------
    def preflight(self, check: Preflight, dom: Any, state: str, live: Any, inactive: Any, mode: str,
                  disks: Dict[str, Any]) -> None:
        name = self.params["name"]
        will_run = state in ACTIVE_STATES
        uuid = dom.UUIDString()
        other = self.service.dest_domain_by_uuid(uuid)
        if other is not None:
            check.refuse("the destination has domain %s with this domain's UUID %s: undefine it there (a stale copy) "
                         "or give one of them a new UUID" % (other.name(), uuid))
        else:
            check.ok("no domain named %s and none with UUID %s on the destination" % (name, uuid))
        self.check_networks(check, live, will_run)
        self.check_storage(check, disks, mode)
        if will_run:
            self.check_memory(check, live)
        self.check_cpu(check, live if will_run else inactive, will_run)
        if mode == "cold" and (hostdev_addresses(inactive) or self.selectors):
            self.check_hostdevs(check, inactive)

    def check_networks(self, check: Preflight, root: Any, will_run: bool) -> None:
        for network, mac in network_names(root):
            active = self.service.network_state(network)
            if active is None:
                check.refuse("network %s (interface %s) does not exist on the destination: define it there with the "
                             "same name (mlinfra.kvm.network)" % (network, mac))
            elif will_run and not active:
                check.refuse("network %s (interface %s) is not active on the destination: start it there "
                             "(mlinfra.kvm.network state=active)" % (network, mac))
            else:
                check.ok("network %s is %s on the destination" % (network, "active" if active else "defined"))
        for iface in root.findall("devices/interface"):
            if iface.get("type") in ("bridge", "direct"):
                source = iface.find("source")
                device = source.get("bridge") or source.get("dev") if source is not None else "?"
                check.note("interface on %s %s: libvirt cannot show another host's %ss; it must exist on the destination"
                           % (iface.get("type"), device, "bridge" if iface.get("type") == "bridge" else "device"))

    def check_storage(self, check: Preflight, disks: Dict[str, Any], mode: str) -> None:
        needed: Dict[str, int] = {}
        freed: Dict[str, int] = {}  # pool -> bytes the removal of stale volumes gives back
        for disk in disks["plan"]:
            where = "disk %s (%s)" % (disk["target"], disk["path"] or "network")
            if disk["type"] == "network":
                check.ok("%s is network storage: not copied" % where)
                continue
            if disk["action"] == "present":
                why = ("read-only" if disk["readonly"] or disk["device"] != "disk" else "shareable" if disk["shareable"]
                       else "on shared storage" if disk["shared"] else "copy_storage none")
                if not self.on_dest(disk):
                    check.refuse("%s is not copied (%s) and the destination has no volume at that path: make it available "
                                 "there in a storage pool at the same path (shared storage), or let it be copied "
                                 "(copy_storage auto)" % (where, why))
                else:
                    check.ok("%s is not copied (%s) and is on the destination" % (where, why))
                continue
            pool = self.dest_pool_for(disk)
            if pool is None:
                check.refuse("%s is copied, and the destination has no active storage pool %s: define and start one there "
                             "(mlinfra.kvm.pool%s)" % (where, "named %s" % disk["pool"] if disk["type"] == "volume"
                                                       else "with target %s" % os.path.dirname(disk["path"]),
                                                       "" if disk["type"] == "volume" else " target: %s"
                                                       % os.path.dirname(disk["path"])))
                continue
            disk["dest"] = {"pool": pool["name"], "name": disk["volume"] if disk["type"] == "volume"
                            else os.path.basename(disk["path"])}
            if self.on_dest(disk):
                stale = self.stale_volume(check, disk, where)
                if stale is None:
                    continue
                disk["replace"] = stale
                freed[stale["pool"]] = freed.get(stale["pool"], 0) + (stale.get("allocation") or 0)
            if disk["action"] == "copy-top" and not disk["backing_on_dest"]:
                check.refuse("%s has the backing image %s, which the destination lacks at that path: put it there (in a "
                             "pool at the same path)%s" % (where, disk["backing"], "" if mode == "cold" else
                                                           ", or copy the whole image (copy_storage: all)"))
                continue
            size = self.copy_size(disk)
            if size is not None:
                needed[pool["name"]] = needed.get(pool["name"], 0) + size
            check.ok("%s: %s into pool %s on the destination (%s)%s" % (
                where, "the top image is copied" if disk["action"] == "copy-top" else "copied whole", pool["name"],
                human(size), ", replacing the stale volume there" if disk.get("replace") else ""))
        for pool in self.dest_pools():
            want = needed.get(pool["name"])
            if want is None or pool["available"] is None:
                continue
            available = pool["available"] + freed.get(pool["name"], 0)
            if want > available:
                check.refuse("storage pool %s on the destination has %s available, the copied disks need about %s: free "
                             "space there or use another pool" % (pool["name"], human(available), human(want)))
            else:
                check.ok("storage pool %s on the destination has %s available for %s" % (
                    pool["name"], human(available), human(want)))

    def stale_volume(self, check: Preflight, disk: Dict[str, Any], where: str) -> Optional[Dict[str, Any]]:
        """The destination's volume at a copied disk's path, when option stale_disks lets the move
        remove it first: it is in an active storage pool there (libvirt can delete it), no domain
        defined there uses it (running or not) and no volume there is layered on it. Otherwise the
        refusal that names why; None."""
        if self.params["stale_disks"] != "replace":
            check.refuse("%s: the destination already has a volume at that path, which the copy would overwrite: "
                         "remove it there if it is a stale copy (mlinfra.kvm.volume state=absent, or stale_disks: "
                         "replace to let this move remove it when no domain there uses it), or set copy_storage: none "
                         "if both hosts share this storage" % where)
            return None
        found = self.dest_volume(disk)
        pool = {p["name"]: p for p in self.dest_pools()}.get(found["pool"]) if found else None
        if found is None or pool is None or not pool["active"]:
            check.refuse("%s: the destination has something at that path outside its active storage pools, which "
                         "libvirt cannot remove (stale_disks: replace removes only a volume of an active pool): "
                         "remove it there by hand if it is a stale copy" % where)
            return None
        if pool["type"] in SHARED_POOL_TYPES:
            check.refuse("%s: the destination's volume at that path is in pool %s of type %s, storage both hosts may "
                         "share (it may be the very image the domain runs on): stale_disks: replace does not remove it; "
                         "set copy_storage: none if it is shared, else remove it there by hand"
                         % (where, pool["name"], pool["type"]))
            return None
        if self._dest_users is None:
            self._dest_users = self.service.domain_paths("dest", self.params["name"])
        user = self._dest_users.get(found["path"])
        if user is not None:
            check.refuse("%s: the destination's volume at that path is used by domain %s there, so it is no stale copy "
                         "and stale_disks: replace does not remove it: check which copy is current, then undefine %s "
                         "there or give it another disk" % (where, user, user))
            return None
        layered = self.service.backing_users("dest", found["path"])
        if layered:
            check.refuse("%s: the destination's volume at that path is the backing image of %s there, so stale_disks: "
                         "replace does not remove it: remove or rebase those first" % (where, ", ".join(layered)))
            return None
        check.ok("%s: the destination's volume at that path (pool %s) is used by no domain there: removed before the "
                 "copy (stale_disks: replace)" % (where, pool["name"]))
        return found

    def dest_volume(self, disk: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The destination's volume where a copied disk lands (name, pool, path, allocation)."""
        path = disk["path"]
        if disk["type"] == "volume" and disk["pool"] and disk["volume"]:
            path = self.service.volume_path("dest", disk["pool"], disk["volume"])
            if path is None:
                return None
        return self.service.volume_at("dest", os.path.normpath(path))

    def on_dest(self, disk: Dict[str, Any]) -> bool:
        """Whether the destination already has the disk: the volume of the same pool and name for a
        volume disk, a volume at the same path for any other."""
        if disk["type"] == "volume" and disk["pool"] and disk["volume"]:
            return self.service.volume_path("dest", disk["pool"], disk["volume"]) is not None
        return self.service.volume_at("dest", disk["path"]) is not None

    def dest_pool_for(self, disk: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The destination's active pool a copied disk goes into: the pool of the same name for a
        volume disk, the pool whose target is the image's directory for a file disk (the domain
        keeps its paths, so the image must land at the same one)."""
        for pool in self.dest_pools():
            if not pool["active"]:
                continue
            if disk["type"] == "volume" and pool["name"] == disk["pool"]:
                return pool
            if disk["type"] == "file" and pool["path"] == os.path.dirname(disk["path"]):
                return pool
        return None

    def copy_size(self, disk: Dict[str, Any]) -> Optional[int]:
        """Bytes the destination's pool must hold: the top image's allocation, or the whole
        chain's for a flattened copy (capped by the disk's capacity)."""
        vol = disk.get("source_volume")
        if vol is None:
            block = disk.get("block")
            return block["allocation"] if block else None
        size = vol["allocation"]
        if disk["action"] == "copy" and disk.get("backing"):
            backing = self.service.volume_at("source", disk["backing"])
            size += backing["allocation"] if backing else vol["capacity"]
        return size

    def check_memory(self, check: Preflight, root: Any) -> None:
        need = memory_bytes(root)
        free = self.service.free_memory()
        if free is None:
            check.note("the destination's driver reports no free memory: not checked (the domain needs %s)" % human(need))
        elif free < need:
            check.refuse("the destination has %s of free memory, the domain needs %s: free memory there (stop or move "
                         "other guests) or pick another destination" % (human(free), human(need)))
        else:
            check.ok("the destination has %s of free memory for the domain's %s" % (human(free), human(need)))

    def check_cpu(self, check: Preflight, root: Any, will_run: bool) -> None:
        cpu = root.find("cpu")
        mode = cpu.get("mode", "custom") if cpu is not None else None
        if cpu is None or (mode == "custom" and cpu.find("model") is None):
            check.ok("the domain names no CPU model (QEMU's default model runs on any host of that QEMU)")
            return
        if mode in ("host-passthrough", "maximum") or (mode == "host-model" and not will_run):
            check.note("CPU mode %s: libvirt cannot compare it with another host; the destination must have the same "
                       "CPU (and QEMU) as the source for the guest to see the same CPU" % mode)
            return
        os_type = root.find("os/type")
        verdict = self.service.compare_cpu(
            to_string(cpu), root.findtext("devices/emulator"), os_type.get("arch") if os_type is not None else None,
            os_type.get("machine") if os_type is not None else None, root.get("type"))
        model = cpu.findtext("model") or mode
        if verdict is None:
            check.note("the destination's driver cannot compare CPUs: CPU model %s not checked" % model)
        elif verdict:
            check.refuse("the destination's CPU cannot run the domain's CPU (model %s): %s. Pick a destination with that "
                         "CPU, or give the domain a CPU model both hosts have (mlinfra.kvm.domain cpu)" % (model, verdict))
        else:
            check.ok("the destination can run the domain's CPU (model %s)" % model)

    def check_hostdevs(self, check: Preflight, inactive: Any) -> None:
        """Resolve the destination's host devices (option hostdevs, else the source's addresses)
        on its node device list, and hold them to the rule mlinfra.kvm.domain applies."""
        pci = self.service.dest_pci()
        devices = pci.devices()
        selectors = self.selectors or [(parse_selector("hostdevs", h["address"]), h["managed"])
                                       for h in hostdev_addresses(inactive)]
        wanted: Dict[str, bool] = {}
        for selector, managed in selectors:
            try:
                found = selector.resolve(devices, "on the destination (%s)" % pci.describe())
            except InvalidInputError as err:
                check.refuse("%s (option hostdevs: give the destination's devices)" % err.msg)
                continue
            for address in found:
                wanted.setdefault(address, managed)
        in_use = self.service.dest.hostdevs_in_use(None)
        for address in sorted(wanted):
            dev = devices[address]
            if dev.iommu_group is None:
                check.refuse("PCI device %s has no IOMMU group on the destination: enable the IOMMU there" % address)
                continue
            blockers = group_blockers([devices[m] for m in pci.group_members(dev.iommu_group) if m in devices])
            if blockers:
                check.refuse("PCI device %s is in IOMMU group %d on the destination, which is not wholly bound to vfio-pci "
                             "(%s): bind the group to vfio-pci there (mlinfra.kvm.vfio_pci)" % (
                                 address, dev.iommu_group, ", ".join("%s uses %s" % (b.address, b.driver) for b in blockers)))
            elif address in in_use:
                check.refuse("PCI device %s is used by running domain %s on the destination: pick another device "
                             "(option hostdevs)" % (address, in_use[address]))
            else:
                check.ok("PCI device %s on the destination is free and its IOMMU group is bound to vfio-pci" % address)
        self.dest_hostdevs = [{"address": a, "managed": m} for a, m in sorted(wanted.items())]

    # -- stale volumes on the destination -------------------------------------------------------
    def replace_stale(self, plan: List[Dict[str, Any]]) -> None:
        """Remove the destination's stale volumes the preflight let stale_disks: replace remove,
        before anything else moves (check mode records it only)."""
        for disk in plan:
            stale = disk.get("replace")
            if stale:
                self.tracker.act("remove the destination's stale volume %s in pool %s before the copy (disk %s, "
                                 "stale_disks: replace)" % (stale["path"], stale["pool"], disk["target"]),
                                 self.service.delete_volume_in, "dest", stale["pool"], stale["name"])
                self.replaced.append(stale["path"])

    # -- live ----------------------------------------------------------------------------------
    def move_live(self, dom: Any, plan: List[Dict[str, Any]], copy_storage: str) -> None:
        name = dom.name()
        created: List[Dict[str, str]] = []
        try:
            for disk in plan:
                if disk["action"] in ("copy", "copy-top"):
                    self.precreate(disk, created)
            if self.params["max_downtime_ms"] is not None:
                self.tracker.act("set the maximum downtime to %d ms" % self.params["max_downtime_ms"],
                                 self.service.set_max_downtime, dom, self.params["max_downtime_ms"])
            flags = (libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
                     | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)
            if copy_storage == "all":
                flags |= libvirt.VIR_MIGRATE_NON_SHARED_DISK
            elif copy_storage == "incremental":
                flags |= libvirt.VIR_MIGRATE_NON_SHARED_INC
            params: Dict[str, Any] = {}
            if self.params["migration_uri"]:
                params[libvirt.VIR_MIGRATE_PARAM_URI] = self.params["migration_uri"]
            copied = [d["target"] for d in plan if d["action"] != "present"]
            if copied:
                params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = copied
            how = "copy_storage %s: %s" % (copy_storage, ", ".join(copied)) if copied else "no disk copied"
            self.tracker.act("migrate live to %s (peer-to-peer, %s)" % (self.dst_uri, how), self.run_live, dom, params, flags)
        except KvmError as err:
            if self.defined_on_dest(name):
                self.undone.append("kept the volumes made on the destination: %s is defined there" % name)
            else:
                self.undo_created(created)
            self.say_where(err, name)
            raise
        if not self.check:
            try:
                self.downtime_ms = self.service.completed_downtime(name)
            except KvmError:  # a report only: the domain has moved, whatever this read says
                self.downtime_ms = None

    def precreate(self, disk: Dict[str, Any], created: List[Dict[str, str]]) -> None:
        """The destination's volume for a copied disk, made before the migration: libvirt cannot
        pre-create one for an incremental copy (it needs the backing), and this way a failure
        knows exactly which volumes to remove again."""
        vol = disk.get("source_volume") or {}
        capacity = vol.get("capacity") or (disk.get("block") or {}).get("capacity") or 0
        fmt = disk["format"] or vol.get("format") or "raw"
        top = disk["action"] == "copy-top"
        xml = volume_xml(disk["dest"]["name"], capacity, fmt, disk["backing"] if top else None,
                         vol.get("backing_format") if top else None)
        self.create_dest_volume(disk, xml, created)

    def create_dest_volume(self, disk: Dict[str, Any], xml: str, created: List[Dict[str, str]]) -> None:
        where = dict(disk["dest"], path=disk["path"])
        self.tracker.act("create volume %s in pool %s on the destination (disk %s)" % (disk["path"], where["pool"], disk["target"]),
                         self.service.create_volume, "dest", where["pool"], xml)
        created.append(where)

    def run_live(self, dom: Any, params: Dict[str, Any], flags: int) -> None:
        """The migration call, watched: progress lines from the job statistics, and an abort
        past the timeout."""
        job = self.service.start_live_migration(dom, params, flags)
        deadline = self.monotonic() + self.params["timeout"]
        last = None
        while not job.wait(POLL_S):
            stats = self.service.job_stats(dom)
            if stats:
                line = progress_line(stats)
                if line != last:
                    self.add_progress(line)
                    last = line
            if self.monotonic() > deadline:
                if self.abort_past_deadline(dom, job):
                    break
                raise KvmError("the live migration of %s did not finish within %d s (option timeout) and was aborted: "
                               "raise timeout, or bound the downtime less tightly (max_downtime_ms) so that it can "
                               "converge" % (dom.name(), self.params["timeout"]), progress=self.progress)
        job.result()
        self.add_progress("completed")

    def abort_past_deadline(self, dom: Any, job: Any) -> bool:
        """Abort the job and wait for the migration call to return; True when the migration
        completed all the same. The job may finish between
        the last poll and the abort (a poll can wait behind a busy QEMU monitor): then libvirt
        refuses the abort because the domain has already left the source, the call returns
        successfully, and the domain runs on the destination. That is a completed migration,
        reported as one, never a failure whose undo would remove the disk it now runs on.

        libvirt also refuses an abort that comes before the migration call has begun its job on
        a loaded host ("no job is active on the domain"): while the call runs on, the abort is
        asked again every poll, up to ABORT_WAIT_S, so that such a move is aborted as the timeout
        says rather than left to finish (seen in CI: a 3 s timeout, a move that then ran a minute)."""
        def abort() -> None:
            give_up = self.monotonic() + ABORT_WAIT_S
            while True:
                try:
                    self.service.abort_job(dom)
                    break
                except KvmError:
                    if job.wait(POLL_S):
                        return  # the call returned: completed, or failed (the caller tells which)
                    if self.monotonic() > give_up:
                        raise
            job.wait(ABORT_WAIT_S)

        self.tracker.act("abort the migration job (past the timeout of %d s)" % self.params["timeout"], abort)
        if not job.succeeded():
            return False
        self.add_progress("completed before the abort reached it")
        return True

    def add_progress(self, line: str) -> None:
        self.progress.append(line)
        if len(self.progress) > PROGRESS_LINES:
            del self.progress[PROGRESS_LINES // 2]

    def defined_on_dest(self, name: str) -> bool:
        """Whether the destination holds the domain after a failed live move: its volumes are then
        its disks, whatever the failure was, and are not removed. Unknown counts as defined."""
        try:
            return self.service.dest.lookup(name) is not None
        except KvmError:
            return True

    def undo_created(self, created: List[Dict[str, str]]) -> None:
        for where in reversed(created):
            try:
                self.tracker.act("undo: remove volume %s on the destination" % where["path"], self.service.delete_volume_in,
                                 "dest", where["pool"], where["name"])
                self.undone.append("removed %s on the destination" % where["path"])
            except KvmError as err:
                self.undone.append("could not remove %s on the destination (%s)" % (where["path"], err.msg))

    def say_where(self, err: KvmError, name: str) -> None:
        """End a failure's message with where the domain is now, read back from the source."""
        try:
            dom = self.service.source.lookup(name)
            state = self.service.source.state(dom) if dom is not None else "absent"
        except KvmError as read_err:  # the source's libvirtd gone too: say that instead
            state = "unknown (reading it failed: %s)" % read_err.msg
        err.details["source_state"] = state
        if self.undone:
            err.details["undone"] = list(self.undone)
            err.msg = "%s; undone: %s" % (err.msg, "; ".join(self.undone))
        err.msg = "%s. Domain %s is %s on the source (%s)" % (err.msg, name, state, self.src_uri)
        if self.replaced:
            err.details["replaced"] = list(self.replaced)
            err.msg = "%s; the destination's stale volume%s %s had been removed before (stale_disks: replace)" % (
                err.msg, "s" if len(self.replaced) > 1 else "", ", ".join(self.replaced))
        if self.progress:
            err.details.setdefault("progress", self.progress)

    # -- cold ----------------------------------------------------------------------------------
    def move_cold(self, dom: Any, state: str, inactive: Any, plan: List[Dict[str, Any]]) -> None:
        name = dom.name()
        was_running = state == "running"
        created: List[Dict[str, str]] = []
        dest_dom: Dict[str, Any] = {}
        shut = False
        try:
            if was_running:
                self.tracker.act("shut down on the source (clean, up to %d s)" % self.params["shutdown_timeout"],
                                 self.shutdown_source, dom)
                shut = True
            deadline = self.monotonic() + self.params["timeout"]
            for disk in plan:
                if disk["action"] in ("copy", "copy-top"):
                    # Empty and raw: the upload writes the image file as it is, format and backing included.
                    self.create_dest_volume(disk, volume_xml(disk["dest"]["name"], 0, "raw"), created)
                    self.tracker.act("copy disk %s (%s) to the destination" % (disk["target"], disk["path"]),
                                     self.copy_disk, disk, deadline)
            root = self.dest_definition(inactive)
            hostdevs = ", ".join(h["address"] for h in hostdev_addresses(root))
            self.tracker.act("define on the destination%s" % (" (hostdevs %s)" % hostdevs if hostdevs else ""),
                             self.define_dest, root, dest_dom)
            if was_running:
                self.tracker.act("start on the destination", self.start_dest, dest_dom)
            self.tracker.act("undefine on the source", self.service.source.undefine, dom)
        except KvmError as err:
            self.undo_cold(name, dest_dom, created, shut)
            self.say_where(err, name)
            raise

    def shutdown_source(self, dom: Any) -> None:
        self.service.source.request_shutdown(dom)
        if not self.service.source.wait_shutoff(dom, self.params["shutdown_timeout"]):
            raise KvmError("domain %s did not shut down within %d s (option shutdown_timeout); it was asked to (ACPI) and "
                           "may still be shutting down: check that the guest handles the power button, or raise "
                           "shutdown_timeout" % (dom.name(), self.params["shutdown_timeout"]))

    def copy_disk(self, disk: Dict[str, Any], deadline: float) -> None:
        sent = self.service.copy_volume(disk["path"], disk["dest"]["pool"], disk["dest"]["name"], deadline)
        self.add_progress("copied %s: %s" % (disk["path"], human(sent)))

    def dest_definition(self, inactive: Any) -> Any:
        """The source's persistent definition with the host devices chosen on the destination."""
        root = parse(to_string(inactive))
        if self.dest_hostdevs or hostdev_addresses(root):
            write_hostdevs(root, self.dest_hostdevs)
        return root

    def define_dest(self, root: Any, holder: Dict[str, Any]) -> None:
        holder["dom"] = self.service.dest.define(root)

    def start_dest(self, holder: Dict[str, Any]) -> None:
        self.service.dest.start(holder["dom"])
        holder["started"] = True

    def undo_cold(self, name: str, dest_dom: Dict[str, Any], created: List[str], shut: bool) -> None:
        steps = []
        if dest_dom.get("started"):
            steps.append(("undo: force the destination's copy off", self.service.dest.destroy, dest_dom["dom"],
                          "stopped it on the destination"))
        if dest_dom.get("dom") is not None:
            steps.append(("undo: undefine on the destination", self.service.dest.undefine, dest_dom["dom"],
                          "undefined it on the destination"))
        for description, effect, arg, said in steps:
            try:
                self.tracker.act(description, effect, arg)
                self.undone.append(said)
            except KvmError as err:
                self.undone.append("could not %s (%s)" % (description[len("undo: "):], err.msg))
        self.undo_created(created)
        source = self.service.source.lookup(name)
        if shut and source is not None and not self.service.source.is_active(source):
            try:
                self.tracker.act("undo: start on the source again", self.service.source.start, source)
                self.undone.append("started it on the source again")
            except KvmError as err:
                self.undone.append("could not start it on the source again (%s)" % err.msg)

    # -- after the move ------------------------------------------------------------------------
    def set_dest_autostart(self, name: str) -> None:
        self.service.dest.set_autostart(self.service.dest.lookup(name), True)

    def remove_source_disks(self, name: str, plan: List[Dict[str, Any]]) -> None:
        """The source's images of the disks that were copied are stale once the domain runs on the
        destination: removed (unless remove_source_disks is false), except an image another domain
        of the source uses or one outside the source's storage pools."""
        copied = [d for d in plan if d["action"] in ("copy", "copy-top")]
        if not copied or not self.params["remove_source_disks"]:
            return
        used = self.service.domain_paths("source", name)
        for disk in copied:
            if disk["path"] in used:
                self.module.warn("kept %s on the source: domain %s uses it too" % (disk["path"], used[disk["path"]]))
            elif disk.get("source_volume") is None:
                self.module.warn("kept %s on the source: it is in no storage pool there, so libvirt cannot remove it; "
                                 "delete it by hand once the domain runs on the destination" % disk["path"])
            else:
                self.tracker.act("remove the source's copy of disk %s (%s)" % (disk["target"], disk["path"]),
                                 self.service.delete_volume, "source", disk["path"])

    # -- the report ----------------------------------------------------------------------------
    def result(self, name: str, state: str, mode: str, disks: Dict[str, Any], check: Preflight, dom: Any) -> Dict[str, Any]:
        if self.check:
            after_state = state if mode == "live" else ("running" if state == "running" else "shutoff")
            hostdevs = [h["address"] for h in self.dest_hostdevs]
        else:
            moved = self.service.dest.lookup(name)
            after_state = self.service.dest.state(moved) if moved is not None else "absent"
            hostdevs = [h["address"] for h in hostdev_addresses(self.service.dest.inactive_root(moved))] if moved else []
        out = {
            "changed": self.tracker.changed, "actions": self.tracker.actions, "mode": mode,
            "source": self.src_uri, "destination": self.dst_uri,
            "domain": {"name": name, "uuid": dom.UUIDString(), "state": after_state, "uri": self.dst_uri},
            "copy_storage": disks["copy_storage"],
            "disks": [{"target": d["target"], "path": d["path"], "action": d["action"]} for d in disks["plan"]],
            "preflight": check.passed, "progress": self.progress, "downtime_ms": self.downtime_ms, "hostdevs": hostdevs,
        }
        return self.with_diff(out, {"uri": self.src_uri, "state": state}, {"uri": self.dst_uri, "state": after_state})


def run_migration(module: AnsibleModule) -> Dict[str, Any]:
    """Open both connections, then move the domain under its host lock (a local source): a
    domain run and a migration of the same guest take turns."""
    params = module.params
    src_uri = resolve_uri(params["uri"])
    validate_request(params, src_uri)  # before any lock file or connection is made of the input
    with local_object_lock(is_local(src_uri), "domain", params["name"]):
        with Connection(src_uri) as source:
            with Connection(params["dest_uri"]) as dest:
                service = MigrationService(source.conn, source.uri, dest.conn, dest.uri)
                return MigrationRunner(module, service).run()
