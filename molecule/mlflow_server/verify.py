"""Testinfra checks for the mlflow_server scenario (sqlite backend, basic auth).

The checks shared with the PostgreSQL scenario are inherited from MlflowServerChecks
(molecule/_shared/mlflow_checks.py); pytest collects them through the Test class below.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))

from mlflow_checks import MlflowServerChecks  # noqa: E402


class TestMlflowServerOnSqlite(MlflowServerChecks):

    def test_backend_store_is_sqlite_in_the_service_home(self, host):
        with host.sudo():
            env = host.file("/etc/mlflow/server.env").content_string
        store = [line for line in env.splitlines() if line.startswith("MLFLOW_BACKEND_STORE_URI=")]
        assert len(store) == 1 and store[0].startswith("MLFLOW_BACKEND_STORE_URI=sqlite:////var/lib/mlflow/"), store
