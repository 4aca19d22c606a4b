# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The glue every module's main() uses: build the AnsibleModule, run the runner, report."""
from __future__ import annotations

import traceback
from typing import Any, Callable, Dict, Type

from ansible.module_utils.basic import AnsibleModule, _load_params
from ansible.module_utils.common.validation import check_type_dict, check_type_list

from ._errors import KvmError, error_of, fail_from_error, is_libvirt_error


def new_module(module_class: Type[AnsibleModule], **kwargs: Any) -> AnsibleModule:
    """``module_class(**kwargs)``, with a clear refusal where ansible-core's own validation crashes.

    ansible-core (2.16 to 2.19) raises a bare TypeError inside ``AnsibleModule()`` when an option
    with suboptions gets a scalar (``numa_tuning: 7``): the user sees MODULE FAILURE and a
    traceback. The parameters are loaded by then, so a second module over the same spec without
    suboptions reports the value the way ansible-core reports any other wrong type, naming the
    option. The class is passed in so that the module file's own name is the one called.
    """
    # A scalar where a list of mappings is wanted does not raise: ansible-core fails with "dictionary
    # requested, could not parse JSON or key=value", naming no option. The given parameters are
    # read first (ansible-core caches them), so such a value is refused the same way as above.
    given = None
    if isinstance(module_class, type) and issubclass(module_class, AnsibleModule):  # not a test's stand-in
        given = _unparsable_list_element(kwargs.get("argument_spec") or {}, _load_params())
    try:
        if given:
            raise TypeError(given)
        return module_class(**kwargs)
    except TypeError:
        plain = module_class(**dict(kwargs, argument_spec=_without_suboptions(kwargs.get("argument_spec") or {})))
        where = given or _first_non_mapping(kwargs.get("argument_spec") or {}, plain.params) \
            or ("an option with suboptions", None)
        plain.fail_json(msg="option %s: value %r is not a mapping, and this option takes suboptions; give it as a "
                        "YAML mapping (a list of mappings where the option is a list)" % where,
                        exception=traceback.format_exc())
        raise  # fail_json exits; this line is never reached


def _unparsable_list_element(spec: Dict[str, Any], params: Any) -> Any:
    """(option[index], value) of the first element of a top-level list of mappings that
    ansible-core cannot make a mapping of (its own error names no option); None when all can."""
    if not isinstance(params, dict):
        return None
    for name, entry in spec.items():
        value = params.get(name)
        if value is None or entry.get("type") != "list" or entry.get("elements") != "dict" or not entry.get("options"):
            continue
        try:
            items = check_type_list(value)
        except TypeError:
            continue  # ansible-core names the option itself
        for index, item in enumerate(items):
            if isinstance(item, dict):
                continue
            try:
                check_type_dict(item)
            except TypeError:
                return ("%s[%d]" % (name, index), item)
    return None


def _first_non_mapping(spec: Dict[str, Any], params: Any, prefix: str = "") -> Any:
    """(dotted option name, value) of the first value that should be a mapping and is not."""
    if not isinstance(params, dict):
        return None
    for name, entry in spec.items():
        sub, value = entry.get("options"), params.get(name)
        if not sub or value is None:
            continue
        path = prefix + name
        items = list(enumerate(value)) if isinstance(value, list) and entry.get("type") == "list" else [(None, value)]
        for index, item in items:
            item_path = path if index is None else "%s[%s]" % (path, index)
            if not isinstance(item, dict):
                return (item_path, item)
            found = _first_non_mapping(sub, item, item_path + ".")
            if found:
                return found
    return None


_SUBOPTION_KEYS = ("options", "apply_defaults", "required_if", "required_one_of", "mutually_exclusive",
                   "required_together", "required_by")


def _without_suboptions(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The argument spec without suboptions, so type checks alone judge each top-level value."""
    plain = {}
    for name, entry in spec.items():
        entry = {k: v for k, v in entry.items() if k not in _SUBOPTION_KEYS}
        if entry.get("type") == "list" and entry.get("elements") == "dict":
            entry.pop("elements")
        plain[name] = entry
    return plain


def run(module: AnsibleModule, runner: Callable[[], Dict[str, Any]]) -> None:
    """Call ``runner`` and exit; any KvmError becomes a fail_json with its details."""
    try:
        result = runner()
    except KvmError as err:
        fail_from_error(module, err)
        return
    except Exception as exc:  # pylint: disable=broad-except
        if is_libvirt_error(exc):
            # A libvirt call outside a service's call(): libvirt's own words, never a traceback
            # (libvirtd gone mid-run is the usual cause).
            err = error_of(exc)
            module.fail_json(msg="libvirt error: code %s: %s. Something may have changed before it: re-run to converge"
                             % (err["code"], err["message"]), libvirt_code=err["code"],
                             libvirt_message=err["message"], exception=traceback.format_exc())
            return
        # A bug: the user gets a message, not a traceback (Ansible shows ``exception`` with -vvv).
        module.fail_json(msg="internal error in %s (a bug in mlinfra.kvm; report it with the -vvv output): %s: %s. "
                         "Something may have changed before it: read the object's state before re-running"
                         % (module._name, type(exc).__name__, exc), exception=traceback.format_exc())
        return
    module.exit_json(**result)
