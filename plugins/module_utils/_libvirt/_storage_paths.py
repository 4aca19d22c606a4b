# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which host files may become a guest's disk, and a backing chain read without qemu-img.

The policy, shared by mlinfra.kvm.volume(s) (``backing``) and mlinfra.kvm.domain(s)
(``disks[].path``): a path libvirt is asked to hand to a guest, and every image in its
backing chain, must lie inside the target directory of one of the host's libvirt storage
pools or inside a directory the task lists in ``allowed_paths``. On a local host both sides
are resolved with realpath, so neither a symlink nor ``..`` can step out of them. Only
regular files and block devices are disk images: a FIFO blocks whoever opens it for ever, and
a socket, character device (``/dev/mem``) or directory is no disk. Without this, ``backing:
/etc/shadow`` made a volume whose guest reads the host's password hashes.

The chain is read from the qcow2 headers here, in Python, with a depth limit: qemu-img (which
libvirtd runs for a new overlay) follows a looping chain for ever and waits on a FIFO for
ever, so an untrusted chain is never handed to it before this walk has seen its end.
"""
from __future__ import annotations

import os
import stat
import struct
from typing import Any, Dict, List, Optional, Tuple

from .._core._errors import InvalidInputError
from .._core._validate import absolute_path, plain_text
from ._connection import call, libvirt
from .._core import _xml as X

# The option (same name in volume(s) and domain(s)) that lists directories kept outside pools.
ALLOWED_PATHS_SPEC: Dict[str, Any] = dict(allowed_paths=dict(type="list", elements="path", default=[]))
# Images in one chain, the image named included. A base image, its overlays and a few external
# snapshots stay far below it; a deeper chain is more likely a mistake (or a loop through many
# names) than a disk, and every image in it costs a guest a file open per read miss.
MAX_CHAIN_DEPTH = 32

QCOW2_MAGIC = b"QFI\xfb"
# The version 2 header is 72 bytes; version 3 adds fields up to header_length (at offset 100).
QCOW2_V2_HEADER = 72
# qemu's own bound on a backing file name (it refuses longer ones).
BACKING_NAME_MAX = 1023
# Header extensions lie in the first cluster; read at most this much of them.
EXTENSIONS_MAX = 64 * 1024
EXT_END, EXT_BACKING_FORMAT = 0, 0xE2792ACA

POOL_FIX = ("keep the image in a directory of a libvirt storage pool (mlinfra.kvm.pool), or list its "
            "directory in allowed_paths")
TYPE_FIX = "give a disk image: a regular file (qcow2 or raw) or a block device"


def check_allowed_paths(value: Any) -> List[str]:
    """The allowed_paths option: absolute paths without control characters."""
    paths = list(value or [])
    for index, path in enumerate(paths):
        option = "allowed_paths[%d]" % index
        plain_text(option, path)
        absolute_path(option, path)
    return paths


class StoragePolicyService:
    """What the policy reads from libvirt (the only libvirt calls of this module)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def pool_targets(self) -> List[Tuple[str, str]]:
        """(pool name, target path) of every pool the host defines, active or not."""
        targets = []
        for pool in call("listing storage pools", self.conn.listAllStoragePools, 0):
            try:
                root = X.parse(pool.XMLDesc(libvirt.VIR_STORAGE_XML_INACTIVE))
            except libvirt.libvirtError:
                continue  # removed by someone else since the listing: it holds nothing now
            target = X.text(root, "target/path")
            if target and target.startswith("/"):
                targets.append((pool.name(), target))
        return sorted(targets)


def _inside(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


class StoragePolicy:
    """Where disk images may lie on one host: its pools' targets plus ``allowed_paths``.

    ``local``: the module runs on the libvirt host, so paths are resolved (realpath) and the
    files themselves are checked; for a remote URI only the spelling can be compared (normpath).
    """

    def __init__(self, pools: List[Tuple[str, str]], allowed: List[str], local: bool) -> None:
        self.local = local
        self.pools = pools
        self.roots = [self.resolve(target) for _unused, target in pools] + [self.resolve(p) for p in allowed]

    @classmethod
    def of_host(cls, conn: Any, allowed: Any, local: bool) -> "StoragePolicy":
        return cls(StoragePolicyService(conn).pool_targets(), check_allowed_paths(allowed), local)

    def resolve(self, path: str) -> str:
        return os.path.realpath(path) if self.local else os.path.normpath(path)

    def allows(self, path: str) -> bool:
        real = self.resolve(path)
        return any(_inside(real, root) for root in self.roots)

    def where(self) -> str:
        pools = ", ".join("%s (%s)" % pool for pool in self.pools) or "none"
        return "the host's storage pools: %s" % pools

    def check_path(self, option: str, value: str, path: Optional[str] = None) -> None:
        """Refuse ``path`` (default: ``value`` itself) outside every pool and allowed path."""
        path = path or value
        if self.allows(path):
            return
        real = self.resolve(path)
        shown = path if real == path else "%s (resolved: %s)" % (path, real)
        what = "lies at %s" % shown if path == value else "has %s in its backing chain" % shown
        raise InvalidInputError(option, value, "%s, outside %s and outside allowed_paths" % (what, self.where()),
                                POOL_FIX, policy_roots=self.roots)

    def check_image(self, option: str, value: str) -> List[str]:
        """The whole check of an image a guest will read: ``value`` and (on a local host) every
        image of its backing chain inside the policy, files or block devices, no loop, at most
        MAX_CHAIN_DEPTH images. The chain, top first (just ``value`` for a remote host)."""
        self.check_path(option, value)
        if not self.local:
            return [value]
        return walk_backing_chain(option, value, self)


# -- the backing chain -------------------------------------------------------------------------

def _file_kind(mode: int) -> Optional[str]:
    """None for a disk image's file type; else what the file is, for the message."""
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file or block device"


def _refuse(option: str, value: str, path: str, problem: str, fix: str) -> InvalidInputError:
    subject = "is" if path == value else "has %s in its backing chain, which is" % path
    return InvalidInputError(option, value, "%s %s" % (subject, problem), fix)


def read_backing(option: str, value: str, path: str) -> Tuple[bool, Optional[str], Optional[str]]:
    """(is qcow2, backing file name, backing format) of the image at ``path``.

    The file type is checked before the file is opened (a character device may act on open)
    and again on the open descriptor (the file may have been swapped in between); the open is
    non-blocking, so even a FIFO put there meanwhile cannot hold the module.
    """
    try:
        kind = _file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        raise _refuse(option, value, path, "missing (it does not exist)",
                      "build or import the image first, or fix the path") from None
    except OSError as exc:
        raise _refuse(option, value, path, "unreadable (%s)" % (exc.strerror or exc), TYPE_FIX) from None
    if kind:
        raise _refuse(option, value, path, "%s, not a disk image" % kind, TYPE_FIX)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _refuse(option, value, path, "unreadable (%s)" % (exc.strerror or exc), TYPE_FIX) from None
    try:
        kind = _file_kind(os.fstat(fd).st_mode)
        if kind:
            raise _refuse(option, value, path, "%s, not a disk image" % kind, TYPE_FIX)
        return _qcow2_backing(option, value, path, fd)
    except OSError as exc:
        raise _refuse(option, value, path, "unreadable (%s)" % (exc.strerror or exc), TYPE_FIX) from None
    finally:
        os.close(fd)


def _qcow2_backing(option: str, value: str, path: str, fd: int) -> Tuple[bool, Optional[str], Optional[str]]:
    header = os.pread(fd, 104, 0)
    if len(header) < QCOW2_V2_HEADER or header[:4] != QCOW2_MAGIC:
        return False, None, None  # raw (or another format qemu-img will name): no backing file
    version, offset, size = struct.unpack(">IQI", header[4:20])
    if not size:
        return True, None, None
    if size > BACKING_NAME_MAX or offset < QCOW2_V2_HEADER or offset > EXTENSIONS_MAX:
        raise _refuse(option, value, path, "a qcow2 image with a damaged header (backing file name of %d bytes "
                      "at offset %d)" % (size, offset), "check the image (qemu-img check) or rebuild it")
    raw = os.pread(fd, size, offset)
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        name = ""
    if len(raw) != size or not name or "\0" in name:
        raise _refuse(option, value, path, "a qcow2 image whose backing file name cannot be read",
                      "check the image (qemu-img check) or rebuild it")
    header_length = struct.unpack(">I", header[100:104])[0] if version >= 3 and len(header) >= 104 \
        else QCOW2_V2_HEADER
    return True, name, _backing_format(fd, header_length, offset)


def _backing_format(fd: int, start: int, end: int) -> Optional[str]:
    """The backing format header extension, if the image has one (between the header and
    the backing file name)."""
    if start < QCOW2_V2_HEADER or start >= end:
        return None
    data = os.pread(fd, min(end, EXTENSIONS_MAX) - start, start)
    pos = 0
    while pos + 8 <= len(data):
        ext_type, length = struct.unpack(">II", data[pos:pos + 8])
        if ext_type == EXT_END:
            return None
        if ext_type == EXT_BACKING_FORMAT:
            return data[pos + 8:pos + 8 + length].decode("ascii", "replace") or None
        pos += 8 + (length + 7) // 8 * 8
    return None


def _next_path(option: str, value: str, current: str, name: str) -> str:
    """The backing file ``name`` of ``current`` as a path: relative names are relative to the
    directory of the image that names them, as qemu reads them; a protocol (nbd:, json:, http:)
    names nothing this host can check."""
    colon = name.find(":")
    if 0 < colon < (name.find("/") if "/" in name else len(name)):
        protocol = name[:colon]
        if protocol != "file":
            raise _refuse(option, value, current, "an image whose backing file is %r, a %s: protocol that "
                          "cannot be checked" % (name, protocol),
                          "use a base image in a local file (qemu-img convert the remote one into a pool)")
        name = name[colon + 1:]
    return name if name.startswith("/") else os.path.join(os.path.dirname(current), name)


def walk_backing_chain(option: str, value: str, policy: Optional[StoragePolicy] = None,
                       max_depth: int = MAX_CHAIN_DEPTH) -> List[str]:
    """Every image of ``value``'s chain, top first, each checked (policy, file type); raises
    InvalidInputError naming ``option`` on a loop, a chain deeper than ``max_depth`` images,
    a missing or non-image member. Reads headers only: never runs qemu-img."""
    chain: List[str] = []
    seen: Dict[str, int] = {}
    current, fmt = value, None
    while True:
        real = os.path.realpath(current)
        if real in seen:
            loop = " -> ".join(chain[seen[real]:] + [current])
            raise InvalidInputError(option, value, "has a backing chain that loops: %s" % loop,
                                    "give a base image whose chain ends in an image without a backing file "
                                    "(rebuild the images, or qemu-img convert one into a standalone image)")
        if len(chain) >= max_depth:
            raise InvalidInputError(option, value, "has a backing chain deeper than %d images (%s -> ...)"
                                    % (max_depth, " -> ".join(chain[:3])),
                                    "flatten it (qemu-img convert into a standalone image) and use that")
        if policy is not None and current != value:
            policy.check_path(option, value, current)
        seen[real] = len(chain)
        chain.append(current)
        is_qcow2, name, next_fmt = read_backing(option, value, current)
        # An image read as raw (its overlay says so) has no chain of its own, whatever it holds.
        if fmt == "raw" or not is_qcow2 or not name:
            return chain
        current, fmt = _next_path(option, value, current, name), next_fmt
