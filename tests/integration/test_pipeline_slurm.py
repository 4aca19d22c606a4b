"""The pipeline's train under Slurm (pipeline_scheduler slurm) on a real cluster: two workers,
each an Ansible host inside the network namespace of its own Slurm node (tests/slurm_cluster.py;
the modules run there through a python wrapper, so each worker has the node's address), run
playbooks/pipeline.yml. The train is due, so both workers are held as one Slurm job, torchrun
runs on each as a step of that job (srun), the ranks rendezvous across the namespaces, and the
job is released COMPLETED with its accounting from sacct. A second run and a check run submit
nothing. A job left queued by an interrupted run is found again and waited for, never doubled."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
import yaml

from conftest import ROOT
from slurm_cluster import Cluster
from test_pipeline_workers import TRAIN_PARAMS, play_env, recap, run_pipeline_play, train_line
from test_train_ddp import torch_python  # noqa: F401  # pylint: disable=unused-import  # the module-scoped torch venv fixture

pytestmark = pytest.mark.integration

BIN = ROOT / ".venv" / "bin"


class SlurmLab:
    def __init__(self, base: Path, cluster: Cluster, python: Path) -> None:
        self.base, self.cluster, self.python = base, cluster, python
        self.roots = {}
        hosts: Dict[str, Any] = {}
        for i, node in enumerate(cluster.node_names):
            host = "w%d" % (i + 1)
            wrapper = base / ("python-in-%s" % node)
            wrapper.write_text('#!/bin/sh\nexec ip netns exec %s %s "$@"\n' % (node, BIN / "python"))
            wrapper.chmod(0o755)
            self.roots[host] = base / host
            hosts[host] = {"ansible_connection": "local", "ansible_host": cluster.node_addrs[i],
                           "ansible_python_interpreter": str(wrapper), "pipeline_root": str(base / host),
                           "pipeline_slurm_node_name": node}
        self.inventory = base / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": hosts}}}}))
        self.runs = 0

    def play(self, *extra: str, check: bool = False) -> subprocess.CompletedProcess:
        evars = {"pipeline_python": str(self.python), "pipeline_dataset": {"rows": 1200, "features": 8, "seed": 5},
                 "pipeline_train_params": TRAIN_PARAMS, "pipeline_rendezvous_timeout": 120,
                 "pipeline_scheduler": "slurm", "pipeline_slurm_conf": self.cluster.conf,
                 "pipeline_slurm_account": "team-a", "pipeline_slurm_wait_timeout": 300}
        self.runs += 1
        return run_pipeline_play(self.base / ("play-%d.log" % self.runs), self.inventory, evars, extra, check)

    def jobs(self, *states: str) -> list:
        out = self.cluster.slurm("sacct", "--noheader", "--parsable2", "--allocations", "--allusers",
                                 "--starttime", "now-1days", "--format", "JobID,JobName,State,Account,NodeList")
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        return [r for r in rows if r[1].startswith("train-") and (not states or r[2] in states)]


@pytest.fixture(scope="module")
def slurm_lab(torch_python: Path, tmp_path_factory) -> Iterator[SlurmLab]:  # noqa: F811
    with Cluster(tmp_path_factory.mktemp("slurm-pipeline")) as cluster:
        yield SlurmLab(tmp_path_factory.mktemp("pipeline-slurm"), cluster, torch_python)


def test_the_train_runs_as_one_slurm_job_across_both_nodes_then_submits_nothing(slurm_lab: SlurmLab) -> None:
    first = slurm_lab.play()
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    assert train_line(first.stdout) == "ran" and "world size 2" in first.stdout
    jobs = slurm_lab.jobs()
    assert len(jobs) == 1, jobs
    job_id, name, state, account, nodes = jobs[0]
    assert state == "COMPLETED" and account == "team-a", jobs
    assert sorted(slurm_lab.cluster.slurm("scontrol", "show", "hostnames", nodes).split()) == \
        sorted(slurm_lab.cluster.node_names)
    line = re.search(r"slurm job (\d+) COMPLETED: nodes (\S+), account team-a, elapsed (\d+) s, 0 GPU\(s\), "
                     r"[0-9.]+ GPU-hours, ([0-9.]+) CPU-hours", " ".join(first.stdout.split()))
    assert line and line.group(1) == job_id and float(line.group(4)) > 0, first.stdout[-4000:]
    # Each rank ran as a step of that job on its own node: the reports name different hosts.
    r0 = json.loads((slurm_lab.roots["w1"] / "work" / "train" / "rank-0.json").read_text())
    r1 = json.loads((slurm_lab.roots["w2"] / "work" / "train" / "rank-1.json").read_text())
    assert (r0["world_size"], r1["world_size"]) == (2, 2) and r0["weights_sha256"] == r1["weights_sha256"]
    steps = slurm_lab.cluster.slurm("sacct", "--noheader", "--parsable2", "-j", job_id, "--format", "JobID,NodeList,State")
    step_nodes = sorted(s.split("|")[1] for s in steps.splitlines() if re.match(r"^\d+\.\d+\|", s))
    assert step_nodes == sorted(slurm_lab.cluster.node_names), steps

    for check in (True, False):
        again = slurm_lab.play(check=check)
        assert again.returncode == 0, again.stdout[-4000:]
        assert train_line(again.stdout) == "skipped" and "no worker due" in again.stdout
        assert all(v["changed"] == 0 for v in recap(again.stdout).values()), again.stdout[-3000:]
    assert len(slurm_lab.jobs()) == 1  # a skipped stage submitted nothing


def test_a_job_left_queued_by_an_interrupted_run_is_waited_for_not_doubled(slurm_lab: SlurmLab) -> None:
    # Another team's job holds every node; the forced train queues behind it and the play is
    # killed while it waits. The re-run finds that job by its name and waits for it.
    before = {job[0] for job in slurm_lab.jobs()}
    blocker = slurm_lab.cluster.slurm("sbatch", "--parsable", "-A", "team-b", "-N2", "--exclusive", "-J", "other-team",
                                      "--output", "/dev/null", "--wrap", "sleep 600").strip()
    evars = {"pipeline_python": str(slurm_lab.python), "pipeline_dataset": {"rows": 1200, "features": 8, "seed": 5},
             "pipeline_train_params": TRAIN_PARAMS, "pipeline_scheduler": "slurm", "pipeline_force": True,
             "pipeline_slurm_conf": slurm_lab.cluster.conf, "pipeline_slurm_account": "team-a"}
    play = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(slurm_lab.inventory), "playbooks/pipeline.yml",
                             "-e", json.dumps(evars)], cwd=str(ROOT), env=play_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not slurm_lab.jobs("PENDING"):
            assert time.monotonic() < deadline and play.poll() is None, "the train job was never queued"
            time.sleep(1)
    finally:
        if play.poll() is None:
            os.killpg(play.pid, 9)  # the interrupted play
        play.wait(30)
    queued = slurm_lab.jobs("PENDING")
    assert len(queued) == 1, queued

    slurm_lab.cluster.slurm("scancel", blocker)
    rerun = slurm_lab.play("-e", json.dumps({"pipeline_force": True}))
    assert rerun.returncode == 0, rerun.stdout[-6000:]
    # The blocker is gone, so the queued job may have started before the re-run looks: either way
    # the re-run names that job and waits for it.
    found = re.search(r"job %s \(%s\) was already (PENDING|RUNNING): waiting for it, not submitting another"
                      % (queued[0][0], queued[0][1]), " ".join(rerun.stdout.split()))
    assert found, rerun.stdout[-4000:]
    assert "slurm job %s COMPLETED" % queued[0][0] in " ".join(rerun.stdout.split())
    # One job for the interrupted run and its re-run, never two (the first test's job carries the
    # same name: a forced run of the same train key).
    assert [j[0] for j in slurm_lab.jobs() if j[0] not in before] == [queued[0][0]], slurm_lab.jobs()
