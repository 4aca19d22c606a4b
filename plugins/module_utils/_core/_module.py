# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The glue every module's main() uses: build the AnsibleModule, run the runner, report."""
from __future__ import annotations

import traceback
from typing import Any, Callable, Dict

from ansible.module_utils.basic import AnsibleModule

from ._errors import KvmError, error_of, fail_from_error, is_libvirt_error


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
