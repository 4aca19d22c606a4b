"""Returned values agree with each module's RETURN: every key a module returns is documented, and
every key RETURN promises as always returned is there, in check mode too."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from conftest import ROOT, run_module_process  # noqa: E402
from sysfs_builder import gpu_host  # noqa: E402

pytestmark = pytest.mark.unit
MODULES = Path(ROOT) / "plugins" / "modules"


def documented(module: str) -> Dict[str, Any]:
    tree = ast.parse((MODULES / ("%s.py" % module)).read_text())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "RETURN")
    return yaml.safe_load(text)


def test_pci_info_devices_return_only_documented_keys(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    result = run_module_process("pci_info", {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc)}, check=True)
    assert not result["failed"], result
    keys = set(documented("pci_info")["devices"]["contains"])
    for device in result["devices"]:
        assert set(device) <= keys, "undocumented in RETURN devices: %s" % sorted(set(device) - keys)
    assert {"slot", "revision"} <= keys


def test_pool_in_check_mode_returns_the_name_of_the_pool_it_would_make(tmp_path: Path) -> None:
    # test:///default is a fresh in-memory libvirt per process: the pool is always new here.
    # (A real run is in tests/integration/test_pool.py, against libvirtd.)
    args = {"name": "mlkvm-returns", "type": "dir", "target": str(tmp_path / "pool"), "uri": "test:///default"}
    result = run_module_process("pool", args, check=True)
    assert not result["failed"], result
    assert result["changed"] is True
    assert "name" in documented("pool")["pool"]["contains"]
    assert result["pool"]["name"] == "mlkvm-returns"
