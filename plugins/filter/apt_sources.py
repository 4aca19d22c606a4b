# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Debian mirror a host's apt already uses, read from its source files.

Roles that add components (contrib, non-free) take the mirror from the host rather than
naming a registry host of their own. Input: the ``results`` of an ``ansible.builtin.slurp``
loop over the host's apt source files, in the order apt reads them. The parsing is
module_utils/_host/_apt_sources.py, which the image build uses too.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, List, Tuple

from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.module_utils._host._apt_sources import mirror_for


def _slurped(files: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """(path, text) of each successful slurp result."""
    out = []
    for item in files or []:
        if not isinstance(item, dict) or "content" not in item:
            continue  # a skipped or failed slurp
        path = str(item.get("item") or item.get("source") or "")
        try:
            out.append((path, base64.b64decode(item["content"]).decode("utf-8", "replace")))
        except (TypeError, ValueError) as err:
            raise AnsibleFilterError("apt_mirror: %s is not a slurp result (%s)" % (path or item, err))
    return out


def apt_mirror(files: List[Dict[str, Any]], suite: str) -> str:
    """The URI of the first source whose suite is ``suite``; '' when there is none."""
    return mirror_for(_slurped(files), suite)


class FilterModule:
    def filters(self):
        return {"apt_mirror": apt_mirror}
