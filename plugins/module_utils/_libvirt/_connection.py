# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libvirt connection shared by every libvirt module, and what goes with it: the ``uri``
option (:data:`LIBVIRT_ARGSPEC`, :func:`resolve_uri`), :class:`Connection`, and the wrappers
:func:`call` and :func:`lookup` with their error helpers.

The ``*Service`` classes are the only code that talks to libvirt; they go through :func:`call` so that a
``libvirt.libvirtError`` always becomes a :class:`LibvirtCallError` with libvirt's code and
message (never swallowed, never a bare traceback).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, TypeVar

from ansible.module_utils.basic import env_fallback

from .._core._errors import KvmError, LibvirtCallError, error_of
from ._uri import is_local

try:
    import libvirt  # type: ignore
    HAS_LIBVIRT = True
    LIBVIRT_IMPORT_ERROR: Optional[str] = None
except ImportError as exc:  # pragma: no cover - depends on the host
    libvirt = None  # type: ignore
    HAS_LIBVIRT = False
    LIBVIRT_IMPORT_ERROR = str(exc)

DEFAULT_URI = "qemu:///system"

# Spread into every libvirt module's argument_spec (documented by the libvirt doc fragment).
# No ``default`` on purpose: Ansible applies a default before the environment fallback,
# which would hide LIBVIRT_DEFAULT_URI. resolve_uri() supplies the default afterwards.
LIBVIRT_ARGSPEC: Dict[str, Any] = {
    "uri": {"type": "str", "fallback": (env_fallback, ["LIBVIRT_DEFAULT_URI"])},
}

T = TypeVar("T")

# libvirt silently prints errors to stderr unless a handler is registered.
if HAS_LIBVIRT:
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def resolve_uri(uri: Optional[str]) -> str:
    return uri or os.environ.get("LIBVIRT_DEFAULT_URI") or DEFAULT_URI


def require_libvirt() -> None:
    if not HAS_LIBVIRT:
        raise KvmError(
            "the Python module 'libvirt' is not importable (%s); install libvirt-python "
            "(pip install libvirt-python) or python3-libvirt on the managed host" % LIBVIRT_IMPORT_ERROR)


def call(action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one libvirt call; turn libvirtError into LibvirtCallError naming ``action``."""
    try:
        return fn(*args, **kwargs)
    except libvirt.libvirtError as exc:
        err = error_of(exc)
        raise LibvirtCallError(action, err["code"], err["message"], err["domain"])


def is_no_such(exc: Exception, *codes: int) -> bool:
    return isinstance(exc, libvirt.libvirtError) and exc.get_error_code() in codes


def lookup(action: str, fn: Callable[[str], T], name: str, missing_codes: tuple) -> Optional[T]:
    """Look an object up by name; None when libvirt says it does not exist."""
    try:
        return fn(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() in missing_codes:
            return None
        err = error_of(exc)
        raise LibvirtCallError(action, err["code"], err["message"], err["domain"])


class Connection:
    """A libvirt connection opened from the module's ``uri`` option (context manager)."""

    def __init__(self, uri: Optional[str], readonly: bool = False) -> None:
        require_libvirt()
        self.uri = resolve_uri(uri)
        self.readonly = readonly
        self._conn = None

    def open(self) -> Any:
        if self._conn is None:
            opener = libvirt.openReadOnly if self.readonly else libvirt.open
            try:
                self._conn = opener(self.uri)
            except libvirt.libvirtError as exc:
                err = error_of(exc)
                raise LibvirtCallError(
                    "connecting to %s (option uri; check the URI, that libvirtd runs and that "
                    "you may use its socket)" % self.uri,
                    err["code"], err["message"], err["domain"], uri=self.uri)
        return self._conn

    @property
    def conn(self) -> Any:
        return self.open()

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:  # closing a dead connection is not worth failing on
                pass
            self._conn = None

    def __enter__(self) -> "Connection":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connected_runner(module: Any, run_object: Callable[[Any, Any, bool], Dict[str, Any]],
                     precheck: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Callable[[], Dict[str, Any]]:
    """The runner of a module that changes one libvirt object: ``precheck(module.params)`` first,
    so that bad input fails before libvirt is even contacted, then ``run_object(module, conn,
    local)`` on one connection opened from the module's ``uri`` (``local``: :func:`is_local`)."""
    def runner() -> Dict[str, Any]:
        if precheck is not None:
            precheck(module.params)
        with Connection(module.params["uri"]) as connection:
            return run_object(module, connection.conn, is_local(connection.uri))
    return runner
