"""ca_path of ml_stage (mlflow.ca_path) and mlflow_user: validated before any call, used by every
client, passed on to the tracked command, and a refused certificate named as such.

The real TLS server is exercised by tests/integration/test_mlflow_tls.py; here a small https
server in this process (certificates from tests/mlflow_server.make_tls) proves the client side fast.
"""
from __future__ import annotations

import os
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from conftest import COLLECTIONS
from mlflow_server import make_tls
from test_mlflow_user_plan import params

sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _mlflow_user as U  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_mlflow import (  # noqa: E402
    MlflowClient, MlflowError)
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_spec import StageSpec  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_track import apply_tls_env  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path, Path]:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def https(tls: Tuple[Path, Path, Path]) -> Iterator[str]:
    """An https server answering /health with the certificate of the private CA."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tls[1]), str(tls[2]))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "https://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def user_params(**over: Any) -> Dict[str, Any]:
    """The plan tests' parameters, on an https URL."""
    return params(**dict({"tracking_uri": "https://mlflow.lab:5443"}, **over))


def stage(tmp_path: Path, mlflow: Dict[str, Any], **over: Any) -> StageSpec:
    p = {"name": "s", "chdir": str(tmp_path), "cmd": ["true"], "mlflow": mlflow}
    p.update(over)
    return StageSpec(p)


def test_ca_path_is_absolute_and_optional(tls: Tuple[Path, Path, Path], tmp_path: Path) -> None:
    ca = str(tls[0])
    assert U.UserSpec.from_params(user_params(ca_path=ca)).ca_path == ca
    assert U.UserSpec.from_params(user_params()).ca_path is None
    # an http:// URL keeps it (unused), so a site can switch the scheme alone
    assert U.UserSpec.from_params(user_params(tracking_uri="http://mlflow.lab:5000", ca_path=ca)).ca_path == ca
    # ml_stage: relative to chdir, like its other paths; the command gets the absolute path
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes(tls[0].read_bytes())
    m = stage(tmp_path, {"tracking_uri": "https://mlflow.lab:5443", "ca_path": "certs/ca.pem"}).mlflow
    assert m is not None and m.ca_path == str(tmp_path / "certs" / "ca.pem")


@pytest.mark.parametrize("case, problem", [
    ("missing", "does not exist"),
    ("directory", "is a directory, not a regular file"),
    ("fifo", "is a special file, not a regular file"),
    ("not_pem", "holds no CA certificate"),
    ("key_only", "holds no CA certificate"),
    ("relative", "is not an absolute path"),
])
def test_a_bad_ca_path_is_refused_naming_option_value_and_fix(tls: Tuple[Path, Path, Path], tmp_path: Path,
                                                              case: str, problem: str) -> None:
    paths = {"missing": tmp_path / "nope.pem", "directory": tmp_path, "fifo": tmp_path / "fifo",
             "not_pem": tmp_path / "ca.txt", "key_only": tls[2], "relative": "ca.pem"}
    os.mkfifo(str(tmp_path / "fifo"))   # never opened: the check must not block on it
    (tmp_path / "ca.txt").write_text("not a certificate\n")
    value = str(paths[case])
    with pytest.raises(InvalidInputError) as err:
        U.UserSpec.from_params(user_params(ca_path=value))
    assert err.value.details["option"] == "ca_path" and problem in err.value.msg, err.value.msg
    assert value in err.value.msg and "PEM file of the CA" in err.value.msg
    if case == "relative":
        return   # ml_stage takes it relative to chdir
    with pytest.raises(InvalidInputError) as err:
        stage(tmp_path, {"tracking_uri": "http://mlflow.lab:5000", "ca_path": value})
    assert err.value.details["option"] == "mlflow.ca_path" and problem in err.value.msg, err.value.msg


def test_the_task_cannot_set_the_tls_variables_beside_ca_path(tls: Tuple[Path, Path, Path], tmp_path: Path) -> None:
    mlflow = {"tracking_uri": "https://mlflow.lab:5443", "ca_path": str(tls[0])}
    for option in ("env", "secret_env", "runtime_env"):
        with pytest.raises(InvalidInputError) as err:
            stage(tmp_path, mlflow, **{option: {"MLFLOW_TRACKING_SERVER_CERT_PATH": "/etc/ssl/x.pem"}})
        assert "mlflow.ca_path" in err.value.msg
    with pytest.raises(InvalidInputError):
        stage(tmp_path, mlflow, env={"MLFLOW_TRACKING_INSECURE_TLS": "true"})
    # without ca_path the task's own variables stay the task's (as before ca_path existed)
    stage(tmp_path, {"tracking_uri": "https://mlflow.lab:5443"}, env={"MLFLOW_TRACKING_SERVER_CERT_PATH": "/x"})


def test_tls_variables_for_the_command(tls: Tuple[Path, Path, Path], tmp_path: Path) -> None:
    ca = str(tls[0])

    def env_for(mlflow: Dict[str, Any], env: Dict[str, str]) -> Dict[str, str]:
        m = stage(tmp_path, dict({"tracking_uri": "https://mlflow.lab:5443"}, **mlflow)).mlflow
        assert m is not None
        apply_tls_env(m, env)
        return env

    # an inherited insecure flag would make MLflow refuse the cert path: dropped
    assert env_for({"ca_path": ca}, {"MLFLOW_TRACKING_INSECURE_TLS": "true"}) == {
        "MLFLOW_TRACKING_SERVER_CERT_PATH": ca}
    assert env_for({}, {}) == {}
    assert env_for({"validate_certs": False}, {}) == {"MLFLOW_TRACKING_INSECURE_TLS": "true"}
    assert env_for({"validate_certs": False, "ca_path": ca}, {}) == {"MLFLOW_TRACKING_INSECURE_TLS": "true"}
    # an environment that already says how to verify is left as it is
    assert env_for({"validate_certs": False}, {"MLFLOW_TRACKING_SERVER_CERT_PATH": "/x"}) == {
        "MLFLOW_TRACKING_SERVER_CERT_PATH": "/x"}


def test_client_verifies_against_ca_path(https: str, tls: Tuple[Path, Path, Path]) -> None:
    MlflowClient(https, ca_path=str(tls[0])).health()
    MlflowClient(https, validate_certs=False).health()
    with pytest.raises(MlflowError) as err:
        MlflowClient(https).health()   # the private CA is not among the system's
    msg = err.value.msg
    assert err.value.certificate and "unreachable" not in msg, msg
    assert "TLS certificate of MLflow tracking server %s could not be verified" % https in msg
    assert "set mlflow.ca_path to the PEM file of the CA that signed it" in msg
    assert "mlflow.validate_certs: false for a test server" in msg


def test_user_service_uses_ca_path_for_every_client(https: str, tls: Tuple[Path, Path, Path]) -> None:
    service = U.MlflowUserService(U.UserSpec.from_params(user_params(tracking_uri=https, ca_path=str(tls[0]))))
    clients = [service.admin, service._client("pipe", "twelve-chars-or-more", "password")]
    for client in clients:
        assert client.ca_path == str(tls[0])
        client.health()
    with pytest.raises(MlflowError) as err:
        U.MlflowUserService(U.UserSpec.from_params(user_params(tracking_uri=https))).admin.health()
    assert "set ca_path to the PEM file" in err.value.msg and "validate_certs: false" in err.value.msg
    assert "mlflow." not in err.value.msg
