# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Libvirt storage volumes: validation, the service (the only code that calls libvirt and
qemu-img for volumes) and the runner that mlinfra.kvm.volume and mlinfra.kvm.volumes share."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from .._core._command import run_bounded
from .._core._runner import ObjectRunner
from .._core._errors import ConflictError, InvalidInputError, KvmError, LibvirtCallError
from ._connection import LIBVIRT_ARGSPEC, call, libvirt, lookup
from .._core._host_lock import local_object_lock
from ._libvirt_guards import DiskUsage
from .._core._validate import object_name, plain_text, size_bytes
from ._volume_io import PARTIAL_SUFFIX, capacity_in_range, partial_name, stream_file
from ._fields import LIVE, NEVER, Field, option_specs, refuse_never_changes
from ._resource_list import ResourceKind, read_listed
from ._storage_paths import ALLOWED_PATHS_SPEC, StoragePolicy, check_allowed_paths, read_backing
from .._core import _xml as X

# A volume's fields, declared once: the options (with their argument spec entries) and what a
# change costs on an existing volume. Capacity grows in place (never shrinks: the guest's file
# systems would be cut); format and backing are NEVER changed, since converting or rebasing a
# disk in place could lose data. The XML is small and written whole (build_xml); read_xml reads
# back what the fields hold.
FIELD_TABLE: Tuple[Field, ...] = (
    Field("format", dict(format=dict(type="str", choices=["qcow2", "raw"])), NEVER, "format",
          never="converting a disk in place is not done (it would lose data). Delete it first (state: absent) "
                "or use another name."),
    Field("capacity", dict(capacity=dict(type="str")), LIVE, "capacity"),
    Field("backing", dict(backing=dict(type="path")), NEVER, "backing image",
          never="rebasing an existing disk is not done. Delete it first (state: absent) or use another name."),
    Field("backing_format", dict(backing_format=dict(type="str", choices=["qcow2", "raw"])), NEVER,
          "backing format", never="the format a disk reads its backing image with is not changed in place. "
                                  "Set backing_format: {current} or leave it unset."),
)
DIFF_FIELDS = ("state",) + tuple(f.key for f in FIELD_TABLE)
# Seconds for one qemu-img info: it reads one header (the chain is checked before it runs), so
# a longer wait means a dead disk or a hung NFS mount, which the task should report, not wait on.
QEMU_IMG_TIMEOUT_S = 60
TEXT_OPTIONS = ("name", "pool", "capacity", "backing", "import_from")


def validate_params(params: Dict[str, Any]) -> Optional[int]:
    """Check every option before libvirt is contacted; the capacity in bytes.

    Control characters first: the name regex of _validate accepts a trailing newline.
    """
    for option in TEXT_OPTIONS:
        plain_text(option, params.get(option))
    object_name("name", params["name"])
    object_name("pool", params["pool"])
    if params["name"].endswith(PARTIAL_SUFFIX):
        # Such a name is this module's temporary: a run for the shorter name would delete it.
        raise InvalidInputError("name", params["name"], "ends with %s, the suffix of an import's temporary volume"
                                % PARTIAL_SUFFIX, "choose a name that does not end with %s" % PARTIAL_SUFFIX)
    check_allowed_paths(params.get("allowed_paths"))
    if params.get("backing_format") and not params.get("backing"):
        raise InvalidInputError("backing_format", params["backing_format"], "applies only to an overlay",
                                "set backing to the base image too, or remove backing_format")
    return capacity_in_range("capacity", params["capacity"], size_bytes("capacity", params["capacity"]))


def human(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n = n / 1024.0  # type: ignore[assignment]
    return str(n)


def read_xml(root: Any) -> Dict[str, Optional[str]]:
    """The fields a volume's XML holds (capacity comes from virStorageVolGetInfo, in bytes)."""
    return {"format": X.attr(root, "target/format", "type"), "backing": X.text(root, "backingStore/path"),
            "backing_format": X.attr(root, "backingStore/format", "type")}


def build_xml(name: str, fmt: str, capacity: int, backing: Optional[str], backing_format: Optional[str]) -> str:
    root = X.element("volume")
    X.sub(root, "name", text=name)
    X.sub(root, "capacity", {"unit": "bytes"}, text=capacity)
    # qcow2 volumes start sparse; raw ones are fully allocated by libvirt unless told otherwise.
    X.sub(root, "allocation", {"unit": "bytes"}, text=0)
    target = X.sub(root, "target")
    X.sub(target, "format", {"type": fmt})
    if backing:
        store = X.sub(root, "backingStore")
        X.sub(store, "path", text=backing)
        X.sub(store, "format", {"type": backing_format})
    return X.to_string(root)


class VolumeService:
    """The only code that talks to libvirt (and qemu-img) for volumes."""

    def __init__(self, module: Optional[AnsibleModule], conn: Any) -> None:
        self.module = module  # None for the list's reads (gather_volumes): they describe no absent volume
        self.conn = conn

    def pool(self, name: str) -> Optional[Any]:
        return lookup("looking up pool %s" % name, self.conn.storagePoolLookupByName, name,
                      (libvirt.VIR_ERR_NO_STORAGE_POOL,))

    def active_pools(self) -> List[Any]:
        return call("listing pools", self.conn.listAllStoragePools, libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE)

    @staticmethod
    def pool_active(pool: Any) -> bool:
        # Uncaught, as ever: run() reports libvirt's own words.
        return bool(pool.isActive())

    @staticmethod
    def volumes(pool: Any) -> List[Any]:
        return call("listing volumes", pool.listAllVolumes, 0)

    def volume(self, pool: Any, name: str) -> Optional[Any]:
        return lookup("looking up volume %s" % name, pool.storageVolLookupByName, name,
                      (libvirt.VIR_ERR_NO_STORAGE_VOL,))

    def pool_available(self, pool: Any) -> int:
        """Free bytes, as of a refresh now: libvirt's figures date from the pool's last refresh,
        and files written beside libvirt (a copy by hand, another tool) count only after one.
        Called only before a create, so a run with nothing to do pays nothing for it."""
        try:
            pool.refresh(0)
        except libvirt.libvirtError:
            # A pool with a volume being made refuses a refresh ("asynchronous jobs running"):
            # its last figures are the best there is, and the write itself still reports ENOSPC.
            pass
        return call("reading pool info", pool.info)[3]

    def describe(self, pool_name: str, vol: Optional[Any]) -> Dict[str, Any]:
        if vol is None:
            return {"name": self.module.params["name"], "pool": pool_name, "state": "absent"}
        xml = call("reading volume XML", vol.XMLDesc, 0)
        root = X.parse(xml)
        _unused, capacity, allocation = call("reading volume info", vol.info)
        out = {"name": vol.name(), "pool": pool_name, "state": "present", "path": vol.path(),
               "capacity": capacity, "allocation": allocation}
        out.update(read_xml(root))
        return out

    def storage_policy(self, allowed_paths: Any, local: bool) -> StoragePolicy:
        """Where a backing image may lie on this host (its pools, plus allowed_paths)."""
        return StoragePolicy.of_host(self.conn, allowed_paths, local)

    @staticmethod
    def image_info(option: str, path: str) -> Dict[str, Any]:
        """qemu-img's view of one image, bounded; only ever called on a file whose own type and
        chain were checked first (StoragePolicy.check_image, or read_backing for an import).
        -U: the image may be open by running guests (a base image always is)."""
        rc, out, err = run_bounded(["qemu-img", "info", "-U", "--output=json", path], timeout_s=QEMU_IMG_TIMEOUT_S)
        if rc != 0:
            raise InvalidInputError(option, path, "cannot be read as a disk image (qemu-img: %s)" % err.strip(),
                                    "give a qcow2 or raw image file")
        try:
            return json.loads(out)
        except ValueError:
            raise InvalidInputError(option, path, "cannot be read as a disk image (qemu-img printed no JSON)",
                                    "give a qcow2 or raw image file") from None

    def create(self, pool: Any, xml: str, name: str) -> Any:
        try:
            return call("creating volume %s" % name, pool.createXML, xml, 0)
        except LibvirtCallError as err:
            raise self.concurrent(err, name) from None

    def clone(self, pool: Any, xml: str, name: str, source: Any) -> Any:
        try:
            return call("copying %s into volume %s" % (source.name(), name), pool.createXMLFrom, xml, source, 0)
        except LibvirtCallError as err:
            raise self.concurrent(err, name) from None

    @staticmethod
    def concurrent(err: LibvirtCallError, name: str) -> KvmError:
        """libvirt's refusals that mean another client (remote URIs: no host lock) got there first."""
        if err.code == libvirt.VIR_ERR_STORAGE_VOL_EXIST:
            return ConflictError("volume %s was created by another client while this run was creating it (%s); "
                                 "nothing of it was changed by this run. Run again to check it." % (name, err.msg),
                                 option="name", libvirt_code=err.code)
        return err

    def upload(self, vol: Any, path: str, size: int) -> int:
        """Stream ``size`` bytes of ``path`` into ``vol``; the bytes sent (always ``size``)."""
        stream = call("opening an upload stream", self.conn.newStream, 0)
        call("starting the upload", vol.upload, stream, 0, size, 0)
        try:
            sent = stream_file(path, size, lambda data: self.send(stream, data))
            call("finishing the upload", stream.finish)
        except KvmError:
            try:
                stream.abort()
            except libvirt.libvirtError:  # the stream is already broken; the original error matters
                pass
            raise
        return sent

    @staticmethod
    def send(stream: Any, data: bytes) -> None:
        # virStreamSend may accept less than it was given; loop until libvirt took it all.
        view = memoryview(data)
        while view:
            count = call("uploading", stream.send, bytes(view))
            if count < 0:
                raise KvmError("libvirt's upload stream refused data (send returned %d)" % count)
            view = view[count:]

    def verify(self, vol: Any, capacity: int, what: str) -> None:
        """libvirt re-reads the volume for info(): its capacity must be what was uploaded."""
        _unused, held, _unused = call("reading volume info", vol.info)
        if held != capacity:
            raise KvmError("volume %s holds %d bytes of virtual size after %s, %d were expected; the copy is "
                           "discarded. Check the image (qemu-img check) and run again." % (vol.name(), held, what, capacity))

    def resize(self, vol: Any, capacity: int) -> None:
        try:
            call("resizing volume %s" % vol.name(), vol.resize, capacity, 0)
        except LibvirtCallError as err:
            if err.code == libvirt.VIR_ERR_OPERATION_INVALID and "allocated" in err.msg:
                raise ConflictError("volume %s is still being allocated by another client; it was not resized. "
                                    "Run again once that finishes (%s)." % (vol.name(), err.msg),
                                    option="capacity", libvirt_code=err.code) from None
            raise

    def delete(self, vol: Any) -> None:
        call("deleting volume %s" % vol.name(), vol.delete, 0)

    def users(self, pool_name: str, vol: Any) -> List[str]:
        return DiskUsage(self.conn).users(pool_name, vol.name(), vol.path())

    def xml(self, vol: Any) -> str:
        return call("reading volume XML", vol.XMLDesc, 0)

    @staticmethod
    def info(vol: Any) -> Any:
        """libvirt's (type, capacity, allocation) of a volume."""
        return call("reading volume info", vol.info)

    @staticmethod
    def path(vol: Any) -> str:
        return vol.path()


class VolumeRunner(ObjectRunner):
    def __init__(self, module: AnsibleModule, service: VolumeService, local: bool) -> None:
        super().__init__(module, service, local)
        # Host changes already made in this run (real runs only), for partial-failure reports.
        self.changes: List[str] = []
        # The temporary volume an interrupted import left, found by run(); None once handled.
        self.leftover: Optional[Any] = None
        self.capacity: Optional[int] = None  # the capacity option in bytes, once validated

    def validate(self) -> None:
        self.capacity = validate_params(self.params)

    def converge(self) -> Dict[str, Any]:
        p = self.params
        capacity = self.capacity
        pool = self.service.pool(p["pool"])
        if pool is None and p["state"] == "absent":
            # No pool, no volume: a teardown that runs twice must not fail the second time.
            gone = {"name": p["name"], "pool": p["pool"], "state": "absent"}
            result: Dict[str, Any] = {"changed": False, "actions": [], "xml": "", "volume": gone}
            return self.with_diff(result, {"state": "absent"}, {"state": "absent"})
        if pool is None:
            raise InvalidInputError("pool", p["pool"], "is not a libvirt storage pool",
                                    "create it first (mlinfra.kvm.pool) or name an existing pool")
        if not self.service.pool_active(pool):
            raise InvalidInputError("pool", p["pool"], "is not active",
                                    "start it (mlinfra.kvm.pool with state: active)")
        vol = self.service.volume(pool, p["name"])
        before = self.service.describe(p["pool"], vol)
        users: Optional[List[str]] = None
        self.leftover = self.service.volume(pool, partial_name(p["name"]))
        if p["state"] == "absent":
            users = self.delete(vol)
        elif vol is None:
            self.create(pool, capacity)
        else:
            self.update(vol, before, capacity)
        self.remove_leftover()  # after the checks above, so that a refusal changes nothing
        after = dict(before)
        after.update(self.tracker.get_after())
        xml = ""
        if not self.check:
            vol = self.service.volume(pool, p["name"])
            after = self.service.describe(p["pool"], vol)
            xml = self.service.xml(vol) if vol is not None else ""
        result = {"changed": self.tracker.changed, "actions": self.tracker.actions, "volume": after, "xml": xml}
        if users is not None:
            result["users"] = users
        return self.with_diff(result, {f: before.get(f) for f in DIFF_FIELDS}, {f: after.get(f) for f in DIFF_FIELDS})

    def done(self, what: str) -> None:
        """Record a change made to the host, for the report of a later failure."""
        self.changes.append(what)

    def done_so_far(self) -> List[str]:
        """An import is one action made of steps (temporary volume, copy, clean-up): its ledger
        says which of them happened; without one, the actions that completed."""
        return list(self.changes) or self.tracker.performed

    def report_partial(self, err: KvmError) -> None:
        """The common partial report, plus ``done`` (the documented list of host changes)."""
        super().report_partial(err)
        if err.details.get("changed"):
            err.details["done"] = self.done_so_far()

    def remove_leftover(self) -> None:
        """Delete the temporary volume an interrupted import left (any state, any run for this name).

        An interrupted upload must never look like a finished volume: it only ever exists
        under the partial name, and the next run for this volume removes it. Called once
        every check of the run passed (an import calls it just before it uploads).
        """
        leftover, self.leftover = self.leftover, None
        if leftover is None:
            return
        name = partial_name(self.params["name"])
        self.tracker.act("delete leftover partial import %s" % name, self.delete_leftover, leftover, name)

    def delete_leftover(self, leftover: Any, name: str) -> None:
        self.service.delete(leftover)
        self.done("deleted leftover partial import %s" % name)

    # -- delete -----------------------------------------------------------------------------
    def delete(self, vol: Optional[Any]) -> Optional[List[str]]:
        """Delete ``vol`` unless a defined domain uses it (and force is off); its users."""
        if vol is None:
            return None
        p = self.params
        # Checked in check mode too, so that check mode reports the same refusal.
        users = self.service.users(p["pool"], vol)
        if users and not p["force"]:
            raise ConflictError(
                "option state: value 'absent' would delete volume %s (%s) of pool %s, which is in use by %s; "
                "deleting it would leave those domains without their disk. Remove the domains or their disks "
                "first (mlinfra.kvm.domain), or set force: true to delete it anyway."
                % (p["name"], self.service.path(vol), p["pool"], "; ".join(users)), option="force", users=users)
        if users:
            self.module.warn("force: true: deleting volume %s although in use by %s" % (p["name"], "; ".join(users)))
        self.tracker.add("state", "present", "absent")
        self.tracker.act("delete", self.service.delete, vol)
        return users

    # -- create -----------------------------------------------------------------------------
    def create(self, pool: Any, capacity: Optional[int]) -> None:
        p = self.params
        if p["import_from"]:
            self.create_imported(pool, capacity)
            return
        backing, backing_format = None, None
        fmt = p["format"] or "qcow2"
        if p["backing"]:
            backing, backing_format, virtual = self.backing_image()
            if fmt != "qcow2":
                raise InvalidInputError("format", fmt, "cannot hold a backing image",
                                        "use format: qcow2 for an overlay (or leave format unset)")
            if capacity is None:
                capacity = virtual
            elif capacity < virtual:
                raise InvalidInputError("capacity", p["capacity"],
                                        "is smaller than the backing image (%s)" % human(virtual),
                                        "give at least %d bytes, or leave capacity unset" % virtual)
        elif capacity is None:
            raise InvalidInputError("capacity", None, "is required for a new empty volume",
                                    "give a size such as 10G (or set backing or import_from)")
        self.check_free_space(pool, capacity if not backing else 0)
        for field, value in (("state", "present"), ("format", fmt), ("capacity", capacity),
                             ("backing", backing), ("backing_format", backing_format)):
            self.tracker.add(field, None if field != "state" else "absent", value, active=value is not None)
        self.tracker.act("create", self.service.create,
                         pool, build_xml(p["name"], fmt, capacity, backing, backing_format), p["name"])

    def backing_image(self):
        p = self.params
        path = p["backing"]
        if self.local and not os.path.exists(path):
            raise InvalidInputError("backing", path, "does not exist",
                                    "build or import the base image first, or fix the path")
        # Before qemu-img or libvirt reads it: inside the host's pools (or allowed_paths), and a
        # chain of image files that ends (no loop, no FIFO, bounded depth).
        self.service.storage_policy(p["allowed_paths"], self.local).check_image("backing", path)
        info = self.service.image_info("backing", path) if self.local else {}
        detected = info.get("format")
        fmt = p["backing_format"] or detected
        if fmt not in ("qcow2", "raw"):
            raise InvalidInputError("backing_format", fmt, "is not a supported backing format",
                                    "set backing_format to qcow2 or raw")
        if detected and p["backing_format"] and detected != p["backing_format"]:
            raise InvalidInputError("backing_format", p["backing_format"],
                                    "does not match the image, which qemu-img reads as %s" % detected,
                                    "set backing_format: %s or leave it unset" % detected)
        return path, fmt, int(info.get("virtual-size") or 0)

    def create_imported(self, pool: Any, capacity: Optional[int]) -> None:
        p = self.params
        path = p["import_from"]
        if not os.path.isfile(path):
            raise InvalidInputError("import_from", path, "is not a file on this host",
                                    "give the path of an existing image file")
        _is_qcow2, backing, _fmt = read_backing("import_from", path, path)
        if backing:
            # The volume would name that file as its backing image, unchecked: refuse, as qemu-img
            # and libvirt would follow it (a loop, a FIFO, a file outside every pool).
            raise InvalidInputError("import_from", path, "has a backing file (%s); an imported image must stand "
                                    "alone" % backing, "convert it into a standalone image first (qemu-img convert "
                                    "-O qcow2 %s standalone.qcow2), or make an overlay with backing instead" % path)
        info = self.service.image_info("import_from", path)
        detected = info.get("format")
        fmt = p["format"] or detected
        if fmt != detected:
            raise InvalidInputError("format", p["format"], "differs from the imported file's format (%s)" % detected,
                                    "convert it first (qemu-img convert -O %s) or set format: %s" % (fmt, detected))
        if detected not in ("qcow2", "raw"):
            raise InvalidInputError("import_from", path, "is a %s image" % detected,
                                    "convert it to qcow2 or raw first")
        virtual = int(info["virtual-size"])
        if capacity is not None and capacity < virtual:
            raise InvalidInputError("capacity", p["capacity"], "is smaller than the imported image (%s)" % human(virtual),
                                    "give at least %d bytes, or leave capacity unset" % virtual)
        size = os.path.getsize(path)
        # Twice the file: the upload lands in a temporary volume that is then copied.
        self.check_free_space(pool, 2 * size, "import_from", path,
                              " (twice the file's %s: the upload lands in a temporary volume that is then copied)"
                              % human(size))
        final_capacity = max(capacity or 0, virtual)
        self.tracker.add("state", "absent", "present")
        self.tracker.add("format", None, fmt)
        self.tracker.add("capacity", None, final_capacity)
        self.remove_leftover()
        self.tracker.act("import %s" % path, self.import_verified, pool, path, size, fmt, virtual, final_capacity)
        if final_capacity > virtual:
            # Part of the import above: its temporary volume is grown before the copy is made.
            self.tracker.action("grow to %s" % human(final_capacity))

    def import_verified(self, pool: Any, path: str, size: int, fmt: str, virtual: int, capacity: int) -> None:
        """Upload into NAME.mlinfra-partial, verify, then copy it to NAME and drop the temporary.

        libvirt has no rename, and a completion marker cannot be kept: a dir pool rebuilds a
        volume's XML from the file, so nothing written into it survives. libvirt's own copy
        (createXMLFrom) works for every pool type and remote URIs, and it removes its target
        itself when the copy fails, so NAME appears only complete. It costs a second copy
        of the image on the host; imports happen once per image, so that is paid rarely.
        """
        name = self.params["name"]
        temp_name = partial_name(name)
        temp = self.service.create(pool, build_xml(temp_name, fmt, virtual, None, None), temp_name)
        self.done("created temporary volume %s" % temp_name)
        try:
            sent = self.service.upload(temp, path, size)
            self.service.verify(temp, virtual, "uploading %d bytes of %s" % (sent, path))
            if capacity > virtual:
                self.service.resize(temp, capacity)
            self.service.clone(pool, build_xml(name, fmt, capacity, None, None), name, temp)
        except KvmError:
            self.discard(temp, temp_name)
            raise
        self.done("created volume %s from %s" % (name, temp_name))
        self.service.delete(temp)
        self.changes.remove("created temporary volume %s" % temp_name)

    def discard(self, temp: Any, temp_name: str) -> None:
        """Remove an incomplete temporary volume; if that fails too, the report says it is left."""
        try:
            self.service.delete(temp)
        except KvmError as err:
            self.done("could not delete %s (%s); the next run deletes it" % (temp_name, err.msg))
            return
        self.changes.remove("created temporary volume %s" % temp_name)

    def check_free_space(self, pool: Any, needed: int, option: str = "capacity", value: Any = None,
                         why: str = "") -> None:
        available = self.service.pool_available(pool)
        if needed > available:
            raise InvalidInputError(
                option, value if value is not None else (self.params["capacity"] or needed),
                "needs %s%s but pool %s has %s free" % (human(needed), why, self.params["pool"], human(available)),
                "free space in the pool, choose a smaller size or another pool")

    # -- update -----------------------------------------------------------------------------
    def update(self, vol: Any, before: Dict[str, Any], capacity: Optional[int]) -> None:
        p = self.params
        # Every NEVER field at once, from the table: the paths compared as the file system does.
        refuse_never_changes(FIELD_TABLE, dict(before, backing=_normpath(before["backing"])),
                             dict(p, backing=_normpath(p["backing"])), "volume %s" % p["name"])
        if capacity is None or capacity == before["capacity"]:
            return
        if capacity < before["capacity"]:
            raise ConflictError(
                "option capacity: value %r (%d bytes) is smaller than volume %s (%d bytes); volumes are "
                "never shrunk (the guest's file systems would be cut). Give at least %d bytes."
                % (p["capacity"], capacity, p["name"], before["capacity"], before["capacity"]), option="capacity")
        self.tracker.add("capacity", before["capacity"], capacity)
        self.tracker.act("grow to %s" % human(capacity), self.service.resize, vol, capacity)


def _normpath(path: Optional[str]) -> Optional[str]:
    return os.path.normpath(path) if path else None


MUTUALLY_EXCLUSIVE = [("backing", "import_from")]


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        name=dict(type="str", required=True),
        pool=dict(type="str", required=True),
        state=dict(type="str", default="present", choices=["present", "absent"]),
        **option_specs(FIELD_TABLE),
        import_from=dict(type="path"),
        **ALLOWED_PATHS_SPEC,
        force=dict(type="bool", default=False),
    )
    spec.update(LIBVIRT_ARGSPEC)
    return spec


def run_volume(module: AnsibleModule, conn: Any, local: bool) -> Dict[str, Any]:
    """One volume, on an open connection (mlinfra.kvm.volume, and each item of mlinfra.kvm.volumes).

    Host-local lock (local URIs): a second run for the same volume waits and then sees the
    finished volume, never one that is still being allocated or uploaded. For a remote URI no
    lock is shared; libvirt's own refusals (volume exists, still being allocated) then come
    back as clear errors."""
    p = module.params
    with local_object_lock(local, "volume", p["name"], scope=p["pool"]):
        return VolumeRunner(module, VolumeService(module, conn), local).run()


# -- resource list (mlinfra.kvm.volumes) -------------------------------------------------------

def gather_volumes(conn: Any) -> List[Dict[str, Any]]:
    """Every volume of every active pool as a volumes item (an import's temporary left out)."""
    service = VolumeService(None, conn)

    def read_pool(pool: Any) -> Dict[str, Any]:
        return {"name": pool.name(), "volumes": service.volumes(pool)}

    def read(pool_name: str, vol: Any) -> Optional[Dict[str, Any]]:
        if vol.name().endswith(PARTIAL_SUFFIX):
            return None
        root = X.parse(service.xml(vol))
        _unused, capacity, _allocation = service.info(vol)
        item: Dict[str, Any] = {"name": vol.name(), "pool": pool_name, "capacity": str(capacity)}
        item.update(read_xml(root))
        if item["format"] not in ("qcow2", "raw"):
            return None  # an ISO or other file in a dir pool: not a disk this module makes
        return {k: v for k, v in item.items() if v is not None}

    items: List[Dict[str, Any]] = []
    for pool in read_listed(service.active_pools(), read_pool):
        items.extend(read_listed(pool["volumes"], lambda vol, name=pool["name"]: read(name, vol)))
    return sorted(items, key=lambda i: (i["pool"], i["name"]))


def render_volume(params: Dict[str, Any]) -> str:
    capacity = validate_params(params)
    if capacity is None:
        raise InvalidInputError("capacity", None, "is needed to render a volume (the backing image is not read)",
                                "give a size such as 10G")
    backing = params["backing"]
    return build_xml(params["name"], params["format"] or "qcow2", capacity, backing,
                     (params["backing_format"] or "qcow2") if backing else None)


def precheck_volume(params: Dict[str, Any]) -> None:
    validate_params(params)


LIST_KIND = ResourceKind("volume", argument_spec(), MUTUALLY_EXCLUSIVE, run_volume, gather_volumes, render_volume,
                         precheck_volume, key_fields=("pool", "name"))
