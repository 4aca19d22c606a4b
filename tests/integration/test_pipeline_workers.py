"""The pipeline role's train across workers, on this machine: two inventory hosts (local
connection, each with its own pipeline_root) run playbooks/pipeline.yml, so each runs data and
prepare, then both run train.py under torchrun as two nodes of one c10d rendezvous (gloo on
loopback), tracked in a real MLflow server.

What the lab tier proves across two TCG guests over the lab network, this proves in about two
minutes: one decision and one key for the job, one MLflow run, identical weights on both ranks,
disjoint shards; refusals before any process starts (a worker with other params, a busy
rendezvous port, too many workers, a batch smaller than the world); pipeline_workers=1; the
rendezvous port's firewall (an nftables table on this machine while the module runs, removed by
its teardown) admitting the workers' address and resetting another, four ways off.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from conftest import ROOT
from mlflow_server import Server
from test_train_ddp import torch_python  # noqa: F401  # pylint: disable=unused-import  # the module-scoped torch venv fixture

pytestmark = pytest.mark.integration

BIN = ROOT / ".venv" / "bin"
TRAIN_PARAMS = {"epochs": 3, "lr": 0.003, "hidden": [16], "dropout": 0.0, "batch_size": 0,
                "seed": 7, "precision": "auto", "dist_timeout_s": 60}


def play_env() -> Dict[str, str]:
    """ansible-playbook's environment for the pipeline plays: the checkout's ansible.cfg, no GPU."""
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def run_pipeline_play(log: Path, inventory: Path, evars: Dict[str, Any], extra: tuple = (),
                      check: bool = False) -> subprocess.CompletedProcess:
    """playbooks/pipeline.yml over ``inventory`` with ``evars``; its output is kept in ``log``."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/pipeline.yml",
           "-e", json.dumps(evars), *extra] + (["--check"] if check else [])
    proc = subprocess.run(cmd, cwd=str(ROOT), env=play_env(), capture_output=True, text=True, timeout=900, check=False)
    log.write_text(proc.stdout + proc.stderr)
    return proc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Lab:
    def __init__(self, base: Path, python: Path, server: Server, experiment: str) -> None:
        self.base, self.python, self.server, self.experiment = base, python, server, experiment
        self.port = _free_port()
        self.roots = {h: base / h for h in ("w1", "w2")}
        hosts = {h: {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                     "ansible_python_interpreter": str(BIN / "python"), "pipeline_root": str(root)}
                 for h, root in self.roots.items()}
        self.inventory = base / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": hosts}}}}))
        self.runs = 0

    def play(self, *extra: str, check: bool = False, params: Dict[str, Any] = None) -> subprocess.CompletedProcess:
        evars = {"pipeline_python": str(self.python), "pipeline_dataset": {"rows": 1200, "features": 8, "seed": 5},
                 "pipeline_train_params": params or TRAIN_PARAMS, "pipeline_mlflow_tracking_uri": self.server.url,
                 "pipeline_mlflow_experiment": self.experiment, "pipeline_rendezvous_port": self.port,
                 "pipeline_rendezvous_timeout": 120}
        self.runs += 1
        return run_pipeline_play(self.base / ("play-%d.log" % self.runs), self.inventory, evars, extra, check)

    def train_runs(self) -> List[Dict[str, Any]]:
        return [r for r in self.server.runs(self.experiment)
                if {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("mlinfra.stage") == "train"]

    def report(self, host: str, rank: int) -> Dict[str, Any]:
        return json.loads((self.roots[host] / "work" / "train" / ("rank-%d.json" % rank)).read_text())


def recap(out: str) -> Dict[str, Dict[str, int]]:
    got = {}
    for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out, re.M):
        got[m.group(1)] = {"changed": int(m.group(3)), "failed": int(m.group(5))}
    return got


def train_line(out: str) -> str:
    found = re.findall(r"train: (ran|skipped) ", out)
    assert len(found) == 1, out[-3000:]  # one report for the job, from the first worker
    return found[0]


def flat(text: str) -> str:
    return " ".join(text.split())


NFT_TABLE = "mlinfra_rendezvous"  # the pipeline role's (plugins/filter/rendezvous_firewall.py)


def nft_table() -> Optional[Dict[str, Any]]:
    proc = subprocess.run(["nft", "-j", "list", "table", "inet", NFT_TABLE], capture_output=True, text=True, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def drop_nft_table() -> None:
    if nft_table() is not None:
        subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True, check=True)


def probe(port: int, sources: List[str]) -> Dict[str, str]:
    """Whether a connection to a listener on 127.0.0.1:PORT from each source address got through."""
    got = {}
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(4)
        for source in sources:
            with socket.socket() as cli:
                cli.settimeout(5)
                cli.bind((source, 0))
                try:
                    cli.connect(("127.0.0.1", port))
                    got[source] = "connected"
                except OSError as err:
                    got[source] = type(err).__name__
    return got


@pytest.fixture(scope="module")
def lab(torch_python: Path, mlflow_server: Server, tmp_path_factory):  # noqa: F811
    drop_nft_table()  # a table left by an earlier, killed run would make the first play differ
    yield Lab(tmp_path_factory.mktemp("pipeline-workers"), torch_python, mlflow_server, "pipeline-workers")
    drop_nft_table()  # this machine's firewall as it was


def test_two_workers_train_one_model_then_agree_to_skip(lab: Lab) -> None:
    first = lab.play()
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    assert train_line(first.stdout) == "ran"
    assert "world size 2" in first.stdout
    # Both ranks took part, on disjoint shards, and ended with the same weights.
    r0, r1 = lab.report("w1", 0), lab.report("w2", 1)
    assert (r0["world_size"], r1["world_size"]) == (2, 2) and r0["backend"] == r1["backend"] == "gloo"
    assert not set(r0["shard_indices"]) & set(r1["shard_indices"]) and r0["shard_rows"] == r1["shard_rows"] > 0
    assert r0["weights_sha256"] == r1["weights_sha256"]
    # Rank 0 alone wrote the model and the metrics; rank 1 only its report.
    assert sorted(p.name for p in (lab.roots["w1"] / "work" / "train").iterdir()) == ["metrics.json", "model.pt", "rank-0.json"]
    assert sorted(p.name for p in (lab.roots["w2"] / "work" / "train").iterdir()) == ["rank-1.json"]
    # One MLflow run for the job, tagged with both workers, with the world size.
    runs = lab.train_runs()
    assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED", runs
    run = lab.server.run(runs[0]["info"]["run_id"])
    assert run["tags"]["mlinfra.hosts"] == "w1,w2" and run["tags"]["mlinfra.world_size"] == "2", run["tags"]
    assert run["params"].get("world_size") == "2", run["params"]
    assert run["metrics"]["world_size"] == 2 and run["metrics"]["test_rmse"] > 0
    # Check mode, then a second run: both skip with the same key, nothing changes.
    for check in (True, False):
        again = lab.play(check=check)
        assert again.returncode == 0, again.stdout[-4000:]
        assert train_line(again.stdout) == "skipped" and "no worker due" in again.stdout
        assert all(v["changed"] == 0 for v in recap(again.stdout).values()), again.stdout[-3000:]
    assert len(lab.train_runs()) == 1


@pytest.mark.skipif(not Path("/usr/sbin/nft").exists(), reason="needs nft (nftables; make setup installs it)")
def test_rendezvous_port_admits_the_workers_only_and_turns_off_four_ways(lab: Lab) -> None:
    # The first test's run left the table on w1 (this machine): the port admits the workers'
    # address (127.0.0.1) and resets a connection from any other.
    table = nft_table()
    assert table is not None, "the two-worker train left no rendezvous firewall"
    accepted = [e["match"]["right"] for o in table["nftables"] if "rule" in o for e in o["rule"]["expr"]
                if "match" in e and e["match"]["left"].get("payload", {}).get("field") == "saddr"]
    assert accepted in (["127.0.0.1"], [{"set": ["127.0.0.1"]}]), accepted
    assert probe(lab.port, ["127.0.0.1", "127.0.0.2"]) == {"127.0.0.1": "connected", "127.0.0.2": "ConnectionRefusedError"}
    # Off, four ways: check predicts the removal on w1 only and removes nothing; apply removes it;
    # then nothing is left to change.
    off = ("-e", "pipeline_rendezvous_firewall=false")
    predicted = lab.play(*off, check=True)
    assert predicted.returncode == 0, predicted.stdout[-4000:]
    assert {h: v["changed"] for h, v in recap(predicted.stdout).items()} == {"w1": 1, "w2": 0}
    assert "rendezvous firewall: the table is present and should not be" in predicted.stdout
    assert nft_table() is not None
    applied = lab.play(*off)
    assert applied.returncode == 0 and train_line(applied.stdout) == "skipped", applied.stdout[-4000:]
    assert {h: v["changed"] for h, v in recap(applied.stdout).items()} == {"w1": 1, "w2": 0}
    assert nft_table() is None
    assert probe(lab.port, ["127.0.0.2"]) == {"127.0.0.2": "connected"}
    for check in (True, False):
        again = lab.play(*off, check=check)
        assert again.returncode == 0, again.stdout[-4000:]
        assert all(v["changed"] == 0 for v in recap(again.stdout).values()), again.stdout[-3000:]
    # On again (the default): put back in one change on w1, and the job still skips.
    back = lab.play()
    assert back.returncode == 0 and train_line(back.stdout) == "skipped", back.stdout[-4000:]
    assert {h: v["changed"] for h, v in recap(back.stdout).items()} == {"w1": 1, "w2": 0}
    assert "rendezvous firewall: table inet mlinfra_rendezvous is missing" in back.stdout
    assert probe(lab.port, ["127.0.0.2"]) == {"127.0.0.2": "ConnectionRefusedError"}


def test_changed_lr_reruns_both_workers(lab: Lab) -> None:
    params = dict(TRAIN_PARAMS, lr=0.002)
    predicted = lab.play(check=True, params=params)
    assert predicted.returncode == 0 and train_line(predicted.stdout) == "ran", predicted.stdout[-4000:]
    assert {h: v["changed"] for h, v in recap(predicted.stdout).items()} == {"w1": 1, "w2": 1}
    before = lab.report("w2", 1)["weights_sha256"]
    res = lab.play(params=params)
    assert res.returncode == 0 and train_line(res.stdout) == "ran", res.stdout[-4000:]
    assert "param lr 0.003 -> 0.002" in res.stdout
    assert {h: v["changed"] for h, v in recap(res.stdout).items()} == {"w1": 1, "w2": 1}
    assert lab.report("w1", 0)["weights_sha256"] == lab.report("w2", 1)["weights_sha256"] != before
    assert len(lab.train_runs()) == 2
    again = lab.play(params=params)
    assert again.returncode == 0 and train_line(again.stdout) == "skipped"


def _lock(lab: Lab, host: str) -> bytes:
    return (lab.roots[host] / ".ml_stage" / "train.lock.json").read_bytes()


@pytest.mark.parametrize("case", ["other_params", "port_in_use", "too_many_workers", "tiny_batch", "worker_left"])
def test_bad_input_is_refused_before_any_process_starts(lab: Lab, case: str) -> None:
    locks = {h: _lock(lab, h) for h in lab.roots}
    runs = len(lab.train_runs())
    extra: List[str] = []
    params = dict(TRAIN_PARAMS, lr=0.001)  # would run, were it not refused
    holder = None
    if case == "other_params":
        # w2's inventory gives it other train params: another key, named with the input.
        inv = yaml.safe_load(lab.inventory.read_text())
        inv["all"]["children"]["mlinfra_worker"]["hosts"]["w2"]["pipeline_train_params"] = dict(params, epochs=4)
        bad_inventory = lab.base / "hosts-other-params.yml"
        bad_inventory.write_text(yaml.safe_dump(inv))
        extra = ["-i", str(bad_inventory)]
        needle = "w2: key"
        # -e would override the host variable: pass the params only through the inventories.
        params = None
    elif case == "worker_left":
        # w2 fails before the train (its root cannot be made): w1 must not train alone, nor
        # trip over w2's missing facts (a CI run ended in "HostVarsVars has no attribute").
        inv = yaml.safe_load(lab.inventory.read_text())
        inv["all"]["children"]["mlinfra_worker"]["hosts"]["w2"]["pipeline_root"] = "/proc/mlinfra-no-such-root"
        bad_inventory = lab.base / "hosts-worker-left.yml"
        bad_inventory.write_text(yaml.safe_dump(inv))
        extra = ["-i", str(bad_inventory)]
        needle = "w2 left the play after an earlier failure"
        params = None
    elif case == "port_in_use":
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("", lab.port))
        holder.listen()
        needle = "pipeline_rendezvous_port %d is in use on w1" % lab.port
    elif case == "too_many_workers":
        extra = ["-e", "pipeline_workers=3"]
        needle = "pipeline_workers=3 over the 2 host(s) of group mlinfra_worker"
    else:
        params = dict(params, batch_size=1)
        needle = "pipeline_train_params.batch_size 1 over 2 processes"
    try:
        if case in ("other_params", "worker_left"):
            proc = _play_inventories(lab, extra)
        else:
            proc = lab.play(*extra, params=params)
    finally:
        if holder:
            holder.close()
    assert proc.returncode != 0
    assert needle in flat(proc.stdout), proc.stdout[-4000:]
    if case == "other_params":
        assert "params" in flat(proc.stdout) and "nothing was started" in flat(proc.stdout)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert {h: _lock(lab, h) for h in lab.roots} == locks and len(lab.train_runs()) == runs


def _play_inventories(lab: Lab, extra: List[str]) -> subprocess.CompletedProcess:
    """Like Lab.play, with the train params from the inventory (host variables) only."""
    evars = {"pipeline_python": str(lab.python), "pipeline_dataset": {"rows": 1200, "features": 8, "seed": 5},
             "pipeline_mlflow_tracking_uri": lab.server.url, "pipeline_mlflow_experiment": lab.experiment,
             "pipeline_rendezvous_port": lab.port}
    inv = yaml.safe_load(Path(extra[1]).read_text())
    inv["all"]["children"]["mlinfra_worker"]["hosts"]["w1"]["pipeline_train_params"] = dict(TRAIN_PARAMS, lr=0.001)
    Path(extra[1]).write_text(yaml.safe_dump(inv))
    cmd = [str(BIN / "ansible-playbook"), "-i", extra[1], "playbooks/pipeline.yml", "-e", json.dumps(evars)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900, check=False)


def test_one_worker_trains_alone_without_torchrun(lab: Lab) -> None:
    res = lab.play("-e", "pipeline_workers=1")
    assert res.returncode == 0, res.stdout[-4000:]
    assert train_line(res.stdout) == "ran" and "world size 1" in res.stdout
    assert recap(res.stdout)["w2"]["changed"] == 0
    report = lab.report("w1", 0)
    assert report["world_size"] == 1 and report["backend"] is None
    lock = json.loads(_lock(lab, "w1"))
    assert "torch.distributed.run" not in lock["inputs"]["cmd"]
