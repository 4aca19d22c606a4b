"""mlflow_user (ca_path) and ml_stage (mlflow.ca_path) against a real MLflow server that serves
https with a certificate of a private CA, and runs MLflow's basic-auth app as the role sets it up.

The CA is not among the system's, so only a client given ca_path gets through: without it the
modules fail before any change, saying how to fix it. The stage's command is a Python script
that logs through the mlflow package itself: its metric on the run proves that the command was
given the same CA (MLFLOW_TRACKING_SERVER_CERT_PATH).
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from conftest import four_ways, run_module_process
from test_ml_stage_mlflow import ml, ran
from test_mlflow_user import server_user

pytestmark = pytest.mark.integration

PASSWORD = "tls-pipe-pass-" + secrets.token_hex(6)

SCRIPT = r'''
import os
assert os.environ["MLFLOW_TRACKING_URI"].startswith("https://127.0.0.1:")
# the module's ca_path, not the system's CAs (which do not hold the private CA)
assert os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"] == os.environ["EXPECTED_CA"], os.environ
assert "MLFLOW_TRACKING_INSECURE_TLS" not in os.environ
run_id = os.environ["MLFLOW_RUN_ID"]                 # start_run() consumes it
import mlflow
with mlflow.start_run() as run:                      # attaches to the module's run over https
    assert run.info.run_id == run_id, (run.info.run_id, run_id)
    mlflow.log_metric("from_tls_script", 7.0)
with open("runs.log", "a") as f:
    f.write(run.info.run_id + "\n")
with open("model.txt", "w") as f:
    f.write("trained\n")
'''


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mlflow_server import Server
    srv = Server(tmp_path_factory.mktemp("mlflow-tls"), admin_password="admin-" + secrets.token_hex(8),
                 tls=True)
    yield srv
    srv.stop()


def user_args(srv: Any, **over: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {"tracking_uri": srv.url, "admin_username": srv.ADMIN,
                            "admin_password": srv.admin_password, "ca_path": str(srv.ca_path)}
    args.update(over)
    return args


def assert_clean_failure(res: Dict[str, Any]) -> None:
    assert res["failed"] and res["changed"] is False, res
    assert "exception" not in res and "Traceback" not in res.get("module_stderr", ""), res


def test_user_over_tls_with_ca_path(tls_server: Any) -> None:
    srv = tls_server
    args = user_args(srv, name="tls-a", password=PASSWORD,
                     experiment_permissions=[{"experiment": "tls-a-exp"}])
    runs = four_ways("mlflow_user", args)
    assert runs["apply"]["actions"] == ["create user tls-a",
                                        "create experiment tls-a-exp and grant EDIT on it to user tls-a"]
    assert server_user(srv, "tls-a") is not None
    assert srv.api("GET", "mlflow/users/current", login=("tls-a", PASSWORD))["user"]["username"] == "tls-a"
    # the password is compared by signing in as the user: that client trusts the CA as well
    rotated = four_ways("mlflow_user", dict(args, password=PASSWORD + "-rotated"))
    assert rotated["apply"]["actions"] == ["set the password of user tls-a"]


def test_user_without_ca_path_fails_on_the_certificate(tls_server: Any) -> None:
    srv = tls_server
    args = user_args(srv, name="tls-b", password=PASSWORD)
    del args["ca_path"]   # validate_certs stays true (the default): the system's CAs only
    for check in (True, False):
        res = run_module_process("mlflow_user", args, check=check)
        assert_clean_failure(res)
        msg = res["msg"]
        assert "TLS certificate of MLflow tracking server %s could not be verified" % srv.url in msg, msg
        assert "set ca_path to the PEM file of the CA that signed it" in msg, msg
        assert "validate_certs: false" in msg and "unreachable" not in msg, msg
    assert server_user(srv, "tls-b") is None


@pytest.mark.parametrize("case, problem", [("missing", "does not exist"),
                                           ("directory", "is a directory, not a regular file")])
def test_user_with_a_bad_ca_path_is_refused(tls_server: Any, tmp_path: Path, case: str, problem: str) -> None:
    srv = tls_server
    value = str(tmp_path / "no-such-ca.pem") if case == "missing" else str(tmp_path)
    res = run_module_process("mlflow_user", user_args(srv, name="tls-c", password=PASSWORD, ca_path=value))
    assert_clean_failure(res)
    assert res["msg"].startswith("option ca_path: value %r %s;" % (value, problem)), res["msg"]
    assert "PEM file of the CA" in res["msg"]
    assert server_user(srv, "tls-c") is None


def project(base: Path) -> Path:
    base.mkdir(parents=True)
    (base / "data.csv").write_text("x,y\n1,2\n")
    (base / "train.py").write_text(SCRIPT)
    return base


def stage_args(srv: Any, proj: Path, mlflow: Dict[str, Any]) -> Dict[str, Any]:
    return {"name": "train", "chdir": str(proj), "cmd": [sys.executable, "train.py"],
            "deps": ["data.csv"], "outs": ["model.txt"], "code": {"paths": ["train.py"]},
            "secret_env": {"EXPECTED_CA": str(srv.ca_path)}, "mlflow": mlflow}


def test_stage_over_tls_with_ca_path(tls_server: Any, tmp_path: Path) -> None:
    srv = tls_server
    # the stage logs as a pipeline user that may edit its experiment only (basic-auth app)
    made = run_module_process("mlflow_user", user_args(srv, name="tls-stage", password=PASSWORD,
                                                       experiment_permissions=[{"experiment": "tls-stage-exp"}]))
    assert not made["failed"] and made["changed"], made
    proj = project(tmp_path / "p")
    mlflow = {"tracking_uri": srv.url, "experiment": "tls-stage-exp", "ca_path": str(srv.ca_path),
              "credentials": {"username": "tls-stage", "password": PASSWORD}}
    args = stage_args(srv, proj, mlflow)

    predicted = ml(args, check=True)
    assert not predicted["failed"] and predicted["changed"] is True, predicted
    assert srv.runs("tls-stage-exp") == [] and ran(proj) == 0   # check mode wrote nothing

    res = ml(args)
    assert not res["failed"] and res["changed"] and res["ran"], res
    run = srv.run(res["mlflow"]["run_id"])   # read back over https, verified with the CA
    assert run["info"]["status"] == "FINISHED"
    assert run["metrics"]["from_tls_script"] == 7.0   # the command's own mlflow client got through
    assert ran(proj) == 1

    check_again = ml(args, check=True)
    assert not check_again["failed"] and check_again["changed"] is False, check_again
    again = ml(args)
    assert not again["failed"] and again["changed"] is False and again["reasons"] == [], again
    assert len(srv.runs("tls-stage-exp")) == 1 and ran(proj) == 1


def test_stage_without_ca_path_fails_before_running(tls_server: Any, tmp_path: Path) -> None:
    srv = tls_server
    proj = project(tmp_path / "p")
    mlflow = {"tracking_uri": srv.url, "experiment": "tls-refused",
              "credentials": {"username": srv.ADMIN, "password": srv.admin_password}}
    res = ml(stage_args(srv, proj, mlflow))
    assert_clean_failure(res)
    assert res["msg"].startswith("option mlflow.ca_path: the TLS certificate of MLflow tracking server"), res["msg"]
    assert "set mlflow.ca_path to the PEM file of the CA that signed it" in res["msg"]
    assert "mlflow.validate_certs: false" in res["msg"]
    assert ran(proj) == 0 and srv.experiment("tls-refused") is None

    bad = ml(stage_args(srv, proj, dict(mlflow, ca_path="certs/missing.pem")))
    assert_clean_failure(bad)
    assert bad["msg"].startswith("option mlflow.ca_path: value 'certs/missing.pem (%s)' does not exist"
                                 % (proj / "certs" / "missing.pem")), bad["msg"]
    assert ran(proj) == 0
