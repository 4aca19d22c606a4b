"""The pipeline's preflight and agreement filters (plugins/filter/train_job.py, stage_plan.py):
the sentences a user reads when a distributed train is refused."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.stage_plan import stage_plan_differences
from ansible_collections.mlinfra.kvm.plugins.filter.train_job import distributed_train_problems

pytestmark = pytest.mark.unit

FACTS = {"python": "3.11.2", "torch": "2.13.0", "gpus": 0, "interface": "enp1s0"}


def facts(**over):
    return dict(FACTS, **over)


def test_sound_workers_have_no_problem():
    assert distributed_train_problems({"w1": facts(port_free=True), "w2": facts()}, "w1", forks=10) == []


def test_each_problem_names_the_worker_the_value_and_the_fix():
    got = distributed_train_problems(
        {"w1": facts(port_free=False, port_holder="LISTEN 0 128 *:29400 users:((\"nc\",pid=7))"),
         "w2": facts(torch="2.12.0", interface=None), "w3": facts(torch=None, python="3.12.1", gpus=1)},
        "w1", port=29400, batch_size=2, forks=2)
    text = " | ".join(got)
    assert "forks 2 < 3 workers" in text
    assert "no torch in pipeline_python on w3" in text
    assert "Python versions differ: w1 3.11.2, w2 3.11.2, w3 3.12.1" in text
    assert "torch versions differ: w1 2.13.0, w2 2.12.0, w3 None" in text
    assert "GPU counts differ" in text and "w3 1" in text
    assert "w2: no network interface holds its collective address" in text
    assert "pipeline_rendezvous_port 29400 is in use on w1" in text and "nc" in text
    assert "batch_size 2 over 3 processes leaves 0 rows per process" in text


def test_a_given_interface_or_one_worker_needs_no_interface_per_worker():
    two = {"w1": facts(interface=None), "w2": facts(interface=None)}
    assert distributed_train_problems(two, "w1", interface="eth1") == []
    assert distributed_train_problems({"w1": facts(interface=None, port_free=False)}, "w1") == []


def test_unknown_reference_is_a_filter_error():
    with pytest.raises(AnsibleFilterError):
        distributed_train_problems({"w2": facts()}, "w1")
    with pytest.raises(AnsibleFilterError):
        stage_plan_differences({"w2": {}}, "w1")


def plan(key, **digest):
    base = {"cmd": "c1", "params": "p1", "deps/work/prepared": "d1", "code/python": "py1"}
    return {"key": key, "inputs_digest": dict(base, **digest),
            "code_python": {"python": "3.11.2", "implementation": "cpython",
                            "dists": {"torch": "2.13.0", "numpy": "2.4.6"}}}


def test_same_keys_agree():
    assert stage_plan_differences({"w1": plan("k"), "w2": plan("k")}, "w1") == []


def test_differing_parts_and_versions_are_named():
    other = plan("k2", params="p2", **{"deps/work/prepared": "d2", "code/python": "py2"})
    other["code_python"] = {"python": "3.11.2", "implementation": "cpython",
                            "dists": {"torch": "2.12.0", "numpy": "2.4.6", "extra": "1.0"}}
    lines = stage_plan_differences({"w1": plan("k1"), "w2": other}, "w1")
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("w2: key k2 differs from w1's k1 in ")
    assert "deps/work/prepared" in line and "params" in line
    assert "torch 2.12.0 on w2, 2.13.0 on w1" in line and "extra 1.0 on w2, (absent) on w1" in line
    assert line.index("torch") < line.index("extra"), "torch is named first"
