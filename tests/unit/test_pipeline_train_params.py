"""The pipeline role's training parameters: pipeline_train_params_overrides merges over
pipeline_train_params, so changing one parameter keeps the others (dist_timeout_s, precision).

The role's own preflight runs against localhost in check mode (a worker group of one), then
the play reads the parameters the train stage would run with (its key before world_size).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit
ROLE = Path(ROOT) / "roles" / "pipeline"
MARK = "TRAIN_PARAMS="


def preflight(tmp_path: Path, extra_vars: dict):
    """(ansible-playbook's result, the merged parameters the play printed or None)."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "pipeline preflight", "hosts": "localhost", "gather_facts": False,
        "tasks": [
            {"name": "the role's preflight", "ansible.builtin.include_role": {
                "name": "mlinfra.kvm.pipeline", "tasks_from": "preflight", "public": True}},
            {"name": "the parameters train runs with", "ansible.builtin.debug": {
                "msg": MARK + "{{ __pipeline_train_params_given | to_json }}"}},
        ],
    }], sort_keys=False))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": {
        "localhost": {"ansible_connection": "local"}}}}}}))
    overrides = tmp_path / "extra.json"
    overrides.write_text(json.dumps(extra_vars))
    proc = run_playbook(play, "-i", str(inventory), "--check", "-e", "@%s" % overrides)
    found = [line for line in proc.stdout.splitlines() if MARK in line]
    # The default callback's line: ok: [localhost] => {"msg": "TRAIN_PARAMS={...}"}
    params = json.loads(json.loads(found[0][found[0].index("=> ") + 3:])["msg"][len(MARK):]) if found else None
    return proc, params


def role_default_train_params() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["pipeline_train_params"]


def test_an_override_changes_one_parameter_and_keeps_the_others(tmp_path):
    proc, params = preflight(tmp_path, {"pipeline_train_params_overrides": {"lr": 0.002, "epochs": 6}})
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    assert params == dict(role_default_train_params(), lr=0.002, epochs=6), params
    assert params["dist_timeout_s"] == 120 and params["precision"] == "auto"


def test_overrides_merge_over_an_inventory_s_whole_mapping(tmp_path):
    base = {"epochs": 4, "lr": 0.003, "hidden": [64, 32], "dropout": 0.1, "batch_size": 0, "seed": 7,
            "precision": "auto", "dist_timeout_s": 60}
    proc, params = preflight(tmp_path, {"pipeline_train_params": base,
                                        "pipeline_train_params_overrides": {"hidden": [16]}})
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    assert params == dict(base, hidden=[16]), params


def test_the_preflight_checks_the_merged_parameters(tmp_path):
    proc, params = preflight(tmp_path, {"pipeline_train_params_overrides": {"dist_timeout_s": 0}})
    assert proc.returncode != 0 and params is None, proc.stdout[-3000:]
    [(task, msg)] = failures(proc)
    assert task.endswith("Assert the training parameters are sound"), task
    assert "pipeline_train_params_overrides" in msg and '"dist_timeout_s": 0' in msg, msg


def test_the_readme_changes_one_parameter_with_the_overrides():
    """README's example of a changed training parameter keeps the other parameters."""
    readme = (Path(ROOT) / "README.md").read_text()
    assert '"pipeline_train_params_overrides"' in readme
    assert '-e \'{"pipeline_train_params": ' not in readme, "an example replacing the whole mapping drops keys"
