"""Make antsibull-docs' simplified RST a Sphinx project (scripts/docs.sh runs this).

The simplified format links pages as files (`text <name.rst>`__), which suits a repository
browser but not Sphinx. Here each link to a page of this collection becomes a :doc: role, so
Sphinx checks that its target exists (a broken one is a warning, and the build runs with -W).
A link to another collection's page points at that collection's page on the Ansible docsite.
The index gets a hidden toctree, so every page is part of the site.

    docs_prepare.py RST_DIR
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

LINK = re.compile(r"`([^`<]+?) <([A-Za-z0-9_]+)\.rst>`__?")
FQCN = re.compile(r"^([a-z0-9_]+)\.([a-z0-9_]+)\.([a-z0-9_]+)$")
ANSIBLE_DOCS = "https://docs.ansible.com/ansible/latest/collections/%s/%s/%s.html"


OWN = ("mlinfra", "kvm")


def relink(text: str, pages: set, missing: list) -> str:
    """``text`` with its page links rewritten; links to pages of this collection that do not
    exist are appended to ``missing`` (and left as they are, so Sphinx names them too)."""
    def one(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if target in pages:
            return ":doc:`%s <%s>`" % (label, target)
        fqcn = FQCN.match(label.replace("\\_", "_"))
        if fqcn and fqcn.group(1, 2) == OWN:
            missing.append("%s -> %s.rst" % (label, target))
            return match.group(0)
        if fqcn:
            return "`%s <%s>`__" % (label, ANSIBLE_DOCS % (fqcn.group(1), fqcn.group(2), target))
        return label
    return LINK.sub(one, text)


def main(rst_dir: str) -> int:
    root = Path(rst_dir)
    pages = {p.stem for p in root.glob("*.rst")}
    if "index" not in pages:
        print("docs_prepare: %s has no index.rst (did antsibull-docs run?)" % root, file=sys.stderr)
        return 1
    missing: list = []
    for page in sorted(root.glob("*.rst")):
        found: list = []
        text = relink(page.read_text(encoding="utf-8"), pages, found)
        missing += ["%s: %s" % (page.name, link) for link in found]
        if page.stem == "index":
            text += "\n.. toctree::\n   :hidden:\n   :glob:\n\n   *\n"
        page.write_text(text, encoding="utf-8")
    for link in missing:
        print("docs_prepare: link to a page this collection does not have: %s" % link, file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
