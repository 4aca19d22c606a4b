"""The monitoring role's Slurm alert rules (roles/monitoring/templates/mlinfra-slurm.rules.yml.j2).

Rendered the way Ansible's template module renders it (the #jinja2: header sets [[ ]] as the
variable delimiters, so Prometheus' {{ $labels.x }} pass through), with the role's defaults. The
file must pass `promtool check rules`, and `promtool test rules` runs
tests/unit/monitoring/slurm.rules.test.yml against it: every alert fires in one case (exact
labels and summary) and stays quiet in another.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict

import jinja2.meta
import pytest
import yaml

from conftest import ROOT
from prometheus_rules import (alert_cases, needs_promtool, promtool_check_rules, promtool_test_rules, rules_of,
                              template_environment)

pytestmark = pytest.mark.unit

ROLE = Path(ROOT) / "roles" / "monitoring"
TEMPLATE = ROLE / "templates" / "mlinfra-slurm.rules.yml.j2"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "monitoring" / "slurm.rules.test.yml"
RULE_FILE_NAME = "mlinfra-slurm.rules.yml"
ALERTS = ["SlurmctldDown", "SlurmdbdDown", "SlurmNodeDown", "SlurmNodeDrained", "SlurmJobPendingTooLong"]
VARIABLES = {"monitoring_slurm_alerts_silenced", "monitoring_slurm_alert_daemon_down_for",
             "monitoring_slurm_alert_node_for", "monitoring_slurm_alert_pending_hours"}


def defaults() -> Dict[str, Any]:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def environment() -> tuple:
    return template_environment(TEMPLATE)


def render(**overrides: Any) -> str:
    env, body = environment()
    values = {k: v for k, v in defaults().items() if k in VARIABLES}
    values.update(overrides)
    return env.from_string(body).render(**values)


def test_the_template_reads_only_its_documented_variables_which_the_role_defines():
    env, body = environment()
    assert jinja2.meta.find_undeclared_variables(env.parse(body)) == VARIABLES
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = {name: spec for entry in specs["argument_specs"].values() for name, spec in entry["options"].items()}
    for name in VARIABLES:
        assert name in defaults() and name in options, name
        assert options[name]["default"] == defaults()[name], name
    assert options["monitoring_slurm_alerts_silenced"]["choices"] == ALERTS


def test_every_alert_has_severity_a_summary_and_a_description_that_say_what_to_do():
    rules = rules_of(render())
    assert [rule["alert"] for rule in rules] == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        for text in (rule["annotations"]["summary"], rule["annotations"]["description"]):
            assert re.search(r"`[^`]+`", text), (rule["alert"], text)   # a command to run


def test_durations_and_threshold_come_from_the_variables():
    rules = {rule["alert"]: rule for rule in rules_of(render(
        monitoring_slurm_alert_daemon_down_for="7m", monitoring_slurm_alert_node_for="11m",
        monitoring_slurm_alert_pending_hours=0.5))}
    assert rules["SlurmctldDown"]["for"] == rules["SlurmdbdDown"]["for"] == "7m"
    assert rules["SlurmNodeDown"]["for"] == rules["SlurmNodeDrained"]["for"] == "11m"
    assert re.search(r"> 1800\b", rules["SlurmJobPendingTooLong"]["expr"]), rules["SlurmJobPendingTooLong"]["expr"]


@pytest.mark.parametrize("name", ALERTS)
def test_a_silenced_alert_is_left_out(tmp_path, name):
    rendered = render(monitoring_slurm_alerts_silenced=[name])
    assert [rule["alert"] for rule in rules_of(rendered)] == [a for a in ALERTS if a != name]


@needs_promtool
def test_silencing_everything_leaves_a_valid_file(tmp_path):
    proc = promtool_check_rules(tmp_path, render(monitoring_slurm_alerts_silenced=ALERTS), RULE_FILE_NAME)
    assert proc.returncode == 0 and "0 rules found" in proc.stdout, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_check_rules(tmp_path):
    proc = promtool_check_rules(tmp_path, render(), RULE_FILE_NAME)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(ALERTS) in proc.stdout, proc.stdout


@needs_promtool
def test_promtool_unit_tests(tmp_path):
    proc = promtool_test_rules(tmp_path, render(), RULE_FILE_NAME, PROMTOOL_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_tests_cover_every_alert_firing_and_quiet():
    fires, quiet, _expected = alert_cases(PROMTOOL_TESTS)
    assert fires == quiet == set(ALERTS), (fires, quiet)


def test_prometheus_gets_the_rules_file_checked_by_promtool():
    """The server writes it into the rules directory that prometheus.yml loads (*.rules.yml),
    through promtool, with the other rule files."""
    tasks = yaml.safe_load((ROLE / "tasks" / "prometheus.yml").read_text())
    [write] = [t for t in tasks if "mlinfra.kvm.config_files" in t]
    [entry] = write["mlinfra.kvm.config_files"]["files"]
    assert entry["path"] == "{{ __monitoring_rules_dir }}/%s" % RULE_FILE_NAME
    assert "mlinfra-slurm.rules.yml.j2" in entry["content"]
    assert entry["validate"] == ["promtool", "check", "rules", "%s"]
    assert "{{ __monitoring_rules_dir }}/*.rules.yml" in (ROLE / "templates" / "prometheus.yml.j2").read_text()
