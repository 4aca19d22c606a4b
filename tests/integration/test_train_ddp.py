"""The pipeline's train stage (roles/pipeline/files/train.py) under torchrun: real DDP over gloo
on loopback, two CPU ranks, plus the plain `python train.py` path.

The project's venv has no torch: a module fixture builds one from the ML runtime's own pins
(roles/ml_runtime/defaults/main.yml, ml_runtime_packages) under <repo>/.cache/torch-venv-<hash>,
reused while the pins and the Python are the same. The machine's pip configuration says where
the CPU torch comes from. torchrun is run as `python -m torch.distributed.run` (its entry
point), so the venv still works after the build is renamed into place.

Each training run goes through a small wrapper that records, per rank, the files the rank moved
into place (os.replace) and whether it imported mlflow: the proof that only rank 0 writes the
model and the metrics and logs to MLflow.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from conftest import ROOT
from mlflow_server import Server

pytestmark = pytest.mark.integration

FILES = ROOT / "roles" / "pipeline" / "files"
TRAIN = FILES / "train.py"
TRAIN_ROWS = 1600  # 2000 generated rows, test_fraction 0.2
PARAMS = {"epochs": 4, "lr": 0.003, "hidden": [32, 16], "dropout": 0.1, "batch_size": 200,
          "seed": 7, "precision": "auto", "dist_timeout_s": 60}
# Records, per rank, what it moved into place and whether it imported mlflow; then runs train.py.
# WRAP_SLOW_METRICS_S: rank 0 takes that many seconds to move metrics.json into place, the way
# its save and MLflow upload after the last all-reduce outlast dist_timeout_s on a TCG guest.
WRAPPER = r'''
import atexit, json, os, runpy, sys, time
moved, real_replace = [], os.replace
def replace(src, dst, *args, **kwargs):
    name = os.path.basename(os.fspath(dst))
    if name == "metrics.json" and os.environ.get("RANK") == "0" and os.environ.get("WRAP_SLOW_METRICS_S"):
        time.sleep(float(os.environ["WRAP_SLOW_METRICS_S"]))
    moved.append(name)
    return real_replace(src, dst, *args, **kwargs)
os.replace = replace
@atexit.register
def record():
    path = os.path.join(os.environ["WRAP_LOG_DIR"], "wrap-%s.json" % os.environ.get("RANK", "plain"))
    with open(path, "w") as handle:
        json.dump({"moved": moved, "mlflow_imported": "mlflow" in sys.modules}, handle)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''
SCRUB = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RUN_ID", "PYTHONPATH", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI",
         "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "ML_TRAIN_RANK_REPORT_DIR",
         "ML_TRAIN_DIE_AT_EPOCH", "ML_TRAIN_DIE_RANK", "ML_TRAIN_DIST_BACKEND")


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# -- the torch venv ---------------------------------------------------------------------------

def _runtime_pins() -> List[str]:
    defaults = yaml.safe_load((ROOT / "roles" / "ml_runtime" / "defaults" / "main.yml").read_text())
    return [str(p) for p in defaults["ml_runtime_packages"]]


@pytest.fixture(scope="module")
def torch_python() -> Path:
    pins = _runtime_pins()
    key = json.dumps({"pins": pins, "python": "%d.%d" % sys.version_info[:2], "machine": platform.machine()})
    venv = ROOT / ".cache" / ("torch-venv-" + hashlib.sha256(key.encode()).hexdigest()[:12])
    python = venv / "bin" / "python"
    if python.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    build = venv.with_name("%s.build-%d" % (venv.name, os.getpid()))
    shutil.rmtree(build, ignore_errors=True)
    try:
        for cmd in ([sys.executable, "-m", "venv", str(build)],
                    [str(build / "bin" / "python"), "-m", "pip", "install", "-q", "--no-input",
                     "--disable-pip-version-check", "--no-compile", *pins]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, check=False,
                                  env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
            if proc.returncode != 0:
                pytest.fail("building the torch venv failed: %s (rc %d)\n%s"
                            % (" ".join(cmd[:4]), proc.returncode, (proc.stdout + proc.stderr)[-4000:]))
        try:
            build.rename(venv)  # whole or not at all: a killed build leaves only *.build-PID
        except OSError:
            if not python.exists():  # else another session finished the same venv first
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return python


# -- data and runs ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ddp-data")
    for script, args, params in (
            ("generate.py", [base / "dataset.parquet"], {"rows": 2000, "features": 16, "seed": 11}),
            ("prepare.py", [base / "dataset.parquet", base / "prepared"], {"test_fraction": 0.2, "seed": 13})):
        (base / "params.json").write_text(json.dumps(params))
        proc = subprocess.run([str(torch_python), str(FILES / script), *map(str, args)], cwd=str(base),
                              env=dict(_env(), ML_STAGE_PARAMS=str(base / "params.json")),
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return base / "prepared"


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    # CPU ranks and gloo on loopback, also on a machine with GPUs; one thread per rank.
    env.update(CUDA_VISIBLE_DEVICES="", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class Run:
    def __init__(self, rc: int, out: str, err: str, seconds: float, work: Path) -> None:
        self.rc, self.out, self.err, self.seconds, self.work = rc, out, err, seconds, work

    def tail(self) -> str:
        return "rc=%s after %.1f s\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.seconds, self.out[-3000:],
                                                                 self.err[-5000:])

    def result_lines(self) -> List[Dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]

    def report(self, rank: int) -> Dict[str, Any]:
        return json.loads((self.work / "reports" / ("rank-%d.json" % rank)).read_text())

    def wrap(self, name: str) -> Dict[str, Any]:
        return json.loads((self.work / ("wrap-%s.json" % name)).read_text())


@pytest.fixture
def train(torch_python: Path, prepared: Path, tmp_path: Path):
    """train(nproc=2 | None for plain python, params=..., env=...) -> Run; every process
    group it starts is killed at teardown, whatever happened."""
    procs: List[subprocess.Popen] = []

    def _train(nproc: Optional[int] = 2, params: Optional[Dict[str, Any]] = None,
               timeout: float = 180, **env: str) -> Run:
        work = tmp_path / ("run-%d" % len(procs))
        work.mkdir()
        (work / "params.json").write_text(json.dumps(params or PARAMS))
        (work / "wrap.py").write_text(WRAPPER)
        launcher = [str(torch_python)]
        if nproc:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                         "--nproc-per-node=%d" % nproc]
        cmd = launcher + [str(work / "wrap.py"), str(TRAIN), str(prepared), str(work / "model.pt"),
                          str(work / "metrics.json")]
        run_env = _env(ML_STAGE_PARAMS=str(work / "params.json"), WRAP_LOG_DIR=str(work),
                       ML_TRAIN_RANK_REPORT_DIR=str(work / "reports"), **env)
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=str(work), env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc)
            pytest.fail("%s did not finish in %d s" % (" ".join(cmd[:6]), timeout))
        return Run(proc.returncode, out, err, time.monotonic() - start, work)

    yield _train
    for proc in procs:
        _killpg(proc)


# -- the tests --------------------------------------------------------------------------------

def test_two_ranks_train_disjoint_shards_to_identical_weights(train) -> None:
    run = train(nproc=2)
    assert run.rc == 0, run.tail()
    reports = [run.report(0), run.report(1)]
    shards = [set(r["shard_indices"]) for r in reports]
    for rank, (report, rows) in enumerate(zip(reports, shards)):
        assert (report["rank"], report["world_size"], report["backend"]) == (rank, 2, "gloo"), report
        assert report["device"] == "cpu"
        assert len(rows) == len(report["shard_indices"]) == report["shard_rows"] == TRAIN_ROWS // 2
    assert not shards[0] & shards[1], "the ranks' shards overlap"
    assert shards[0] | shards[1] <= set(range(TRAIN_ROWS))
    assert reports[0]["weights_sha256"] == reports[1]["weights_sha256"], "DDP replicas diverged"

    # rank 0 alone wrote the model and the metrics, once each, and printed the result
    assert run.wrap("0")["moved"] == ["rank-0.json", "model.pt", "metrics.json"]
    assert run.wrap("1")["moved"] == ["rank-1.json"]
    assert not run.wrap("0")["mlflow_imported"] and not run.wrap("1")["mlflow_imported"]
    assert sorted(p.name for p in run.work.iterdir() if p.suffix in (".pt", ".json", ".tmp")) == \
        ["metrics.json", "model.pt", "params.json", "wrap-0.json", "wrap-1.json"]
    metrics = json.loads((run.work / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["backend"] == "gloo" and metrics["epochs"] == 4
    assert metrics["test_rmse"] > 0 and metrics["rows_per_s"] > 0
    [line] = run.result_lines()
    assert line["world_size"] == 2 and line["backend"] == "gloo" and line["test_rmse"] == metrics["test_rmse"]


def test_only_rank_zero_logs_to_mlflow(train, mlflow_server: Server) -> None:
    server = mlflow_server
    exp = server.api("POST", "mlflow/experiments/create", {"name": "ddp-train"})["experiment_id"]
    run_id = server.api("POST", "mlflow/runs/create",
                        {"experiment_id": exp, "start_time": int(time.time() * 1000)})["run"]["info"]["run_id"]
    params = dict(PARAMS, epochs=3, batch_size=0)
    run = train(nproc=2, params=params, MLFLOW_RUN_ID=run_id, MLFLOW_TRACKING_URI=server.url)
    assert run.rc == 0, run.tail()
    assert run.wrap("0")["mlflow_imported"] and not run.wrap("1")["mlflow_imported"]
    got = server.run(run_id)
    assert got["info"]["status"] == "FINISHED"
    assert got["metrics"]["world_size"] == 2 and got["metrics"]["epochs"] == 3
    assert got["metrics"]["test_rmse"] > 0 and "rows_per_s" in got["metrics"]
    history = server.api("GET", "mlflow/metrics/get-history",
                         query={"run_id": run_id, "metric_key": "train_loss"})["metrics"]
    assert sorted(m["step"] for m in history) == [0, 1, 2], "one train_loss per epoch, not per rank"
    assert [m["value"] for m in sorted(history, key=lambda m: m["step"])][-1] == \
        pytest.approx(got["metrics"]["final_train_loss"])
    assert server.artifacts(run_id, "model") == ["model/model.pt"]


def test_plain_python_is_one_process_without_a_group(train) -> None:
    run = train(nproc=None)
    assert run.rc == 0, run.tail()
    [line] = run.result_lines()
    assert line["world_size"] == 1 and line["backend"] is None and line["device"] == "cpu"
    metrics = json.loads((run.work / "metrics.json").read_text())
    assert metrics["world_size"] == 1 and metrics["epochs"] == 4 and metrics["test_rmse"] > 0
    report = run.report(0)
    assert report["shard_indices"] == list(range(TRAIN_ROWS)) and report["shard_rows"] == TRAIN_ROWS
    assert run.wrap("plain")["moved"] == ["rank-0.json", "model.pt", "metrics.json"]


def test_full_batch_on_two_ranks_follows_one_process(train) -> None:
    """Without dropout a full-batch step sees the same mean gradient whether one process holds
    all rows or two ranks hold half each and all-reduce: the same model, to rounding."""
    params = dict(PARAMS, dropout=0.0, batch_size=0, epochs=5)
    one, two = train(nproc=None, params=params), train(nproc=2, params=params)
    assert one.rc == 0 and two.rc == 0, one.tail() + two.tail()
    [single], [ddp] = one.result_lines(), two.result_lines()
    assert (single["world_size"], ddp["world_size"]) == (1, 2)
    for key in ("final_train_loss", "test_mse"):
        assert ddp[key] == pytest.approx(single[key], rel=1e-5), (key, single, ddp)


def test_a_dead_rank_fails_the_run(train) -> None:
    params = dict(PARAMS, epochs=50)
    run = train(nproc=2, params=params, ML_TRAIN_DIE_AT_EPOCH="2", ML_TRAIN_DIE_RANK="1")
    assert run.rc != 0, run.tail()
    assert "rank 1: ML_TRAIN_DIE_AT_EPOCH=2" in run.err, run.tail()
    assert not (run.work / "model.pt").exists() and not (run.work / "metrics.json").exists()
    assert not run.result_lines()


def test_rank_zero_may_finish_after_the_collective_timeout(train) -> None:
    """The ranks leave through a barrier bounded by dist_finish_timeout_s: rank 1 waits there
    longer than dist_timeout_s while rank 0 saves (a stage-train failure once seen in the lab)."""
    params = dict(PARAMS, epochs=2, dist_timeout_s=15)
    run = train(nproc=2, params=params, WRAP_SLOW_METRICS_S="30")
    assert run.rc == 0, run.tail()
    assert run.wrap("0")["moved"][-1] == "metrics.json" and run.wrap("1")["moved"] == ["rank-1.json"]
    [line] = run.result_lines()
    assert line["world_size"] == 2


def test_a_stuck_rank_zero_fails_the_job_at_the_finish_timeout(train) -> None:
    params = dict(PARAMS, epochs=2, dist_timeout_s=15, dist_finish_timeout_s=5)
    run = train(nproc=2, params=params, WRAP_SLOW_METRICS_S="120")
    assert run.rc != 0, run.tail()
    assert "rank 1 of 2 failed" in run.err, run.tail()
    # torchrun stopped rank 0 while it was still saving: the job did not wait for it
    assert not (run.work / "metrics.json").exists() and not run.result_lines(), run.tail()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_zero_exits_by_itself_when_its_peer_dies(torch_python: Path, prepared: Path,
                                                      tmp_path: Path) -> None:
    """No torchrun agent to stop the survivor: train.py itself must not hang on a dead peer."""
    (tmp_path / "params.json").write_text(json.dumps(dict(PARAMS, epochs=50, dist_timeout_s=30)))
    port = str(_free_port())
    procs = []
    try:
        for rank in (0, 1):
            env = _env(ML_STAGE_PARAMS=str(tmp_path / "params.json"), RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       ML_TRAIN_DIE_AT_EPOCH="2", ML_TRAIN_DIE_RANK="1")
            procs.append(subprocess.Popen(
                [str(torch_python), str(TRAIN), str(prepared), str(tmp_path / "model.pt"),
                 str(tmp_path / "metrics.json")], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True))
        outs = []
        for proc in procs:
            try:
                outs.append(proc.communicate(timeout=180))
            except subprocess.TimeoutExpired:
                pytest.fail("rank %d still running after 180 s (dist_timeout_s 30)" % procs.index(proc))
        assert procs[1].returncode == 1, outs[1]
        assert procs[0].returncode not in (0, None), outs[0]
        assert "rank 0 of 2 failed" in outs[0][1], outs[0][1][-3000:]
        assert not (tmp_path / "model.pt").exists() and not (tmp_path / "metrics.json").exists()
    finally:
        for proc in procs:
            _killpg(proc)
