"""slurm_controller and slurm_node without a cluster: layout, syntax and preflight refusals.

Each play runs against an inventory of local hosts (connection local) in check mode with the
preflight tag, so nothing on this machine changes. The roles against real daemons are
tests/integration/test_slurm_roles.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import yaml

from conftest import ROOT
from test_roles_static import ANSIBLE_PLAYBOOK, failures, test_role_layout

pytestmark = pytest.mark.unit

ROLES = ["slurm_controller", "slurm_node"]


def run(tmp_path: Path, controller_vars: Dict[str, Any], nodes: Optional[Dict[str, Any]] = None,
        node_play: bool = False, *extra: str) -> subprocess.CompletedProcess:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    nodes = {"worker1": {"ansible_host": "127.0.0.1"}} if nodes is None else nodes
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "slurm_controller": {"hosts": {"head": dict(local, ansible_host="127.0.0.1")}},
        "slurm_nodes": {"hosts": {name: dict(local, **v) for name, v in nodes.items()}}}}}))
    plays = [{"hosts": "slurm_controller", "gather_facts": False,
              "roles": [{"role": "mlinfra.kvm.slurm_controller", "vars": controller_vars}]}]
    if node_play:
        plays = [{"hosts": "slurm_nodes", "gather_facts": False, "roles": ["mlinfra.kvm.slurm_node"]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_CALLBACK_FORMAT_PRETTY="0", ANSIBLE_RETRY_FILES_ENABLED="0")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                           "--check", "--tags", "preflight", *extra], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=300, check=False)


@pytest.mark.parametrize("role", ROLES)
def test_layout(role):
    test_role_layout(role)


def test_preflight_accepts_a_declared_cluster(tmp_path):
    proc = run(tmp_path, {"slurm_controller_qos": [{"name": "small", "max_gpus": 1}],
                          "slurm_controller_accounts": [{"name": "team-a", "qos": ["normal", "small"]}],
                          "slurm_controller_users": [{"name": "alice", "accounts": ["team-a"]}],
                          "slurm_controller_partitions": [{"name": "gpu", "nodes": ["worker1"], "default": True}]})
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])


@pytest.mark.parametrize("controller_vars,nodes,needle", [
    ({"slurm_controller_partitions": [{"name": "gpu", "nodes": ["worker9"]}]}, None,
     "slurm_controller_partitions names worker9, which is not a node of group slurm_nodes (its nodes: worker1)"),
    ({"slurm_controller_accounts": [{"name": "team-a", "qos": ["big"]}]}, None,
     "slurm_controller_accounts names QOS big, which slurm_controller_qos does not declare"),
    ({"slurm_controller_users": [{"name": "alice", "accounts": ["team-z"]}]}, None,
     "slurm_controller_users names account team-z, which slurm_controller_accounts does not declare"),
    ({}, {"worker1": {"ansible_host": "127.0.0.1"}, "worker2": {}},
     "These nodes have neither slurm_node_address nor ansible_host"),
    ({"slurm_controller_cluster_name": "Lab Cluster"}, None, "slurm_controller_cluster_name=\"Lab Cluster\""),
    ({"slurm_controller_node_group": "gpu_workers"}, None, "slurm_controller_node_group=gpu_workers names no host"),
    ({"slurm_controller_db_password": "it's"}, None, "slurm_controller_db_password has a quote"),
    ({"slurm_controller_slurmdbd_port": 70000}, None, "slurm_controller_slurmdbd_port=70000: not a TCP port"),
])
def test_controller_preflight_refuses(tmp_path, controller_vars, nodes, needle):
    proc = run(tmp_path, controller_vars, nodes)
    assert proc.returncode != 0, proc.stdout[-3000:]
    found = failures(proc)
    assert found and any(needle in msg for _task, msg in found), found


def test_controller_db_password_never_printed_by_its_refusal(tmp_path):
    proc = run(tmp_path, {"slurm_controller_db_password": "s3cr'etvalue"})
    assert proc.returncode != 0 and "s3cr'etvalue" not in proc.stdout + proc.stderr


def test_node_preflight_wants_the_controller_role_first(tmp_path):
    proc = run(tmp_path, {}, None, True)
    assert proc.returncode != 0
    assert any("Run that role on the controller first" in msg for _task, msg in failures(proc)), failures(proc)
