# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The only code of mlinfra.kvm.domain_migration that talks to libvirt, on two connections: the
source's (option ``uri``) and the destination's (``dest_uri``). The runner (``_migration``) decides;
this class reads and performs.

Domain lookups, definitions, starts and shutdowns go through one :class:`DomainService` per side
(the calls mlinfra.kvm.domain makes); what only a migration needs is here: the live migration
itself (``migrateToURI3`` in a thread, see :class:`LiveMigrationJob`), its job statistics, abort and
downtime limit, the destination's facts a preflight reads (networks, pools, volumes by path, free
memory, CPU comparison, node devices), and the copy of a volume through two libvirt streams.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .._core._errors import KvmError, LibvirtCallError
from .._core._xml import parse
from ._connection import call, libvirt, lookup
from ._domain_pci import NodeDevPci
from ._domain_service import DomainService

# One read or write of a volume copy; large enough that the per-call overhead of the remote
# protocol does not matter, small enough that a timeout is noticed within a second or so.
COPY_CHUNK = 4 * 1024 * 1024

# Pool types whose volumes every host that defines the pool sees at the same path: a disk there
# is shared storage, which a migration must not copy.
SHARED_POOL_TYPES = ("netfs", "gluster", "rbd", "iscsi", "iscsi-direct", "sheepdog", "vstorage")


class LiveMigrationJob:
    """``migrateToURI3`` blocks until the migration ends. It runs in a thread so that the runner
    meanwhile reads the job's progress, and aborts the job past its timeout (libvirt then ends the
    call with an error, the domain still running on the source). libvirt's connections are
    thread-safe; the thread runs the one call the service hands it (through call(), in the service)."""

    def __init__(self, migrate: Callable[[], Any]) -> None:
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(migrate,), daemon=True)
        self._thread.start()

    def _run(self, migrate: Callable[[], Any]) -> None:
        try:
            migrate()
        except BaseException as exc:  # pylint: disable=broad-except  # handed to the runner's thread
            self._error = exc

    def wait(self, seconds: float) -> bool:
        """True once the migration call has returned (successfully or not)."""
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def succeeded(self) -> bool:
        """True once the migration call has returned without an error."""
        return not self._thread.is_alive() and self._error is None

    def result(self) -> None:
        """Raise what the migration call raised (a LibvirtCallError with libvirt's words)."""
        if self._error is not None:
            raise self._error


class MigrationService:
    def __init__(self, src_conn: Any, src_uri: str, dst_conn: Any, dst_uri: str,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.src_conn = src_conn
        self.dst_conn = dst_conn
        self.src_uri = src_uri
        self.dst_uri = dst_uri
        self.source = DomainService(src_conn, src_uri, sleep=sleep)
        self.dest = DomainService(dst_conn, dst_uri, sleep=sleep)
        self.sleep = sleep
        self._dest_pci: Optional[NodeDevPci] = None
        self._refreshed: Dict[str, bool] = {}  # side -> its pools were refreshed this run

    def side(self, which: str) -> Any:
        return self.src_conn if which == "source" else self.dst_conn

    def uri(self, which: str) -> str:
        return self.src_uri if which == "source" else self.dst_uri

    # ------------------------------------------------------------------ domains
    def is_persistent(self, dom: Any) -> bool:
        return bool(call("reading whether %s is persistent" % dom.name(), dom.isPersistent))

    def dest_domain_by_uuid(self, uuid: str) -> Optional[Any]:
        return lookup("looking up UUID %s on %s" % (uuid, self.dst_uri), self.dst_conn.lookupByUUIDString, uuid,
                      (libvirt.VIR_ERR_NO_DOMAIN,))

    def block_info(self, dom: Any, target: str) -> Optional[Dict[str, int]]:
        """Capacity and allocation (bytes) of one disk as libvirt sees it; None where the driver
        cannot tell (the size is then not checked against the destination pool)."""
        try:
            capacity, allocation, physical = dom.blockInfo(target, 0)
        except libvirt.libvirtError:
            return None
        return {"capacity": int(capacity), "allocation": int(allocation), "physical": int(physical)}

    def domain_paths(self, which: str, exclude: str) -> Dict[str, str]:
        """Disk path -> name of a domain on that side (running or not), other than ``exclude``,
        that uses it: a volume another domain uses is never deleted. Both definitions of a running
        domain are read (a disk attached live is in its live one only, with the backing chain
        libvirt found), and a disk of type volume counts by the path of its pool's volume."""
        found: Dict[str, str] = {}
        conn = self.side(which)
        for dom in call("listing the domains of %s" % self.uri(which), conn.listAllDomains, 0):
            if dom.name() == exclude:
                continue
            roots = [parse(call("reading the XML of %s" % dom.name(), dom.XMLDesc, libvirt.VIR_DOMAIN_XML_INACTIVE))]
            if call("reading the state of %s" % dom.name(), dom.isActive):
                roots.append(parse(call("reading the XML of %s" % dom.name(), dom.XMLDesc, 0)))
            for root in roots:
                for source in root.findall("devices/disk//source"):
                    path = source.get("file") or source.get("dev")
                    if not path and source.get("pool") and source.get("volume"):
                        path = self.volume_path(which, source.get("pool"), source.get("volume"))
                    if path:
                        found[os.path.normpath(path)] = dom.name()
        return found

    def backing_users(self, which: str, path: str) -> List[str]:
        """The volumes of a side's active pools whose backing image is ``path``: an image another
        one is layered on is never deleted."""
        users = []
        conn = self.side(which)
        for pool in call("listing the storage pools of %s" % self.uri(which), conn.listAllStoragePools,
                         libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
            for vol in call("listing the volumes of storage pool %s" % pool.name(), pool.listAllVolumes, 0):
                root = parse(call("reading volume %s" % vol.name(), vol.XMLDesc, 0))
                backing = root.findtext("backingStore/path")
                if backing and os.path.normpath(backing) == path:
                    users.append(call("reading the path of volume %s" % vol.name(), vol.path))
        return sorted(users)

    # ------------------------------------------------------------------ destination facts
    def network_state(self, name: str) -> Optional[bool]:
        """Whether the destination's network ``name`` is active; None when it does not exist."""
        net = lookup("looking up network %s on %s" % (name, self.dst_uri), self.dst_conn.networkLookupByName, name,
                     (libvirt.VIR_ERR_NO_NETWORK,))
        if net is None:
            return None
        return bool(call("reading the state of network %s" % name, net.isActive))

    def pools(self, which: str) -> List[Dict[str, Any]]:
        """Every storage pool of one side: name, type, target path, active, bytes available."""
        out = []
        conn = self.side(which)
        for pool in call("listing the storage pools of %s" % self.uri(which), conn.listAllStoragePools, 0):
            root = parse(call("reading storage pool %s" % pool.name(), pool.XMLDesc, 0))
            active = bool(call("reading the state of storage pool %s" % pool.name(), pool.isActive))
            available = None
            if active:
                available = int(call("reading storage pool %s" % pool.name(), pool.info)[3])
            target = root.findtext("target/path")
            out.append({"name": pool.name(), "type": root.get("type"), "active": active, "available": available,
                        "path": os.path.normpath(target) if target else None})
        return out

    def volume_at(self, which: str, path: str) -> Optional[Dict[str, Any]]:
        """The volume at ``path`` on one side (name, pool, format, capacity, allocation, backing);
        None when no pool of that side holds it. Pools are refreshed first, once per side and run,
        so that a file copied in since the last refresh is seen."""
        conn = self.side(which)
        self._refresh_once(which)
        vol = lookup("looking up the volume at %s on %s" % (path, self.uri(which)), conn.storageVolLookupByPath, path,
                     (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        if vol is None:
            return None
        root = parse(call("reading volume %s" % path, vol.XMLDesc, 0))
        fmt = root.find("target/format")
        info = call("reading volume %s" % path, vol.info)
        backing_format = root.find("backingStore/format")
        return {"name": vol.name(), "pool": call("reading the pool of %s" % path, vol.storagePoolLookupByVolume).name(),
                "path": path, "format": fmt.get("type") if fmt is not None else None, "capacity": int(info[1]),
                "allocation": int(info[2]), "backing": root.findtext("backingStore/path"),
                "backing_format": backing_format.get("type") if backing_format is not None else None}

    def volume_path(self, which: str, pool_name: str, name: str) -> Optional[str]:
        """The path of volume ``name`` in pool ``pool_name`` on one side (a disk of type volume);
        None when the pool or the volume does not exist there."""
        conn = self.side(which)
        pool = lookup("looking up storage pool %s on %s" % (pool_name, self.uri(which)), conn.storagePoolLookupByName,
                      pool_name, (libvirt.VIR_ERR_NO_STORAGE_POOL,))
        if pool is None or not call("reading the state of storage pool %s" % pool_name, pool.isActive):
            return None
        vol = lookup("looking up volume %s in pool %s" % (name, pool_name), pool.storageVolLookupByName, name,
                     (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        return call("reading the path of volume %s" % name, vol.path) if vol is not None else None

    def _refresh_once(self, which: str) -> None:
        if self._refreshed.get(which):
            return
        conn = self.side(which)
        for pool in call("listing the storage pools of %s" % self.uri(which), conn.listAllStoragePools,
                         libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
            try:
                pool.refresh(0)
            except libvirt.libvirtError:  # a pool busy with another job keeps its last listing
                pass
        self._refreshed[which] = True

    def free_memory(self) -> Optional[int]:
        """The destination's free memory in bytes; None where its driver cannot tell."""
        try:
            return int(self.dst_conn.getFreeMemory())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                return None
            raise LibvirtCallError("reading the free memory of %s" % self.dst_uri, exc.get_error_code(),
                                   exc.get_error_message() or str(exc))

    def compare_cpu(self, cpu_xml: str, emulator: Optional[str], arch: Optional[str], machine: Optional[str],
                    virt_type: Optional[str]) -> Optional[str]:
        """libvirt's verdict on running the domain's CPU on the destination: '' when compatible,
        libvirt's reason when not; None when the destination's driver cannot compare."""
        flags = libvirt.VIR_CONNECT_COMPARE_CPU_FAIL_INCOMPATIBLE
        try:
            self.dst_conn.compareHypervisorCPU(emulator, arch, machine, virt_type, cpu_xml, flags)
            return ""
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            if code == libvirt.VIR_ERR_NO_SUPPORT:
                return None
            if code == libvirt.VIR_ERR_CPU_INCOMPATIBLE:
                return exc.get_error_message() or str(exc)
            raise LibvirtCallError("comparing the domain's CPU with %s" % self.dst_uri, code,
                                   exc.get_error_message() or str(exc))

    def dest_pci(self) -> NodeDevPci:
        """The destination's PCI devices through libvirt's node device API (any URI)."""
        if self._dest_pci is None:
            self._dest_pci = NodeDevPci(self.dst_conn)
        return self._dest_pci

    # ------------------------------------------------------------------ live migration
    def set_max_downtime(self, dom: Any, milliseconds: int) -> None:
        # Set on the source's QEMU before the job starts: libvirt 9.0 has no typed migration
        # parameter for it, and QEMU keeps it for the migration that follows.
        call("setting the maximum downtime of %s to %d ms" % (dom.name(), milliseconds),
             dom.migrateSetMaxDowntime, milliseconds, 0)

    def start_live_migration(self, dom: Any, params: Dict[str, Any], flags: int) -> LiveMigrationJob:
        action = "migrating %s to %s" % (dom.name(), self.dst_uri)
        return LiveMigrationJob(lambda: call(action, dom.migrateToURI3, self.dst_uri, params, flags))

    def job_stats(self, dom: Any) -> Dict[str, Any]:
        """The running job's statistics (libvirt's VIR_DOMAIN_JOB_* keys); {} before the job has
        started or after it ended."""
        try:
            stats = dom.jobStats(0)
        except libvirt.libvirtError:  # the domain left the source between two polls
            return {}
        return stats if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) != libvirt.VIR_DOMAIN_JOB_NONE else {}

    def abort_job(self, dom: Any) -> None:
        call("aborting the migration of %s" % dom.name(), dom.abortJob)

    def completed_downtime(self, name: str) -> Optional[int]:
        """The downtime (ms) QEMU measured for the migration that just completed, from the
        destination's record of the incoming job; None where libvirt keeps none."""
        dom = self.dest.lookup(name)
        if dom is None:
            return None
        try:
            stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
        except libvirt.libvirtError:
            return None
        value = stats.get(libvirt.VIR_DOMAIN_JOB_DOWNTIME)
        return int(value) if value is not None else None

    # ------------------------------------------------------------------ volumes
    def create_volume(self, which: str, pool_name: str, xml: str) -> None:
        conn = self.side(which)
        pool = call("looking up storage pool %s on %s" % (pool_name, self.uri(which)),
                    conn.storagePoolLookupByName, pool_name)
        call("creating a volume in pool %s on %s" % (pool_name, self.uri(which)), pool.createXML, xml, 0)

    def delete_volume(self, which: str, path: str) -> None:
        conn = self.side(which)
        vol = lookup("looking up the volume at %s on %s" % (path, self.uri(which)), conn.storageVolLookupByPath,
                     path, (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        if vol is not None:
            call("deleting the volume at %s on %s" % (path, self.uri(which)), vol.delete, 0)

    def delete_volume_in(self, which: str, pool_name: str, name: str) -> None:
        """Delete volume ``name`` of pool ``pool_name`` on one side, when it is there."""
        conn = self.side(which)
        pool = lookup("looking up storage pool %s on %s" % (pool_name, self.uri(which)), conn.storagePoolLookupByName,
                      pool_name, (libvirt.VIR_ERR_NO_STORAGE_POOL,))
        vol = None if pool is None else lookup("looking up volume %s in pool %s" % (name, pool_name),
                                               pool.storageVolLookupByName, name, (libvirt.VIR_ERR_NO_STORAGE_VOL,))
        if vol is not None:
            call("deleting volume %s of pool %s on %s" % (name, pool_name, self.uri(which)), vol.delete, 0)

    def copy_volume(self, path: str, pool_name: str, name: str, deadline: float) -> int:
        """Copy the source's volume file at ``path`` byte for byte into the destination's volume
        ``name`` of pool ``pool_name`` (made empty by the runner), through a download and an upload
        stream; holes stay holes. Returns the bytes sent. Past ``deadline`` (time.monotonic()) both
        streams are aborted and the copy fails."""
        src = call("looking up the volume at %s on %s" % (path, self.src_uri), self.src_conn.storageVolLookupByPath, path)
        pool = call("looking up storage pool %s on %s" % (pool_name, self.dst_uri), self.dst_conn.storagePoolLookupByName,
                    pool_name)
        dst = call("looking up volume %s in pool %s on %s" % (name, pool_name, self.dst_uri), pool.storageVolLookupByName, name)
        down = call("opening a stream on %s" % self.src_uri, self.src_conn.newStream, 0)
        up = call("opening a stream on %s" % self.dst_uri, self.dst_conn.newStream, 0)
        sent = 0
        try:
            call("reading volume %s on %s" % (path, self.src_uri), src.download, down, 0, 0,
                 libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
            call("writing volume %s on %s" % (path, self.dst_uri), dst.upload, up, 0, 0,
                 libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
            while True:
                if time.monotonic() > deadline:
                    raise KvmError("copying %s took longer than the timeout (option timeout) after %d bytes" % (path, sent))
                data = call("reading volume %s" % path, down.recvFlags, COPY_CHUNK, libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
                if data == -3:  # a hole: skipped on both sides
                    hole = call("reading volume %s" % path, down.recvHole, 0)
                    call("writing volume %s" % path, up.sendHole, hole, 0)
                    continue
                if isinstance(data, int) or not data:
                    break
                offset = 0
                while offset < len(data):
                    offset += call("writing volume %s" % path, up.send, data[offset:])
                sent += len(data)
            call("finishing the read of %s" % path, down.finish)
            call("finishing the write of %s" % path, up.finish)
        except BaseException:
            for stream in (down, up):
                try:
                    stream.abort()
                except libvirt.libvirtError:  # already finished or broken: nothing to release
                    pass
            raise
        call("refreshing storage pool %s on %s" % (pool_name, self.dst_uri), pool.refresh, 0)
        return sent
