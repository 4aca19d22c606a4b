"""What the tests of the monitoring role's alert rule templates share (test_monitoring_rules.py for
mlinfra-alerts.rules.yml.j2, test_monitoring_slurm_rules.py for mlinfra-slurm.rules.yml.j2): the
template rendered as Ansible's template module renders it, the rules of a rendered file, promtool,
the directory `promtool test rules` runs in, and the alerts that the promtool tests make fire and
keep quiet."""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import jinja2
import pytest
import yaml

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed; `make setup` installs it")


def template_environment(template: Path) -> Tuple[jinja2.Environment, str]:
    """(jinja2 Environment, template source without its header), as Ansible builds them: the
    #jinja2: header line sets [[ ]] as the variable delimiters, so Prometheus' {{ $labels.x }}
    pass through."""
    header, _unused, body = template.read_text().partition("\n")
    assert header.startswith("#jinja2:"), "the template must start with a #jinja2: header line"
    overrides = {}
    for pair in header[len("#jinja2:"):].split(","):  # Ansible's parsing of the override line
        key, value = pair.split(":", 1)
        overrides[key.strip()] = ast.literal_eval(value.strip())
    # Ansible's template module: trim_blocks on, lstrip_blocks off; undefined variables fail.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **overrides)
    return env, body


def rules_of(text: str) -> List[Dict[str, Any]]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in (group["rules"] or [])]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=str(cwd), timeout=120, check=False)


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _block_strings)


def write_promtool_test_dir(directory: Path, rendered: str, rule_file_name: str, promtool_tests: Path) -> Path:
    """The rendered rules as rule_file_name, without descriptions (operator prose, not compared by
    the unit tests; promtool compares all annotations), and a copy of promtool_tests naming them.
    Returns the copy's path, for `promtool test rules`."""
    rules = yaml.safe_load(rendered)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("description", None)
    (directory / rule_file_name).write_text(yaml.dump(rules, Dumper=_Dumper, sort_keys=False, width=10 ** 6))
    tests = yaml.safe_load(promtool_tests.read_text())
    tests["rule_files"] = [rule_file_name]
    path = directory / promtool_tests.name
    path.write_text(yaml.safe_dump(tests, sort_keys=False, width=10 ** 6, allow_unicode=True))
    return path


def promtool_check_rules(directory: Path, rendered: str, rule_file_name: str) -> subprocess.CompletedProcess:
    """`promtool check rules` of the rendered rules, written as rule_file_name in directory."""
    (directory / rule_file_name).write_text(rendered)
    return promtool("check", "rules", rule_file_name, cwd=directory)


def promtool_test_rules(directory: Path, rendered: str, rule_file_name: str, promtool_tests: Path) -> subprocess.CompletedProcess:
    """`promtool test rules` of promtool_tests against the rendered rules (write_promtool_test_dir)."""
    path = write_promtool_test_dir(directory, rendered, rule_file_name, promtool_tests)
    return promtool("test", "rules", path.name, cwd=directory)


def alert_cases(promtool_tests: Path) -> Tuple[Set[str], Set[str], List[Tuple[str, Dict[str, Any]]]]:
    """(the alerts a case makes fire, the alerts a case keeps quiet, every alert a case expects as
    (case name, alert)). Each expected alert is compared on its summary alone."""
    fires, quiet, expected = set(), set(), []
    for group in yaml.safe_load(promtool_tests.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
            for alert in case.get("exp_alerts") or []:
                assert set(alert.get("exp_annotations", {})) == {"summary"}, (group.get("name"), case["alertname"])
                expected.append((case["alertname"], alert))
    return fires, quiet, expected
