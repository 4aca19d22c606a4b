# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small difference tracker, after community.docker's: it drives ``changed`` and ``diff``.

Modules record every field they compared (``add``) and every action they decided on
(``action``). ``changed`` is true when a field differs or an action is planned, which is
why check mode can predict a real run exactly: both take the same decisions, only the
real run then performs the actions. ``act`` is that guard, written once: it records an
action and performs its side effect unless the tracker was made for check mode. It also
keeps the ledger a failure needs: which actions' effects completed (``performed``) and which
one was running when it failed (``failed_action``), so that a run that fails half-way can
say exactly what it changed.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional


class DifferenceTracker:
    def __init__(self, check_mode: Optional[bool] = None) -> None:
        self._diffs: List[Dict[str, Any]] = []
        self._actions: List[str] = []
        self._performed: List[str] = []
        self._failed: Optional[str] = None
        # None: the owner guards its side effects itself, and act() refuses to guess.
        self.check_mode = check_mode

    def add(self, name: str, before: Any, after: Any, active: bool = True) -> bool:
        """Compare one field; return True when it differs. ``active=False`` skips it."""
        if not active or before == after:
            return False
        self._diffs.append({"name": name, "before": before, "after": after})
        return True

    def action(self, description: str) -> None:
        """Record a side effect the module will perform (or would, in check mode)."""
        self._actions.append(description)

    def act(self, description: str, effect: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Record an action and, unless in check mode, perform it: ``effect(*args, **kwargs)``,
        whose result is returned (None in check mode)."""
        if self.check_mode is None:
            raise TypeError("DifferenceTracker.act needs the tracker made with check_mode")
        self._actions.append(description)
        if self.check_mode:
            return None
        try:
            result = effect(*args, **kwargs)
        except BaseException:
            # An effect may act in turn: the innermost action records its failure first, and
            # the outer ones, which only fail with it, leave that record as it is.
            if self._failed is None:
                self._failed = description
            raise
        self._performed.append(description)
        return result

    @property
    def changed(self) -> bool:
        return bool(self._diffs or self._actions)

    @property
    def differences(self) -> List[Dict[str, Any]]:
        return list(self._diffs)

    @property
    def actions(self) -> List[str]:
        return list(self._actions)

    @property
    def performed(self) -> List[str]:
        """The actions whose side effect completed (a real run; check mode performs none)."""
        return list(self._performed)

    @property
    def failed_action(self) -> Optional[str]:
        """The action whose side effect raised, if one did."""
        return self._failed

    def fields(self) -> List[str]:
        return [d["name"] for d in self._diffs]

    def get_before(self) -> Dict[str, Any]:
        return {d["name"]: d["before"] for d in self._diffs}

    def get_after(self) -> Dict[str, Any]:
        return {d["name"]: d["after"] for d in self._diffs}

    def diff(self, before: Optional[Dict[str, Any]] = None,
             after: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Ansible's ``diff`` return: the whole before/after view when given, else the fields."""
        return {
            "before": before if before is not None else self.get_before(),
            "after": after if after is not None else self.get_after(),
        }
