"""_pci_info, the pci_info report, in-process on synthetic trees: what gpus_only keeps, what
check_usage adds, and that check mode answers like a real run (the module itself, as a process,
is tested in tests/unit/plugins/modules/test_pci_info.py)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sysfs_builder import BRIDGE, EDU, GPU, GPU_AUDIO, VGA, VGA_AUDIO, SysfsTree, gpu_host  # noqa: E402

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci_info import argument_spec, run_pci_info  # noqa: E402

pytestmark = pytest.mark.unit


def module(tree: SysfsTree, check_mode: bool = False, **params: Any) -> SimpleNamespace:
    values = {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc), "gpus_only": False, "check_usage": True}
    values.update(params)
    return SimpleNamespace(params=values, check_mode=check_mode)


def test_the_spec_has_the_documented_options_and_defaults() -> None:
    spec = argument_spec()
    assert sorted(spec) == ["check_usage", "gpus_only", "proc_root", "sysfs_root"]
    assert spec["gpus_only"] == {"type": "bool", "default": False}
    assert spec["check_usage"] == {"type": "bool", "default": True}


def test_gpus_only_keeps_the_gpus_their_groups_and_functions(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    everything = {d["address"] for d in run_pci_info(module(tree))["devices"]}
    assert EDU in everything
    kept = [d["address"] for d in run_pci_info(module(tree, gpus_only=True))["devices"]]
    assert sorted(kept) == sorted({BRIDGE, GPU, GPU_AUDIO, VGA, VGA_AUDIO}), "the group's bridge stays, EDU goes"


def test_check_usage_false_leaves_in_use_out(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    assert all("in_use" in g for g in run_pci_info(module(tree))["gpus"])
    assert not any("in_use" in g for g in run_pci_info(module(tree, check_usage=False))["gpus"])


def test_check_mode_gives_the_real_runs_answer(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    tree.unbind(GPU)
    tree.bind(GPU, "vfio-pci")
    real = run_pci_info(module(tree))
    assert real == run_pci_info(module(tree, check_mode=True))
    assert real["changed"] is False and real["vfio"] == {"driver_loaded": True, "devices": [GPU]}
    gpu = {g["address"]: g for g in real["gpus"]}[GPU]
    assert gpu["selector"] == {"vendor": "10de", "device": "2335", "index": 0, "include_functions": True}


def test_a_relative_root_is_refused_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError) as err:
        run_pci_info(module(gpu_host(tmp_path), sysfs_root="sys"))
    assert err.value.details["option"] == "sysfs_root"
