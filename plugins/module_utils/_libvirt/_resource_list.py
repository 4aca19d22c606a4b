# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Resource lists: one module call declares every object of a kind on a hypervisor.

The states are those of Ansible's network resource modules (ansible.netcommon): merged,
replaced, overridden, deleted, gathered, rendered. Each object goes through the same runner
as its single-object module (``run_network``, ``run_pool``, ``run_volume``, ``run_domain``), fed an
``ItemModule`` in place of the AnsibleModule, on one libvirt connection: the single-object
module's validation, guards, check mode and diff hold item by item, and the cost of a call is
one module process however many objects it lists (a loop over the single-object module pays
one process per object, about 0.2 s here).

Every call runs the whole list in check mode first. A bad item, or a refusal that a run
would meet (a volume in use, a backing image that differs), so fails the call before anything
changes; only then, outside check mode, does the same list run for real.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from .._core._command import DEFAULT_TIMEOUT_S, module_runner
from .._core._errors import InvalidInputError, KvmError, LibvirtCallError
from ._connection import LIBVIRT_ARGSPEC, Connection, error_of, libvirt
from ._uri import is_local

STATES = ("merged", "replaced", "overridden", "deleted", "gathered", "rendered")
# Read-only commands a runner may call once per item (the host's addresses, a backing
# image's size): their output is kept for the call until something changes on the host.
READ_ONLY_COMMANDS = (("ip", "-j", "-4", "addr", "show"), ("ip", "-j", "-4", "route", "show"), ("qemu-img", "info"))


# libvirt's "no such domain / network / pool / volume": an object removed (by someone else)
# between the listing and the read of it.
VANISHED_CODES = (42, 43, 49, 50)


def read_listed(objects: List[Any], read: Callable[[Any], Optional[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """read(obj) for every listed object; one that is gone by the time it is read is left out,
    as if it had not been listed (a busy hypervisor creates and removes objects all the time)."""
    items = []
    for obj in objects:
        try:
            item = read(obj)
        except LibvirtCallError as err:
            if err.code in VANISHED_CODES:
                continue
            raise
        except libvirt.libvirtError as exc:  # the few raw calls (name, isActive, autostart)
            if exc.get_error_code() in VANISHED_CODES:
                continue
            raise
        if item is not None:
            items.append(item)
    return items


class ResourceKind:
    """What the engine needs to know about one kind of libvirt object."""

    def __init__(self, kind: str, single_spec: Dict[str, Any], mutually_exclusive: List[Tuple[str, str]],
                 apply: Callable[[Any, Any, bool], Dict[str, Any]],
                 gather: Callable[[Any], List[Dict[str, Any]]],
                 render: Callable[[Dict[str, Any]], str],
                 precheck: Callable[[Dict[str, Any]], None],
                 key_fields: Tuple[str, ...] = ("name",),
                 item_states: Tuple[str, ...] = ("present",),
                 delete_options: Tuple[str, ...] = ("force",),
                 apply_replaced: Optional[Callable[[Any, Any, bool], Dict[str, Any]]] = None,
                 merge_onto_current: bool = True,
                 required_when_replaced: Tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.single_spec = single_spec
        self.mutually_exclusive = mutually_exclusive
        self.apply = apply
        self.gather = gather
        self.render = render
        self.precheck = precheck
        self.key_fields = key_fields
        # The single module's states an item may ask for but absent (active/present), the first
        # one its default. An item with state absent is removed, with the same guards, in any
        # list state that makes objects (merged, replaced, overridden).
        self.item_states = item_states
        self.delete_options = delete_options
        # replaced/overridden items, when the runner itself must know that the item declares
        # the whole object (a domain: its unset options are not "defaults" of the argument spec).
        self.apply_replaced = apply_replaced or apply
        # merged: an item's unset options keep the object's current values, by completing the
        # item with its gathered form (False: the single module already leaves them alone).
        self.merge_onto_current = merge_onto_current
        self.required_when_replaced = required_when_replaced

    def key(self, item: Dict[str, Any]) -> str:
        return "/".join(str(item.get(f)) for f in self.key_fields)

    def item_spec(self) -> Dict[str, Any]:
        """The single module's options, without defaults (so that merged sees what was given)
        and without required flags but for the key (a merged item may name only what changes)."""
        spec: Dict[str, Any] = {}
        for option, desc in self.single_spec.items():
            if option == "uri":
                continue
            desc = {k: v for k, v in desc.items() if k not in ("default", "required")}
            if option == "state":
                desc["choices"] = list(self.item_states) + ["absent"]
            if option in self.key_fields:
                desc["required"] = True
            spec[option] = desc
        return spec


def list_argument_spec(kind: ResourceKind) -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        config=dict(type="list", elements="dict", options=kind.item_spec(),
                    mutually_exclusive=kind.mutually_exclusive),
        state=dict(type="str", default="merged", choices=list(STATES)),
        scope=dict(type="dict", options=dict(name_prefix=dict(type="str", required=True))),
    )
    if "force" in kind.delete_options:
        spec["force"] = dict(type="bool", default=False)
    spec.update(LIBVIRT_ARGSPEC)
    return spec


class ItemModule:
    """Stands in for the AnsibleModule of one object: its own params and check mode, the
    list module's diff flag, warnings and command runner (read-only commands kept), and
    ``shared``: what a kind's runner keeps for the whole call (a domain list's PCI scan)."""

    def __init__(self, parent: AnsibleModule, params: Dict[str, Any], check_mode: bool, label: str,
                 command_cache: Dict[Tuple[str, ...], Tuple[int, str, str]],
                 shared: Optional[Dict[str, Any]] = None) -> None:
        self.params = params
        self.shared = shared if shared is not None else {}
        self.check_mode = check_mode
        self._diff = parent._diff
        self._parent = parent
        self._label = label
        self._cache = command_cache

    def warn(self, message: str) -> None:
        self._parent.warn("%s: %s" % (self._label, message))

    def run_command(self, argv: List[str], **kwargs: Any) -> Tuple[int, str, str]:
        """``AnsibleModule.run_command``'s shape, bounded (run_bounded; ``timeout_s`` in kwargs,
        else the default bound); a read-only command's output is kept for the call."""
        key = tuple(argv)
        run = module_runner(kwargs.pop("timeout_s", DEFAULT_TIMEOUT_S))
        if not any(key[:len(prefix)] == prefix for prefix in READ_ONLY_COMMANDS):
            return run(argv, **kwargs)
        if key not in self._cache:
            self._cache[key] = run(argv, **kwargs)
        return self._cache[key]


def list_call_cache(module: Any) -> Optional[Dict[str, Any]]:
    """What a list call keeps for all its items (a domain list's PCI scan, a network list's check
    pass predictions); None for a single module's own call, which has nothing to share."""
    return module.shared if isinstance(module, ItemModule) else None


class ListRun:
    """One call of a list module: plan, check every item, apply, report."""

    def __init__(self, module: AnsibleModule, kind: ResourceKind) -> None:
        self.module = module
        self.kind = kind
        self.params = module.params
        self.state = module.params["state"]
        self.command_cache: Dict[Tuple[str, ...], Tuple[int, str, str]] = {}
        self.shared: Dict[str, Any] = {}
        self.validator = ArgumentSpecValidator(kind.single_spec, mutually_exclusive=kind.mutually_exclusive)

    # -- input --------------------------------------------------------------------------------
    def given_items(self) -> List[Dict[str, Any]]:
        """The listed items with only the options the user set (None: not set)."""
        return [{k: v for k, v in item.items() if v is not None} for item in self.params["config"] or []]

    def label(self, index: int, item: Dict[str, Any]) -> str:
        return "config[%d] (%s)" % (index, self.kind.key(item))

    def completed(self, index: int, given: Dict[str, Any], base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The item as the single module's params: base (the current object, for merged) or
        the single module's defaults, overlaid with what the item sets."""
        raw = dict(base or {})
        raw.update(given)
        raw.setdefault("state", self.kind.item_states[0])
        if self.state in ("replaced", "overridden"):
            for option in self.kind.required_when_replaced:
                if raw.get(option) is None:
                    raise InvalidInputError("%s.%s" % (self.label(index, given), option), None,
                                            "is required with state: %s (the item declares the whole %s)"
                                            % (self.state, self.kind.kind),
                                            "set it, or use state: merged to change only what the item sets")
        params = self.validated(raw, self.label(index, given), given)
        self.precheck(index, given, params)
        return params

    def validated(self, raw: Dict[str, Any], label: str, given: Dict[str, Any]) -> Dict[str, Any]:
        """raw checked against the single module's argument spec, its defaults filled in."""
        raw["uri"] = self.params["uri"]
        result = self.validator.validate(raw)
        if result.error_messages:
            raise InvalidInputError(label, given, result.error_messages[0],
                                    "fix the item as mlinfra.kvm.%s documents the option" % self.kind.kind)
        return result.validated_parameters

    def precheck(self, index: int, given: Dict[str, Any], params: Dict[str, Any]) -> None:
        try:
            self.kind.precheck(params)
        except InvalidInputError as err:
            raise self.in_item(err, index, given)

    def in_item(self, err: KvmError, index: int, given: Dict[str, Any]) -> KvmError:
        """The same error, its message and option prefixed with the item that caused it."""
        label = self.label(index, given)
        err.msg = "%s: %s" % (label, err.msg)
        if err.details.get("option"):
            err.details["option"] = "%s.%s" % (label, err.details["option"])
        err.details["item"] = self.kind.key(given)
        return err

    def check_unique(self, items: List[Dict[str, Any]]) -> None:
        seen: Dict[str, int] = {}
        for index, item in enumerate(items):
            key = self.kind.key(item)
            if key in seen:
                raise InvalidInputError("config[%d]" % index, key, "names the same %s as config[%d]"
                                        % (self.kind.kind, seen[key]),
                                        "list each %s once (merge the two items)" % self.kind.kind)
            seen[key] = index

    def check_scope(self, items: List[Dict[str, Any]]) -> None:
        scope = self.params["scope"]
        if self.state == "overridden" and not scope:
            raise InvalidInputError("scope", None, "is required with state: overridden",
                                    "set scope.name_prefix to the prefix of the %ss this list owns "
                                    "(overridden never removes every %s on the host)" % (self.kind.kind, self.kind.kind))
        if self.state == "deleted" and not items and not scope:
            raise InvalidInputError("config", [], "is empty and no scope is set, with state: deleted",
                                    "list the %ss to delete, or set scope.name_prefix" % self.kind.kind)
        if scope is not None and not scope["name_prefix"]:
            raise InvalidInputError("scope.name_prefix", scope["name_prefix"], "is empty: it would match every %s"
                                    % self.kind.kind, "give the prefix the names of this list share")
        if scope and self.state in ("merged", "replaced", "overridden"):
            for index, item in enumerate(items):
                if not self.kind.key(item).startswith(scope["name_prefix"]):
                    raise InvalidInputError(self.label(index, item), self.kind.key(item),
                                            "is outside scope.name_prefix %s" % scope["name_prefix"],
                                            "rename the item or widen the scope")

    def in_scope(self, current: Dict[str, Any]) -> bool:
        """scope.name_prefix matches the object's key: its name, or POOL/NAME for a volume."""
        scope = self.params["scope"]
        return bool(scope) and self.kind.key(current).startswith(scope["name_prefix"])

    # -- plan -----------------------------------------------------------------------------------
    def plan(self, conn: Any, given: List[Dict[str, Any]],
             prepared: Dict[int, Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
        """(label, single-module params) for every object this call touches, in order;
        ``prepared``: the items already completed before libvirt was contacted, by index."""
        reads = ("merged", "overridden", "deleted") if self.kind.merge_onto_current else ("overridden", "deleted")
        current = {self.kind.key(c): c for c in self.kind.gather(conn)} if self.state in reads else {}
        steps: List[Tuple[str, Dict[str, Any]]] = []
        if self.state == "deleted":
            targets = given if given else [c for c in current.values() if self.in_scope(c)]
            for index, item in enumerate(targets):
                steps.append((self.label(index, item) if given else self.kind.key(item), self.deletion(item)))
            return steps
        for index, item in enumerate(given):
            if item.get("state") == "absent":
                steps.append((self.label(index, item), self.deletion(item)))
            elif index in prepared:
                steps.append((self.label(index, item), prepared[index]))
            else:  # merged: completed against the object as it is now
                steps.append((self.label(index, item), self.completed(index, item, current.get(self.kind.key(item)))))
        if self.state == "overridden":
            listed = {self.kind.key(item) for item in given}
            for key, obj in sorted(current.items()):
                if key not in listed and self.in_scope(obj):
                    steps.append(("%s (not listed, in scope)" % key, self.deletion(obj)))
        return steps

    def deletion(self, item: Dict[str, Any]) -> Dict[str, Any]:
        raw = {f: item[f] for f in self.kind.key_fields}
        for option in self.kind.delete_options:
            raw[option] = item.get(option, self.params.get("force") if option == "force" else None)
        raw = {k: v for k, v in raw.items() if v is not None}
        raw["state"] = "absent"
        return self.validated(raw, "config", raw)

    # -- apply ----------------------------------------------------------------------------------
    def apply(self, conn: Any, local: bool, steps: List[Tuple[str, Dict[str, Any]]],
              check: bool) -> List[Tuple[str, Dict[str, Any]]]:
        done: List[Tuple[str, Dict[str, Any]]] = []
        apply = self.kind.apply_replaced if self.state in ("replaced", "overridden") else self.kind.apply
        for label, params in steps:
            item = ItemModule(self.module, params, check, label, self.command_cache, self.shared)
            try:
                result = apply(item, conn, local)
            except KvmError as err:
                self.report_partial(err, label, done, check)
                raise
            except libvirt.libvirtError as exc:  # a raw call (libvirtd gone in the middle of the list)
                err = error_of(exc)
                failure = LibvirtCallError("applying %s" % label, err["code"], err["message"], err["domain"])
                self.report_partial(failure, label, done, check)
                raise failure
            if result.get("changed"):
                # The host changed (or, in check mode, would): read-only commands run again.
                self.command_cache.clear()
            done.append((self.kind.key(params), result))
        return done

    def report_partial(self, err: KvmError, label: str, done: List[Tuple[str, Dict[str, Any]]], check: bool) -> None:
        if not err.msg.startswith("config[") and not err.msg.startswith(label):
            err.msg = "%s: %s" % (label, err.msg)
        changed = [key for key, result in done if result.get("changed")]
        if check or not changed:
            err.details.setdefault("changed", bool(err.details.get("changed")))
            return
        err.details["changed"] = True
        err.details["objects"] = {key: self.item_result(result) for key, result in done}
        err.msg = "%s (already done, before it: %s)" % (err.msg, "; ".join(
            "%s: %s" % (key, ", ".join(result.get("actions", []))) for key, result in done if result.get("changed")))

    def item_result(self, result: Dict[str, Any]) -> Dict[str, Any]:
        # The single module's XML is left out: a list of hundreds would carry every document.
        return {k: v for k, v in result.items() if k not in ("xml", "diff")}

    def report(self, done: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
        changed = [(key, result) for key, result in done if result.get("changed")]
        out: Dict[str, Any] = {
            "changed": bool(changed),
            "objects": {key: self.item_result(result) for key, result in done},
            "actions": ["%s: %s" % (key, action) for key, result in changed for action in result.get("actions", [])],
        }
        if self.module._diff:
            out["diff"] = {"before": {key: r["diff"]["before"] for key, r in changed if "diff" in r},
                           "after": {key: r["diff"]["after"] for key, r in changed if "diff" in r}}
        return out

    # -- states -----------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        given = self.given_items()
        self.check_unique(given)
        self.check_scope(given)
        if self.state == "rendered":
            return {"changed": False, "rendered": self.rendered(given)}
        # Bad input fails before libvirt is contacted; merged items are completed against the
        # objects as they are, in plan().
        prepared: Dict[int, Dict[str, Any]] = {}
        if self.state in ("replaced", "overridden"):
            prepared = {index: self.completed(index, item) for index, item in enumerate(given)
                        if item.get("state") != "absent"}
        with Connection(self.params["uri"]) as connection:
            conn = connection.conn
            if self.state == "gathered":
                found = [c for c in self.kind.gather(conn) if not self.params["scope"] or self.in_scope(c)]
                return {"changed": False, "gathered": found}
            local = is_local(connection.uri)
            steps = self.plan(conn, given, prepared)
            predicted = self.apply(conn, local, steps, check=True)
            if self.module.check_mode or not any(result.get("changed") for _key, result in predicted):
                # Nothing to change: the check pass read everything a real pass would report.
                return self.report(predicted)
            return self.report(self.apply(conn, local, steps, check=False))

    def rendered(self, given: List[Dict[str, Any]]) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for index, item in enumerate(given):
            params = self.completed(index, item)
            try:
                out[self.kind.key(item)] = self.kind.render(params)
            except InvalidInputError as err:
                raise self.in_item(err, index, item)
        return out


def run_list(module: AnsibleModule, kind: ResourceKind) -> Dict[str, Any]:
    return ListRun(module, kind).run()
