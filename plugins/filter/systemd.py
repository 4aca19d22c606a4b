# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read ``systemctl show --property=Id,ActiveState,UnitFileState UNIT...``: the units that are
running and enabled, so a role can skip its "started and enabled" tasks for them (one command
for all units instead of one service module run each)."""
from __future__ import annotations

from typing import Dict, List

from ansible.errors import AnsibleFilterError


def _blocks(text: str) -> List[Dict[str, str]]:
    units, current = [], {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current:
                units.append(current)
            current = {}
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise AnsibleFilterError("systemd_units_up: %r is not a KEY=VALUE line of systemctl show" % line)
        current[key] = value
    return units


def systemd_units_up(show_output: str) -> List[str]:
    """Units (their Id, e.g. prometheus.service) with ActiveState=active and UnitFileState=enabled."""
    if not isinstance(show_output, str):
        raise AnsibleFilterError("systemd_units_up: expects the stdout of systemctl show, got %s" % type(show_output).__name__)
    up = []
    for unit in _blocks(show_output):
        if "Id" not in unit or "ActiveState" not in unit or "UnitFileState" not in unit:
            raise AnsibleFilterError("systemd_units_up: a unit block lacks Id, ActiveState or UnitFileState "
                                     "(run systemctl show --property=Id,ActiveState,UnitFileState): %r" % unit)
        if unit["ActiveState"] == "active" and unit["UnitFileState"] == "enabled":
            up.append(unit["Id"])
    return sorted(up)


class FilterModule:
    def filters(self):
        return {"systemd_units_up": systemd_units_up}
