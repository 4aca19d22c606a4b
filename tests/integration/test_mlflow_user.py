"""mlinfra.kvm.mlflow_user against a real MLflow server running its basic-auth app.

Each change is tried four ways (check, apply, check again, apply again), and what the user may
do is proved by the server itself: the user logs runs where it holds EDIT, and is refused
elsewhere.
"""
from __future__ import annotations

import secrets
import urllib.error
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from conftest import run_module_process

pytestmark = pytest.mark.integration

PASSWORD = "pipeline-pass-" + secrets.token_hex(6)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mlflow_server import Server
    srv = Server(tmp_path_factory.mktemp("mlflow-auth"), admin_password="admin-" + secrets.token_hex(8))
    yield srv
    srv.stop()


def user(srv: Any, check: bool = False, **over: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {"tracking_uri": srv.url, "admin_username": srv.ADMIN,
                            "admin_password": srv.admin_password}
    args.update(over)
    return run_module_process("mlflow_user", args, check=check, diff=True, timeout=120)


def four_ways(srv: Any, **args: Any) -> List[Dict[str, Any]]:
    """check, apply, check, apply: the first two change, the last two do not."""
    results = [user(srv, check=True, **args), user(srv, **args),
               user(srv, check=True, **args), user(srv, **args)]
    for res in results:
        assert not res["failed"], res
    first, applied, check_again, again = results
    assert first["changed"] and applied["changed"], results
    assert first["actions"] == applied["actions"] and first["diff"] == applied["diff"]
    assert first["user"] == applied["user"]
    assert check_again["changed"] is False and again["changed"] is False, results
    assert check_again["actions"] == again["actions"] == []
    assert again["user"] == applied["user"]
    return results


def can_log_run(srv: Any, login: tuple, experiment: str) -> bool:
    experiment_id = srv.experiment(experiment)
    try:
        srv.api("POST", "mlflow/runs/create", {"experiment_id": experiment_id}, login=login)
        return True
    except urllib.error.HTTPError as exc:
        assert exc.code == 403, exc.read()
        return False


def server_user(srv: Any, name: str) -> Optional[Dict[str, Any]]:
    try:
        return srv.api("GET", "mlflow/users/get", query={"username": name})["user"]
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return None


def grants(srv: Any, name: str) -> Dict[str, str]:
    rows = srv.api("GET", "mlflow/users/permissions/list", query={"username": name}, version=3)["permissions"]
    return {r["resource_pattern"]: r["permission"] for r in rows if r["resource_type"] == "experiment"}


def test_pipeline_user_edits_its_experiment_only(auth_server: Any) -> None:
    srv = auth_server
    srv.api("POST", "mlflow/experiments/create", {"name": "shared-reports"})
    args = {"name": "pipe-a", "password": PASSWORD,
            "experiment_permissions": [{"experiment": "pipe-a-exp"},
                                       {"experiment": "shared-reports", "permission": "READ"}]}
    first = user(srv, check=True, **args)
    assert server_user(srv, "pipe-a") is None and srv.experiment("pipe-a-exp") is None  # check wrote nothing
    assert first["actions"] == ["create user pipe-a",
                                "create experiment pipe-a-exp and grant EDIT on it to user pipe-a",
                                "grant READ on experiment shared-reports to user pipe-a"]
    assert first["diff"]["before"] == {"exists": False}
    four_ways(srv, **args)

    login = ("pipe-a", PASSWORD)
    assert can_log_run(srv, login, "pipe-a-exp")
    assert not can_log_run(srv, login, "shared-reports")
    assert server_user(srv, "pipe-a")["is_admin"] is False
    assert grants(srv, "pipe-a") == {srv.experiment("pipe-a-exp"): "EDIT",
                                     srv.experiment("shared-reports"): "READ"}


def test_changed_permission_and_purge(auth_server: Any) -> None:
    srv = auth_server
    base = {"name": "pipe-b", "password": PASSWORD}
    assert not user(srv, experiment_permissions=[{"experiment": "pipe-b-exp"},
                                                 {"experiment": "pipe-b-old"}], **base)["failed"]
    login = ("pipe-b", PASSWORD)
    # an experiment the user made itself: MLflow grants it MANAGE there
    srv.api("POST", "mlflow/experiments/create", {"name": "pipe-b-own"}, login=login)
    assert can_log_run(srv, login, "pipe-b-exp")

    runs = four_ways(srv, experiment_permissions=[{"experiment": "pipe-b-exp", "permission": "READ"}],
                     purge_experiment_permissions=True, **base)
    assert runs[1]["actions"] == ["change EDIT -> READ on experiment pipe-b-exp for user pipe-b",
                                  "revoke EDIT on experiment pipe-b-old from user pipe-b",
                                  "revoke MANAGE on experiment pipe-b-own from user pipe-b"]
    assert runs[1]["diff"]["before"]["experiment_permissions"] == {
        "pipe-b-exp": "EDIT", "pipe-b-old": "EDIT", "pipe-b-own": "MANAGE"}
    assert runs[1]["diff"]["after"]["experiment_permissions"] == {"pipe-b-exp": "READ"}
    assert grants(srv, "pipe-b") == {srv.experiment("pipe-b-exp"): "READ"}
    assert not can_log_run(srv, login, "pipe-b-exp")

    # without purge, grants not listed stay
    kept = user(srv, experiment_permissions=[{"experiment": "pipe-b-old"}], **base)
    assert kept["changed"] and kept["user"]["experiment_permissions"] == {"pipe-b-exp": "READ", "pipe-b-old": "EDIT"}


def test_password_is_compared_by_logging_in(auth_server: Any) -> None:
    srv = auth_server
    assert not user(srv, name="pipe-c", password=PASSWORD)["failed"]
    new = PASSWORD + "-rotated"
    runs = four_ways(srv, name="pipe-c", password=new)
    assert runs[1]["actions"] == ["set the password of user pipe-c"]
    assert runs[1]["diff"]["after"]["password"] == "(the declared password)"
    assert new not in repr(runs) and PASSWORD not in repr(runs)
    with pytest.raises(urllib.error.HTTPError) as old:
        srv.api("GET", "mlflow/users/current", login=("pipe-c", PASSWORD))
    assert old.value.code == 401
    assert srv.api("GET", "mlflow/users/current", login=("pipe-c", new))["user"]["username"] == "pipe-c"
    # on_create: an existing user's password is left as it is
    kept = user(srv, name="pipe-c", password=PASSWORD, update_password="on_create")
    assert kept["changed"] is False and not kept["failed"]


def test_absent_deletes_the_user(auth_server: Any) -> None:
    srv = auth_server
    assert not user(srv, name="pipe-d", password=PASSWORD,
                    experiment_permissions=[{"experiment": "pipe-d-exp"}])["failed"]
    runs = four_ways(srv, name="pipe-d", state="absent")
    assert runs[1]["actions"] == ["delete user pipe-d"]
    assert runs[1]["diff"]["after"] == {"exists": False}
    assert server_user(srv, "pipe-d") is None
    assert srv.experiment("pipe-d-exp") is not None   # the experiment and its runs stay


@pytest.mark.parametrize("over, option, words", [
    # (not a word of the message: Ansible masks a no_log value wherever it appears)
    ({"password": "x7Q-pw"}, "password", "shorter than MLflow's minimum of 12"),
    ({"name": "admin"}, "name", "is the admin account"),
    ({"name": "a:b"}, "name", "cannot contain ':'"),
    ({"name": "bad\x07user"}, "name", "control character"),
    ({"experiment_permissions": [{"experiment": "x-dup"}, {"experiment": "x-dup", "permission": "READ"}]},
     "experiment_permissions[1].experiment", "listed twice"),
    ({"experiment_permissions": [{"experiment": "x-missing"}], "create_experiments": False},
     "experiment_permissions", "does not exist"),
    ({"tracking_uri": "mlflow.lab:5000"}, "tracking_uri", "not an http(s) URL"),
    ({"timeout": 0}, "timeout", "out of range"),
])
def test_bad_input_is_refused_before_any_change(auth_server: Any, over: Dict[str, Any], option: str,
                                                words: str) -> None:
    srv = auth_server
    args: Dict[str, Any] = {"name": "pipe-bad", "password": PASSWORD}
    args.update(over)
    res = user(srv, **args)
    assert res["failed"] and res["changed"] is False, res
    assert res["msg"].startswith("option %s:" % option) and words in res["msg"], res["msg"]
    assert "Traceback" not in res.get("module_stderr", "") + res.get("exception", "")
    assert server_user(srv, "pipe-bad") is None
    assert srv.experiment("x-missing") is None and srv.experiment("x-dup") is None


def test_wrong_admin_password_and_unreachable_server(auth_server: Any, tmp_path: Path) -> None:
    srv = auth_server
    wrong = user(srv, name="pipe-e", password=PASSWORD, admin_password="not-the-admin-password")
    assert wrong["failed"] and "HTTP 401" in wrong["msg"], wrong
    assert "check admin_username/admin_password" in wrong["msg"]
    assert "not-the-admin-password" not in repr(wrong)
    from mlflow_server import _free_port
    gone = user(srv, name="pipe-e", password=PASSWORD, tracking_uri="http://127.0.0.1:%d" % _free_port())
    assert gone["failed"] and "unreachable" in gone["msg"] and "exception" not in gone, gone
    assert server_user(srv, "pipe-e") is None
