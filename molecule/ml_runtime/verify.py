"""Testinfra checks for the ml_runtime scenario: the pinned ML venv in a TCG guest.

Molecule's testinfra verifier runs this file with `--connection=ansible --hosts=all`.
"""
from __future__ import annotations

import json

import pytest

VENV = "/opt/mlinfra/venv"
PINS = {
    "numpy": "2.4.6",
    "pandas": "3.1.1",
    "pyarrow": "25.0.1",
    "scikit-learn": "1.9.1",
    "torch": "2.13.0+cpu",  # the CPU build: no CUDA wheels pulled into a guest without a GPU
    "mlflow-skinny": "3.17.2",
}

# One small training step: torch on CPU, a pandas/pyarrow round trip, sklearn scaling, mlflow import.
TRAINING_STEP = """
import io, json, numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq, torch, mlflow
from sklearn.preprocessing import StandardScaler
df = pd.DataFrame(np.random.default_rng(0).normal(size=(256, 4)), columns=list("abcd"))
buf = io.BytesIO(); pq.write_table(pa.Table.from_pandas(df), buf); buf.seek(0)
x = StandardScaler().fit_transform(pq.read_table(buf).to_pandas().values)
t = torch.tensor(x, dtype=torch.float32)
model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
before = float(torch.nn.functional.mse_loss(model(t), t[:, :1]))
for _ in range(20):
    opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(t), t[:, :1]); loss.backward(); opt.step()
print(json.dumps({"cuda": torch.cuda.is_available(), "before": before, "after": float(loss),
                  "torch": torch.__version__}))
"""


@pytest.fixture(scope="module")
def installed(host) -> dict:
    out = host.check_output("%s -m pip list --format=json --disable-pip-version-check", VENV + "/bin/python")
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def test_venv_is_a_python_3_11_venv_owned_by_root(host):
    venv = host.file(VENV)
    assert venv.is_directory and venv.user == "root"
    assert host.file(VENV + "/pyvenv.cfg").contains("^version = 3\\.11\\.")
    assert host.check_output("%s -c %s", VENV + "/bin/python", "import sys; print(sys.prefix)") == VENV


@pytest.mark.parametrize("name", sorted(PINS))
def test_pinned_version_is_installed(installed, name):
    assert installed.get(name) == PINS[name], (name, installed.get(name))


def test_system_packages(host):
    assert host.package("python3-venv").is_installed


def test_a_training_step_runs_and_lowers_the_loss(host):
    result = json.loads(host.check_output("%s -c %s", VENV + "/bin/python", TRAINING_STEP))
    assert result["torch"] == PINS["torch"] and result["cuda"] is False, result
    assert result["after"] < result["before"], result
