# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lxml helpers: build libvirt XML from options, read it back, normalise it for comparison.

No XML is ever built from strings: values go through lxml, which escapes them.
"""
from __future__ import annotations

import traceback
from typing import Any, Iterable, Mapping, Optional

from ansible.module_utils.basic import missing_required_lib

from ._errors import KvmError

try:
    from lxml import etree  # type: ignore
    HAS_LXML = True
    LXML_IMPORT_ERROR: Optional[str] = None
except ImportError:  # pragma: no cover - depends on the host
    etree = None  # type: ignore
    HAS_LXML = False
    # Kept for fail_json's ``exception`` (shown with -vvv), as ansible-core's own modules do.
    LXML_IMPORT_ERROR = traceback.format_exc()

LXML_REASON = "to build and read libvirt's XML; install python3-lxml (or pip install lxml) on the managed host"


def fail_without_lxml(module: Any) -> None:
    """Every module that builds or reads XML calls this as soon as its AnsibleModule exists:
    without lxml it fails there, naming the library, instead of an AttributeError half-way."""
    if not HAS_LXML:
        module.fail_json(msg=missing_required_lib("lxml", reason=LXML_REASON), exception=LXML_IMPORT_ERROR)


def require_lxml() -> None:
    """The same refusal for code that has no module at hand (a KvmError, reported by run())."""
    if not HAS_LXML:
        raise KvmError(missing_required_lib("lxml", reason=LXML_REASON))


def _attrs(attrs: Optional[Mapping[str, Any]]) -> dict:
    """Attribute values as strings; None means 'leave the attribute out'."""
    out = {}
    for key, value in (attrs or {}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "yes" if value else "no"
        out[key] = str(value)
    return out


def element(tag: str, attrs: Optional[Mapping[str, Any]] = None, text: Any = None) -> Any:
    el = etree.Element(tag, _attrs(attrs))
    if text is not None:
        el.text = str(text)
    return el


def sub(parent: Any, tag: str, attrs: Optional[Mapping[str, Any]] = None, text: Any = None) -> Any:
    """Append a child element; attributes whose value is None are omitted."""
    el = etree.SubElement(parent, tag, _attrs(attrs))
    if text is not None:
        el.text = str(text)
    return el


def parse(xml: str) -> Any:
    parser = etree.XMLParser(remove_blank_text=True, resolve_entities=False, no_network=True)
    return etree.fromstring(xml.encode("utf-8") if isinstance(xml, str) else xml, parser)


def to_string(el: Any) -> str:
    return etree.tostring(el, pretty_print=True, encoding="unicode")


def text(root: Any, path: str, default: Optional[str] = None) -> Optional[str]:
    found = root.find(path)
    if found is None or found.text is None:
        return default
    return found.text.strip()


def attr(root: Any, path: str, name: str, default: Optional[str] = None) -> Optional[str]:
    found = root if path in ("", ".") else root.find(path)
    if found is None:
        return default
    return found.get(name, default)


def normalise(xml: Any, drop: Iterable[str] = ()) -> str:
    """A canonical string of ``xml`` without the elements/attributes matched by ``drop``.

    ``drop`` holds XPath expressions: elements are removed, attributes deleted. Attribute
    order and whitespace do not matter in the result (C14N), so two documents that libvirt
    would treat alike compare equal.
    """
    root = parse(xml) if isinstance(xml, (str, bytes)) else etree.fromstring(etree.tostring(xml))
    for path in drop:
        for node in root.xpath(path):
            if isinstance(node, str) and getattr(node, "is_attribute", False):
                node.getparent().attrib.pop(node.attrname, None)
            elif hasattr(node, "getparent") and node.getparent() is not None:
                node.getparent().remove(node)
    for el in root.iter():
        if el.text is not None and not el.text.strip():
            el.text = None
        if el.tail is not None and not el.tail.strip():
            el.tail = None
    return etree.tostring(root, method="c14n").decode("utf-8")
