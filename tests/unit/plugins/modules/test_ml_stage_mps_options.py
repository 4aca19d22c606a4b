"""ml_stage's mps option without a daemon: validation, the daemon check's refusals, the key.

A real MPS control daemon needs a GPU. These tests never need one: they check what happens
when there is none (or when something that is not one sits in the pipe directory). The
integration test tests/integration/test_ml_stage_mps.py binds a real Unix socket named
`control` in place of the daemon, and tests/device/h200_mps.sh runs a stage under the real
daemon on an H200.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from test_ml_stage import _project, args, lock_bytes, ml, ok, runs, snapshot, warnings
from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit

DAEMON_FIX = "nvidia-cuda-mps-control -d"


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return _project(tmp_path)


def mps_args(proj: Path, mps: Dict[str, Any], **over: Any) -> Dict[str, Any]:
    return args(proj, mps=mps, **over)


# -- bad input: option, value and fix in the message; no run; the lock intact ------------------
BAD = [
    ("mps.active_thread_percentage", {"active_thread_percentage": 0}, "value 0 is not a whole number from 1 to 100",
     "give e.g. 50"),
    ("mps.active_thread_percentage", {"active_thread_percentage": 101}, "value 101 is not a whole number",
     "give e.g. 50"),
    ("mps.pinned_device_mem_limit", {"pinned_device_mem_limit": "2T"}, "value '2T' is not a device memory limit",
     "e.g. 0=16G"),
    ("mps.pinned_device_mem_limit", {"pinned_device_mem_limit": "0=2G,gpu1=1G"},
     "value '0=2G,gpu1=1G' is not a device memory limit ('gpu1=1G')", "e.g. 0=16G"),
    ("mps.pinned_device_mem_limit", {"pinned_device_mem_limit": "0=0G"}, "is not a device memory limit",
     "sizes in M or G"),
    ("mps.pinned_device_mem_limit", {"pinned_device_mem_limit": "0=2G,0=1G"}, "limits device 0 twice",
     "give each device index once"),
]


@pytest.mark.parametrize("option,mps,problem,fix", BAD, ids=["%s-%d" % (b[0], i) for i, b in enumerate(BAD)])
def test_bad_mps_settings_fail_clearly_without_running(proj: Path, tmp_path: Path, option: str,
                                                       mps: Dict[str, Any], problem: str, fix: str) -> None:
    ok(args(proj))
    before = lock_bytes(proj)
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    for check in (True, False):
        # force: the stage is due, so only validation can stop it
        res = ml(mps_args(proj, dict(mps, pipe_directory=str(pipe)), force=True), check=check)
        assert res["failed"], res
        assert res["msg"].startswith("option %s: " % option), res["msg"]
        assert problem in res["msg"] and fix in res["msg"], res["msg"]
        assert "Traceback" not in res.get("module_stderr", ""), res
    assert runs(proj) == 1 and lock_bytes(proj) == before


def test_missing_pipe_directory_fails_before_running_and_check_mode_reports_it(proj: Path, tmp_path: Path) -> None:
    ok(args(proj))
    lock = lock_bytes(proj)
    pipe = tmp_path / "no-such-pipe"
    a = mps_args(proj, {"pipe_directory": str(pipe), "active_thread_percentage": 50}, params={"lr": 0.5})
    before = snapshot(proj)
    predicted = ok(a, check=True)
    # check mode predicts the run and reports the missing daemon instead of failing
    assert predicted["changed"] is True and predicted["would_run"] is True, predicted
    assert "cannot be read (No such file or directory)" in predicted["mps"]["daemon"], predicted["mps"]
    assert any("mps.pipe_directory %s" % pipe in w and "a real run fails" in w for w in warnings(predicted))
    assert snapshot(proj) == before
    res = ml(a)
    assert res["failed"] and res["changed"] is False, res
    assert res["msg"].startswith("option mps.pipe_directory: value '%s' cannot be read" % pipe), res["msg"]
    assert DAEMON_FIX in res["msg"] and "mlinfra.kvm.nvidia_mps" in res["msg"], res["msg"]
    assert res["option"] == "mps.pipe_directory" and res["value"] == str(pipe)
    assert runs(proj) == 1 and lock_bytes(proj) == lock


@pytest.mark.parametrize("kind", ["empty", "file", "fifo", "not_a_dir"])
def test_pipe_directory_without_a_control_socket_is_refused(proj: Path, tmp_path: Path, kind: str) -> None:
    import os
    pipe = tmp_path / "pipe"
    if kind == "not_a_dir":
        pipe.write_text("a file, not a directory")
        expected = "is not a directory"
    else:
        pipe.mkdir()
        if kind == "file":
            (pipe / "control").write_text("not a socket")
        elif kind == "fifo":
            os.mkfifo(str(pipe / "control"))  # the daemon's other pipes are FIFOs: not the socket
        expected = ("holds no control socket" if kind == "empty"
                    else "holds %s, which is not a Unix socket" % (pipe / "control"))
    res = ml(mps_args(proj, {"pipe_directory": str(pipe)}))
    assert res["failed"] and expected in res["msg"] and DAEMON_FIX in res["msg"], res["msg"]
    assert res["msg"].startswith("option mps.pipe_directory: value '%s'" % pipe)
    assert runs(proj) == 0 and not (proj / ".ml_stage" / "prep.lock.json").exists()


def test_skipped_stage_checks_no_daemon_and_mps_is_not_in_the_key(proj: Path, tmp_path: Path) -> None:
    first = ok(args(proj))
    assert first["ran"] is True and first["mps"] is None
    # A pipe directory that does not exist: no failure, because an up-to-date stage starts no
    # CUDA client; and no re-run, because mps is not part of the key.
    a = mps_args(proj, {"pipe_directory": str(tmp_path / "absent"), "active_thread_percentage": 30,
                        "pinned_device_mem_limit": "8G"})
    for check in (True, False):
        res = ok(a, check=check)
        assert res["changed"] is False and res["reasons"] == [] and res["key"] == first["key"], res
        assert res["mps"]["daemon"] is None
        assert res["mps"]["env"] == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "absent"),
                                     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G"}
    assert runs(proj) == 1
    frozen = ok(dict(a, frozen=True, params={"lr": 9}))  # due but frozen: still no check, no run
    assert frozen["changed"] is False and frozen["would_run"] is True and frozen["mps"]["daemon"] is None
    assert runs(proj) == 1


def test_mps_variables_in_env_are_refused(proj: Path, tmp_path: Path) -> None:
    for option in ("env", "secret_env"):
        res = ml(mps_args(proj, {"pipe_directory": str(tmp_path)},
                          **{option: {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}}))
        assert res["failed"], res
        assert res["msg"].startswith("option env: value ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'] are set by "
                                     "ml_stage when mps is given; drop them"), res["msg"]
    assert runs(proj) == 0


def test_mps_without_pipe_directory_is_refused_by_the_argument_spec(proj: Path) -> None:
    res = ml(mps_args(proj, {"active_thread_percentage": 50}))
    assert res["failed"] and "pipe_directory" in res["msg"] and "mps" in res["msg"], res
    assert runs(proj) == 0


def test_mps_spec_env_tags_and_inherited_variables(tmp_path: Path) -> None:
    from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_mps import MpsSpec
    spec = MpsSpec({"pipe_directory": "pipe", "active_thread_percentage": 40,
                    "pinned_device_mem_limit": "0=16G, 1=8192M"}, str(tmp_path))
    assert spec.pipe_directory == str(tmp_path / "pipe")  # relative to chdir
    env = {"CUDA_MPS_LOG_DIRECTORY": "/inherited/log", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "90", "KEEP": "1"}
    spec.apply(env)
    assert env == {"KEEP": "1", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G,1=8192M"}
    assert spec.tags() == {"mlinfra.stage.mps.pipe_directory": str(tmp_path / "pipe"),
                           "mlinfra.stage.mps.active_thread_percentage": "40",
                           "mlinfra.stage.mps.pinned_device_mem_limit": "0=16G,1=8192M"}


# -- the pipeline role: pipeline_mps goes to the train stage; preflight checks its shape --------------
def _pipeline_play(tmp_path: Path, role_vars: Dict[str, Any]) -> Path:
    import yaml
    path = tmp_path / "play-pipeline.yml"
    # The inventory is "localhost,": localhost is the one worker of group ungrouped.
    role_vars = dict(role_vars, pipeline_worker_group="ungrouped")
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False,
                                     "roles": [{"role": "mlinfra.kvm.pipeline", "vars": role_vars}]}]))
    return path


@pytest.mark.parametrize("pipeline_mps,accepted", [
    ({}, True),
    ({"pipe_directory": "/run/nvidia-mps", "active_thread_percentage": 50, "pinned_device_mem_limit": "0=32G"}, True),
    ({"pipe_directory": "/run/nvidia-mps", "pinned_device_mem_limit": "32G"}, True),
    ({"active_thread_percentage": 50}, False),                                   # no pipe directory
    ({"pipe_directory": "run/nvidia-mps"}, False),                               # not absolute
    ({"pipe_directory": "/run/nvidia-mps", "active_thread_percentage": 0}, False),
    ({"pipe_directory": "/run/nvidia-mps", "pinned_device_mem_limit": "0=32T"}, False),
], ids=["off", "full", "bare-size", "no-pipe", "relative", "percentage-0", "size-T"])
def test_pipeline_preflight_checks_pipeline_mps(tmp_path: Path, pipeline_mps: Dict[str, Any], accepted: bool) -> None:
    proc = run_playbook(_pipeline_play(tmp_path, {"pipeline_mps": pipeline_mps}), "--check", "--tags", "preflight")
    if accepted:
        assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
        return
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed and "pipeline_mps=" in failed[0][1] and "is not a valid MPS setting" in failed[0][1], failed
    assert "/run/nvidia-mps" in failed[0][1]  # names the fix


def test_pipeline_passes_pipeline_mps_to_the_train_stage_only() -> None:
    import yaml
    from conftest import ROOT
    tasks = ROOT / "roles" / "pipeline" / "tasks"
    stages = yaml.safe_load((tasks / "stages.yml").read_text())
    assert [t["name"] for t in stages if "mps" in (t.get("mlinfra.kvm.ml_stage") or {})] == []
    # train.yml declares the train stage once (module_defaults of its block): plan and run.
    block = yaml.safe_load((tasks / "train.yml").read_text())[0]
    train = block["module_defaults"]["mlinfra.kvm.ml_stage"]
    assert train["name"] == "train"
    assert "pipeline_mps" in train["mps"] and "omit" in train["mps"], train["mps"]
    assert all("mps" not in (t.get("mlinfra.kvm.ml_stage") or {}) for t in block["block"])
