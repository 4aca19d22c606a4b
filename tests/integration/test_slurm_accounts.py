"""slurm_accounts against a real slurmdbd (tests/slurm_cluster.py): QOS with a GPU limit,
accounts under a parent, users with their default account, each four ways; a change sends only
the difference; removal; bad input and an unknown cluster refused with nothing changed; a
slurmdbd that does not answer named by host and port."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from conftest import four_ways, run_module_process
from slurm_cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("slurm"), nodes=1) as c:
        yield c


def show(cluster: Cluster, *argv: str) -> list:
    out = cluster.slurm("sacctmgr", "--noheader", "--parsable2", "show", *argv)
    return [line.split("|") for line in out.splitlines() if line.strip()]


def assocs(cluster: Cluster) -> set:
    return {tuple(r) for r in show(cluster, "assoc", "cluster=%s" % cluster.cluster_name,
                                   "format=Account,User,ParentName,QOS")}


def declaration(cluster: Cluster, **over: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {
        "cluster": cluster.cluster_name, "conf": cluster.conf,
        "qos": [{"name": "vis-gpus", "max_gpus": 2, "max_wall": "1-00:00:00", "priority": 10}],
        "accounts": [{"name": "vision", "description": "Vision team", "organization": "research",
                      "qos": ["normal", "vis-gpus"]},
                     {"name": "vision-ocr", "parent": "vision"}],
        "users": [{"name": "alice", "accounts": ["vision", "vision-ocr"], "default_account": "vision-ocr"}],
    }
    args.update(over)
    return args


def test_declared_accounts_four_ways_then_changed_then_removed(cluster: Cluster) -> None:
    results = four_ways("slurm_accounts", declaration(cluster))
    assert results["check"]["actions"] == results["apply"]["actions"]
    for result in results.values():  # RETURN, both ways (the unit tier has no slurmdbd to run against)
        assert set(result) - {"changed", "failed", "invocation", "diff"} == {"actions", "cluster"}, result
    assert results["apply"]["actions"][0] == "add qos vis-gpus"
    assert ["vis-gpus", "gres/gpu=2", "1-00:00:00", "10"] in show(cluster, "qos", "format=Name,GrpTRES,MaxWall,Priority")
    assert ("vision", "", "root", "normal,vis-gpus") in assocs(cluster)
    assert ("vision-ocr", "", "vision", "normal,vis-gpus") in assocs(cluster)  # inherited
    assert {("vision", "alice"), ("vision-ocr", "alice")} <= {(a, u) for a, u, _p, _q in assocs(cluster)}
    assert ["alice", "vision-ocr"] in show(cluster, "user", "format=User,DefaultAccount")
    assert ["vision", "vision team", "research"] in show(cluster, "account", "format=Account,Descr,Org")

    # A change: only the difference is sent.
    changed = declaration(cluster, qos=[{"name": "vis-gpus", "max_gpus": 3, "max_wall": "1-00:00:00"}],
                          users=[{"name": "alice", "accounts": ["vision"]}])
    check = run_module_process("slurm_accounts", changed, check=True, diff=True)
    assert check["changed"] and not check["failed"], check
    assert check["actions"] == ["set GrpTRES=gres/gpu=3 on qos vis-gpus", "set default account vision for user alice",
                                "remove user alice from vision-ocr in cluster %s" % cluster.cluster_name], check
    assert check["diff"]["before"]["qos"]["vis-gpus"]["max_gpus"] == 2
    assert ["vis-gpus", "gres/gpu=2"] in show(cluster, "qos", "format=Name,GrpTRES")  # check changed nothing
    applied = run_module_process("slurm_accounts", changed)
    assert applied["actions"] == check["actions"], applied
    assert ["vis-gpus", "gres/gpu=3"] in show(cluster, "qos", "format=Name,GrpTRES")
    assert {(a, u) for a, u, _p, _q in assocs(cluster) if u == "alice"} == {("vision", "alice")}
    assert run_module_process("slurm_accounts", changed)["changed"] is False

    # Removing a parent alone would take its child with it: refused, nothing changed.
    refused = run_module_process("slurm_accounts", declaration(cluster, qos=[], users=[],
                                                               accounts=[{"name": "vision", "state": "absent"}]))
    assert refused["failed"] and "option accounts[0].state:" in refused["msg"], refused
    assert "vision-ocr" in refused["msg"] and ("vision-ocr", "", "vision", "normal,vis-gpus") in assocs(cluster)

    # Removal, four ways: users, then children, then parents, then the QOS.
    gone = declaration(cluster, qos=[{"name": "vis-gpus", "state": "absent"}],
                       accounts=[{"name": "vision", "state": "absent"}, {"name": "vision-ocr", "state": "absent"}],
                       users=[{"name": "alice", "state": "absent"}])
    removed = four_ways("slurm_accounts", gone)
    assert removed["apply"]["actions"] == [
        "remove user alice in cluster %s" % cluster.cluster_name,
        "remove account vision-ocr in cluster %s" % cluster.cluster_name,
        "remove account vision in cluster %s" % cluster.cluster_name, "remove qos vis-gpus"], removed["apply"]
    assert not [r for r in assocs(cluster) if r[0].startswith("vision") or r[1] == "alice"]
    assert "vis-gpus" not in [r[0] for r in show(cluster, "qos", "format=Name")]


@pytest.mark.parametrize("over,option,words", [
    ({"accounts": [{"name": "orphan", "parent": "nosuch"}]}, "accounts[0].parent", "neither declared present"),
    ({"accounts": [{"name": "a1", "qos": ["nosuch-qos"]}]}, "accounts[0].qos", "neither declared present"),
    ({"accounts": [{"name": "Team-C"}]}, "accounts[0].name", "lower-case"),
    ({"users": [{"name": "dave", "accounts": ["nosuch"]}]}, "users[0].accounts", "neither declared present"),
    ({"users": [{"name": "dave", "accounts": ["team-a"], "default_account": "team-b"}]}, "users[0].default_account",
     "not among"),
    ({"qos": [{"name": "q", "max_wall": "1:30:30"}]}, "qos[0].max_wall", "whole minutes"),
    ({"qos": [{"name": "q", "max_gpus": -1}]}, "qos[0].max_gpus", "negative"),
    ({"accounts": [{"name": "x1", "parent": "x2"}, {"name": "x2", "parent": "x1"}]}, "accounts", "cycle"),
    ({"accounts": [{"name": "team-a", "state": "absent"}, {"name": "team-a-sub", "parent": "team-a"}]},
     "accounts[1].parent", "neither declared present"),
    ({"cluster": "nosuch"}, "cluster", "not registered in slurmdbd"),
])
def test_bad_input_is_refused_and_changes_nothing(cluster: Cluster, over: Dict[str, Any], option: str,
                                                  words: str) -> None:
    before = (assocs(cluster), show(cluster, "qos", "format=Name"))
    args = dict({"cluster": cluster.cluster_name, "conf": cluster.conf,
                 "qos": [{"name": "fresh-qos", "max_gpus": 1}]}, **over)
    for check in (True, False):
        result = run_module_process("slurm_accounts", args, check=check)
        assert result["failed"], result
        assert "option %s:" % option in result["msg"] and words in result["msg"], result["msg"]
        assert result["changed"] is False
    assert (assocs(cluster), show(cluster, "qos", "format=Name")) == before


def test_slurmdbd_not_answering_is_named(cluster: Cluster, tmp_path: Path) -> None:
    conf = Path(cluster.conf).read_text()
    bad = tmp_path / "slurm.conf"
    bad.write_text(re.sub(r"(?m)^AccountingStoragePort=.*$", "AccountingStoragePort=1", conf))
    result = run_module_process("slurm_accounts", {"cluster": cluster.cluster_name, "conf": str(bad),
                                                   "accounts": [{"name": "never"}]})
    assert result["failed"] and result["changed"] is False, result
    host = re.search(r"(?m)^AccountingStorageHost=(\S+)", conf).group(1)
    assert "slurmdbd at %s port 1 did not answer" % host in result["msg"], result["msg"]
    assert "never" not in [r[0] for r in show(cluster, "account", "format=Account")]
