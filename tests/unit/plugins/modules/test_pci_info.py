"""pci_info on the captured H200 guest (real sysfs, no IOMMU) and on synthetic host trees."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest


from conftest import SHARED, run_module_process  # noqa: E402
from sysfs_builder import BRIDGE, EDU, GPU, GPU_AUDIO, VGA, VGA_AUDIO, SysfsTree, gpu_host  # noqa: E402

pytestmark = pytest.mark.unit

H200_TGZ = SHARED / "fixtures" / "h200-passthrough-guest" / "sysfs-pci.tgz"


@pytest.fixture
def h200(tmp_path: Path) -> Dict[str, Any]:
    """The captured tree, extracted, with its proc_cmdline put where /proc/cmdline would be."""
    if not H200_TGZ.exists():
        pytest.skip("fixture %s is not here (shared fixtures missing)" % H200_TGZ)
    subprocess.run(["tar", "-xzf", str(H200_TGZ), "-C", str(tmp_path)], check=True)
    (tmp_path / "proc").mkdir()
    shutil.copy(str(tmp_path / "proc_cmdline"), str(tmp_path / "proc" / "cmdline"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    result = run_module_process("pci_info", {"sysfs_root": str(tmp_path / "sys"), "proc_root": str(tmp_path / "proc")})
    assert not result["failed"], result
    return {"result": result, "manifest": manifest, "base": tmp_path}


def test_h200_gpu_found(h200: Dict[str, Any]) -> None:
    result = h200["result"]
    assert result["changed"] is False
    assert [g["address"] for g in result["gpus"]] == ["0000:00:06.0"]
    gpu = result["gpus"][0]
    assert gpu["id"] == "10de:2335" and gpu["vendor_name"] == "NVIDIA"
    assert (gpu["subsystem_vendor_id"], gpu["subsystem_device_id"]) == ("10de", "18bf")
    assert gpu["class"] == "030200" and gpu["class_name"] == "3D controller"
    assert gpu["driver"] == "nvidia" and gpu["driver_override"] is None
    assert gpu["numa_node"] is None, "numa_node -1 is reported as unknown"
    assert gpu["boot_vga"] is False and gpu["iommu_group"] is None and gpu["functions"] == []


def test_h200_matches_manifest(h200: Dict[str, Any]) -> None:
    """Every device of the capture's own summary, with the same ids and driver."""
    devices = {d["address"]: d for d in h200["result"]["devices"]}
    manifest = h200["manifest"]["devices"]
    assert sorted(devices) == sorted(manifest)
    for address, want in manifest.items():
        got = devices[address]
        assert "0x" + got["vendor_id"] == want["vendor"] and "0x" + got["device_id"] == want["device"]
        assert "0x" + got["class"] == want["class"]
        assert got["driver"] == (os.path.basename(want["driver"]) if "driver" in want else None)
    assert h200["result"]["vfio"] == {"driver_loaded": False, "devices": []}


def test_h200_iommu_absent_and_passthrough_impossible(h200: Dict[str, Any]) -> None:
    iommu = h200["result"]["iommu"]
    assert iommu["enabled"] is False and iommu["groups"] == {} and iommu["group_count"] == 0
    assert iommu["cmdline_flags"] == [], "proc_cmdline of the capture has no IOMMU flag"
    assert "no IOMMU groups" in iommu["reason"] and "intel_iommu=on" in iommu["reason"]
    passthrough = h200["result"]["gpus"][0]["passthrough"]
    assert passthrough["possible"] is False
    assert passthrough["reasons"][0].startswith("IOMMU is not enabled")
    assert "bound to driver nvidia" in passthrough["reasons"][1]
    assert passthrough["blocking_devices"] == ["0000:00:06.0"]


def test_h200_gpus_only(tmp_path: Path, h200: Dict[str, Any]) -> None:
    base = h200["base"]
    result = run_module_process("pci_info", {"sysfs_root": str(base / "sys"), "proc_root": str(base / "proc"),
                                             "gpus_only": True})
    assert [d["address"] for d in result["devices"]] == ["0000:00:06.0"]


# -- synthetic host trees -----------------------------------------------------------------------
def info(tree: SysfsTree, **extra: Any) -> Dict[str, Any]:
    args = {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc)}
    args.update(extra)
    result = run_module_process("pci_info", args, check=True)
    assert not result["failed"], result
    assert result["changed"] is False
    return result


def test_groups_members_functions_and_boot_vga(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    tree.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/vda1 intel_iommu=on iommu=pt -- single")
    result = info(tree)
    iommu = result["iommu"]
    assert iommu["enabled"] is True and iommu["reason"] is None
    assert iommu["groups"]["7"] == [BRIDGE, GPU, GPU_AUDIO]
    assert iommu["groups"]["6"] == [VGA, VGA_AUDIO]
    assert iommu["cmdline_flags"] == ["intel_iommu=on", "iommu=pt"] and iommu["passthrough_mode"] is True
    assert iommu["cpu_vendor"] == "intel" and iommu["required_argument"] == "intel_iommu=on"
    gpus = {g["address"]: g for g in result["gpus"]}
    assert sorted(gpus) == [VGA, GPU]
    assert gpus[VGA]["boot_vga"] is True and gpus[VGA]["functions"] == [VGA_AUDIO]
    assert gpus[GPU]["numa_node"] == 0 and gpus[GPU]["iommu_group"] == "7"
    devices = {d["address"]: d for d in result["devices"]}
    assert devices[BRIDGE]["is_bridge"] is True and devices[EDU]["driver"] is None


def test_passthrough_reasons_name_blocking_endpoints_not_bridges(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    gpu = {g["address"]: g for g in info(tree)["gpus"]}[GPU]["passthrough"]
    assert gpu["possible"] is False
    assert gpu["group_members"] == [BRIDGE, GPU, GPU_AUDIO]
    assert gpu["blocking_devices"] == [GPU, GPU_AUDIO], "the bridge (pcieport) does not block"
    assert any("%s (10de:22a3) is bound to driver snd_hda_intel" % GPU_AUDIO in r for r in gpu["reasons"])


def test_passthrough_possible_when_group_on_vfio_or_unbound(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    tree.unbind(GPU)
    tree.bind(GPU, "vfio-pci")
    tree.unbind(GPU_AUDIO)  # no driver at all is fine too
    result = info(tree)
    gpu = {g["address"]: g for g in result["gpus"]}[GPU]
    assert gpu["passthrough"] == {"possible": True, "reasons": [], "iommu_group": "7",
                                  "group_members": [BRIDGE, GPU, GPU_AUDIO], "blocking_devices": []}
    assert result["vfio"] == {"driver_loaded": True, "devices": [GPU]}


def test_in_use_reported(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    tree.add_class_device(VGA, "drm/card0", "dri/card0")
    tree.open_fd(1, "/dev/dri/card0")
    nvidia = tree.proc / "driver" / "nvidia" / "gpus" / GPU
    nvidia.mkdir(parents=True)
    (nvidia / "information").write_text("Model: \t NVIDIA H200\nDevice Minor: \t 2\n")
    tree.open_fd(77, "/dev/nvidia2", fd=9)
    gpus = {g["address"]: g for g in info(tree)["gpus"]}
    assert gpus[VGA]["in_use"] == ["/dev/dri/card0 is open by a process"]
    assert gpus[GPU]["in_use"] == ["/dev/nvidia2 is open by a process"]


def test_amd_host_without_iommu(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    tree.cpuinfo("amd", hypervisor=True)
    iommu = info(tree)["iommu"]
    assert iommu["enabled"] is False and iommu["virtual_machine"] is True
    assert iommu["required_argument"] == "amd_iommu=on" and "amd_iommu=on" in iommu["reason"]


def test_flag_present_but_no_groups_points_at_firmware(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    tree.cmdline("root=/dev/sda1 intel_iommu=on")
    assert "firmware" in info(tree)["iommu"]["reason"]


def test_empty_tree(tmp_path: Path) -> None:
    """A sysfs root with no PCI at all (a container): empty answers, no error."""
    result = info(SysfsTree(tmp_path))
    assert result["devices"] == [] and result["gpus"] == [] and result["iommu"]["enabled"] is False
