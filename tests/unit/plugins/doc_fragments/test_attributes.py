"""plugins/doc_fragments/attributes.py: how far each module supports check mode, diff mode and which
platform it runs on is written once per kind of module (one that changes something, one that only
reads) and named by each module. Here every module's documentation, as ansible-doc renders it with
the fragments merged, states all three attributes with a support level, and a module that names a
part restates none of what the part already says (its own entry is only what differs)."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, module_env
from ansible_collections.mlinfra.kvm.plugins.doc_fragments.attributes import ModuleDocFragment

pytestmark = pytest.mark.unit

MODULES = sorted(p.stem for p in (Path(ROOT) / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
SUPPORT = {"full", "partial", "none", "N/A"}
PARTS = {"mlinfra.kvm.attributes": "DOCUMENTATION", "mlinfra.kvm.attributes.info": "INFO",
         "mlinfra.kvm.attributes.posix": "POSIX"}


def documentation_of(name: str) -> dict:
    module = importlib.import_module("ansible_collections.mlinfra.kvm.plugins.modules." + name)
    return yaml.safe_load(module.DOCUMENTATION)


@pytest.fixture(scope="module")
def rendered() -> dict:
    ansible_doc = Path(sys.executable).parent / "ansible-doc"
    proc = subprocess.run([str(ansible_doc), "-t", "module", "--json"] + ["mlinfra.kvm." + m for m in MODULES],
                          cwd=str(ROOT), env=module_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", MODULES)
def test_every_module_renders_check_mode_diff_mode_and_the_posix_platform(rendered, name):
    attributes = rendered["mlinfra.kvm." + name]["doc"]["attributes"]
    assert set(attributes) >= {"check_mode", "diff_mode", "platform"}, (name, sorted(attributes))
    for key in ("check_mode", "diff_mode", "platform"):
        assert attributes[key].get("description"), (name, key)
        assert attributes[key].get("support") in SUPPORT, (name, key, attributes[key])
    assert attributes["platform"]["platforms"] == "posix", name


@pytest.mark.parametrize("name", MODULES)
def test_a_module_that_names_a_part_states_only_what_differs_from_it(name):
    doc = documentation_of(name)
    parts = [f for f in doc.get("extends_documentation_fragment", []) if f in PARTS]
    if not parts:
        return      # states its attributes itself, merged over ansible.builtin.action_common_attributes
    assert len(parts) == 1, (name, parts)
    assert "ansible.builtin.action_common_attributes" in doc["extends_documentation_fragment"], name
    given = yaml.safe_load(getattr(ModuleDocFragment, PARTS[parts[0]]))["attributes"]
    for key, own in (doc.get("attributes") or {}).items():
        repeated = {k: v for k, v in own.items() if given.get(key, {}).get(k) == v}
        assert not repeated, "%s restates %s of %s: %s" % (name, key, parts[0], repeated)


def test_a_read_only_part_says_there_is_no_difference_to_show():
    info = yaml.safe_load(ModuleDocFragment.INFO)["attributes"]
    assert info["diff_mode"]["support"] == "N/A" and info["diff_mode"]["details"]
    changes = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["attributes"]
    assert (changes["check_mode"]["support"], changes["diff_mode"]["support"]) == ("full", "full")
