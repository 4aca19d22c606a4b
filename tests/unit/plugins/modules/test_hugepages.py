"""hugepages on synthetic sysfs/proc/etc trees, plus a stingy-kernel service seam for short grants."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict

import pytest


from conftest import COLLECTIONS, four_ways, run_module_process  # noqa: E402
from sysfs_builder import SysfsTree  # noqa: E402

if str(COLLECTIONS) not in sys.path:  # the in-process tests import the module itself
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import Roots  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._hugepages import HugepagesRunner, HugepagesService  # noqa: E402
from fake_module import StandInModule  # noqa: E402

pytestmark = pytest.mark.unit

MEM_KIB = 16 * 1024 * 1024  # 16 GiB


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    tree = SysfsTree(tmp_path)
    tree.meminfo(MEM_KIB)
    tree.hugepages()
    return tree


def nr(tree: SysfsTree, kib: int) -> str:
    return (tree.sys / "kernel/mm/hugepages" / ("hugepages-%dkB" % kib) / "nr_hugepages").read_text().strip()


def sysctl(tree: SysfsTree) -> Path:
    return tree.etc / "sysctl.d" / "80-mlinfra-hugepages.conf"


def test_2m_now_and_sysctl_four_ways(tree: SysfsTree) -> None:
    results = four_ways("hugepages", dict(tree.roots(), size="2M", count=1024))
    assert nr(tree, 2048) == "1024"
    assert sysctl(tree).read_text().splitlines()[-1] == "vm.nr_hugepages = 1024"
    apply = results["apply"]
    assert apply["granted"] == 1024 and apply["fully_granted"] is True and apply["persistent_method"] == "sysctl"
    assert apply["kernel_args"] == []
    assert results["check"]["diff"]["before"] == {"nr_hugepages": 0, "sysctl_file": ""}
    assert results["check"]["diff"]["after"]["nr_hugepages"] == 1024


def test_check_mode_writes_nothing(tree: SysfsTree) -> None:
    result = run_module_process("hugepages", dict(tree.roots(), count=512), check=True, diff=True)
    assert result["changed"] is True and nr(tree, 2048) == "0" and not sysctl(tree).exists()


def test_1g_returns_kernel_args_four_ways(tree: SysfsTree) -> None:
    results = four_ways("hugepages", dict(tree.roots(), size="1G", count=4))
    assert nr(tree, 1048576) == "4" and not sysctl(tree).exists()
    assert results["apply"]["persistent_method"] == "kernel_args"
    assert results["apply"]["kernel_args"] == ["hugepagesz=1G", "hugepages=4"]


def test_1g_default_size_uses_sysctl(tree: SysfsTree) -> None:
    tree.meminfo(MEM_KIB, hugepagesize_kib=1048576)  # booted with default_hugepagesz=1G
    result = run_module_process("hugepages", dict(tree.roots(), size="1G", count=2))
    assert result["persistent_method"] == "sysctl" and "vm.nr_hugepages = 2" in sysctl(tree).read_text()


def test_release_removes_sysctl_file(tree: SysfsTree) -> None:
    run_module_process("hugepages", dict(tree.roots(), count=256))
    results = four_ways("hugepages", dict(tree.roots(), count=0))
    assert nr(tree, 2048) == "0" and not sysctl(tree).exists()
    assert results["apply"]["diff"]["before"]["nr_hugepages"] == 256


def test_not_persistent_leaves_etc_alone(tree: SysfsTree) -> None:
    result = run_module_process("hugepages", dict(tree.roots(), count=64, persistent=False))
    assert result["changed"] is True and nr(tree, 2048) == "64" and not sysctl(tree).exists()
    assert result["persistent_method"] == "none"


# -- refusals ---------------------------------------------------------------------------------------
def assert_refused(tree: SysfsTree, result: Dict[str, Any], *words: str) -> None:
    assert result["failed"] and result["changed"] is False, result
    for word in words:
        assert word in result["msg"], (word, result["msg"])
    assert nr(tree, 2048) == "0" and nr(tree, 1048576) == "0" and not sysctl(tree).exists()


def test_more_than_memory_refused(tree: SysfsTree) -> None:
    result = run_module_process("hugepages", dict(tree.roots(), size="1G", count=32))
    assert_refused(tree, result, "option count", "32.0 GiB", "MemTotal (16.0 GiB)", "at most 14")
    assert result["most"] == 14


def test_other_size_counts_against_memory(tree: SysfsTree) -> None:
    (tree.sys / "kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages").write_text("10\n")
    result = run_module_process("hugepages", dict(tree.roots(), size="2M", count=3000))
    assert result["failed"] and "10.0 GiB already reserved in other sizes" in result["msg"]
    assert "at most 2252" in result["msg"]
    assert nr(tree, 2048) == "0"


@pytest.mark.parametrize("args,option", [({"count": -1}, "option count"),
                                         ({"count": 1, "sysctl_name": "../x"}, "option sysctl_name"),
                                         ({"count": 1, "max_memory_percent": 0}, "option max_memory_percent")])
def test_bad_values_refused(tree: SysfsTree, args: Dict[str, Any], option: str) -> None:
    assert_refused(tree, run_module_process("hugepages", dict(tree.roots(), **args)), option)


def test_size_not_offered_refused(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.meminfo(MEM_KIB)
    tree.hugepages(sizes_kib=(2048,))
    result = run_module_process("hugepages", dict(tree.roots(), size="1G", count=1))
    assert result["failed"] and "option size" in result["msg"] and "pdpe1gb" in result["msg"]


def test_bad_size_choice_refused(tree: SysfsTree) -> None:
    result = run_module_process("hugepages", dict(tree.roots(), size="4M", count=1))
    assert result["failed"] and "size" in result["msg"]


# -- what the kernel grants: a service seam that plays a fragmented kernel ---------------------------
class FakeModule(StandInModule):
    def __init__(self, params: Dict[str, Any], check_mode: bool = False) -> None:
        super().__init__(params, check_mode=check_mode)


class StingyKernel(HugepagesService):
    """Grants at most ``limit`` pages, writing that back to nr_hugepages like the kernel."""

    def __init__(self, roots: Roots, limit: int) -> None:
        super().__init__(roots)
        self.limit = limit

    def set_count(self, kib: int, count: int) -> int:
        return super().set_count(kib, min(count, self.limit))


def params(tree: SysfsTree, **extra: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = dict(tree.roots(), size="1G", count=8, persistent=True, sysctl_name="80-mlinfra-hugepages",
                               max_memory_percent=90, strict=False)
    out.update(extra)
    return out


def test_short_grant_reported_and_warned(tree: SysfsTree) -> None:
    module = FakeModule(params(tree))
    result = HugepagesRunner(module, StingyKernel(Roots(**tree.roots()), 3)).run()
    assert result["changed"] is True and result["requested"] == 8 and result["granted"] == 3
    assert result["fully_granted"] is False and nr(tree, 1048576) == "3"
    assert "granted 3 of 8 1G hugepages" in module.warnings[0] and "kernel_args" in module.warnings[0]
    assert result["kernel_args"] == ["hugepagesz=1G", "hugepages=8"], "the boot reservation asks for all 8"


def test_short_grant_strict_fails(tree: SysfsTree) -> None:
    module = FakeModule(params(tree, strict=True))
    with pytest.raises(KvmError) as err:
        HugepagesRunner(module, StingyKernel(Roots(**tree.roots()), 5)).run()
    assert "granted 5 of 8" in err.value.msg and err.value.details["changed"] is True


class ReadOnlyEtc(HugepagesService):
    """nr_hugepages can be set, the sysctl.d file cannot be written."""

    def write(self, path: str, content: Any) -> None:
        raise KvmError("cannot write %s: read-only file system" % path, path=path)


def test_sysctl_write_failing_after_the_count_is_a_partial_change(tree: SysfsTree) -> None:
    module = FakeModule(params(tree, size="2M", count=16))
    with pytest.raises(KvmError) as err:
        HugepagesRunner(module, ReadOnlyEtc(Roots(**tree.roots()))).run()
    nr_path = tree.sys / "kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    assert nr(tree, 2048) == "16" and not sysctl(tree).exists()
    assert err.value.details["changed"] is True
    assert err.value.details["actions"] == ["set %s to 16" % nr_path]
    assert err.value.details["failed_action"] == "write %s" % sysctl(tree)
    assert err.value.msg == "cannot write %s: read-only file system (already done: set %s to 16)" % (sysctl(tree), nr_path)


def test_check_mode_predicts_a_full_grant_and_writes_nothing(tree: SysfsTree) -> None:
    module = FakeModule(params(tree, size="2M", count=16), check_mode=True)
    result = HugepagesRunner(module, ReadOnlyEtc(Roots(**tree.roots()))).run()
    assert result["changed"] is True and result["granted"] == 16 and result["fully_granted"] is True
    assert nr(tree, 2048) == "0" and not sysctl(tree).exists() and module.warnings == []
