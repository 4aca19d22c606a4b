# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Debian mirror a host's apt already uses, read from its source files.

One parser for every place that needs the mirror without naming a registry host: the
``mlinfra.kvm.apt_mirror`` filter (the cuda and nvidia_driver roles, on the target's files)
and ``lab/image/build.sh`` (on the controller's own files, run as a script). Standard
library only, so the image build can run it with the system python3:

    python3 plugins/module_utils/_host/_apt_sources.py SUITE [APT_DIR]   # prints the URI or nothing
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

# One-line format: "deb [options] URI suite component...".
_LINE = re.compile(r"^\s*deb\s+(?:\[[^\]\n]*\]\s+)?(\S+)\s+(\S+)", re.M)
_DISABLED = {"no", "false", "off", "without", "disable", "0"}
# The names apt itself reads under sources.list.d (others there are ignored by it too).
_PART_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.(list|sources)$")


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


def entries_of(path: str, text: str) -> List[Tuple[str, str]]:
    """[(uri, suite)] of the enabled binary ("deb") sources of one file, in order."""
    if not path.endswith(".sources"):
        return _LINE.findall(text)
    entries: List[Tuple[str, str]] = []
    for stanza in _deb822_stanzas(text):
        if "deb" not in stanza.get("types", "").split():
            continue
        if stanza.get("enabled", "yes").strip().lower() in _DISABLED:
            continue
        entries.extend((uri, suite) for uri in stanza.get("uris", "").split()
                       for suite in stanza.get("suites", "").split())
    return entries


def mirror_for(files: Iterable[Tuple[str, str]], suite: str) -> str:
    """The URI of the first source whose suite is ``suite`` in (path, text) files given in
    apt's order; '' when there is none."""
    for path, text in files:
        for uri, found in entries_of(path, text):
            if found == suite:
                return uri
    return ""


def files_in(apt_dir: str = "/etc/apt") -> List[Tuple[str, str]]:
    """(path, text) of apt's source files in the order apt reads them: sources.list, then
    sources.list.d/*.list and *.sources by name."""
    root = Path(apt_dir)
    paths = [root / "sources.list"] + sorted(
        p for p in (root / "sources.list.d").glob("*") if _PART_NAME.match(p.name))
    return [(str(p), p.read_text(errors="replace")) for p in paths if p.is_file()]


if __name__ == "__main__":
    # The command line of lab/image/build.sh (outside any module), so sys.exit and print are right here.
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: _apt_sources.py SUITE [APT_DIR]")  # pylint: disable=ansible-bad-function
    print(mirror_for(files_in(*sys.argv[2:]), sys.argv[1]))  # pylint: disable=ansible-bad-function
