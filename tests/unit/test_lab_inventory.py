"""The lab and example inventories, and the inventory preflight's refusals (no VM is made:
only the preflight play runs, on localhost)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit
BIN = Path(sys.executable).parent  # the venv running the tests (its ansible-playbook)


def ansible(tool: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(Path(ROOT) / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **env_extra)
    return subprocess.run([str(BIN / tool), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def preflight(*extra: str) -> subprocess.CompletedProcess:
    return ansible("ansible-playbook", "-i", "inventories/lab", "playbooks/preflight.yml", *extra)


def test_lab_preflight_accepts_the_lab_inventory():
    proc = preflight()
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("extra,needle", [
    (["-e", "mlinfra_worker_count=0"], "mlinfra_worker_count is 0"),
    (["-e", "mlinfra_worker_count=two"], "mlinfra_worker_count is two"),
    (["-e", json.dumps({"mlinfra_extra_vms": [{"name": "mlinfra-worker-1", "role": "data"}]})], "give every VM its own name"),
    (["-e", json.dumps({"mlinfra_extra_vms": [{"name": "x1", "role": "trainer"}]})], "role 'trainer', which is unknown"),
    (["-e", "pipeline_dataset_file=/nonexistent/data.parquet"], "pipeline_dataset_file /nonexistent/data.parquet does not exist"),
    (["-e", json.dumps({"mlinfra_extra_vms": [{"name": "t2", "role": "tracking"}]})], "exactly one is needed"),
    (["-e", json.dumps({"mlinfra_extra_vms": [{"name": "w9", "role": "worker", "hypervisor": "nohost"}]})],
     "names hypervisor nohost, which is not in the group"),
])
def test_lab_preflight_refuses_bad_inventory(extra, needle):
    proc = preflight(*extra)
    assert proc.returncode != 0
    assert needle in " ".join((proc.stdout + proc.stderr).split()), proc.stdout[-3000:]


def test_preflight_splits_vms_over_hypervisors_in_the_example():
    proc = ansible("ansible-playbook", "-i", "inventories/example", "playbooks/preflight.yml", "-v",
                   ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    per_host = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"^ok: \[localhost -> [^]]+\] => \(item=([^)]+)\) => (\{.*\})$", line)
        if match and "guest_vms" in match.group(2):
            per_host[match.group(1)] = [vm["name"] for vm in json.loads(match.group(2))["ansible_facts"]["guest_vms"]]
    assert per_host == {
        "gpu-hv-01.example.internal": ["mlflow-01", "gpu-worker-01", "gpu-worker-02"],
        "gpu-hv-02.example.internal": ["gpu-worker-03", "gpu-worker-04"],
    }


def test_example_inventory_graph():
    proc = ansible("ansible-inventory", "-i", "inventories/example", "--graph")
    assert proc.returncode == 0, proc.stderr
    assert "gpu-hv-01.example.internal" in proc.stdout and "gpu-hv-02.example.internal" in proc.stdout


@pytest.mark.parametrize("inventory", ["inventories/lab", "inventories/example"])
@pytest.mark.parametrize("playbook", ["site.yml", "teardown.yml", "snapshot.yml", "pipeline.yml", "hypervisor_maintenance.yml", "slurm.yml"])
def test_playbooks_syntax(inventory, playbook):
    proc = ansible("ansible-playbook", "-i", inventory, "--syntax-check", "playbooks/" + playbook)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _role_entries(playbook: str, strategy: str = "") -> set:
    """(role, tasks_from) pairs a playbook runs, from `roles:` and include/import_role tasks
    (only in plays of the given strategy, when one is given)."""
    import yaml
    found = set()
    for play in yaml.safe_load((Path(ROOT) / "playbooks" / playbook).read_text()):
        if strategy and play.get("strategy", "linear") != strategy:
            continue
        for role in play.get("roles", []):
            found.add((role["role"] if isinstance(role, dict) else role, "main"))
        for task in play.get("tasks", []):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                if key in task:
                    found.add((task[key]["name"], task[key].get("tasks_from", "main")))
    return found


def _imported_task_files(path: Path) -> list:
    """The task files path imports, in order, blocks included."""
    import yaml

    def walk(tasks: list) -> list:
        found = []
        for task in tasks or []:
            if "ansible.builtin.import_tasks" in task:
                found.append(path.parent / task["ansible.builtin.import_tasks"])
            found += walk(task.get("block"))
        return found
    return walk(yaml.safe_load(path.read_text()))


def test_services_play_runs_what_the_single_purpose_playbooks_run():
    """site.yml runs services.yml instead of tracking/workers/monitoring/slurm/pipeline.yml: the two
    must not drift apart (a role added to one and not the other)."""
    single = set()
    for playbook in ("tracking.yml", "workers.yml", "monitoring.yml", "slurm.yml", "pipeline.yml"):
        single |= _role_entries(playbook)
    services = _role_entries("services.yml")
    # services.yml splits mlflow_server's readiness off (tasks_from: ready), makes the
    # controller-side bundles in a play of their own (tasks_from: their source's task file), and
    # runs the pipeline's main in parts: code (before MLflow is up) and prepare in the free play,
    # train in a linear play; and it makes MLflow's CA in its first, linear play (tasks_from:
    # tls_ca, which the role's main runs too) so the workers find it whatever the tracking VM's pace.
    extra = {("mlinfra.kvm.mlflow_server", "ready"), ("mlinfra.kvm.mlflow_server", "tls_ca")} | {
        (role, entry) for role, entry in services if entry.startswith("{{")}
    parts = {("mlinfra.kvm.pipeline", "code"), ("mlinfra.kvm.pipeline", "prepare"),
             ("mlinfra.kvm.pipeline", "train")}
    assert parts <= services
    assert services - extra - parts == single - {("mlinfra.kvm.pipeline", "main")}, (services - extra) ^ single
    tasks = Path(ROOT) / "roles" / "pipeline" / "tasks"
    assert _imported_task_files(tasks / "main.yml") == [tasks / "prepare.yml", tasks / "train.yml"]
    # code is the first part of prepare (which skips it when code already ran), nothing else
    code = _imported_task_files(tasks / "code.yml")
    assert code == [tasks / "preflight.yml", tasks / "layout.yml", tasks / "data.yml"], code
    assert _imported_task_files(tasks / "prepare.yml")[:3] == code


def test_free_strategy_play_loads_no_run_once_task():
    """run_once does not hold under the free strategy (Ansible warns and runs it per host):
    nothing the services play's free play loads may carry it."""
    import yaml
    entries = _role_entries("services.yml", strategy="free")
    assert ("mlinfra.kvm.pipeline", "prepare") in entries
    offenders = []

    def scan_tasks(path: Path, tasks: list) -> None:
        for task in tasks or []:
            if "run_once" in task:
                offenders.append("%s: %s" % (path.relative_to(ROOT), task.get("name")))
            imported = task.get("ansible.builtin.import_tasks")
            if imported:
                scan(path.parent / imported)
            for block_key in ("block", "rescue", "always"):
                scan_tasks(path, task.get(block_key))

    def scan(path: Path) -> None:
        scan_tasks(path, yaml.safe_load(path.read_text()))

    for role, entry in entries:
        if entry.startswith("{{"):
            continue
        path = Path(ROOT) / "roles" / role.split(".")[-1] / "tasks" / (entry + ".yml")
        assert path.is_file(), path
        scan(path)
    assert offenders == [], offenders
