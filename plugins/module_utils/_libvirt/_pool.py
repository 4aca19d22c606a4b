# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Libvirt storage pools: validation, the XML both ways, the service (the only code that calls
libvirt for pools) and the runner that mlinfra.kvm.pool and mlinfra.kvm.pools share."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from .._core._runner import ObjectRunner
from .._core._errors import ConflictError, InvalidInputError, KvmError
from .._core._host_lock import local_object_lock
from ._connection import LIBVIRT_ARGSPEC, call, libvirt, lookup
from ._libvirt_guards import DiskUsage
from .._core._validate import object_name, plain_text
from ._volume_io import lock_name
from ._resource_list import ResourceKind, read_listed
from ._fields import RECREATE, FieldTable, XmlField, changed_with, compare
from .._core import _xml as X

# A pool's fields, declared once, in the order they are written to XML: the option and its
# argument spec, where the value lives, for which pool types, and what a change costs
# (RECREATE: the pool's storage moves, so it is refused unless recreate: true).
FIELDS = FieldTable("type", [
    XmlField("type", ".", attr="type", change=RECREATE,
             spec=dict(type="str", default="dir", choices=["dir", "logical", "netfs"])),
    XmlField("source_devices", "source/device", attr="path", kinds=("logical",), many=True, free_text=True,
             spec=dict(type="list", elements="path", default=[])),
    XmlField("source_name", "source/name", kinds=("logical",), change=RECREATE, free_text=True,
             spec=dict(type="str")),
    XmlField(None, "source/format", attr="type", kinds=("logical",), const="lvm2"),
    XmlField("source_host", "source/host", attr="name", kinds=("netfs",), change=RECREATE, free_text=True,
             spec=dict(type="str")),
    XmlField("source_dir", "source/dir", attr="path", kinds=("netfs",), change=RECREATE, free_text=True,
             spec=dict(type="str")),
    XmlField("source_format", "source/format", attr="type", kinds=("netfs",),
             spec=dict(type="str", default="auto", choices=["auto", "nfs", "glusterfs", "cifs"])),
    XmlField("target", "target/path", change=RECREATE, free_text=True, normalise=os.path.normpath,
             spec=dict(type="path")),
])
# Fields of a pool definition that the structured options cover.
SPEC_FIELDS = FIELDS.options


def validate_input(params: Dict[str, Any]) -> None:
    """Checks that need no libvirt: run before connecting, so bad input changes nothing."""
    plain_text("name", params.get("name"))
    FIELDS.check_free_text(params)
    object_name("name", params["name"])
    if params.get("xml") is not None:
        xml_name(params["name"], params["xml"])


def xml_name(name: str, xml: str) -> None:
    """The ``xml`` escape hatch must parse and define the pool the ``name`` option names.

    Otherwise the module would look up one pool and define another: every run would report
    a change, and a pool named only in the XML would be created behind the name's back.
    """
    plain_text("xml", xml, multiline=True)
    try:
        root = X.parse(xml)
    except (X.etree.XMLSyntaxError, ValueError) as exc:
        raise InvalidInputError("xml", xml, "is not well-formed XML (%s)" % exc,
                                "give a complete <pool> document") from None
    if root.tag != "pool":
        raise InvalidInputError("xml", xml, "has root element <%s>, not <pool>" % root.tag,
                                "give a complete <pool type='...'> document")
    inner = X.text(root, "name")
    if inner != name:
        raise InvalidInputError("xml", xml, "defines the pool <name>%s</name> but option name is %r" % (inner, name),
                                "make <name> in xml and the name option the same")


def desired_spec(params: Dict[str, Any]) -> Dict[str, Any]:
    ptype = params["type"]
    spec: Dict[str, Any] = {"type": ptype}
    if ptype == "logical":
        vg = params["source_name"] or params["name"]
        spec.update(source_name=vg, target=params["target"] or "/dev/%s" % vg,
                    source_devices=sorted(params["source_devices"] or []))
    else:
        spec["target"] = os.path.normpath(params["target"])
    if ptype == "netfs":
        spec.update(source_host=params["source_host"], source_dir=params["source_dir"],
                    source_format=params["source_format"])
    return spec


def spec_from_xml(xml: str) -> Dict[str, Any]:
    """The declared options of a pool definition, as a request would give them."""
    return FIELDS.read(X.parse(xml))


def build_xml(name: str, spec: Dict[str, Any], uuid: Optional[str] = None) -> str:
    root = X.element("pool")
    X.sub(root, "name", text=name)
    if uuid:
        X.sub(root, "uuid", text=uuid)
    FIELDS.write(root, spec)
    return X.to_string(root)


class PoolService:
    """The only code that talks to libvirt for pools."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def get(self, name: str) -> Any:
        return lookup("looking up pool %s" % name, self.conn.storagePoolLookupByName, name,
                      (libvirt.VIR_ERR_NO_STORAGE_POOL,))

    def list_all(self) -> List[Any]:
        return call("listing pools", self.conn.listAllStoragePools, 0)

    @staticmethod
    def is_active(pool: Any) -> bool:
        # Uncaught, as ever: read_listed skips a pool that vanished, run() reports the rest.
        return bool(pool.isActive())

    @staticmethod
    def autostart(pool: Any) -> bool:
        return bool(pool.autostart())

    def inactive_xml(self, pool: Any) -> str:
        return call("reading pool XML", pool.XMLDesc, libvirt.VIR_STORAGE_XML_INACTIVE)

    def define(self, xml: str) -> Any:
        return call("defining pool", self.conn.storagePoolDefineXML, xml, 0)

    def build(self, pool: Any, no_overwrite: bool) -> None:
        flags = libvirt.VIR_STORAGE_POOL_BUILD_NO_OVERWRITE if no_overwrite else 0
        call("building pool %s" % pool.name(), pool.build, flags)

    def start(self, pool: Any) -> None:
        call("starting pool %s" % pool.name(), pool.create, 0)

    def stop(self, pool: Any) -> None:
        call("stopping pool %s" % pool.name(), pool.destroy)

    def undefine(self, pool: Any) -> None:
        call("undefining pool %s" % pool.name(), pool.undefine)

    def set_autostart(self, pool: Any, value: bool) -> None:
        call("setting autostart of pool %s" % pool.name(), pool.setAutostart, int(value))

    def refresh(self, pool: Any) -> None:
        call("refreshing pool %s" % pool.name(), pool.refresh, 0)

    def volumes(self, pool: Any) -> List[Any]:
        return call("listing volumes of pool %s" % pool.name(), pool.listAllVolumes, 0)

    def volume(self, pool: Any, name: str) -> Optional[Any]:
        return lookup("looking up volume %s" % name, pool.storageVolLookupByName, name,
                      (libvirt.VIR_ERR_NO_STORAGE_VOL,))

    def delete_volume(self, vol: Any) -> None:
        call("deleting volume %s" % vol.name(), vol.delete, 0)

    def volumes_in_use(self, pool: Any) -> Dict[str, List[str]]:
        """Volume name -> the defined domains that use it (works on an inactive pool too)."""
        usage = DiskUsage(self.conn)
        in_use = usage.users_under(pool.name(), spec_from_xml(self.inactive_xml(pool)).get("target"))
        if self.is_active(pool):  # exact paths where libvirt can list them
            for vol in self.volumes(pool):
                users = usage.users(pool.name(), vol.name(), vol.path())
                if users:
                    in_use[vol.name()] = users
        return in_use

    def delete_storage(self, pool: Any) -> None:
        call("deleting the storage of pool %s" % pool.name(), pool.delete, 0)

    def describe(self, pool: Optional[Any]) -> Dict[str, Any]:
        if pool is None:
            return {"state": "absent"}
        spec = spec_from_xml(self.inactive_xml(pool))
        active = self.is_active(pool)
        info = call("reading pool info", pool.info) if active else [0, 0, 0, 0]
        out = {"name": pool.name(), "uuid": pool.UUIDString(), "state": "active" if active else "inactive",
               "autostart": self.autostart(pool), "capacity": info[1], "allocation": info[2],
               "available": info[3], "volumes": sorted(v.name() for v in self.volumes(pool)) if active else []}
        out.update(spec)
        return out


class PoolRunner(ObjectRunner):
    def __init__(self, module: AnsibleModule, service: PoolService, local: bool) -> None:
        super().__init__(module, service, local)
        # Names of the volumes a purge deletes (would delete, in check mode); None: no purge.
        self.purged: Optional[List[str]] = None

    # -- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        """The check that needs the host; every caller of run_pool ran precheck_pool first
        (mlinfra.kvm.pool before it connects, the pools list for every item)."""
        p = self.params
        if p["state"] == "absent" or p["xml"]:
            return
        if p["target"] and self.local and os.path.exists(p["target"]) and not os.path.isdir(p["target"]):
            raise InvalidInputError("target", p["target"], "is an existing regular file, not a directory",
                                    "point target at a directory (or remove the file)")

    # -- decisions --------------------------------------------------------------------------
    def needs_build(self, spec: Dict[str, Any]) -> bool:
        if self.params["build"] is False:
            return False
        if spec["type"] == "logical":
            return bool(self.params["build"]) and not os.path.exists(spec["target"])
        return self.local and not os.path.isdir(spec["target"])

    def converge(self) -> Dict[str, Any]:
        name = self.params["name"]
        pool = self.service.get(name)
        before = self.service.describe(pool)
        if self.params["state"] == "absent":
            self.ensure_absent(pool)
        else:
            pool = self.ensure_present(pool, before)
        after = self.predict_after(before) if self.check else self.service.describe(self.service.get(name))
        after.setdefault("name", name)  # RETURN's pool.name, also for a pool that is (or would be) made or absent
        fields = [f for f in ("state", "autostart") + SPEC_FIELDS if f in after or f in before]
        result = {
            "changed": self.tracker.changed,
            "actions": self.tracker.actions,
            "pool": after,
            "xml": "" if self.check or after["state"] == "absent" else
            self.service.inactive_xml(self.service.get(name)),
        }
        if self.purged is not None:
            result["purged"] = self.purged
        diff_before = {f: before.get(f) for f in fields}
        diff_after = {f: after.get(f) for f in fields}
        if self.purged is not None:
            diff_before["volumes"], diff_after["volumes"] = list(self.purged), []
        return self.with_diff(result, diff_before, diff_after)

    def report_partial(self, err: KvmError) -> None:
        """The common partial report, plus the volumes a purge had already deleted."""
        super().report_partial(err)
        if err.details.get("changed") and self.purged is not None:
            err.details["purged"] = [a[len("delete volume "):] for a in self.tracker.performed
                                     if a.startswith("delete volume ")]

    def predict_after(self, before: Dict[str, Any]) -> Dict[str, Any]:
        after = dict(before)
        after.update(self.tracker.get_after())
        return after

    # -- absent -----------------------------------------------------------------------------
    def ensure_absent(self, pool: Optional[Any]) -> None:
        if pool is None:
            return
        self.tracker.add("state", "active" if self.service.is_active(pool) else "inactive", "absent")
        was_active = self.service.is_active(pool)
        if self.params["purge"]:
            # Refuse before anything is touched: not even the start below may happen.
            self.guard_purge(pool)
            self.purge_volumes(pool)
        # A pool started only to purge it runs now in a real run; check mode predicts the same stop.
        if self.service.is_active(pool) or (self.params["purge"] and not was_active):
            self.tracker.act("stop", self.service.stop, pool)
        if self.params["purge"] and self.tracker_type_is_dir(pool):
            self.tracker.act("delete target directory", self.service.delete_storage, pool)
        self.tracker.act("undefine", self.service.undefine, pool)

    def guard_purge(self, pool: Any) -> None:
        """Refuse a purge that would delete volumes defined domains use, unless force."""
        in_use = self.service.volumes_in_use(pool)
        if not in_use:
            return
        listing = "; ".join("%s: %s" % (vol, ", ".join(users)) for vol, users in sorted(in_use.items()))
        if self.params["force"]:
            self.module.warn("force: true: purging pool %s although volumes are in use: %s" % (pool.name(), listing))
            return
        raise ConflictError(
            "option purge: value True would delete volumes of pool %s that defined domains use (%s); "
            "deleting them would leave those domains without their disks. Remove the domains or their "
            "disks first (mlinfra.kvm.domain), or set force: true to delete them anyway. Nothing was changed."
            % (pool.name(), listing), option="force", volumes_in_use=in_use)

    def purge_volumes(self, pool: Any) -> None:
        """Delete every volume (each lands in ``purged`` just before its deletion)."""
        self.purged = []
        if not self.service.is_active(pool):
            self.tracker.act("start (to purge volumes)", self.service.start, pool)
            if self.check:
                # Listing needs a running pool; predict from the directory where we can.
                self.delete_in_turn(pool, self.predicted_volumes(pool))
                return
        self.delete_in_turn(pool, sorted(vol.name() for vol in self.service.volumes(pool)))
        if not self.check:
            self.delete_volumes_made_meanwhile(pool)

    def delete_in_turn(self, pool: Any, names: List[str]) -> None:
        """Record and (in a real run) delete each volume, in order, each under its lock."""
        for name in names:
            self.purged.append(name)
            self.tracker.act("delete volume %s" % name, self.delete_volume_locked, pool, name)

    def delete_volume_locked(self, pool: Any, name: str) -> None:
        """Delete one volume under its own host lock, so that a volume run still allocating or
        uploading it finishes first: a purge never deletes a volume half made. What that run
        left is looked up again."""
        with local_object_lock(self.local, "volume", lock_name(name), scope=pool.name(), option=None):
            vol = self.service.volume(pool, name)
            if vol is not None:  # else the run that held the lock removed or renamed it
                self.service.delete_volume(vol)

    def delete_volumes_made_meanwhile(self, pool: Any) -> None:
        """A volume run that held a lock above may have finished an import into a new name: delete
        what appeared, a few passes at most (a run that keeps making volumes is a conflict)."""
        for _attempt in range(3):
            left = sorted(vol.name() for vol in self.service.volumes(pool))
            if not left:
                return
            self.delete_in_turn(pool, left)
        raise ConflictError("purging pool %s: volumes keep appearing (%s); another run is making volumes in it. "
                            "Stop that run, then purge again." % (pool.name(), ", ".join(left)), option="purge")

    def predicted_volumes(self, pool: Any) -> List[str]:
        spec = spec_from_xml(self.service.inactive_xml(pool))
        target = spec.get("target")
        if spec["type"] != "dir" or not self.local or not target or not os.path.isdir(target):
            return []
        # What libvirt's dir pool lists: every entry that resolves (dangling links are skipped).
        return sorted(e for e in os.listdir(target) if os.path.exists(os.path.join(target, e)))

    def tracker_type_is_dir(self, pool: Any) -> bool:
        return spec_from_xml(self.service.inactive_xml(pool))["type"] == "dir"

    # -- present / active -------------------------------------------------------------------
    def ensure_present(self, pool: Optional[Any], before: Dict[str, Any]) -> Optional[Any]:
        p = self.params
        if p["xml"]:
            pool = self.ensure_definition_xml(pool, p["xml"])
            spec = spec_from_xml(p["xml"])
        else:
            spec = desired_spec(p)
            pool = self.ensure_definition(pool, before, spec)
        if self.needs_build(spec):
            self.tracker.act("build", self.service.build, pool, no_overwrite=spec["type"] == "logical")
        active = pool is not None and self.service.is_active(pool)
        if p["state"] == "active":
            self.tracker.add("state", before["state"] if before["state"] != "absent" else "inactive", "active",
                             active=not active)
            if not active:
                self.tracker.act("start", self.service.start, pool)
        elif before["state"] == "absent":
            self.tracker.add("state", "absent", "inactive")
        if p["autostart"] is not None:
            current = self.service.autostart(pool) if pool is not None else False
            if self.tracker.add("autostart", current, p["autostart"]):
                self.tracker.act("autostart %s" % ("on" if p["autostart"] else "off"),
                                 self.service.set_autostart, pool, p["autostart"])
        return pool

    def ensure_definition(self, pool: Optional[Any], before: Dict[str, Any], spec: Dict[str, Any]) -> Optional[Any]:
        name = self.params["name"]
        if pool is None:
            compare(self.tracker, {}, spec)
            return self.tracker.act("define", self.service.define, build_xml(name, spec))
        current = {f: before.get(f) for f in spec}
        changed = compare(self.tracker, current, spec)
        if not changed:
            return pool
        relocating = changed_with(FIELDS.fields, changed, RECREATE)
        if relocating and not self.params["recreate"]:
            raise ConflictError(
                "pool %s exists with %s; the request asks for %s. Changing where a pool keeps its "
                "volumes would hide the volumes already there. Set recreate: true to redefine it "
                "(volumes stay on disk), or use another pool name."
                % (name, ", ".join("%s=%r" % (f, current[f]) for f in relocating),
                   ", ".join("%s=%r" % (f, spec[f]) for f in relocating)),
                option="recreate", fields=relocating)
        if relocating:
            return self.recreate(pool, spec)
        defined = self.tracker.act("redefine", self.service.define, build_xml(name, spec, pool.UUIDString()))
        # Check mode defines nothing; what is read next (active, autostart) is the existing pool's,
        # which a redefine keeps.
        return defined if defined is not None else pool

    def recreate(self, pool: Any, spec: Dict[str, Any]) -> Optional[Any]:
        if self.service.is_active(pool):
            self.tracker.act("stop", self.service.stop, pool)
        xml = build_xml(self.params["name"], spec, pool.UUIDString())  # the same UUID: the same pool to libvirt
        self.tracker.act("undefine", self.service.undefine, pool)
        defined = self.tracker.act("define", self.service.define, xml)
        return defined if defined is not None else pool  # check mode: nothing was redefined

    def ensure_definition_xml(self, pool: Optional[Any], xml: str) -> Optional[Any]:
        # libvirt fills in uuid, sizes and permissions; they are not part of the request.
        ignored = ["/pool/uuid", "/pool/capacity", "/pool/allocation", "/pool/available",
                   "/pool/target/permissions", "/pool/source[not(*)]"]
        wanted = X.normalise(xml, drop=ignored)
        current = X.normalise(self.service.inactive_xml(pool), drop=ignored) if pool is not None else None
        if not self.tracker.add("xml", current, wanted):
            return pool
        defined = self.tracker.act("define" if pool is None else "redefine", self.service.define, xml)
        return defined if defined is not None else pool  # check mode: nothing was (re)defined


MUTUALLY_EXCLUSIVE = [("xml", "target")]


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="active", choices=["active", "present", "absent"]),
        **FIELDS.option_specs(),
        build=dict(type="bool"),
        autostart=dict(type="bool"),
        recreate=dict(type="bool", default=False),
        purge=dict(type="bool", default=False),
        force=dict(type="bool", default=False),
        xml=dict(type="str"),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_pool(module: AnsibleModule, conn: Any, local: bool) -> Dict[str, Any]:
    """One pool, on an open connection (mlinfra.kvm.pool, and each item of mlinfra.kvm.pools),
    under the pool's host lock (_host_lock)."""
    with local_object_lock(local, "pool", module.params["name"]):
        return PoolRunner(module, PoolService(conn), local).run()


# -- resource list (mlinfra.kvm.pools) ---------------------------------------------------------

# The pool types this collection manages; pools of other types are left out of gathered (and
# so never removed by overridden).
LIST_TYPES = ("dir", "logical", "netfs")


def gather_pools(conn: Any) -> List[Dict[str, Any]]:
    """Every pool of a managed type as a pools item (the module's own input format)."""
    service = PoolService(conn)

    def read(pool: Any) -> Optional[Dict[str, Any]]:
        spec = spec_from_xml(service.inactive_xml(pool))
        if spec["type"] not in LIST_TYPES:
            return None
        item: Dict[str, Any] = {"name": pool.name(), "state": "active" if service.is_active(pool) else "present",
                                "autostart": service.autostart(pool)}
        item.update({k: v for k, v in spec.items() if v is not None and v != []})
        return item

    return sorted(read_listed(service.list_all(), read), key=lambda i: i["name"])


def render_pool(params: Dict[str, Any]) -> str:
    if params["xml"]:
        return params["xml"]
    precheck_pool(params)
    return build_xml(params["name"], desired_spec(params))


def precheck_pool(params: Dict[str, Any]) -> None:
    """Every check that needs neither libvirt nor the host: the module's runner, the list's
    precheck and ``rendered`` all refuse the same requests."""
    validate_input(params)
    if params["state"] == "absent" or params["xml"]:
        return
    if params["type"] in ("dir", "netfs") and not params["target"]:
        raise InvalidInputError("target", params["target"], "is required for a %s pool" % params["type"],
                                "set target to the directory that holds the volumes")
    if params["type"] == "netfs" and not (params["source_host"] and params["source_dir"]):
        raise InvalidInputError("source_host/source_dir", [params["source_host"], params["source_dir"]],
                                "are required for a netfs pool", "set the NFS server and its export")


LIST_KIND = ResourceKind("pool", argument_spec(), MUTUALLY_EXCLUSIVE, run_pool, gather_pools, render_pool,
                         precheck_pool, item_states=("active", "present"), delete_options=("force", "purge"))
