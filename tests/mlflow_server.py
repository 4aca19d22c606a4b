"""A real `mlflow server` (sqlite backend, artifact proxy) on 127.0.0.1 for the integration tier.

Started from the project's venv on a free port in a temporary directory; ready once /health
answers; stopped with its whole process group. tests/conftest.py starts one per pytest session
(fixture ``mlflow_server``): each test uses experiments of its own names, so they share it.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mlflow_bin() -> str:
    for candidate in (Path(sys.executable).with_name("mlflow"), ROOT / ".venv" / "bin" / "mlflow"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("mlflow")
    if not found:
        pytest.fail("the mlflow CLI is not installed: run `make setup` (requirements.txt pins mlflow)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``admin_password`` set: MLflow's basic-auth app, its admin ``admin`` with that password,
    every user READ by default (as mlinfra.kvm.mlflow_server configures it)."""

    ADMIN = "admin"

    def __init__(self, tmp: Path, admin_password: Optional[str] = None) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.admin_password = admin_password
        cmd = [_mlflow_bin(), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", "sqlite:///%s" % (tmp / "mlflow.db"),
               "--artifacts-destination", str(tmp / "artifacts"), "--workers", "1"]
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
        if admin_password:
            ini = tmp / "basic_auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///%s\n"
                           "admin_username = %s\nauthorization_function = "
                           "mlflow.server.auth:authenticate_request_basic_auth\n"
                           % (tmp / "basic_auth.db", self.ADMIN))
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_AUTH_ADMIN_PASSWORD=admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY=os.urandom(16).hex())
            cmd += ["--app-name", "basic-auth"]
        self.log = open(tmp / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, cwd=str(tmp), stdout=self.log, env=env,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 240
        while True:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail("mlflow server exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("mlflow server did not answer /health in 240 s:\n%s" % self.log_tail())
            time.sleep(0.5)

    def log_tail(self) -> str:
        return (self.tmp / "server.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()

    # -- REST, independent of the module's own client ------------------------------------
    def api(self, method: str, endpoint: str, body: Optional[Dict[str, Any]] = None,
            query: Optional[Dict[str, Any]] = None, version: int = 2,
            login: Optional[Tuple[str, str]] = None) -> Dict[str, Any]:
        """One REST call; on a basic-auth server as ``login`` (user, password), else as the admin."""
        url = "%s/api/%d.0/%s" % (self.url, version, endpoint)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Content-Type": "application/json"}
        if login is None and self.admin_password:
            login = (self.ADMIN, self.admin_password)
        if login:
            token = base64.b64encode(("%s:%s" % login).encode()).decode()
            headers["Authorization"] = "Basic " + token
        req = urllib.request.Request(url, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else {}

    def experiment(self, name: str) -> Optional[str]:
        try:
            return self.api("GET", "mlflow/experiments/get-by-name",
                            query={"experiment_name": name})["experiment"]["experiment_id"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def runs(self, experiment: str) -> list:
        exp = self.experiment(experiment)
        if exp is None:
            return []
        return self.api("POST", "mlflow/runs/search", {"experiment_ids": [exp]}).get("runs", [])

    def run(self, run_id: str) -> Dict[str, Any]:
        run = self.api("GET", "mlflow/runs/get", query={"run_id": run_id})["run"]
        data = run["data"]
        return {"info": run["info"],
                "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
                "params": {p["key"]: p["value"] for p in data.get("params", [])},
                "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])}}

    def artifacts(self, run_id: str, path: str) -> list:
        res = self.api("GET", "mlflow/artifacts/list", query={"run_id": run_id, "path": path})
        return sorted(f["path"] for f in res.get("files", []))

    def artifact(self, run_info: Dict[str, Any], path: str) -> bytes:
        root = run_info["artifact_uri"].split("mlflow-artifacts:", 1)[1].lstrip("/")
        with urllib.request.urlopen("%s/api/2.0/mlflow-artifacts/artifacts/%s/%s"
                                    % (self.url, root, path), timeout=30) as resp:
            return resp.read()
