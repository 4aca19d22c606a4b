# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whole-file writes that a reader or a crash never sees half done: a temporary file in the
target's directory, written, given its mode, flushed to disk, renamed over the target.

Why not ``AnsibleModule.atomic_move``: it gives the new file the permissions of the file it
replaces, or for a new file the umask's default (0644 under the usual umask), so a secret
written 0600 would be replaced readable; it does not fsync; and these writers also run where no
module object is at hand (ml_stage's lock, hash cache and metrics). Here the caller's mode is
set on the temporary file before the rename, so the target never exists with another mode.
"""
from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional, Tuple

from ._errors import KvmError


def fsync_dir(path: str) -> None:
    """Flush a directory entry (a rename) to disk; best effort where the platform refuses."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str, data: bytes, fsync: bool = True, mode: int = 0o644,
                       owner: Optional[Tuple[int, int]] = None,
                       check: Optional[Callable[[str], None]] = None) -> None:
    """Replace ``path`` with ``data`` (mode ``mode``) through a temporary file beside it.

    A reader sees the old file or the new one, never a torn one; a crash leaves at most a stray
    ``.NAME.*.tmp`` file, never a half-written ``path``. ``owner`` (uid, gid) is set on the
    temporary file too; ``check(tmp_path)`` runs on the finished temporary file and may raise to
    keep ``path`` as it was (the temporary file is removed). Raises OSError.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            if owner is not None:
                os.fchown(handle.fileno(), owner[0], owner[1])
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fsync_dir(directory)


def write_text_atomic(path: str, content: str, mode: int = 0o644) -> None:
    """:func:`write_bytes_atomic` of ``content`` as UTF-8, a failure as a :class:`KvmError` naming
    the path (a drop-in under /etc, a config file that a crash must not leave empty)."""
    try:
        write_bytes_atomic(path, content.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise KvmError("cannot write %s: %s" % (path, exc), path=path)


def read_text(path: str) -> Optional[str]:
    """A whole text file (UTF-8, undecodable bytes replaced), or None when it is absent; any other
    failure to read it as a :class:`KvmError` naming the path."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KvmError("cannot read %s: %s" % (path, exc), path=path)
