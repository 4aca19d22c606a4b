# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for sizes written the way the modules accept them (2G, 512M, 2048)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import size_bytes

MIB = 1024 * 1024


def size_mib(value, bare_unit: str = "M") -> int:
    """'2G' -> 2048; a bare number is taken in ``bare_unit`` (MiB by default, like the domain module)."""
    text = str(value).strip()
    if text.isdigit():
        text += bare_unit
    try:
        return size_bytes("size", text) // MIB
    except InvalidInputError as err:
        raise AnsibleFilterError(err.msg)


def size_bytes_filter(value) -> int:
    try:
        return size_bytes("size", value)
    except InvalidInputError as err:
        raise AnsibleFilterError(err.msg)


class FilterModule:
    def filters(self):
        return {"size_mib": size_mib, "size_bytes": size_bytes_filter}
