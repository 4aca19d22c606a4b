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
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator, Optional
from urllib.parse import quote

from ._errors import ConflictError, KvmError

LOCK_DIRS = ("/run/mlinfra", "/tmp/mlinfra-%d" % os.getuid())
# Long enough to wait for another run's slowest step (an image import, a guest's first boot
# with wait_for_ip), short enough that a hung run is reported rather than waited on forever.
LOCK_TIMEOUT = 1800.0
POLL_S = 0.2


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


@contextmanager
def object_lock(kind: str, name: str, scope: Optional[str] = None,
                timeout: Optional[float] = None) -> Iterator[str]:
    """Hold the exclusive lock of one object (``scope``: the pool of a volume) on this host.

    The file is ``KIND@[SCOPE@]NAME.lock``, each part percent-encoded: the lock is taken before
    the runner validates the name, and a '/' or '..' must not reach outside the lock directory.
    Hold one object's lock at a time: a second open of the same file in this process would
    wait for the first."""
    parts = [kind] + ([scope] if scope else []) + [name]
    path = os.path.join(_lock_dir(), "@".join(quote(part, safe="") for part in parts) + ".lock")
    timeout = LOCK_TIMEOUT if timeout is None else timeout
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise KvmError("cannot lock %s: %s" % (path, exc.strerror or exc))
                if time.monotonic() >= deadline:
                    raise ConflictError(
                        "%s is being changed by another run that still holds %s after %d s; nothing was "
                        "changed. Wait for it to finish and run again." % (object_label(kind, name, scope), path, timeout),
                        option="name", lock=path)
                time.sleep(POLL_S)
        yield path
    finally:
        os.close(fd)  # closing releases the flock


def local_object_lock(local: bool, kind: str, name: str, scope: Optional[str] = None) -> ContextManager:
    """object_lock for a local URI; nothing to hold for a remote one (see the module note)."""
    return object_lock(kind, name, scope) if local else nullcontext()
