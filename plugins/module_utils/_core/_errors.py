# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One exception hierarchy for every module of the collection.

Runners and services raise these; ``main()`` turns them into ``fail_json`` through
:func:`fail_from_error`, so every module reports problems the same way: a message that
names the option, the value and the fix, plus libvirt's code and message when libvirt
itself refused something.
"""
from __future__ import annotations

from typing import Any, Dict, Optional


class KvmError(Exception):
    """Base class: something the module cannot do. Nothing has been changed."""

    def __init__(self, msg: str, **details: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details: Dict[str, Any] = details

    def result(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"msg": self.msg}
        out.update(self.details)
        return out


class InvalidInputError(KvmError):
    """A request that is wrong on its face; raised before any side effect."""

    def __init__(self, option: str, value: Any, problem: str, fix: str, **details: Any) -> None:
        msg = "option %s: value %r %s; %s" % (option, value, problem, fix)
        super().__init__(msg, option=option, value=value, **details)


class ConflictError(KvmError):
    """A request that contradicts the existing state (and no opt-in was given)."""


class ValidationFailedError(KvmError):
    """A file's validate command refused its new content; the file was left as it was."""


class LibvirtCallError(KvmError):
    """libvirt refused a call; carries its error code, domain and message."""

    def __init__(self, action: str, code: Optional[int], message: str,
                 domain: Optional[int] = None, **details: Any) -> None:
        msg = "libvirt error while %s: code %s: %s" % (action, code, message)
        super().__init__(msg, libvirt_code=code, libvirt_message=message,
                         libvirt_domain=domain, **details)
        self.code = code


def fail_from_error(module: Any, err: KvmError, **extra: Any) -> None:
    """Report ``err`` through ``module.fail_json`` (never returns)."""
    result = err.result()
    result.update(extra)
    result.setdefault("changed", False)
    module.fail_json(**result)


def is_libvirt_error(exc: BaseException) -> bool:
    """True for libvirt-python's libvirtError, known by its class so that this layer never
    imports libvirt (modules without libvirt use it too)."""
    return any(cls.__name__ == "libvirtError" and cls.__module__ == "libvirt" for cls in type(exc).__mro__)


def error_of(exc: Exception) -> Dict[str, Any]:
    """libvirt's code, domain and message from a libvirtError."""
    code = exc.get_error_code() if hasattr(exc, "get_error_code") else None
    domain = exc.get_error_domain() if hasattr(exc, "get_error_domain") else None
    message = (exc.get_error_message() if hasattr(exc, "get_error_message") else None) or str(exc)
    return {"code": code, "domain": domain, "message": message}
