"""roles/monitoring/files/mlinfra_slurm_state.py, the Slurm collector for node_exporter's textfile
directory, on outputs recorded from the real test cluster (tests/unit/monitoring/slurm/, made by
record_outputs.py there: one GPU job finished, one running for team-a, one pending for Resources
for team-b, node 1 drained with a reason).

The parsing is checked on those recordings at their recording time; the script itself runs as a
process against stand-in Slurm commands (shell scripts on PATH that print the recordings, fail,
hang or are missing), so its timeouts and its never-crash promise are exercised for real.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = Path(ROOT) / "roles" / "monitoring" / "files" / "mlinfra_slurm_state.py"
RECORDED = Path(__file__).resolve().parent / "monitoring" / "slurm"
RECORDED_AT = float((RECORDED / "recorded_at.txt").read_text())
COMMANDS = ("scontrol", "squeue", "sinfo", "sacctmgr", "sacct")
OUTPUT_OF = {"scontrol": "scontrol_ping.txt", "squeue": "squeue.json", "sinfo": "sinfo.json",
             "sacctmgr": "sacctmgr_cluster.txt", "sacct": "sacct.txt"}


def load_collector():
    spec = importlib.util.spec_from_file_location("mlinfra_slurm_state", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


collector = load_collector()


def recorded_json(name: str) -> dict:
    return json.loads((RECORDED / name).read_text())


def node_names() -> List[str]:
    return sorted(node["name"] for node in recorded_json("sinfo.json")["nodes"])


def samples(text: str) -> Dict[str, float]:
    """{'name{labels}': value} of an exposition text."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _sep, value = line.rpartition(" ")
            out[key] = float(value)
    return out


# --------------------------------------------------------------------------- parsing


def test_jobs_by_partition_state_and_reason_with_the_oldest_pending():
    squeue = recorded_json("squeue.json")
    counts, oldest = collector.job_summary(squeue, RECORDED_AT)
    # The finished job that squeue still lists is not part of the queue.
    assert counts == {("gpu", "RUNNING", ""): 1, ("gpu", "PENDING", "Resources"): 1}
    [pending] = [j for j in squeue["jobs"] if j["job_state"] == "PENDING"]
    assert oldest == {("gpu", "Resources"): (RECORDED_AT - pending["submit_time"], 1)}


def test_node_states_with_the_drain_reason_and_partition_gpus():
    nodes, partitions = collector.node_summary(recorded_json("sinfo.json"))
    first, second = node_names()
    assert nodes == [(first, "drained", "gpu 0 fell off the bus"), (second, "mixed", "")]
    assert partitions == {"gpu": (2, 1)}


@pytest.mark.parametrize("base, flags, word", [
    ("idle", ["DRAIN"], "drained"), ("mixed", ["DRAIN"], "draining"), ("allocated", ["DRAIN"], "draining"),
    ("down", ["DRAIN"], "drained"), ("down", ["NOT_RESPONDING"], "down"), ("idle", [], "idle"),
])
def test_node_state_words_follow_sinfo(base, flags, word):
    assert collector.node_state({"state": base, "state_flags": flags}) == word


def test_gpu_hours_per_account_inside_the_window():
    text = (RECORDED / "sacct.txt").read_text()
    rows = [line.split("|") for line in text.splitlines()]
    finished = [r for r in rows if r[3].isdigit()]
    running = [r for r in rows if r[2].isdigit() and not r[3].isdigit()]
    assert finished and running, "the recording holds a finished and a running GPU job"
    expected = sum(int(r[3]) - int(r[2]) for r in finished) + sum(RECORDED_AT - int(r[2]) for r in running)
    hours = collector.account_gpu_hours(text, RECORDED_AT - 86400, RECORDED_AT)
    assert hours == {"team-a": pytest.approx(expected / 3600.0)}  # the pending team-b job has no start yet
    # A window that starts after the finished job counts only the running one's share of it.
    later = int(finished[0][3]) + 1
    share = RECORDED_AT - max(later, int(running[0][2]))
    assert collector.account_gpu_hours(text, later, RECORDED_AT) == {"team-a": pytest.approx(share / 3600.0)}


def test_tres_gpus_reads_the_untyped_total():
    assert collector.tres_gpus("cpu=4,gres/gpu=2,gres/gpu:a100=2,node=1") == 2
    assert collector.tres_gpus("cpu=4,node=1") == 0
    assert collector.tres_gpus(None) == 0


# --------------------------------------------------------------------------- the script as a process


def fake_slurm(tmp_path: Path, override: Dict[str, str] = None) -> Dict[str, str]:
    """A PATH whose Slurm commands print the recordings; `override` replaces a command's script
    body ("" leaves the command out)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in COMMANDS:
        body = (override or {}).get(command, 'exec /bin/cat "%s"' % (RECORDED / OUTPUT_OF[command]))
        if body == "":
            continue
        path = bin_dir / command
        path.write_text("#!/bin/sh\n%s\n" % body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PATH"] = str(bin_dir)  # only these: the host's own Slurm commands stay out of reach
    return env


def run_once(tmp_path: Path, env: Dict[str, str], *extra: str) -> Tuple[subprocess.CompletedProcess, Dict[str, float], str]:
    out = tmp_path / "mlinfra_slurm_state.prom"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--textfile", str(out), "--once", *extra],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    text = out.read_text() if out.exists() else ""
    return proc, samples(text), text


def test_the_script_publishes_queue_nodes_gpus_and_accounting(tmp_path):
    proc, got, text = run_once(tmp_path, fake_slurm(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first, second = node_names()
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 1
    assert got['mlinfra_slurm_up{daemon="slurmdbd"}'] == 1
    assert got['mlinfra_slurm_jobs{partition="gpu",state="RUNNING",reason=""}'] == 1
    assert got['mlinfra_slurm_jobs{partition="gpu",state="PENDING",reason="Resources"}'] == 1
    assert got['mlinfra_slurm_pending_oldest_gpus{partition="gpu",reason="Resources"}'] == 1
    assert got['mlinfra_slurm_pending_oldest_seconds{partition="gpu",reason="Resources"}'] >= RECORDED_AT - max(
        j["submit_time"] for j in recorded_json("squeue.json")["jobs"])
    assert got['mlinfra_slurm_node_state{node="%s",state="drained",reason="gpu 0 fell off the bus"}' % first] == 1
    assert got['mlinfra_slurm_node_state{node="%s",state="mixed",reason=""}' % second] == 1
    assert got['mlinfra_slurm_partition_gpus{partition="gpu"}'] == 2
    assert got['mlinfra_slurm_partition_gpus_allocated{partition="gpu"}'] == 1
    assert got['mlinfra_slurm_account_gpu_hours{account="team-a"}'] > 0
    assert got["mlinfra_slurm_gpu_usage_window_seconds"] == 30 * 86400
    assert all(got['mlinfra_slurm_command_success{command="%s"}' % c] == 1
               for c in ("scontrol_ping", "squeue", "sinfo", "sacctmgr_show_cluster", "sacct"))
    assert not [k for k in got if k.startswith("mlinfra_slurm_command_error")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "mlinfra_slurm_state.prom"]  # no temporary left
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                               timeout=60, check=False)
        # Parsed (exit 0, or 3 for lint findings); the one lint finding allowed is the unit of
        # the GPU-hours, kept in hours because people read it so.
        lint = [line for line in check.stderr.splitlines()
                if line and line != 'mlinfra_slurm_account_gpu_hours use base unit "seconds" instead of "hours"']
        assert check.returncode in (0, 3) and not lint, check.stdout + check.stderr


def test_a_controller_that_is_down_is_published_with_its_error_not_a_crash(tmp_path):
    refused = 'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1'
    env = fake_slurm(tmp_path, {"scontrol": 'echo "Slurmctld(primary) at head is DOWN"; exit 1',
                                "squeue": refused, "sinfo": refused})
    proc, got, _text = run_once(tmp_path, env)
    assert proc.returncode == 1
    assert "squeue failed: exit 1: slurm_load_jobs error: Unable to contact slurm controller" in proc.stderr
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 0
    assert got['mlinfra_slurm_up{daemon="slurmdbd"}'] == 1
    assert got['mlinfra_slurm_command_success{command="squeue"}'] == 0
    assert got['mlinfra_slurm_command_error{command="squeue",error="exit 1: slurm_load_jobs error: '
               'Unable to contact slurm controller (connect failure)"}'] == 1
    # No queue or node lines at all: never stale ones, never zeros that read as "empty queue".
    assert not [k for k in got if k.startswith(("mlinfra_slurm_jobs", "mlinfra_slurm_node_state"))]
    assert got['mlinfra_slurm_account_gpu_hours{account="team-a"}'] > 0  # slurmdbd still answers


def test_a_hanging_or_missing_command_is_bounded(tmp_path):
    env = fake_slurm(tmp_path, {"sacctmgr": "exec /bin/sleep 60", "sacct": ""})
    proc, got, _text = run_once(tmp_path, env, "--command-timeout", "1")
    assert proc.returncode == 1
    assert got['mlinfra_slurm_up{daemon="slurmdbd"}'] == 0
    assert got['mlinfra_slurm_command_error{command="sacctmgr_show_cluster",error="no answer within 1 s"}'] == 1
    assert not [k for k in got if k.startswith("mlinfra_slurm_account_gpu_hours{")]
    assert got['mlinfra_slurm_up{daemon="slurmctld"}'] == 1  # the rest is read as usual
    assert got['mlinfra_slurm_jobs{partition="gpu",state="RUNNING",reason=""}'] == 1
    other = tmp_path / "missing"
    other.mkdir()
    proc, got, _text = run_once(other, fake_slurm(other, {"sinfo": ""}))
    assert proc.returncode == 1
    [error] = [k for k in got if k.startswith('mlinfra_slurm_command_error{command="sinfo"')]
    assert "cannot run sinfo" in error, error


def test_a_slurm_answer_with_errors_is_a_failure(tmp_path):
    body = "echo '%s'" % json.dumps({"meta": {}, "errors": [{"error": "Invalid user for SlurmUser"}], "jobs": []})
    proc, got, _text = run_once(tmp_path, fake_slurm(tmp_path, {"squeue": body, "sinfo": "echo not json"}))
    assert proc.returncode == 1
    assert got['mlinfra_slurm_command_error{command="squeue",error="Invalid user for SlurmUser"}'] == 1
    assert [k for k in got if k.startswith('mlinfra_slurm_command_error{command="sinfo",error="not JSON')]


@pytest.mark.parametrize("args, words", [
    (["--textfile", "/nonexistent-dir/x.prom"], "--textfile must be a .prom file"),
    (["--textfile", "x.txt"], "--textfile must be a .prom file"),
    (["--textfile", "x.prom", "--interval", "0"], "--interval must be more than 0"),
    (["--textfile", "x.prom", "--command-timeout", "-1"], "--command-timeout must be more than 0"),
])
def test_bad_arguments_are_named(tmp_path, args, words):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--once"], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path), check=False)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
