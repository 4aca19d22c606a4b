"""slurm_controller and slurm_node without a cluster: layout, syntax and preflight refusals.

Each play runs against an inventory of local hosts (connection local) in check mode with the
preflight tag, so nothing on this machine changes; the GPUs the controller declares for a node
(whole GPUs, MIG devices) are rendered by slurm_config into a temporary directory. The roles
against real daemons are tests/integration/test_slurm_roles.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import yaml

from conftest import ROOT, SHARED, run_module_process
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


# -- a node's GPUs as the role declares them, rendered by slurm_config --------------------------

MIG = Path(ROOT) / "tests" / "fixtures" / "mig"
CAPTURE = Path(SHARED) / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"
ROLE = Path(ROOT) / "roles" / "slurm_controller"


def smi_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """nvidia_smi_info's gpus as facts.yml registers them: worker3's first H200 in MIG mode with a
    3g.71gb and a 1g.18gb (the recorded tables' stand-in) beside a whole second H200 (the real
    capture, as GPU 1), and worker4 with the capture's one whole H200."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(tmp_path / "state.json"))
    for argv in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "9,19", "-C"]):
        subprocess.run([sys.executable, str(MIG / "fake_nvidia_smi.py")] + argv, check=True, capture_output=True)
    split = run_module_process("nvidia_smi_info", {"nvidia_smi": str(MIG / "fake_nvidia_smi.py"),
                                                   "mig_minors_file": str(MIG / "mig-minors")})["gpus"]
    whole = run_module_process("nvidia_smi_info", {"xml_file": str(CAPTURE)})["gpus"]
    second = dict(whole[0], index=1, minor_number=1)
    return {"results": [{"item": "worker3", "gpus": split + [second]}, {"item": "worker4", "gpus": whole}]}


def test_a_node_with_mig_devices_offers_them_typed_and_its_whole_gpu_typed_by_model(tmp_path, monkeypatch):
    if not CAPTURE.is_file():
        pytest.skip("fixture %s is missing" % CAPTURE)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "worker3": dict(local, ansible_host="192.168.130.13"), "worker4": dict(local, ansible_host="192.168.130.14")}}}))
    (tmp_path / "gpus.json").write_text(json.dumps({"__slurm_controller_gpu_read": smi_facts(tmp_path, monkeypatch)}))
    # The role's own expressions (vars/main.yml) over the registered facts, looped as facts.yml
    # loops them, then slurm_config as the role calls it (without local_node: no device here).
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "worker3", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [
            {"ansible.builtin.set_fact": {"nodes": "{{ (nodes | default([])) + [__slurm_controller_node_entry] }}"},
             "loop": ["worker3", "worker4"]},
            {"mlinfra.kvm.slurm_config": {"config_dir": str(tmp_path / "etc"), "cluster_name": "lab",
                                          "controller": {"host": "head"}, "nodes": "{{ nodes }}",
                                          "partitions": [{"name": "gpu", "default": True}], "proctrack": "linuxproc"}}]}],
        sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0")
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                           "-e", "@%s" % (tmp_path / "gpus.json")], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=300, check=False)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    assert (tmp_path / "etc" / "gres.conf").read_text().splitlines()[1:] == [
        "NodeName=worker3 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
        "NodeName=worker3 Name=gpu Type=1g.18gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22",
        "NodeName=worker3 Name=gpu Type=nvidia_h200 File=/dev/nvidia1",
        "NodeName=worker4 Name=gpu File=/dev/nvidia0"]
    conf = (tmp_path / "etc" / "slurm.conf").read_text().splitlines()
    assert "NodeName=worker3 NodeAddr=192.168.130.13 Gres=gpu:3g.71gb:1,gpu:1g.18gb:1,gpu:nvidia_h200:1 State=UNKNOWN" in conf
    assert "NodeName=worker4 NodeAddr=192.168.130.14 Gres=gpu:1 State=UNKNOWN" in conf
