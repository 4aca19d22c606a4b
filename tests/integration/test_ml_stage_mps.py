"""ml_stage under MPS, with a real Unix socket named `control` standing in for the daemon.

What this proves: the module finds (or misses) the daemon's control socket, the command gets
the CUDA_MPS_* variables, the settings stay out of the cache key, and they reach the result and
the MLflow run's tags. What it cannot prove: that CUDA attaches to a daemon; that needs a GPU
and the real nvidia-cuda-mps-control, which tests/device/h200_mps.sh runs on an H200.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from conftest import four_ways, run_module_process
from mlflow_server import Server

pytestmark = pytest.mark.integration

# The command: its CUDA_MPS_* variables into env.json (the out), one line per run in runs.log.
SEE_ENV = (
    "import json, os\n"
    "open('runs.log', 'a').write('run\\n')\n"
    "json.dump({k: v for k, v in os.environ.items() if k.startswith('CUDA_MPS_')},"
    " open('env.json', 'w'), sort_keys=True)\n"
)


@pytest.fixture
def pipe_dir() -> Iterator[Path]:
    """A pipe directory whose `control` is a bound Unix socket, as the daemon leaves it.

    Under /tmp with a short name: a socket path must fit in sun_path (108 bytes), which
    pytest's tmp_path does not promise."""
    path = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path / "control"))
        yield path
    finally:
        sock.close()
        shutil.rmtree(str(path), ignore_errors=True)


def stage(proj: Path, mps: Dict[str, Any], **over: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {"name": "train", "chdir": str(proj), "cmd": [sys.executable, "-c", SEE_ENV],
                            "outs": ["env.json"], "params": {"lr": 0.01}, "mps": mps}
    args.update(over)
    return args


def runs(proj: Path) -> int:
    log = proj / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_stage_runs_as_an_mps_client_four_ways(pipe_dir: Path, tmp_path: Path) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    mps = {"pipe_directory": str(pipe_dir), "log_directory": str(tmp_path / "mps-log"),
           "active_thread_percentage": 50, "pinned_device_mem_limit": "0=2G"}
    expected_env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}
    res = four_ways("ml_stage", stage(proj, mps))
    assert runs(proj) == 1
    assert json.loads((proj / "env.json").read_text()) == expected_env   # what the command saw
    socket_ok = "ok: %s is a socket" % (pipe_dir / "control")
    assert res["check"]["mps"]["daemon"] == socket_ok and res["apply"]["mps"]["daemon"] == socket_ok
    assert res["apply"]["mps"]["env"] == expected_env
    assert res["check_again"]["mps"]["daemon"] is None      # skipped: nothing to check
    lock = json.loads((proj / ".ml_stage" / "train.lock.json").read_text())
    assert lock["run"]["mps"]["active_thread_percentage"] == 50
    assert "mps" not in lock["inputs"] and str(pipe_dir) not in json.dumps(lock["inputs"])

    # The thread share alone (or dropping mps) re-runs nothing: the settings are not in the key.
    for other in (dict(mps, active_thread_percentage=25), None):
        again = run_module_process("ml_stage", stage(proj, other))
        assert not again["failed"] and again["changed"] is False and again["key"] == res["apply"]["key"], again
    assert runs(proj) == 1

    # A change that makes the stage due, now without the daemon's socket: refused, nothing runs.
    (pipe_dir / "control").unlink()
    before = (proj / ".ml_stage" / "train.lock.json").read_bytes()
    failed = run_module_process("ml_stage", stage(proj, mps, params={"lr": 0.02}))
    assert failed["failed"] and failed["changed"] is False, failed
    assert failed["msg"].startswith("option mps.pipe_directory: value '%s' holds no control socket" % pipe_dir)
    assert "nvidia-cuda-mps-control -d" in failed["msg"] and "Traceback" not in json.dumps(failed)
    assert runs(proj) == 1 and (proj / ".ml_stage" / "train.lock.json").read_bytes() == before


def test_mps_settings_are_mlflow_tags(pipe_dir: Path, tmp_path: Path, mlflow_server: Server) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    mlflow = {"tracking_uri": mlflow_server.url, "experiment": "stage-mps"}
    res = run_module_process("ml_stage", stage(proj, {"pipe_directory": str(pipe_dir),
                                                      "active_thread_percentage": 30,
                                                      "pinned_device_mem_limit": "4G"}, mlflow=mlflow),
                             timeout=300)
    assert not res["failed"] and res["ran"], res
    tags = mlflow_server.run(res["mlflow_run_id"])["tags"]
    assert tags["mlinfra.stage.mps.pipe_directory"] == str(pipe_dir)
    assert tags["mlinfra.stage.mps.active_thread_percentage"] == "30"
    assert tags["mlinfra.stage.mps.pinned_device_mem_limit"] == "0=4G"   # a bare size is device 0
    assert "mlinfra.stage.mps.log_directory" not in tags                # unset: not tagged
    assert json.loads((proj / "env.json").read_text())["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"

    # Without the socket, a due stage fails before MLflow is contacted: no new run there.
    os.unlink(str(pipe_dir / "control"))
    failed = run_module_process("ml_stage", stage(proj, {"pipe_directory": str(pipe_dir)}, mlflow=mlflow,
                                                  params={"lr": 0.5}), timeout=300)
    assert failed["failed"] and "option mps.pipe_directory" in failed["msg"], failed
    assert len(mlflow_server.runs("stage-mps")) == 1
