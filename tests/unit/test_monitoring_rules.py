"""The monitoring role's Prometheus alert rules (roles/monitoring/templates/mlinfra-alerts.rules.yml.j2).

The template is rendered here the way Ansible's template module renders it: its first line
(`#jinja2: ...`) sets the variable delimiters to [[ ]] so that Prometheus' own {{ $labels.x }}
pass through; blocks keep {% %}, trim_blocks is on as in Ansible. One test renders it with
Ansible itself and compares. The rendered file must pass `promtool check rules`, and
`promtool test rules` runs tests/unit/monitoring/alerts.test.yml against it: every alert
fires in one case (exact labels and summary) and stays quiet in another.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import jinja2.meta
import pytest
import yaml

from prometheus_rules import (PROMTOOL, alert_cases, needs_promtool, promtool_check_rules, promtool_test_rules,
                              rules_of, template_environment)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
TEMPLATE = ROLE / "templates" / "mlinfra-alerts.rules.yml.j2"
ROLE_DEFAULTS = ROLE / "defaults" / "main.yml"
ROLE_VARS = ROLE / "vars" / "main.yml"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "monitoring" / "alerts.test.yml"
RULE_FILE_NAME = "mlinfra-alerts.rules.yml"

# The variables the alert rules read, with the role's default values. roles/monitoring/
# defaults/main.yml must hold the same values: where it defines them, its values are merged
# over these and win, so the tests always run with what the role deploys.
ALERT_VARIABLES: Dict[str, Any] = {
    "monitoring_alerts_silenced": [],
    "monitoring_alert_host_down_for": "2m",
    "monitoring_alert_vm_down_for": "1m",
    "monitoring_alert_gpu_temp_celsius": 85,
    "monitoring_alert_gpu_fb_used_ratio": 0.95,
    "monitoring_alert_disk_free_ratio": 0.10,
    "monitoring_alert_memory_available_ratio": 0.10,
    "monitoring_alert_stage_max_age_hours": 26,
    "monitoring_alert_for": "5m",
}

SEVERITIES = {"critical", "warning", "info"}
ALWAYS_FIRING = {"Watchdog"}  # severity none; never quiet (silencing it is its quiet case)


def role_defaults() -> Dict[str, Any]:
    values = copy.deepcopy(ALERT_VARIABLES)
    if ROLE_DEFAULTS.is_file():
        values.update(yaml.safe_load(ROLE_DEFAULTS.read_text()) or {})
    return values


def alert_names() -> List[str]:
    return yaml.safe_load(ROLE_VARS.read_text())["__monitoring_alert_names"]


def render(**overrides: Any) -> str:
    env, body = template_environment(TEMPLATE)
    values = role_defaults()
    values.update(overrides)
    return env.from_string(body).render(**values)


# --------------------------------------------------------------------------- the template


def test_template_reads_only_the_documented_variables():
    env, body = template_environment(TEMPLATE)
    used = jinja2.meta.find_undeclared_variables(env.parse(body))
    assert used == set(ALERT_VARIABLES), used ^ set(ALERT_VARIABLES)


def test_alert_names_match_the_role_vars():
    names = alert_names()
    assert len(names) == len(set(names)), names
    rendered = [rule["alert"] for rule in rules_of(render())]
    assert len(rendered) == len(set(rendered)), rendered
    assert set(rendered) == set(names), set(rendered) ^ set(names)


def test_every_alert_has_severity_summary_and_description():
    for rule in rules_of(render()):
        name = rule["alert"]
        severity = rule.get("labels", {}).get("severity")
        if name in ALWAYS_FIRING:
            assert severity == "none", name
        else:
            assert severity in SEVERITIES, (name, severity)
        annotations = rule.get("annotations", {})
        assert annotations.get("summary", "").strip(), name
        description = annotations.get("description", "").strip()
        assert description, name
        # What to do: at least one command to run, in backquotes.
        assert re.search(r"`[^`]+`", description), (name, description)


def test_for_durations_come_from_the_variables():
    values = {"monitoring_alert_host_down_for": "7m", "monitoring_alert_vm_down_for": "3m",
              "monitoring_alert_for": "11m"}
    rules = {rule["alert"]: rule for rule in rules_of(render(**values))}
    assert rules["HypervisorDown"]["for"] == "7m"
    assert rules["ExporterDown"]["for"] == "7m"
    assert rules["MLflowUnreachable"]["for"] == "7m"
    assert rules["GuestDown"]["for"] == "3m"
    assert rules["VMNotRunning"]["for"] == "3m"
    for name in ("GPUTemperatureHigh", "GPUMemoryNearlyFull", "DiskNearlyFull", "HypervisorMemoryPressure"):
        assert rules[name]["for"] == "11m", name
    assert "for" not in rules["PipelineStageFailed"]


def test_rendered_like_ansible(tmp_path):
    """Ansible's own template module gives the same file (the #jinja2: header works there)."""
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    if not ansible_playbook.exists():
        pytest.skip("ansible-playbook is not installed in this Python environment")
    dest = tmp_path / RULE_FILE_NAME
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars": ALERT_VARIABLES,
        "tasks": [{"ansible.builtin.template": {"src": str(TEMPLATE), "dest": str(dest)}}],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    argv = [str(ansible_playbook), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)]
    # The role's defaults win over the dict in the play, as in render().
    if ROLE_DEFAULTS.is_file():
        argv[1:1] = ["-e", "@%s" % ROLE_DEFAULTS]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert dest.read_text().rstrip("\n") == render().rstrip("\n")


# --------------------------------------------------------------------------- silencing


@pytest.mark.parametrize("name", alert_names())
def test_silenced_alert_is_absent(tmp_path, name):
    rendered = render(monitoring_alerts_silenced=[name])
    names = [rule["alert"] for rule in rules_of(rendered)]
    assert name not in names
    assert sorted(names + [name]) == sorted(alert_names())
    if PROMTOOL is not None:
        proc = promtool_check_rules(tmp_path, rendered, RULE_FILE_NAME)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_silencing_everything_leaves_a_valid_file(tmp_path):
    full = yaml.safe_load(render())
    rendered = render(monitoring_alerts_silenced=alert_names())
    silent = yaml.safe_load(rendered)
    # The groups stay, each with `rules: []`.
    assert [group["name"] for group in silent["groups"]] == [group["name"] for group in full["groups"]]
    assert all(group["rules"] == [] for group in silent["groups"]), silent
    if PROMTOOL is None:
        pytest.skip("promtool (Debian package prometheus) is not installed; `make setup` installs it")
    proc = promtool_check_rules(tmp_path, rendered, RULE_FILE_NAME)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 rules found" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- promtool


@needs_promtool
def test_promtool_check_rules(tmp_path):
    proc = promtool_check_rules(tmp_path, render(), RULE_FILE_NAME)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(alert_names()) in proc.stdout, proc.stdout


@needs_promtool
def test_promtool_unit_tests(tmp_path):
    proc = promtool_test_rules(tmp_path, render(), RULE_FILE_NAME, PROMTOOL_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_tests_cover_every_alert():
    """alerts.test.yml has, for every alert, a case where it fires and one where it is quiet."""
    fires, quiet, expected = alert_cases(PROMTOOL_TESTS)
    for name, alert in expected:
        assert "severity" in alert.get("exp_labels", {}), name
    names = set(alert_names())
    assert fires == names, names ^ fires
    assert quiet == names - ALWAYS_FIRING, (names - ALWAYS_FIRING) ^ quiet
