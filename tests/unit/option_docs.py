"""Holding a field table against a module's documentation: the same checks for every object kind
whose fields are declared once (plugins/module_utils/_libvirt/_fields)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List

CHECKED_KEYS = ("type", "elements", "default", "choices", "required")


def spec_mismatches(path: str, spec: Dict[str, Any], doc: Dict[str, Any]) -> List[str]:
    """Where a documented option differs from its argument spec entry, down its suboptions."""
    out = []
    for key in CHECKED_KEYS:
        documented, declared = doc.get(key), spec.get(key)
        if key == "required":
            documented, declared = bool(documented), bool(declared)
        if documented != declared:
            out.append("%s: %s documented %r, declared %r" % (path, key, documented, declared))
    sub_spec, sub_doc = spec.get("options") or {}, doc.get("suboptions") or {}
    if set(sub_spec) != set(sub_doc):
        out.append("%s: suboptions documented %s, declared %s" % (path, sorted(sub_doc), sorted(sub_spec)))
    for name in sorted(set(sub_spec) & set(sub_doc)):
        out.extend(spec_mismatches("%s.%s" % (path, name), sub_spec[name], sub_doc[name]))
    return out


def undocumented(fields: Iterable[Any], doc_options: Dict[str, Any]) -> List[str]:
    """Every declared option that the documentation leaves out or documents otherwise."""
    out = []
    for field in fields:
        for option, entry in field.options.items():
            if option not in doc_options:
                out.append("%s (field %s) is not documented" % (option, field.key))
            else:
                out.extend(spec_mismatches(option, entry, doc_options[option]))
    return out


def labels(fields: Iterable[Any], change: str) -> List[str]:
    return [f.label for f in fields if f.change == change]


def argspec_outside_the_table(spec: Dict[str, Any], fields: Iterable[Any], doc_options: Dict[str, Any],
                              actions: set) -> List[str]:
    """What breaks "the argument spec is the field table plus the actions": an option neither
    declared nor an action, a table entry the spec holds otherwise, a documented option in neither."""
    fields = list(fields)
    declared = {option: entry for f in fields for option, entry in f.options.items()}
    out = ["%s is in the argument spec but neither declared nor an action" % o
           for o in sorted(set(spec) - set(declared) - actions)]
    out += ["%s is an action missing from the argument spec" % o for o in sorted(actions - set(spec))]
    out += ["%s: the argument spec holds %r, the table %r" % (o, spec.get(o), e)
            for o, e in sorted(declared.items()) if spec.get(o) != e]
    out += ["%s is documented but neither declared nor an action" % o
            for o in sorted(set(doc_options) - set(declared) - actions)]
    return out
