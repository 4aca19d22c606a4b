# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every object runner starts from (pool, network, volume, snapshot, domain).

A runner reads one object through its service (the only code that talks to the object's API),
compares it with the request, decides, and performs each side effect through
``self.tracker.act``, which skips the call in check mode: so check mode and a real run take
the same decisions and report the same actions.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ._diff import DifferenceTracker


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

    def with_diff(self, result: Dict[str, Any], before: Optional[Dict[str, Any]],
                  after: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """``result`` with Ansible's ``diff`` added when diff mode is on."""
        if self.module._diff:
            result["diff"] = self.tracker.diff(before, after)
        return result
