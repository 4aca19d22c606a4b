# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every object runner starts from (pool, network, volume, snapshot, domain).

One sequence for all five kinds (``run``): validate the request, then ``converge`` (read the
object through its service, the only code that talks to its API; compare with the request;
perform each side effect through ``self.tracker.act``, which skips the call in check mode; read
the result back or predict it) and return the report. Check mode and a real run therefore take
the same decisions and report the same actions.

A failure after the first side effect is a partial change, and ``run`` reports it as one for
every kind alike: ``changed=true``, ``actions`` (what completed), ``failed_action`` and the
message saying what was already done. A kind's own error that already describes what it did
(``actions`` in its details) is left as it is.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._diff import DifferenceTracker
from ._errors import KvmError, LibvirtCallError, error_of, is_libvirt_error


class ObjectRunner:
    def __init__(self, module: Any, service: Any, local: bool = True) -> None:
        self.module = module
        self.params = module.params
        self.service = service
        self.local = local  # a local URI: host locks, host-side checks (bridges, disk space)
        self.tracker = DifferenceTracker(check_mode=bool(module.check_mode))

    @property
    def check(self) -> bool:
        """Check mode, as the tracker that guards the side effects knows it (one place)."""
        return bool(self.tracker.check_mode)

    # -- the sequence -----------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """validate -> converge (read, compare, act, report); a failure after a side effect
        is reported as the partial change it is."""
        self.validate()
        try:
            return self.converge()
        except KvmError as err:
            self.report_partial(err)
            raise
        except Exception as exc:  # pylint: disable=broad-except
            if not is_libvirt_error(exc) or not self.done_so_far():
                raise
            # A libvirt call outside a service's call() (libvirtd gone mid-run): libvirt's own
            # words, with what this run had already done.
            found = error_of(exc)
            err = LibvirtCallError("performing '%s'" % (self.tracker.failed_action or "a read after the changes"),
                                   found["code"], found["message"])
            self.report_partial(err)
            raise err from exc

    def validate(self) -> None:
        """Refuse bad input before anything is read or changed (each kind adds its checks)."""

    def converge(self) -> Dict[str, Any]:
        raise NotImplementedError

    # -- partial changes --------------------------------------------------------------------
    def done_so_far(self) -> List[str]:
        """What this run has changed, in the words its report uses (a kind with finer steps,
        such as volume's import, says them)."""
        return self.tracker.performed

    def report_partial(self, err: KvmError) -> None:
        """Mark ``err`` as a partial change when something was done before it."""
        done = self.done_so_far()
        if self.check or not done or "actions" in err.details:
            return
        err.details["changed"] = True
        err.details["actions"] = self.tracker.performed
        if self.tracker.failed_action is not None:
            err.details["failed_action"] = self.tracker.failed_action
        err.msg = "%s (already done: %s)" % (err.msg, "; ".join(done))

    # -- the report -------------------------------------------------------------------------
    def with_diff(self, result: Dict[str, Any], before: Optional[Dict[str, Any]],
                  after: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """``result`` with Ansible's ``diff`` added when diff mode is on."""
        if self.module._diff:
            result["diff"] = self.tracker.diff(before, after)
        return result
