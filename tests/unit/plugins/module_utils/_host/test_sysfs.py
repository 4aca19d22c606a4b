"""The host modules' roots: a root that is not a directory fails naming the option, through the
real modules (pci_info, hugepages, vfio_pci), in check mode on a synthetic tree."""
from __future__ import annotations

import os

import pytest

from conftest import run_module_process
from sysfs_builder import GPU, GPU_AUDIO, gpu_host

pytestmark = pytest.mark.unit


def hostile_roots(tmp_path):
    # absent is allowed: an etc_root the module fills may not exist yet
    os.mkfifo(str(tmp_path / "fifo"))
    (tmp_path / "file").write_text("x\n")
    return [str(tmp_path / "fifo"), str(tmp_path / "file" / "sub"), "/dev/zero", "/a\x00b", ""]


@pytest.mark.parametrize("name,option,extra", [
    ("pci_info", "proc_root", {}),
    ("pci_info", "sysfs_root", {}),
    ("hugepages", "etc_root", {"count": 4}),
    ("hugepages", "sysfs_root", {"count": 4}),
    ("vfio_pci", "sysfs_root", {"devices": [GPU, GPU_AUDIO], "initramfs": "none"}),
])
def test_a_root_that_is_not_a_directory_names_the_option(tmp_path, name, option, extra):
    tree = gpu_host(tmp_path / "host")
    tree.meminfo(16 * 1024 * 1024)
    tree.hugepages()
    roots = {k: v for k, v in tree.roots().items() if k in ("sysfs_root", "proc_root") or name != "pci_info"}
    # absent is allowed: an etc_root the module fills may not exist yet
    for value in hostile_roots(tmp_path):
        result = run_module_process(name, dict(roots, **extra, **{option: value}), check=True)
        assert result["failed"] and result["msg"].startswith("option %s: value" % option), (value, result)
        assert "exception" not in result, result
