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


def test_run_cost_textfile_filter_in_a_play(tmp_path):
    """The textfile filter chained after run_cost: a second run adds to the previous text's
    counters, and a damaged previous text fails naming the file and the line."""
    play = tmp_path / "play.yml"
    inputs = {"duration_s": 7200, "gpus": 1, "gpu_model": "A100", "pue": 1.58, "electricity_price": 0.15,
              "hardware_price": 10000, "lifetime_years": 3, "utilisation": 0.5, "cloud_rates": {"A100": 3.0}}
    first = "{{ %r | mlinfra.kvm.run_cost | mlinfra.kvm.run_cost_textfile('', pipeline='demo', account='') }}" % inputs
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "first", "ansible.builtin.set_fact": {"first": first}},
        {"name": "second", "ansible.builtin.debug": {
            "msg": "{{ %r | mlinfra.kvm.run_cost | mlinfra.kvm.run_cost_textfile(first, pipeline='demo', "
                   "account='', mlflow_run_id='r2', timestamp=1234) }}" % inputs}},
        {"name": "damaged", "ansible.builtin.debug": {
            "msg": "{{ %r | mlinfra.kvm.run_cost | mlinfra.kvm.run_cost_textfile("
                   "'mlinfra_runs_priced_total{pipeline=\"demo\",account=\"-\"} -3', pipeline='demo') }}" % inputs}},
    ]}]))
    proc = run_playbook(play)
    out = proc.stdout + proc.stderr
    assert 'mlinfra_runs_priced_total{pipeline=\\"demo\\",account=\\"-\\"} 2' in out, out
    assert 'mlinfra_run_gpu_hours_total{pipeline=\\"demo\\",account=\\"-\\"} 4' in out, out
    assert 'mlinfra_run_last_timestamp_seconds{pipeline=\\"demo\\",account=\\"-\\",mlflow_run_id=\\"r2\\"} 1234' in out
    ((task, msg),) = failures(proc)
    assert task == "damaged", task
    assert "run_cost_textfile: option previous_text: value 'line 1:" in msg and "mlinfra_run_cost.prom" in msg, msg
