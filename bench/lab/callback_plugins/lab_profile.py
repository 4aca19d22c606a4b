# -*- coding: utf-8 -*-
"""Where a site.yml run spends its time, per host: every task result with its wall time, written
as JSON to $MLKVM_LAB_PROFILE when the run ends (bench/lab/run.py reads it). A task's module executions
on a host are the module runs that reached that host (one per item of a loop): results of actions
that only run on the controller (set_fact, assert, debug, ...) are recorded but not counted."""
from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: lab_profile
type: aggregate
short_description: per-host task times and module execution counts of a playbook run (benchmark)
description:
  - Writes every task result with its host, action, status and wall time to the JSON file named
    by the MLKVM_LAB_PROFILE environment variable when the run ends.
requirements:
  - MLKVM_LAB_PROFILE set to a writable path
"""

# Actions that the controller carries out itself: they never start a module on the host.
CONTROLLER_ONLY = frozenset(
    "ansible.builtin.%s" % name for name in (
        "set_fact", "assert", "debug", "fail", "meta", "include_tasks", "import_tasks", "include_role",
        "import_role", "include_vars", "add_host", "group_by", "pause", "set_stats", "validate_argument_spec",
        "wait_for_connection"))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "lab_profile"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.started = {}
        self.results = []
        self.run_started = time.monotonic()

    def v2_runner_on_start(self, host, task):
        self.started[(host.get_name(), task._uuid)] = time.monotonic()

    def record(self, result, status: str) -> None:
        host = result._host.get_name()
        task = result._task
        began = self.started.pop((host, task._uuid), None)
        action = task.resolved_action or task.action
        if "." not in action:
            action = "ansible.builtin." + action
        self.results.append({
            "host": host,
            "delegated_to": self.delegated_to(result._result),
            "task": task.get_name(),
            "role": task._role.get_name() if task._role else None,
            "action": action,
            "status": status,
            "changed": bool(result._result.get("changed")),
            "module_executions": self.executions(result, status, action),
            "seconds": round(time.monotonic() - began, 3) if began is not None else None,
        })

    @staticmethod
    def delegated_to(result: dict):
        """Where the task ran when delegated; a loop's result carries it on its items only."""
        found = (result.get("_ansible_delegated_vars") or {}).get("ansible_host")
        items = result.get("results")
        if found is None and isinstance(items, list):
            found = next((item["_ansible_delegated_vars"].get("ansible_host") for item in items
                          if isinstance(item, dict) and item.get("_ansible_delegated_vars")), None)
        return found

    @staticmethod
    def executions(result, status: str, action: str) -> int:
        """Module runs on the host behind one task result: one, or one per item that was not
        skipped for a loop; none for a skipped task or a controller-only action."""
        if status == "skipped" or action in CONTROLLER_ONLY:
            return 0
        items = result._result.get("results")
        if isinstance(items, list):
            return sum(1 for item in items if isinstance(item, dict) and not item.get("skipped"))
        return 1

    def v2_runner_on_ok(self, result):
        self.record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self.record(result, "failed")

    def v2_runner_on_skipped(self, result):
        self.record(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self.record(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("MLKVM_LAB_PROFILE")
        if not path:
            return
        with open(path, "w", encoding="utf-8") as out:
            json.dump({"wall_s": round(time.monotonic() - self.run_started, 1), "results": self.results}, out)
