# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-local locks: two runs that change the same libvirt object take turns.

Every module that changes a network, pool, volume or domain (the single modules and each item
of a list) reads, compares and acts while it holds an exclusive flock named after the object.
Two ``ansible-playbook`` runs of one play against one hypervisor then serialise object by
object: the second waits, reads what the first made and reports it unchanged, instead of
defining a second copy or failing on "already exists" half way through a list.

The lock is a file on the machine the module runs on, so it only works for local URIs (the
roles run the modules on the hypervisor). For a remote URI nothing is shared and libvirt's
own refusals come back as clear errors. The kernel drops a flock when its holder dies, so a
killed run never leaves an object locked.

The holder removes the file before it lets go (one file per object ever touched would pile
up in /run/mlinfra otherwise). A run that opened the file before that removal and then gets
the flock holds a lock on a file nobody else can find: it compares the inode it holds with
the one at the path and, when they differ, opens the path again and waits on that.

Names are validated (``_validate.object_name``) before any lock file is made: every libvirt
object module takes its lock first, so this is the one place where every one of them checks
the names it was given before any file or libvirt call.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator, Optional
from urllib.parse import quote

from ._errors import ConflictError, KvmError
from ._validate import object_name

LOCK_DIRS = ("/run/mlinfra", "/tmp/mlinfra-%d" % os.getuid())
# Long enough to wait for another run's slowest step (an image import, a guest's first boot
# with wait_for_ip), short enough that a hung run is reported rather than waited on forever.
LOCK_TIMEOUT = 1800.0
POLL_S = 0.2
# A lock file name longer than this (encoded names of a volume and its pool can reach it) is
# replaced by a digest of the parts, well under NAME_MAX (255 bytes on Linux file systems).
FILE_NAME_MAX = 200


def _lock_dir() -> str:
    for directory in LOCK_DIRS:
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise KvmError("cannot create a lock directory (tried %s); make /run/mlinfra writable for the user "
                   "that runs the module" % ", ".join(LOCK_DIRS))


def object_label(kind: str, name: str, scope: Optional[str]) -> str:
    return "%s %s of pool %s" % (kind, name, scope) if scope else "%s %s" % (kind, name)


def lock_path(kind: str, name: str, scope: Optional[str] = None) -> str:
    """``KIND@[SCOPE@]NAME.lock`` in the lock directory, each part percent-encoded: a '/' or
    '..' must not reach outside the directory, and an '@' in a name must not fake a scope. A name
    too long for a file name becomes ``KIND@<sha256>.lock``."""
    parts = [kind] + ([scope] if scope else []) + [name]
    file_name = "@".join(quote(part, safe="") for part in parts) + ".lock"
    if len(file_name) > FILE_NAME_MAX:
        digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
        file_name = "%s@%s.lock" % (quote(kind, safe=""), digest)
    return os.path.join(_lock_dir(), file_name)


@contextmanager
def object_lock(kind: str, name: str, scope: Optional[str] = None,
                timeout: Optional[float] = None) -> Iterator[str]:
    """Hold the exclusive lock of one object (``scope``: the pool of a volume) on this host.

    Hold one object's lock at a time: a second open of the same file in this process would
    wait for the first. The file is removed on release, while still held."""
    path = lock_path(kind, name, scope)
    timeout = LOCK_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    fd = _open_locked(path, deadline, object_label(kind, name, scope), timeout)
    try:
        yield path
    finally:
        try:
            # Still held: a waiter that opened this file finds it gone once it gets the flock
            # and starts again on a new one (_open_locked).
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)  # closing releases the flock


def _open_locked(path: str, deadline: float, label: str, timeout: float) -> int:
    """An fd of ``path`` that holds its flock, and is still the file at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock(fd, path, deadline, label, timeout)
            if _is_current(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed it before we got it: lock the new file


def _flock(fd: int, path: str, deadline: float, label: str, timeout: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise KvmError("cannot lock %s: %s" % (path, exc.strerror or exc))
            if time.monotonic() >= deadline:
                raise ConflictError(
                    "%s is being changed by another run that still holds %s after %d s; nothing was "
                    "changed. Wait for it to finish and run again." % (label, path, timeout),
                    option="name", lock=path)
            time.sleep(POLL_S)


def _is_current(fd: int, path: str) -> bool:
    """Whether the locked ``fd`` is the file at ``path`` (not one its holder removed)."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def local_object_lock(local: bool, kind: str, name: str, scope: Optional[str] = None,
                      option: Optional[str] = "name", scope_option: str = "pool") -> ContextManager:
    """object_lock for a local URI; nothing to hold for a remote one (see the module note).

    First, local or not, the names are validated as the options ``option`` and
    ``scope_option`` (a name read from libvirt rather than given: ``option=None``)."""
    if option is not None:
        object_name(option, name)
        if scope is not None:
            object_name(scope_option, scope)
    return object_lock(kind, name, scope) if local else nullcontext()
