"""mlflow_user's plan and its report after a failure midway, with an in-memory service.

The real server is exercised by tests/integration/test_mlflow_user.py (four ways, permissions
proved by the server). A server that fails on the second write cannot be had from MLflow on
demand, so that path is checked here: what was done is reported, with changed=true.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

import pytest

from conftest import COLLECTIONS

sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _mlflow_user as U  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import (  # noqa: E402
    InvalidInputError, KvmError)
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_mlflow import MlflowError  # noqa: E402
from fake_module import StandInModule  # noqa: E402

pytestmark = pytest.mark.unit


def params(**over: Any) -> Dict[str, Any]:
    p: Dict[str, Any] = {"tracking_uri": "http://mlflow.lab:5000", "admin_username": "admin",
                         "admin_password": "admin-password", "name": "pipe", "state": "present",
                         "password": "twelve-chars-or-more", "update_password": "always",
                         "is_admin": False, "experiment_permissions": [], "create_experiments": True,
                         "purge_experiment_permissions": False, "timeout": 30.0, "validate_certs": True}
    p.update(over)
    return p


def runner(module_params: Dict[str, Any], service: "MemoryService", check_mode: bool = False) -> Any:
    """The module's runner on a stand-in module with ``module_params``, talking to ``service``."""
    return U.MlflowUserRunner(StandInModule(module_params, check_mode=check_mode), service)  # type: ignore[arg-type]


class MemoryService:
    """The user API's effects on a dict; ``fail_on`` makes that call raise like a refused request."""

    def __init__(self, fail_on: Optional[str] = None) -> None:
        self.users: Dict[str, Dict[str, Any]] = {}
        self.experiments: Dict[str, str] = {"shared": "1"}
        self.calls: List[str] = []
        self.fail_on = fail_on

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if what == self.fail_on:
            raise MlflowError("MLflow POST %s: HTTP 503 unavailable" % what, status=503)

    def read(self, name: str) -> U.UserState:
        user = self.users.get(name)
        if user is None:
            return U.UserState(exists=False)
        return U.UserState(True, 2, user["admin"], dict(user["grants"]))

    def password_matches(self, name: str, password: str) -> bool:
        return self.users[name]["password"] == password

    def experiment_id(self, name: str) -> Optional[str]:
        return self.experiments.get(name)

    def experiment_name(self, experiment_id: str) -> str:
        return {v: k for k, v in self.experiments.items()}[experiment_id]

    def create_experiment(self, name: str) -> str:
        self._call("experiments/create")
        self.experiments[name] = str(len(self.experiments) + 1)
        return self.experiments[name]

    def create_user(self, name: str, password: str) -> None:
        self._call("users/create")
        self.users[name] = {"password": password, "admin": False, "grants": {}}

    def grant(self, name: str, experiment_id: str, permission: str) -> None:
        self._call("grant")
        self.users[name]["grants"][experiment_id] = permission


def test_a_failure_midway_reports_what_was_done() -> None:
    service = MemoryService(fail_on="grant")
    spec = params(experiment_permissions=[{"experiment": "shared", "permission": "EDIT"}])
    with pytest.raises(KvmError) as err:
        runner(spec, service).run()
    details = err.value.details
    assert details["changed"] is True
    assert details["actions"] == ["create user pipe"]
    assert details["failed_action"] == "grant EDIT on experiment shared to user pipe"
    assert details["actions_left"] == ["grant EDIT on experiment shared to user pipe"]
    assert err.value.msg.startswith("grant EDIT on experiment shared to user pipe failed: MLflow POST grant: HTTP 503")
    assert err.value.msg.endswith("(already done: create user pipe)")
    assert details["mlflow_status"] == 503

    service.fail_on = None   # the re-run completes the rest, and only the rest
    done = runner(spec, service).run()
    assert done["changed"] and done["actions"] == ["grant EDIT on experiment shared to user pipe"]
    assert service.users["pipe"]["grants"] == {"1": "EDIT"}


def test_a_failure_before_any_write_is_not_a_change() -> None:
    service = MemoryService(fail_on="users/create")
    with pytest.raises(KvmError) as err:
        runner(params(), service).run()
    details = err.value.details
    assert "changed" not in details or details["changed"] is False  # the module reports changed=false
    assert "actions" not in details and details["failed_action"] == "create user pipe"
    assert details["actions_left"] == ["create user pipe"]
    assert err.value.msg.startswith("create user pipe failed: ")


def test_check_mode_plans_and_calls_nothing() -> None:
    service = MemoryService()
    spec = params(experiment_permissions=[{"experiment": "new-exp", "permission": "READ"}])
    res = runner(spec, service, check_mode=True).run()
    assert res["changed"] and service.calls == [] and service.users == {}
    assert res["user"]["experiment_permissions"] == {"new-exp": "READ"}


@pytest.mark.parametrize("over, option", [
    ({"password": None}, "password"),
    ({"state": "absent", "password": None, "experiment_permissions": [{"experiment": "e", "permission": "EDIT"}]},
     "experiment_permissions"),
    ({"experiment_permissions": [{"experiment": " ", "permission": "EDIT"}]}, "experiment_permissions[0].experiment"),
    ({"admin_username": ""}, "admin_username"),
    ({"timeout": 7200.0}, "timeout"),
])
def test_spec_refuses(over: Dict[str, Any], option: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        U.UserSpec.from_params(params(**over))
    assert err.value.details["option"] == option
