"""Molecule scenarios keep SSH host keys pinned (no StrictHostKeyChecking=no, even implied) and verify with testinfra.

Molecule writes its own ansible.cfg with host_key_checking = False. Ansible then starts every
ssh command with `-o StrictHostKeyChecking=no`, ahead of the scenario's ssh_connection_options,
and ssh keeps the first value it reads: the pinned known_hosts would be ignored. Seen in a
running scenario's ssh argv; each scenario now turns host key checking back on.

What is shared lives once, in Molecule's base config (.config/molecule/config.yml, which Molecule
finds at the repository root and merges under every molecule/<scenario>/molecule.yml). The checks
run on the merged config, built the way Molecule builds it (molecule.util.merge_dicts: base
first, scenario last; mappings merge, lists and scalars replace), and a scenario may not repeat
what the base already says.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Iterator, Tuple

import pytest
import yaml
from molecule.util import merge_dicts

from conftest import ROOT

pytestmark = pytest.mark.unit

BASE = ROOT / ".config" / "molecule" / "config.yml"
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
KNOWN_HOSTS = "-o UserKnownHostsFile=${MOLECULE_EPHEMERAL_DIRECTORY}/guests/known_hosts"


def base() -> dict:
    return yaml.safe_load(BASE.read_text())


def own(scenario: str) -> dict:
    """The scenario's molecule.yml alone."""
    return yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())


def load(scenario: str) -> dict:
    """The scenario's config as Molecule merges it (config.Config._combine, before its defaults and interpolation)."""
    return merge_dicts(merge_dicts({}, base()), own(scenario))


def leaves(data: Any, path: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], Any]]:
    """(key path, value) for every value merge_dicts would not merge further (anything but a mapping)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, path + (key,))
    else:
        yield path, data


def test_there_are_scenarios() -> None:
    assert {"cuda", "ml_runtime", "mlflow_server", "mlflow_server_postgresql", "nvidia_driver"} <= set(SCENARIOS)


def test_merge_is_molecules() -> None:
    # What the tests below rely on: the scenario's mappings merge into the base's, its lists replace them.
    merged = merge_dicts({"a": {"b": 1, "l": [1, 2]}}, {"a": {"c": 2, "l": [3]}})
    assert merged == {"a": {"b": 1, "c": 2, "l": [3]}}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_host_key_checking_is_on(scenario: str) -> None:
    defaults = load(scenario)["provisioner"].get("config_options", {}).get("defaults", {})
    assert defaults.get("host_key_checking") is True, (
        "molecule/%s/molecule.yml + .config/molecule/config.yml: provisioner.config_options.defaults."
        "host_key_checking must be true (Molecule's default false makes Ansible pass StrictHostKeyChecking=no first)"
        % scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ssh_options_pin_the_host_key(scenario: str) -> None:
    config = load(scenario)
    assert config["driver"]["name"] == "default" and config["driver"]["options"]["managed"] is True, config["driver"]
    options = config["driver"]["ssh_connection_options"]
    for pinned in ("-o StrictHostKeyChecking=yes", "-o GlobalKnownHostsFile=/dev/null",
                   "-o HostKeyAlgorithms=ssh-ed25519", "-o IdentitiesOnly=yes"):
        assert pinned in options, options
    assert any(o.startswith("-o UserKnownHostsFile=") for o in options), options
    env = config["provisioner"].get("env", {})
    everything = " ".join(options + [str(env.get("ANSIBLE_SSH_EXTRA_ARGS", "")), str(env.get("ANSIBLE_SSH_ARGS", ""))])
    assert "StrictHostKeyChecking=no" not in everything and "StrictHostKeyChecking=accept-new" not in everything
    assert "ssh_connection_options" not in own(scenario).get("driver", {}), (
        "molecule/%s/molecule.yml: a list there replaces the base's pinned options; extend them "
        "through provisioner.env ANSIBLE_SSH_EXTRA_ARGS instead" % scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_known_hosts_path_is_literal_for_testinfra(scenario: str) -> None:
    # Testinfra builds its ssh command from these options verbatim (no Jinja), so the path may
    # use only Molecule's own ${...} interpolation. It is the scenario's one known_hosts file, in
    # the state directory the create playbook hands to its helper (--state), where the helper
    # pins every guest's key under the address Ansible connects to.
    config = load(scenario)
    (option,) = [o for o in config["driver"]["ssh_connection_options"] if o.startswith("-o UserKnownHostsFile=")]
    assert "{{" not in option, option
    assert option == KNOWN_HOSTS
    playbooks = config["provisioner"]["playbooks"]
    for step in ("create", "destroy"):
        text = (ROOT / "molecule" / scenario / playbooks[step]).resolve().read_text()
        assert "--state" in text and '"{{ molecule_ephemeral_directory }}/guests"' in text, playbooks[step]
    helper = ROOT / "molecule" / "_shared" / ("podman_guest.py" if "container" in playbooks["create"] else "libvirt_guest.py")
    text = helper.read_text()
    assert "host_keys.pin(state_dir," in text and "host_keys.forget(" in text, helper
    assert 'keydir / "known_hosts"' not in text, "%s: a per-guest known_hosts is not the file ssh reads" % helper


def test_host_keys_pin_one_line_per_host(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("host_keys", ROOT / "molecule" / "_shared" / "host_keys.py")
    host_keys = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_keys)
    path = host_keys.pin(tmp_path, "[127.0.0.1]:2222", "ssh-ed25519 AAAAold root@a")
    assert path == tmp_path / "known_hosts" and path.name == KNOWN_HOSTS.rsplit("/", 1)[1]
    host_keys.pin(tmp_path, "10.1.2.10", "ssh-ed25519 AAAAvm root@b\n")
    host_keys.pin(tmp_path, "[127.0.0.1]:2222", "ssh-ed25519 AAAAnew root@a")
    assert path.read_text() == "10.1.2.10 ssh-ed25519 AAAAvm\n[127.0.0.1]:2222 ssh-ed25519 AAAAnew\n"
    assert path.stat().st_mode & 0o777 == 0o600
    host_keys.forget(tmp_path)
    host_keys.forget(tmp_path)
    assert not path.exists()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_create_refuses_without_the_base_config(scenario: str) -> None:
    # Run outside the checkout, Molecule would not find the base and would fall back to its own
    # ssh options (StrictHostKeyChecking=no): the create playbook stops first.
    create = (ROOT / "molecule" / scenario / load(scenario)["provisioner"]["playbooks"]["create"]).resolve()
    first = yaml.safe_load(create.read_text())[0]["tasks"][0]
    if "ansible.builtin.import_tasks" in first:  # the shared file both create playbooks import
        first = yaml.safe_load((create.parent / first["ansible.builtin.import_tasks"]).read_text())[0]
    assert "ansible.builtin.assert" in first, first
    that = first["ansible.builtin.assert"]["that"]
    assert any("StrictHostKeyChecking=yes" in t for t in that) and any("host_key_checking" in t for t in that), that


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verifies_with_testinfra(scenario: str) -> None:
    config = load(scenario)
    verifier = config.get("verifier", {})
    assert verifier.get("name") == "testinfra", verifier
    assert "verify.py" in verifier.get("additional_files_or_dirs", []), verifier
    assert verifier.get("options", {}).get("hosts") == "all", "without --hosts testinfra checks the controller itself"
    assert (ROOT / "molecule" / scenario / "verify.py").is_file()
    assert "verify" not in config["provisioner"].get("playbooks", {}), "an Ansible verify playbook would not run"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sequence_and_prerun(scenario: str) -> None:
    config = load(scenario)
    assert config["scenario"]["test_sequence"] == ["destroy", "create", "converge", "idempotence", "verify", "destroy"]
    assert config["prerun"] is False
    assert len(config["platforms"]) >= 1 and all(p.get("name") for p in config["platforms"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_does_not_repeat_the_base(scenario: str) -> None:
    # The dedupe stays done: every value the base gives (a mapping's leaf, or a whole list) is
    # said there only. A scenario may add keys or give a different value, never the same one.
    flat_base = dict(leaves(base()))
    repeated = ["/".join(path) for path, value in leaves(own(scenario)) if path in flat_base and flat_base[path] == value]
    assert not repeated, "molecule/%s/molecule.yml repeats .config/molecule/config.yml: %s" % (scenario, repeated)
