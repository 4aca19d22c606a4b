"""Molecule scenarios keep SSH host keys pinned (no StrictHostKeyChecking=no, even implied) and verify with testinfra.

Molecule writes its own ansible.cfg with host_key_checking = False. Ansible then starts every
ssh command with `-o StrictHostKeyChecking=no`, ahead of the scenario's ssh_connection_options,
and ssh keeps the first value it reads: the pinned known_hosts would be ignored. Seen in a
running scenario's ssh argv; each scenario now turns host key checking back on.
"""
from __future__ import annotations

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.unit

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


def load(scenario: str) -> dict:
    return yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())


def test_there_are_scenarios() -> None:
    assert {"cuda", "ml_runtime", "mlflow_server", "mlflow_server_postgresql", "nvidia_driver"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_host_key_checking_is_on(scenario: str) -> None:
    defaults = load(scenario)["provisioner"].get("config_options", {}).get("defaults", {})
    assert defaults.get("host_key_checking") is True, (
        "molecule/%s/molecule.yml: set provisioner.config_options.defaults.host_key_checking: true "
        "(Molecule's default false makes Ansible pass StrictHostKeyChecking=no first)" % scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ssh_options_pin_the_host_key(scenario: str) -> None:
    options = load(scenario)["driver"]["ssh_connection_options"]
    assert "-o StrictHostKeyChecking=yes" in options, options
    assert any(o.startswith("-o UserKnownHostsFile=") for o in options), options
    assert not any("StrictHostKeyChecking=no" in o or "StrictHostKeyChecking=accept-new" in o for o in options)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_known_hosts_path_is_literal_for_testinfra(scenario: str) -> None:
    # Testinfra builds its ssh command from these options verbatim (no Jinja), so the path may
    # use only Molecule's own ${...} interpolation; it names the scenario's one platform.
    config = load(scenario)
    (option,) = [o for o in config["driver"]["ssh_connection_options"] if o.startswith("-o UserKnownHostsFile=")]
    platforms = [p["name"] for p in config["platforms"]]
    assert "{{" not in option, option
    assert option == "-o UserKnownHostsFile=${MOLECULE_EPHEMERAL_DIRECTORY}/guests/%s/known_hosts" % platforms[0]
    assert len(platforms) == 1, "one known_hosts path serves one platform; give each platform its own option"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verifies_with_testinfra(scenario: str) -> None:
    config = load(scenario)
    verifier = config.get("verifier", {})
    assert verifier.get("name") == "testinfra", verifier
    assert "verify.py" in verifier.get("additional_files_or_dirs", []), verifier
    assert verifier.get("options", {}).get("hosts") == "all", "without --hosts testinfra checks the controller itself"
    assert (ROOT / "molecule" / scenario / "verify.py").is_file()
    assert "verify" not in config["provisioner"].get("playbooks", {}), "an Ansible verify playbook would not run"
