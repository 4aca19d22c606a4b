# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A capacity range, verified uploads and a host-local lock for the volume and pool modules.

Kept apart from ``_validate.py`` (shared by every module) because these rules are specific
to storage: a size range and the import machinery. Control characters are refused by
``_validate.plain_text``, as in every module.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from typing import Any, Callable, Iterator, Optional

from contextlib import contextmanager

from ._errors import ConflictError, InvalidInputError, KvmError

PIB = 1024 ** 5
# Larger than any disk image this platform makes, small enough that a typo (10P for 10G,
# or a byte count pasted twice) is caught before libvirt tries to allocate it.
MAX_CAPACITY = PIB
# Suffix of the temporary volume an import uploads into; only the final name counts as done.
PARTIAL_SUFFIX = ".mlinfra-partial"
CHUNK = 4 * 1024 * 1024
LOCK_DIRS = ("/run/mlinfra", "/tmp/mlinfra-%d" % os.getuid())
LOCK_TIMEOUT = 1800.0


def capacity_in_range(option: str, raw: Any, value: Optional[int]) -> Optional[int]:
    """A size must be positive and at most MAX_CAPACITY (1 PiB)."""
    if value is None:
        return None
    if value <= 0:
        raise InvalidInputError(option, raw, "is not a positive size", "give a size such as 10G")
    if value > MAX_CAPACITY:
        raise InvalidInputError(option, raw, "is %d bytes, more than the limit of 1 PiB (%d bytes)" % (value, MAX_CAPACITY),
                                "give a smaller size (check the unit: G, not P)")
    return value


def partial_name(name: str) -> str:
    return name + PARTIAL_SUFFIX


# -- verified upload -------------------------------------------------------------------------

def stream_file(path: str, size: int, send: Callable[[bytes], Any]) -> int:
    """Send the first ``size`` bytes of ``path`` through ``send``; the number of bytes sent.

    Raises KvmError (option import_from) when the file cannot be read, ends before ``size``
    bytes or changes size while it is read: the caller must then discard what was sent.
    """
    sent = 0
    try:
        with open(path, "rb") as handle:
            while sent < size:
                chunk = handle.read(min(CHUNK, size - sent))
                if not chunk:
                    break
                send(chunk)
                sent += len(chunk)
            size_now = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise KvmError("option import_from: value %r could not be read after %d of %d bytes (%s); the partial "
                       "upload is discarded. Check the file (disk, permissions) and run again."
                       % (path, sent, size, exc.strerror or exc), option="import_from", value=path,
                       bytes_sent=sent, bytes_expected=size)
    if sent != size or size_now != size:
        raise KvmError("option import_from: value %r delivered %d of %d bytes (its size is now %d: it was truncated "
                       "or changed while being read); the partial upload is discarded. Import a file that is "
                       "complete and not being written." % (path, sent, size, size_now),
                       option="import_from", value=path, bytes_sent=sent, bytes_expected=size)
    return sent


# -- host-local lock -------------------------------------------------------------------------

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


@contextmanager
def volume_lock(pool: str, name: str, timeout: float = LOCK_TIMEOUT) -> Iterator[str]:
    """Hold an exclusive flock for one volume of one pool on this host.

    Two runs that create the same volume at once serialise here: the second one waits, then
    finds the finished volume (unchanged) instead of resizing or uploading into one that the
    first is still allocating. '@' cannot occur in validated names, so the file name is
    unambiguous. The kernel drops a flock when its holder dies, so a killed run never
    leaves the lock held.
    """
    path = os.path.join(_lock_dir(), "volume@%s@%s.lock" % (pool, name))
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
                        "volume %s of pool %s is being changed by another run that still holds %s after %d s; "
                        "nothing was changed. Wait for it to finish and run again." % (name, pool, path, timeout),
                        option="name", lock=path)
                time.sleep(0.2)
        yield path
    finally:
        os.close(fd)  # closing releases the flock
