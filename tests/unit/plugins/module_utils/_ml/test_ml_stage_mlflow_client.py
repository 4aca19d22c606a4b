"""ml_stage's MLflow REST client against a recording fake server on 127.0.0.1.

The real server is exercised by tests/integration/test_ml_stage_mlflow.py; this checks the
wire format MLflow's limits impose (batches), auth headers and error reporting, fast.
"""
from __future__ import annotations

import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import pytest

from conftest import COLLECTIONS

sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_mlflow as M  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_spec import flatten  # noqa: E402

pytestmark = pytest.mark.unit


class Fake:
    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.status = 200
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append({"method": self.command, "path": self.path,
                                      "auth": self.headers.get("Authorization"), "body": body})
                if fake.status != 200:
                    payload = json.dumps({"error_code": "UNAUTHENTICATED", "message": "nope"}).encode()
                    self.send_response(fake.status)
                elif self.path.startswith("/api/2.0/mlflow/experiments/get-by-name"):
                    self.send_response(404)
                    payload = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "x"}).encode()
                elif self.path == "/api/2.0/mlflow/experiments/create":
                    self.send_response(200)
                    payload = json.dumps({"experiment_id": "7"}).encode()
                else:
                    self.send_response(200)
                    payload = b"{}" if self.path.startswith("/api") else b"OK"
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def batches(self) -> List[Dict[str, Any]]:
        return [json.loads(r["body"]) for r in self.requests if r["path"].endswith("/runs/log-batch")]


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.server.shutdown()


def test_params_in_batches_of_100_metrics_in_one_call(fake: Fake) -> None:
    c = M.MlflowClient(fake.url)
    assert c.log_params("r1", {"p%03d" % i: i for i in range(250)}) == 3
    assert c.log_metrics("r1", {"m%d" % i: i / 3 for i in range(40)}) == 1
    batches = fake.batches()
    assert [len(b.get("params", [])) for b in batches[:3]] == [100, 100, 50]
    assert len(batches[3]["metrics"]) == 40 and "params" not in batches[3]
    assert {p["key"] for b in batches[:3] for p in b["params"]} == {"p%03d" % i for i in range(250)}
    assert batches[0]["params"][5] == {"key": "p005", "value": "5"}


def test_long_values_are_clipped_to_mlflow_limits(fake: Fake) -> None:
    c = M.MlflowClient(fake.url)
    c.log_params("r", {"k" * 300: "v" * 7000})
    param = fake.batches()[0]["params"][0]
    assert len(param["key"]) == M.MAX_KEY and len(param["value"]) == M.MAX_PARAM_VALUE
    assert param["value"].endswith("...")


def test_basic_auth_and_token_headers(fake: Fake) -> None:
    M.MlflowClient(fake.url, username="ml", password="pw").health()
    assert fake.requests[-1]["auth"] == "Basic " + base64.b64encode(b"ml:pw").decode()
    M.MlflowClient(fake.url, token="tok").health()
    assert fake.requests[-1]["auth"] == "Bearer tok"


def test_rejected_credentials_are_named(fake: Fake) -> None:
    fake.status = 401
    with pytest.raises(M.MlflowError) as info:
        M.MlflowClient(fake.url, username="ml", password="bad").experiment_id("e")
    assert info.value.status == 401 and "check mlflow.credentials" in info.value.msg


def test_experiment_created_when_missing(fake: Fake) -> None:
    assert M.MlflowClient(fake.url).experiment_id("new") == "7"
    assert [r["path"].split("?")[0] for r in fake.requests] == [
        "/api/2.0/mlflow/experiments/get-by-name", "/api/2.0/mlflow/experiments/create"]
    assert M.MlflowClient(fake.url).experiment_id("new", create=False) is None


def test_unreachable_server() -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(M.MlflowError) as info:
        M.MlflowClient("http://127.0.0.1:%d" % port, timeout=2).health()
    assert "unreachable" in info.value.msg


def test_artifact_upload_goes_through_the_proxy(fake: Fake, tmp_path) -> None:
    c = M.MlflowClient(fake.url)
    root = c.artifact_root("mlflow-artifacts:/3/abc/artifacts")
    assert root == "3/abc/artifacts"
    assert c.artifact_root("http://h:5000/api/2.0/mlflow-artifacts/artifacts/3/abc/artifacts") == root
    assert c.artifact_root("s3://bucket/3/abc/artifacts") is None
    f = tmp_path / "model.pt"
    f.write_bytes(b"x" * 1000)
    c.upload(root, "outs/model.pt", str(f))
    put = fake.requests[-1]
    assert put["method"] == "PUT" and put["body"] == b"x" * 1000
    assert put["path"] == "/api/2.0/mlflow-artifacts/artifacts/3/abc/artifacts/outs/model.pt"


def test_flatten_and_metrics() -> None:
    assert dict(flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"})) == {"a.b": 1, "a.c": [1, 2], "d": "x"}
    assert M.numeric_metrics({"acc": 0.5, "n": 3, "ok": True, "s": "x", "nan": float("nan"),
                              "nested": {"loss": 1}}) == {"acc": 0.5, "n": 3.0, "nested.loss": 1.0}
    assert M.param_value([1, 2]) == "[1, 2]" and M.param_value("s") == "s"
