# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Debian mirror a host's apt already uses, read from its source files.

Roles that add components (contrib, non-free) take the mirror from the host rather than
naming a registry host of their own. Input: the ``results`` of an ``ansible.builtin.slurp``
loop over the host's apt source files, in the order apt reads them.
"""
from __future__ import annotations

import base64
import re
from typing import Any, Dict, Iterable, List, Tuple

from ansible.errors import AnsibleFilterError

# One-line format: "deb [options] URI suite component...".
_LINE = re.compile(r"^\s*deb\s+(?:\[[^\]\n]*\]\s+)?(\S+)\s+(\S+)", re.M)
_DISABLED = {"no", "false", "off", "without", "disable", "0"}


def _deb822_stanzas(text: str) -> Iterable[Dict[str, str]]:
    """Fields of each stanza (names lower-cased; continuation lines folded, comments dropped)."""
    fields: Dict[str, str] = {}
    last = None
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, None
        elif line[0] in " \t" and last:
            fields[last] += " " + line.strip()
        elif ":" in line:
            name, value = line.split(":", 1)
            last = name.strip().lower()
            fields[last] = value.strip()


def apt_entries(files: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """[(uri, suite)] of every enabled binary ("deb") source, in the order given."""
    entries: List[Tuple[str, str]] = []
    for item in files or []:
        if not isinstance(item, dict) or "content" not in item:
            continue  # a skipped or failed slurp
        path = str(item.get("item") or item.get("source") or "")
        try:
            text = base64.b64decode(item["content"]).decode("utf-8", "replace")
        except (TypeError, ValueError) as err:
            raise AnsibleFilterError("apt_mirror: %s is not a slurp result (%s)" % (path or item, err))
        if path.endswith(".sources"):
            for stanza in _deb822_stanzas(text):
                if "deb" not in stanza.get("types", "").split():
                    continue
                if stanza.get("enabled", "yes").strip().lower() in _DISABLED:
                    continue
                entries.extend((uri, suite) for uri in stanza.get("uris", "").split()
                               for suite in stanza.get("suites", "").split())
        else:
            entries.extend(_LINE.findall(text))
    return entries


def apt_mirror(files: List[Dict[str, Any]], suite: str) -> str:
    """The URI of the first source whose suite is ``suite``; '' when there is none."""
    for uri, found in apt_entries(files):
        if found == suite:
            return uri
    return ""


class FilterModule:
    def filters(self):
        return {"apt_mirror": apt_mirror}
