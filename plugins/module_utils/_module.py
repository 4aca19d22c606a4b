# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The glue every module's main() uses: build the AnsibleModule, run the runner, report."""
from __future__ import annotations

from typing import Any, Callable, Dict

from ansible.module_utils.basic import AnsibleModule

from ._errors import KvmError, fail_from_error


def run(module: AnsibleModule, runner: Callable[[], Dict[str, Any]]) -> None:
    """Call ``runner`` and exit; any KvmError becomes a fail_json with its details."""
    try:
        result = runner()
    except KvmError as err:
        fail_from_error(module, err)
        return
    module.exit_json(**result)
