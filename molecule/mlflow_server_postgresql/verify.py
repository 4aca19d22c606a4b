"""Testinfra checks for the mlflow_server_postgresql scenario.

The sqlite scenario's checks (molecule/_shared/mlflow_checks.py: service, files, listener, auth,
a run logged from the controller that survives an MLflow restart, artifacts), then: the run
really is in PostgreSQL, PostgreSQL listens on loopback only, the server's store URI carries
the generated database password (never shown), and the runs survive a restart of PostgreSQL.
"""
from __future__ import annotations

import re
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))

from mlflow_checks import MlflowServerChecks, api, wait_for_health  # noqa: E402


def psql(host, sql: str) -> str:
    with host.sudo():
        return host.check_output("runuser -u postgres -- psql -XtAq -d mlflow -c %s", sql)


class TestMlflowServerOnPostgresql(MlflowServerChecks):

    def test_postgresql_is_running_and_enabled(self, host):
        service = host.service("postgresql")
        assert service.is_running and service.is_enabled

    def test_postgresql_listens_on_loopback_only(self, host, address):
        assert host.socket("tcp://127.0.0.1:5432").is_listening
        assert not host.socket("tcp://0.0.0.0:5432").is_listening
        assert not host.socket("tcp://%s:5432" % address).is_listening

    def test_the_run_is_stored_in_postgresql(self, host, logged_run):
        assert re.fullmatch(r"[0-9a-f]{32}", logged_run), logged_run
        assert psql(host, "SELECT count(*) FROM runs WHERE run_uuid = '%s'" % logged_run) == "1"

    def test_the_server_uses_the_generated_database_password(self, host, creds):
        with host.sudo():
            env = host.file("/etc/mlflow/server.env").content_string
        expected = "MLFLOW_BACKEND_STORE_URI=postgresql+psycopg2://mlflow:%s@127.0.0.1:5432/mlflow" % (
            urllib.parse.quote(creds["db_password"], safe="/"))
        # Compared, never printed: the line holds the password (a bare bool keeps pytest's
        # assertion rewriting from showing the operands).
        carries_it = expected in env.splitlines()
        assert carries_it, "the server's store URI does not carry the generated database password"

    def test_runs_survive_a_postgresql_restart(self, host, url, creds, logged_run):
        with host.sudo():
            host.check_output("systemctl restart postgresql")
            host.check_output("systemctl restart mlflow-server")
        wait_for_health(url)
        experiment = api(url, creds, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=molecule-verify")["experiment"]
        runs = api(url, creds, "/api/2.0/mlflow/runs/search", method="POST",
                   body={"experiment_ids": [experiment["experiment_id"]], "filter": "params.source = 'controller'",
                         "max_results": 10}).get("runs", [])
        assert logged_run in [run["info"]["run_id"] for run in runs]
