"""The monitoring role's Prometheus alert rules (roles/monitoring/templates/mlinfra-alerts.rules.yml.j2).

The template is rendered here the way Ansible's template module renders it: its first line
(`#jinja2: ...`) sets the variable delimiters to [[ ]] so that Prometheus' own {{ $labels.x }}
pass through; blocks keep {% %}, trim_blocks is on as in Ansible. One test renders it with
Ansible itself and compares. The rendered file must pass `promtool check rules`, and
`promtool test rules` runs tests/unit/monitoring/alerts.test.yml against it: every alert
fires in one case (exact labels and summary) and stays quiet in another.
"""
from __future__ import annotations

import ast
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import jinja2
import jinja2.meta
import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
TEMPLATE = ROLE / "templates" / "mlinfra-alerts.rules.yml.j2"
ROLE_DEFAULTS = ROLE / "defaults" / "main.yml"
ROLE_VARS = ROLE / "vars" / "main.yml"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "monitoring" / "alerts.test.yml"
RULE_FILE_NAME = "mlinfra-alerts.rules.yml"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed; `make setup` installs it")

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


def template_environment() -> tuple:
    """(jinja2 Environment, template source without its header), as Ansible builds them."""
    text = TEMPLATE.read_text()
    header, _unused, body = text.partition("\n")
    assert header.startswith("#jinja2:"), "the template must start with a #jinja2: header line"
    overrides = {}
    for pair in header[len("#jinja2:"):].split(","):  # Ansible's parsing of the override line
        key, value = pair.split(":", 1)
        overrides[key.strip()] = ast.literal_eval(value.strip())
    # Ansible's template module: trim_blocks on, lstrip_blocks off; undefined variables fail.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **overrides)
    return env, body


def render(**overrides: Any) -> str:
    env, body = template_environment()
    values = role_defaults()
    values.update(overrides)
    return env.from_string(body).render(**values)


def rules_of(text: str) -> List[Dict[str, Any]]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in (group["rules"] or [])]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=str(cwd), timeout=120, check=False)


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _block_strings)


def write_promtool_test_dir(directory: Path, rendered: str) -> Path:
    """The rendered rules without descriptions (operator prose, not compared by the unit
    tests; promtool compares all annotations) and a copy of alerts.test.yml naming them."""
    rules = yaml.safe_load(rendered)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("description", None)
    (directory / RULE_FILE_NAME).write_text(yaml.dump(rules, Dumper=_Dumper, sort_keys=False, width=10 ** 6))
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text())
    tests["rule_files"] = [RULE_FILE_NAME]
    path = directory / "alerts.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False, width=10 ** 6, allow_unicode=True))
    return path


# --------------------------------------------------------------------------- the template


def test_template_reads_only_the_documented_variables():
    env, body = template_environment()
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
        (tmp_path / RULE_FILE_NAME).write_text(rendered)
        proc = promtool("check", "rules", RULE_FILE_NAME, cwd=tmp_path)
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
    (tmp_path / RULE_FILE_NAME).write_text(rendered)
    proc = promtool("check", "rules", RULE_FILE_NAME, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 rules found" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- promtool


@needs_promtool
def test_promtool_check_rules(tmp_path):
    (tmp_path / RULE_FILE_NAME).write_text(render())
    proc = promtool("check", "rules", RULE_FILE_NAME, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(alert_names()) in proc.stdout, proc.stdout


@needs_promtool
def test_promtool_unit_tests(tmp_path):
    path = write_promtool_test_dir(tmp_path, render())
    proc = promtool("test", "rules", path.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_tests_cover_every_alert():
    """alerts.test.yml has, for every alert, a case where it fires and one where it is quiet."""
    fires, quiet = set(), set()
    for group in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
            for alert in case.get("exp_alerts") or []:
                assert "severity" in alert.get("exp_labels", {}), (group["name"], case["alertname"])
                assert set(alert.get("exp_annotations", {})) == {"summary"}, (group["name"], case["alertname"])
    names = set(alert_names())
    assert fires == names, names ^ fires
    assert quiet == names - ALWAYS_FIRING, (names - ALWAYS_FIRING) ^ quiet
