"""The run_cost filter through Ansible: the seed's A100 case and a bad input named in the error."""
from __future__ import annotations

import pytest
import yaml

from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit


def test_run_cost_filter_in_a_play(tmp_path):
    play = tmp_path / "play.yml"
    inputs = {"duration_s": 3600, "gpus": 1, "gpu_model": "A100", "pue": 1.58, "electricity_price": 0.15,
              "hardware_price": 10000, "lifetime_years": 3, "utilisation": 0.5, "cloud_rates": {"A100": 3.0}}
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "good", "ansible.builtin.debug": {"msg": "{{ %r | mlinfra.kvm.run_cost }}" % inputs}},
        {"name": "bad", "ansible.builtin.debug": {"msg": "{{ %r | mlinfra.kvm.run_cost }}" % dict(inputs, lifetime_years=0)}},
    ]}]))
    proc = run_playbook(play)
    assert "on premise is cheaper above 13.1% utilisation" in proc.stdout, proc.stdout + proc.stderr
    ((task, msg),) = failures(proc)
    assert task == "bad", task
    assert "run_cost: option pipeline_cost_lifetime_years: value 0 must be above 0" in msg, msg
