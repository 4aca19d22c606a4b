# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Field declarations: each option of an object kind declared once.

A field says which module option it is (and its argument spec entry), where the value lives
in the object's XML, for which object types it applies, whether it is free text, and what a
change to it costs. From one table of fields come the module's argument spec entries, the
reader (XML -> the request's shape), the writer (request -> XML, through lxml) and the lists
the runner decides with (which fields need a recreate, which free-text checks to run).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._core import _xml as X
from .._core._errors import ConflictError
from .._core._validate import plain_text

# What a change to a field costs on an existing object.
REDEFINE = "redefine"   # a new definition with the same UUID; nothing else moves
RECREATE = "recreate"   # the object's storage or identity moves: refused unless the user allows it
LIVE = "live"           # a running object takes it at once, and its definition with it
RESTART = "restart"     # written to the definition; a running object applies it at its next start
NEVER = "never"         # refused on an existing object: it would have to be made again, losing data
CHANGES = (REDEFINE, RECREATE, LIVE, RESTART, NEVER)


@dataclass(frozen=True)
class Field:
    """One field of an object kind whose XML is read and written as a whole (a network) or by
    the field's own functions (a domain's ``read``/``write``).

    ``key`` names the field in the request, the diff and the result; ``options`` are the module
    options it is made from, with their argument spec entries (the request turns them into the
    field's value: a domain's ``memory`` "4GiB" is its ``memory_kib`` 4194304); ``change`` is what
    a change costs on an existing object; ``label`` is how the module's documentation names the
    field where it lists what changes live and what waits for a restart.
    """
    key: str
    options: Dict[str, Dict[str, Any]]
    change: str
    label: str = ""
    read: Optional[Callable[[Any], Any]] = None
    write: Optional[Callable[[Any, Any], None]] = None
    # A NEVER field's refusal: why the change is not made, and the fix ("{current}" is the
    # object's value).
    never: str = ""

    def __post_init__(self) -> None:
        if self.change not in CHANGES:
            raise ValueError("field %s: unknown change policy %r" % (self.key, self.change))


def option_specs(fields: Iterable[Any]) -> Dict[str, Dict[str, Any]]:
    """The argument spec entries of every option the fields are made from, as fresh copies
    (AnsibleModule fills in the defaults of nested specs in place)."""
    return {option: copy.deepcopy(entry) for f in fields for option, entry in f.options.items()}


def keys_with_change(fields: Iterable[Any], change: str) -> Tuple[str, ...]:
    return tuple(f.key for f in fields if f.key and f.change == change)


# The compare and plan steps every runner takes: record what differs, then sort the differences by
# what they cost (a live change, a restart, a recreate the user must allow, or a refusal).

def compare(tracker: Any, before: Dict[str, Any], wanted: Dict[str, Any]) -> List[str]:
    """Record in ``tracker`` each wanted field whose value differs from the object's; return the
    changed keys in the request's order."""
    return [key for key in wanted if tracker.add(key, before.get(key), wanted[key])]


def changed_with(fields: Iterable[Any], changed: Iterable[str], change: str) -> List[str]:
    """The keys among ``changed`` whose change costs ``change`` (e.g. a pool's RECREATE fields)."""
    costing = keys_with_change(fields, change)
    return [key for key in changed if key in costing]


def refuse_never_changes(fields: Iterable[Any], before: Dict[str, Any], wanted: Dict[str, Any],
                         object_label: str) -> None:
    """Refuse, naming the option, the value and the fix, the first wanted value of a NEVER field
    that differs from the object's (``wanted`` holds None for an option left unset: no change
    asked). Both sides already normalised by the caller (paths, units)."""
    for f in fields:
        want, have = wanted.get(f.key), before.get(f.key)
        if f.change != NEVER or want is None or want == have:
            continue
        raise ConflictError("option %s: value %r differs from %s, whose %s is %s; %s"
                            % (f.key, want, object_label, f.label or f.key, "none" if have is None else have,
                               f.never.format(current=have)), option=f.key)


@dataclass(frozen=True)
class XmlField:
    """One option of an object kind and its place in the object's XML.

    ``path`` is an element path below the root ("." is the root itself); the value is the
    attribute ``attr`` of that element, or its text when ``attr`` is None. ``many`` fields are
    lists, one element per item, sorted both ways. ``kinds`` limits the field to those object
    types (empty: every type). A field without ``option`` is a constant the writer puts in
    (``const``) and the reader leaves out.
    """
    option: Optional[str]
    path: str
    attr: Optional[str] = None
    spec: Dict[str, Any] = field(default_factory=dict)
    kinds: Tuple[str, ...] = ()
    many: bool = False
    change: str = REDEFINE
    free_text: bool = False
    normalise: Optional[Callable[[str], str]] = None
    const: Optional[str] = None

    def __post_init__(self) -> None:
        if self.change not in CHANGES:
            raise ValueError("field %s: unknown change policy %r" % (self.option, self.change))

    @property
    def key(self) -> Optional[str]:
        return self.option

    @property
    def options(self) -> Dict[str, Dict[str, Any]]:
        return {self.option: self.spec} if self.option else {}

    def applies_to(self, kind: Optional[str]) -> bool:
        return not self.kinds or kind in self.kinds

    def read(self, root: Any) -> Any:
        if self.many:
            return sorted(self._value(el) for el in root.findall(self.path))
        value = X.text(root, self.path) if self.attr is None else X.attr(root, self.path, self.attr)
        return self.normalise(value) if value and self.normalise else value

    def write(self, root: Any, value: Any) -> None:
        if self.const is not None:
            value = self.const
        if value is None or (self.many and not value):
            return
        if self.path == ".":
            root.set(self.attr, str(value))
            return
        parent_path, _slash, tag = self.path.rpartition("/")
        parent = _element_at(root, parent_path)
        for item in (value if self.many else [value]):
            if self.attr is None:
                X.sub(parent, tag, text=item)
            else:
                X.sub(parent, tag, {self.attr: item})

    def _value(self, el: Any) -> Optional[str]:
        return el.text if self.attr is None else el.get(self.attr)


def _element_at(root: Any, path: str) -> Any:
    """The element at ``path`` below ``root``, made (in order) where it is missing."""
    el = root
    for tag in [t for t in path.split("/") if t]:
        child = el.find(tag)
        el = child if child is not None else X.sub(el, tag)
    return el


class FieldTable:
    """The fields of one object kind, in the order they are written to XML."""

    def __init__(self, kind_attr: str, fields: Iterable[XmlField]) -> None:
        self.kind_attr = kind_attr  # the option (and root attribute) that names the object type
        self.fields: List[XmlField] = list(fields)

    @property
    def options(self) -> Tuple[str, ...]:
        return tuple(f.option for f in self.fields if f.option)

    def option_specs(self) -> Dict[str, Dict[str, Any]]:
        """The argument spec entries of the declared options."""
        return option_specs(self.fields)

    def with_change(self, change: str) -> Tuple[str, ...]:
        return keys_with_change(self.fields, change)

    def check_free_text(self, params: Dict[str, Any]) -> None:
        """No control characters in a free-text option that ends up in the XML."""
        for f in self.fields:
            if not (f.option and f.free_text):
                continue
            if f.many:
                for index, item in enumerate(params.get(f.option) or []):
                    plain_text("%s[%d]" % (f.option, index), item)
            else:
                plain_text(f.option, params.get(f.option))

    def read(self, root: Any) -> Dict[str, Any]:
        """The declared options of the object type ``root`` holds, as the request gives them."""
        kind = root.get(self.kind_attr)
        return {f.option: f.read(root) for f in self.fields if f.option and f.applies_to(kind)}

    def write(self, root: Any, spec: Dict[str, Any]) -> None:
        """Put ``spec`` into ``root`` (its object type from spec[kind_attr])."""
        kind = spec.get(self.kind_attr)
        for f in self.fields:
            if f.applies_to(kind):
                f.write(root, spec.get(f.option) if f.option else None)
