"""Testinfra checks shared by the mlflow_server scenarios (sqlite and PostgreSQL backends).

A scenario's verify.py subclasses MlflowServerChecks in a Test* class, so pytest collects the
inherited tests and fixtures there (and the PostgreSQL scenario adds its own).
What is checked, each able to fail: the service and its unit, the listener (the lab address,
not every address), the files' owners and modes, auth seen from the controller (401 without or
with a wrong password, 200 with the generated one), a run logged from the controller (another
machine) with the MLflow client, which with its metric and artifact survives a restart of the
server, and the schema-version record. Secrets never reach an argument list, an assert message
or a traceback (Secrets' repr).
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import stat
import subprocess
import sys
import time
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

PORT = 5000
VERSION = "3.17.2"
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=5"
HEALTH_DEADLINE_S = 600  # a TCG guest under load; the wait is a poll and ends when /health answers

LOG_RUN = """
import mlflow, sys
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("molecule-verify")
with mlflow.start_run() as run:
    mlflow.log_param("source", "controller")
    mlflow.log_metric("rmse", 0.125)
    mlflow.log_text("artifact body", "notes.txt")
print(run.info.run_id)
"""


class Secrets(dict):
    """The controller's credentials file. pytest prints a failing test's arguments (and those of
    every frame in its traceback), so the repr names the keys only, never a value."""

    def __repr__(self) -> str:
        return "<credentials: %s>" % ", ".join(sorted(self))


# The server speaks TLS with a certificate from the role's private CA: every call from the
# controller verifies against that CA (the credentials file names it), set by the url fixture.
_TLS: Optional[ssl.SSLContext] = None


def hostvars(host) -> dict:
    return host.ansible.get_variables()


def request(url: str, creds: Optional[Secrets] = None, method: str = "GET",
            body: Optional[dict] = None) -> tuple[int, bytes]:
    """One HTTP call from the controller; returns (status, body) for every status."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if creds:
        token = base64.b64encode(("%s:%s" % (creds["username"], creds["password"])).encode()).decode()
        req.add_header("Authorization", "Basic " + token)
    try:
        with urllib.request.urlopen(req, timeout=60, context=_TLS) as resp:  # noqa: S310 (https, the role's CA)
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def api(url: str, creds: Secrets, path: str, **kw: Any) -> dict:
    status, body = request(url + path, creds, **kw)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)


def wait_for_health(url: str) -> None:
    deadline = time.monotonic() + HEALTH_DEADLINE_S
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = request(url + "/health")[0]
            if last == 200:
                return
        except OSError as err:  # refused or reset while the server starts
            last = err
        time.sleep(5)
    pytest.fail("%s/health did not answer 200 within %d s (last: %s)" % (url, HEALTH_DEADLINE_S, last))


class MlflowServerChecks:
    """The checks both MLflow scenarios run; fixtures are per class (one run logged, one restart)."""

    @pytest.fixture(scope="class")
    def address(self, host) -> str:
        return hostvars(host)["ansible_host"]

    @pytest.fixture(scope="class")
    def url(self, address, creds) -> str:
        """The https URL the role wrote, on the guest's address; calls verify with its CA."""
        global _TLS
        assert creds["url"] == "https://%s:%d" % (address, PORT), creds["url"]
        _TLS = ssl.create_default_context(cafile=creds["ca_file"])
        return creds["url"]

    @pytest.fixture(scope="class")
    def creds_file(self, host) -> Path:
        name = "mlflow-%s.json" % hostvars(host)["inventory_hostname"]
        return Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "secrets" / name

    @pytest.fixture(scope="class")
    def creds(self, creds_file) -> Secrets:
        return Secrets(json.loads(creds_file.read_text()))

    @pytest.fixture(scope="class")
    def logged_run(self, url, creds) -> str:
        """A run logged from the controller with the MLflow client; returns its id."""
        env = dict(os.environ, MLFLOW_TRACKING_USERNAME=creds["username"], MLFLOW_TRACKING_PASSWORD=creds["password"],
                   MLFLOW_TRACKING_SERVER_CERT_PATH=creds["ca_file"])
        proc = subprocess.run([sys.executable, "-c", LOG_RUN, url], env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    @pytest.fixture(scope="class")
    def restarted(self, host, url, logged_run) -> str:
        """The server restarted after the run was logged, and answering again."""
        with host.sudo():
            host.check_output("systemctl restart mlflow-server")
        wait_for_health(url)
        return logged_run

    def test_service_is_running_and_enabled(self, host):
        service = host.service("mlflow-server")
        assert service.is_running and service.is_enabled

    def test_unit_and_config_files(self, host):
        with host.sudo():
            unit = host.file("/etc/systemd/system/mlflow-server.service")
            env = host.file("/etc/mlflow/server.env")
            auth = host.file("/etc/mlflow/basic_auth.ini")
            assert (unit.user, unit.mode) == ("root", 0o644)
            assert "/opt/mlinfra/mlflow-venv/bin/" in unit.content_string
            # The environment file holds the admin and Flask secrets: root only.
            assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
            assert (auth.group, auth.mode) == ("mlflow", 0o640)
            assert "default_permission = READ" in auth.content_string

    def test_service_user_and_home(self, host):
        user = host.user("mlflow")
        assert user.exists and user.home == "/var/lib/mlflow"
        with host.sudo():
            home = host.file("/var/lib/mlflow")
            assert home.is_directory and home.user == "mlflow"

    def test_listens_on_the_lab_address_only(self, host, address):
        assert host.socket("tcp://%s:%d" % (address, PORT)).is_listening
        assert not host.socket("tcp://0.0.0.0:%d" % PORT).is_listening
        assert not host.socket("tcp://:::%d" % PORT).is_listening

    def test_credentials_file_is_0600_in_a_0700_directory(self, creds_file):
        assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(creds_file.parent.stat().st_mode) == 0o700

    def test_tls_only_with_the_role_s_ca(self, host, url, address, creds):
        """Basic auth never in clear text: plain HTTP gets no answer, the system CAs do not
        trust the certificate, and the key is readable by the service's group only."""
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen("http://%s:%d/health" % (address, PORT), timeout=30)  # noqa: S310
        with pytest.raises(urllib.error.URLError) as untrusted:
            urllib.request.urlopen(url + "/health", timeout=30, context=ssl.create_default_context())  # noqa: S310
        assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
        key = host.file("/etc/mlflow-tls/server.key")
        with host.sudo():
            assert (key.user, key.group, key.mode) == ("root", "mlflow", 0o640)

    def test_auth_refuses_without_or_with_a_wrong_password(self, url, creds):
        assert request(url + SEARCH)[0] == 401
        assert request(url + SEARCH, Secrets(creds, password="not-" + creds["password"]))[0] == 401

    def test_auth_accepts_the_generated_admin(self, url, creds):
        # api() asserts the 200; the Default experiment is always there.
        assert api(url, creds, SEARCH)["experiments"]

    def test_run_and_metric_survive_a_restart(self, url, creds, restarted):
        run = api(url, creds, "/api/2.0/mlflow/runs/get?run_id=" + restarted)["run"]
        assert [m["value"] for m in run["data"]["metrics"] if m["key"] == "rmse"] == [0.125]
        assert {"key": "source", "value": "controller"} in run["data"]["params"]

    def test_artifact_is_served_after_the_restart(self, url, creds, restarted):
        run = api(url, creds, "/api/2.0/mlflow/runs/get?run_id=" + restarted)["run"]
        root = run["info"]["artifact_uri"]
        assert root.startswith("mlflow-artifacts:/"), root
        status, body = request("%s/api/2.0/mlflow-artifacts/artifacts/%s/notes.txt" % (url, root[len("mlflow-artifacts:/"):]),
                               creds)
        assert (status, body) == (200, b"artifact body")

    def test_schema_version_record_names_the_installed_mlflow(self, host):
        with host.sudo():
            assert host.file("/var/lib/mlflow/.schema-mlflow-version").content_string.strip() == VERSION
