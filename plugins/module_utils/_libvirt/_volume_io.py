# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A capacity range and verified uploads for the volume and pool modules.

Kept apart from ``_validate.py`` (shared by every module) because these rules are specific
to storage: a size range and the import machinery. Control characters are refused by
``_validate.plain_text``, as in every module.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from .._core._errors import InvalidInputError, KvmError

PIB = 1024 ** 5
# Larger than any disk image this platform makes, small enough that a typo (10P for 10G,
# or a byte count pasted twice) is caught before libvirt tries to allocate it.
MAX_CAPACITY = PIB
# Suffix of the temporary volume an import uploads into; only the final name counts as done.
PARTIAL_SUFFIX = ".mlinfra-partial"
CHUNK = 4 * 1024 * 1024


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


def lock_name(name: str) -> str:
    """The volume whose host lock covers ``name``: an import's temporary is under the lock of
    the volume it becomes (the lock the importing run holds)."""
    return name[:-len(PARTIAL_SUFFIX)] if name.endswith(PARTIAL_SUFFIX) else name


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
