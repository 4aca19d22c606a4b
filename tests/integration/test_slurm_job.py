"""slurm_job against a real Slurm cluster (tests/slurm_cluster.py: slurmctld, slurmdbd on MariaDB,
two slurmd in namespaces of their own): gang allocation across both nodes, a job of another
account pending for Resources until the first is released, a re-run that finds the job an
interrupted run left, GPU-hours from slurmdbd's accounting, a killed rank that fails the job
and its MLflow run, and bad input refused before anything is submitted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from conftest import four_ways, module_env, run_module_process, ROOT
from slurm_cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture
def clean_queue(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.slurm("scancel", "--user", "root")
    deadline = time.monotonic() + 60
    while cluster.slurm("squeue", "--noheader").strip() and time.monotonic() < deadline:
        time.sleep(0.5)


def job_args(cluster: Cluster, name: str, **over: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {"name": name, "partition": "gpu", "account": "team-a", "nodes": 2, "gpus_per_node": 1,
                            "conf": cluster.conf, "poll_interval": 0.5, "wait_timeout": 120}
    args.update(over)
    return args


def queued(cluster: Cluster) -> list:
    return cluster.slurm("squeue", "--noheader", "--format", "%i|%j|%T|%r").split()


def sacct_record(cluster: Cluster, job_id: str) -> Dict[str, str]:
    fields = ["JobID", "State", "ElapsedRaw", "AllocTRES", "Account"]
    out = cluster.slurm("sacct", "--noheader", "--parsable2", "--allocations", "-j", job_id, "-o", ",".join(fields))
    return dict(zip(fields, out.splitlines()[0].split("|")))


def test_a_two_node_job_is_held_four_ways_and_its_ranks_report_different_hosts(cluster, clean_queue):
    runs = four_ways("slurm_job", job_args(cluster, "train-fourways"))
    assert runs["check"]["changed"] and runs["check"]["job_id"] is None, runs["check"]
    assert runs["apply"]["changed"] and runs["apply"]["state"] == "RUNNING", runs["apply"]
    job_id = runs["apply"]["job_id"]
    assert sorted(runs["apply"]["nodes"]) == sorted(cluster.node_names)
    for again in ("check_again", "apply_again"):
        assert not runs[again]["changed"] and runs[again]["attached"] and runs[again]["job_id"] == job_id, runs[again]
    assert len([line for line in queued(cluster) if "train-fourways" in line]) == 1

    hosts = cluster.slurm("srun", "--jobid", job_id, "--overlap", "-N2", "-n2", "hostname").split()
    assert sorted(hosts) == sorted(cluster.node_names)  # one rank per node, each on its own host
    time.sleep(1.5)  # at least one whole second of elapsed time in the accounting

    released = four_ways("slurm_job", job_args(cluster, "train-fourways", state="completed"))
    assert released["check"]["changed"] and released["check"]["job_id"] == job_id
    done = released["apply"]
    assert done["changed"] and done["state"] == "COMPLETED" and done["exit_code"] == "0:0", done
    record = sacct_record(cluster, job_id)
    assert record["State"] == "COMPLETED" and "gres/gpu=2" in record["AllocTRES"], record
    assert done["gpus"] == 2 and done["elapsed_s"] == int(record["ElapsedRaw"]) >= 1
    assert done["gpu_hours"] == pytest.approx(2 * int(record["ElapsedRaw"]) / 3600.0)
    for again in ("check_again", "apply_again"):
        assert not released[again]["changed"] and released[again]["job_id"] == job_id, released[again]
        assert released[again]["gpu_hours"] == done["gpu_hours"]


def test_a_job_of_another_account_pends_for_resources_then_runs(cluster, clean_queue):
    first = run_module_process("slurm_job", job_args(cluster, "train-first"))
    assert first["state"] == "RUNNING", first
    second = run_module_process("slurm_job", job_args(cluster, "train-second", account="team-b", nodes=1,
                                                      wait_timeout=0))
    assert second["changed"] and second["state"] == "PENDING" and second["account"] == "team-b", second
    deadline = time.monotonic() + 60  # the scheduler gives its reason on its next pass
    while "%s|train-second|PENDING|Resources" % second["job_id"] not in queued(cluster):
        assert time.monotonic() < deadline, queued(cluster)
        time.sleep(0.5)

    waiter = subprocess.Popen([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.slurm_job"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=module_env(), cwd=str(ROOT))
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": job_args(cluster, "train-second", account="team-b", nodes=1)})
    waiter.stdin.write(payload)
    waiter.stdin.close()
    time.sleep(2)
    assert waiter.poll() is None  # still waiting: the first job holds every GPU
    released = run_module_process("slurm_job", job_args(cluster, "train-first", state="completed"))
    assert released["state"] == "COMPLETED", released
    out = waiter.stdout.read()
    waiter.wait(60)
    result = json.loads(out[out.index("{"):])
    assert result["attached"] and result["job_id"] == second["job_id"] and result["state"] == "RUNNING", result
    assert any("PENDING (Resources)" in line for line in result["progress"]), result["progress"]
    assert any("RUNNING" in line for line in result["progress"]), result["progress"]


def test_a_rerun_after_an_interrupted_run_waits_for_the_job_it_left(cluster, clean_queue):
    blocker = run_module_process("slurm_job", job_args(cluster, "train-blocker"))
    assert blocker["state"] == "RUNNING"
    interrupted = subprocess.Popen([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.slurm_job"],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=module_env(),
                                   cwd=str(ROOT), start_new_session=True)
    interrupted.stdin.write(json.dumps({"ANSIBLE_MODULE_ARGS": job_args(cluster, "train-interrupted")}))
    interrupted.stdin.close()
    deadline = time.monotonic() + 30
    while not [l for l in queued(cluster) if "train-interrupted" in l] and time.monotonic() < deadline:
        time.sleep(0.3)
    os.killpg(interrupted.pid, signal.SIGKILL)  # the play is killed while its job is queued
    interrupted.wait(10)
    left = [l for l in queued(cluster) if "train-interrupted" in l]
    assert len(left) == 1 and "PENDING" in left[0], left

    rerun = run_module_process("slurm_job", job_args(cluster, "train-interrupted", wait_timeout=0))
    assert rerun["attached"] and not rerun["changed"] and rerun["job_id"] == left[0].split("|")[0], rerun
    assert any("not submitting another" in line for line in rerun["progress"])
    assert len([l for l in queued(cluster) if "train-interrupted" in l]) == 1  # never two jobs for one run

    gone = run_module_process("slurm_job", job_args(cluster, "train-interrupted", state="absent"))
    assert gone["changed"] and gone["job_id"] == rerun["job_id"]


def test_a_killed_rank_fails_the_stage_its_job_and_its_mlflow_run(cluster, clean_queue, mlflow_server, tmp_path):
    held = run_module_process("slurm_job", job_args(cluster, "train-killed"))
    job_id = held["job_id"]
    victim = cluster.node_names[1]
    # The stage's command is its job's step on both nodes; the rank on the second node is
    # SIGKILLed while the other finishes, so the step, and with it the stage, fails.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("1")
    stage = {"name": "train", "chdir": str(tmp_path), "deps": ["data/"], "outs": ["out/"],
             "launcher": ["srun", "--jobid", job_id, "--overlap", "-N2", "-n2"],
             "cmd": ["sh", "-c", 'if [ "$(hostname)" = "%s" ]; then kill -9 $$; fi; sleep 1' % victim],
             "env": {"SLURM_CONF": cluster.conf},
             "mlflow": {"tracking_uri": mlflow_server.url, "experiment": "slurm-killed-rank-%d" % os.getpid()}}
    failed = run_module_process("ml_stage", stage, timeout=300)
    assert failed["failed"] and failed.get("mlflow_run_id"), failed
    run_id = failed["mlflow_run_id"]
    assert mlflow_server.run(run_id)["info"]["status"] == "FAILED"

    released = run_module_process("slurm_job", job_args(cluster, "train-killed", state="failed",
                                                        mlflow={"tracking_uri": mlflow_server.url, "run_id": run_id}))
    assert released["state"] == "FAILED" and released["exit_code"] == "1:0", released
    assert sacct_record(cluster, job_id)["State"] == "FAILED"
    run = mlflow_server.run(run_id)
    assert run["tags"]["slurm.job_id"] == job_id and run["tags"]["slurm.state"] == "FAILED", run["tags"]
    assert run["tags"]["slurm.nodes"] == ",".join(sorted(cluster.node_names))
    assert run["metrics"]["slurm_gpu_hours"] == pytest.approx(released["gpu_hours"])

    successor = run_module_process("slurm_job", job_args(cluster, "train-killed", wait_timeout=0))
    assert successor["predecessor"] == {"job_id": job_id, "state": "FAILED"}, successor


def test_a_stage_runs_as_steps_of_its_job_and_the_job_is_not_part_of_its_key(cluster, clean_queue, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("1")
    stage = {"name": "train", "chdir": str(tmp_path), "deps": ["data/"], "outs": ["out/"],
             "cmd": ["sh", "-c", 'mkdir -p out && hostname > "out/$(hostname)"'], "env": {"SLURM_CONF": cluster.conf}}
    first = run_module_process("slurm_job", job_args(cluster, "train-steps-1"))
    step = ["srun", "--jobid", first["job_id"], "--overlap", "-N1", "-n1", "--nodelist", cluster.node_names[1]]
    ran = run_module_process("ml_stage", dict(stage, launcher=step))
    assert ran["changed"] and ran["ran"], ran
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [cluster.node_names[1]]  # ran on that node
    run_module_process("slurm_job", job_args(cluster, "train-steps-1", state="completed"))

    second = run_module_process("slurm_job", job_args(cluster, "train-steps-2"))
    step = ["srun", "--jobid", second["job_id"], "--overlap", "-N1", "-n1"]
    again = run_module_process("ml_stage", dict(stage, launcher=step))
    assert not again["changed"] and not again["would_run"] and again["key"] == ran["key"], again
    bad = run_module_process("ml_stage", dict(stage, launcher=["no-such-srun"]))
    assert bad["failed"] and "launcher" in bad["msg"] and "no-such-srun" in bad["msg"], bad


@pytest.mark.parametrize("over,option,words", [
    ({"partition": "nope"}, "partition", "not a partition"),
    ({"nodes": 3, "nodelist": []}, "nodes", "more than partition gpu has in total (2)"),
    ({"gpus_per_node": 2}, "gpus_per_node", "the partition has 2 GPUs in total"),
    ({"account": "team-z"}, "account", "not a Slurm account"),
    ({"qos": "platinum"}, "qos", "not a Slurm QOS"),
    ({"nodes": 1, "nodelist": ["not-a-node"]}, "nodelist", "not a Slurm node of partition gpu"),
])
def test_bad_input_is_refused_before_anything_is_submitted(cluster, clean_queue, over, option, words):
    for check in (True, False):
        res = run_module_process("slurm_job", job_args(cluster, "train-bad", **over), check=check)
        assert res["failed"] and option in res["msg"] and words in res["msg"], res
        assert "Traceback" not in res["msg"]
    assert queued(cluster) == []


def test_an_unreachable_controller_is_named_with_its_port(cluster, tmp_path):
    conf = Path(cluster.conf).read_text().replace("SlurmctldPort=%d" % cluster.ports["slurmctld"], "SlurmctldPort=9")
    copy = tmp_path / "slurm.conf"
    copy.write_text(conf)
    res = run_module_process("slurm_job", job_args(cluster, "train-nowhere", conf=str(copy), command_timeout=30))
    assert res["failed"] and "no Slurm controller answers at" in res["msg"] and "port 9" in res["msg"], res
