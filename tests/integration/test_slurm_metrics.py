"""The Slurm collector of the monitoring role (roles/monitoring/files/mlinfra_slurm_state.py) once
against a real cluster (tests/slurm_cluster.py: slurmctld, slurmdbd on MariaDB, two slurmd in
namespaces of their own): a finished GPU job in slurmdbd's accounting, a running GPU job, a
job of another account pending for Resources, a drained node; then slurmdbd and slurmctld
stopped, which the collector publishes as down instead of failing."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, Tuple

import yaml

import pytest

from conftest import ROOT
from slurm_cluster import Cluster
from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.integration

SCRIPT = Path(ROOT) / "roles" / "monitoring" / "files" / "mlinfra_slurm_state.py"
DRAIN_REASON = "gpu 0 fell off the bus"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def wait_for(what: str, ready, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError("%s: not within %s s" % (what, timeout))
        time.sleep(0.5)


def collect(cluster: Cluster, tmp_path: Path) -> Tuple[int, Dict[str, float], str]:
    out = tmp_path / "mlinfra_slurm_state.prom"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--textfile", str(out), "--once", "--slurm-conf", cluster.conf,
                           "--command-timeout", "10"], capture_output=True, text=True, timeout=120, check=False)
    got = {}
    for line in out.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _sep, value = line.rpartition(" ")
            got[key] = float(value)
    return proc.returncode, got, proc.stderr


def job_state(cluster: Cluster, job_id: str) -> str:
    return cluster.slurm("squeue", "--noheader", "-j", job_id, "--format", "%T|%r").strip()


def test_queue_nodes_gpus_and_accounting_of_a_real_cluster(cluster, tmp_path):
    first, second = cluster.node_names
    done = cluster.slurm("sbatch", "--parsable", "-A", "team-a", "--gres=gpu:1", "-o", "/dev/null", "-w", second,
                         "--wrap", "sleep 2").strip()
    # slurmdbd records a job's end a little after slurmctld: wait until sacct has it.
    wait_for("job %s's end in sacct" % done, lambda: cluster.slurm(
        "sacct", "--noheader", "--parsable2", "--allocations", "-j", done, "-o", "State").strip() == "COMPLETED")
    cluster.slurm("scontrol", "update", "nodename=" + first, "state=drain", "reason=" + DRAIN_REASON)
    running = cluster.slurm("sbatch", "--parsable", "-A", "team-a", "--gres=gpu:1", "-o", "/dev/null",
                            "--wrap", "sleep 600").strip()
    wait_for("job %s running" % running, lambda: job_state(cluster, running).startswith("RUNNING"))
    pending = cluster.slurm("sbatch", "--parsable", "-A", "team-b", "--gres=gpu:1", "-o", "/dev/null",
                            "--wrap", "sleep 600").strip()
    wait_for("job %s pending for Resources" % pending, lambda: job_state(cluster, pending) == "PENDING|Resources")

    rc, got, stderr = collect(cluster, tmp_path)
    assert rc == 0, stderr
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 1
    assert got['mlinfra_slurm_up{daemon="slurmdbd"}'] == 1
    assert got['mlinfra_slurm_jobs{partition="gpu",state="RUNNING",reason=""}'] == 1
    assert got['mlinfra_slurm_jobs{partition="gpu",state="PENDING",reason="Resources"}'] == 1
    assert got['mlinfra_slurm_pending_oldest_seconds{partition="gpu",reason="Resources"}'] >= 0
    assert got['mlinfra_slurm_pending_oldest_gpus{partition="gpu",reason="Resources"}'] == 1
    assert got['mlinfra_slurm_node_state{node="%s",state="drained",reason="%s"}' % (first, DRAIN_REASON)] == 1
    assert got['mlinfra_slurm_node_state{node="%s",state="mixed",reason=""}' % second] == 1
    assert got['mlinfra_slurm_partition_gpus{partition="gpu"}'] == 2
    assert got['mlinfra_slurm_partition_gpus_allocated{partition="gpu"}'] == 1
    # The finished job's GPU-seconds and the running one's so far, from slurmdbd.
    assert got['mlinfra_slurm_account_gpu_hours{account="team-a"}'] > 0
    assert 'mlinfra_slurm_account_gpu_hours{account="team-b"}' not in got   # pending: no GPU time yet
    assert not [k for k in got if k.startswith("mlinfra_slurm_command_error")], got


def _play(tmp_path: Path, cluster: Cluster, textfiles: Path, script: Path) -> Path:
    play = tmp_path / "slurm_state.yml"
    play.write_text(yaml.safe_dump([{
        "name": "Slurm collector", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "collector", "ansible.builtin.include_role": {
            "name": "mlinfra.kvm.monitoring", "tasks_from": "slurm_state"}}],
        "vars": {"monitoring_slurm_state_path": str(script),
                 "monitoring_textfile_dir": str(textfiles), "monitoring_slurm_interval": 1,
                 "monitoring_slurm_conf": cluster.conf},
    }], sort_keys=False))
    return play


def _changed(proc: subprocess.CompletedProcess) -> int:
    found = re.findall(r"localhost\s*:.*changed=(\d+).*failed=(\d+)", proc.stdout)
    assert found and found[-1][1] == "0", (failures(proc), proc.stdout[-3000:])
    return int(found[-1][0])


@pytest.mark.skipif(os.path.exists("/run/systemd/system") or not shutil.which("daemon"),
                    reason="runs the init-script path (no systemd as PID 1, Debian's `daemon` installed)")
def test_the_role_runs_the_collector_four_ways_without_systemd(cluster, tmp_path):
    """The role's slurm_state tasks on this host (no systemd: an init script that runs the
    collector through `daemon --respawn`): check predicts, apply installs and starts, and both
    again report no change; the running collector publishes the real cluster's slurmctld as up."""
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    # Outside /tmp: `daemon` refuses a program under a world-writable directory.
    script = Path("/usr/local/sbin/mlinfra-slurm-state-test%d" % os.getpid())
    play = _play(tmp_path, cluster, textfiles, script)
    no_systemd = ("-e", json.dumps({"__monitoring_systemd": False}))  # over the role's own read of PID 1
    init = Path("/etc/init.d/mlinfra-slurm-state")
    assert not init.exists(), "an mlinfra-slurm-state init script is already installed on this host"
    try:
        assert _changed(run_playbook(play, "--check", *no_systemd)) > 0
        assert not init.exists()
        assert _changed(run_playbook(play, *no_systemd)) > 0
        assert _changed(run_playbook(play, "--check", *no_systemd)) == 0
        assert _changed(run_playbook(play, *no_systemd)) == 0
        prom = textfiles / "mlinfra_slurm_state.prom"
        wait_for("the collector's textfile", lambda: prom.exists()
                 and 'mlinfra_slurm_up{daemon="slurmctld"} 1' in prom.read_text(), timeout=60)
        assert "--slurm-conf %s" % cluster.conf in init.read_text()
    finally:
        if init.exists():
            subprocess.run([str(init), "stop"], capture_output=True, timeout=60, check=False)
            subprocess.run(["update-rc.d", "-f", "mlinfra-slurm-state", "remove"], capture_output=True, timeout=60,
                           check=False)
            init.unlink()
        if script.exists():
            script.unlink()


def test_stopped_daemons_are_published_as_down(cluster, tmp_path):
    """Last in this module: it stops the cluster's slurmdbd, then its slurmctld."""
    [dbd] = [p for p in cluster.procs if p.args[:1] == ["slurmdbd"]]
    dbd.send_signal(signal.SIGTERM)
    dbd.wait(30)
    rc, got, stderr = collect(cluster, tmp_path)
    assert rc == 1 and "sacctmgr_show_cluster failed" in stderr, stderr
    assert got['mlinfra_slurm_up{daemon="slurmdbd"}'] == 0
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 1
    assert not [k for k in got if k.startswith("mlinfra_slurm_account_gpu_hours{")]
    assert got['mlinfra_slurm_jobs{partition="gpu",state="RUNNING",reason=""}'] == 1  # the queue still reads

    cluster.slurmctld.send_signal(signal.SIGTERM)
    cluster.slurmctld.wait(30)
    rc, got, stderr = collect(cluster, tmp_path)
    assert rc == 1 and "squeue failed" in stderr, stderr
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 0
    assert got['mlinfra_slurm_command_success{command="squeue"}'] == 0
    assert [k for k in got if k.startswith('mlinfra_slurm_command_error{command="squeue"')]
    assert not [k for k in got if k.startswith(("mlinfra_slurm_jobs{", "mlinfra_slurm_node_state{"))]
