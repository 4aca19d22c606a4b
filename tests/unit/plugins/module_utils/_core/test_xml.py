"""_xml without lxml on the managed host: every module that builds or reads XML fails at once,
naming the library, as ansible-core's own modules do (missing_required_lib), never with an
AttributeError half-way. The modules run in a subprocess whose ``lxml`` package raises
ImportError, as a host without python3-lxml would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import COLLECTIONS, ROOT

pytestmark = pytest.mark.unit

# The modules that import the XML helpers (directly or through their services), with arguments
# that pass their argument spec and need no daemon (test:///default, state absent, lists empty).
XML_MODULES = {
    "domain": {"name": "x", "state": "absent"},
    "domain_info": {},
    "domain_migration": {"name": "x", "dest_uri": "test:///default"},
    "domains": {"config": []},
    "network": {"name": "x", "state": "absent"},
    "networks": {"config": []},
    "pool": {"name": "x", "state": "absent"},
    "pools": {"config": []},
    "snapshot": {"name": "x", "domain": "test", "state": "absent"},
    "snapshot_info": {"domain": "test"},
    "volume": {"name": "x", "pool": "default-pool", "state": "absent"},
    "volumes": {"config": []},
}


@pytest.fixture(scope="module")
def no_lxml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, first on PYTHONPATH, makes ``import lxml`` fail."""
    path = tmp_path_factory.mktemp("no-lxml")
    (path / "lxml").mkdir()
    (path / "lxml" / "__init__.py").write_text("raise ImportError('No module named lxml (made unimportable by the test)')\n")
    return path


def run_without_lxml(name: str, args: Dict[str, Any], blocker: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(COLLECTIONS)])
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
    # _ansible_tracebacks_for: what -vvv asks for, so the kept ImportError comes back as ``exception``.
    payload = dict(args, uri="test:///default", _ansible_check_mode=False, _ansible_diff=False,
                   _ansible_tracebacks_for=["error"])
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.%s" % name],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": payload}), capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=120, check=False)
    out = proc.stdout.strip()
    assert "{" in out, "module %s printed no JSON (rc=%s): %s %s" % (name, proc.returncode, out, proc.stderr)
    return json.loads(out[out.index("{"):])


@pytest.mark.parametrize("name", sorted(XML_MODULES))
def test_a_module_without_lxml_fails_cleanly_naming_it(name: str, no_lxml: Path) -> None:
    result = run_without_lxml(name, XML_MODULES[name], no_lxml)
    assert result.get("failed") is True, result
    assert "Failed to import the required Python library (lxml)" in result["msg"], result["msg"]
    assert "python3-lxml" in result["msg"] and "AttributeError" not in json.dumps(result)
    assert result.get("changed", False) is False
    assert "made unimportable by the test" in result["exception"], "the ImportError is kept for -vvv"


def test_the_modules_listed_are_those_that_import_the_xml_helpers() -> None:
    """A new module that builds XML belongs in XML_MODULES (and calls fail_without_lxml)."""
    modules = sorted(p.stem for p in (Path(ROOT) / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
    code = ("import importlib, sys\n"
            "for name in %r:\n"
            "    for key in [k for k in sys.modules if k.startswith('ansible_collections.mlinfra')]:\n"
            "        del sys.modules[key]  # each module's own imports, not those cached before it\n"
            "    importlib.import_module('ansible_collections.mlinfra.kvm.plugins.modules.' + name)\n"
            "    if 'ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml' in sys.modules:\n"
            "        print(name)\n")
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    proc = subprocess.run([sys.executable, "-c", code % modules], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=120, check=True)
    using = proc.stdout.split()
    assert sorted(using) == sorted(XML_MODULES)
    for name in using:
        assert "fail_without_lxml(module)" in (Path(ROOT) / "plugins" / "modules" / ("%s.py" % name)).read_text()
