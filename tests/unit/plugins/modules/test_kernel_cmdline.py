"""kernel_cmdline against a temporary etc/proc root with fake update-grub and grubby executables."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest


from conftest import four_ways, run_module_process  # noqa: E402
from sysfs_builder import SysfsTree  # noqa: E402

pytestmark = pytest.mark.unit

RUNNING = "BOOT_IMAGE=/boot/vmlinuz-6.1.0-27-amd64 root=UUID=1234-abcd ro quiet"


@pytest.fixture
def debian(tmp_path: Path) -> SysfsTree:
    tree = SysfsTree(tmp_path)
    tree.os_release("debian")
    tree.cmdline(RUNNING)
    (tree.etc / "default" / "grub.d").mkdir(parents=True)
    (tree.etc / "default" / "grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    return tree


def args_for(tree: SysfsTree, **extra: Any) -> Dict[str, Any]:
    script, _unused = tree.fake_command("update-grub")
    args: Dict[str, Any] = {"etc_root": str(tree.etc), "proc_root": str(tree.proc),
                            "update_grub_command": [str(script)]}
    args.update(extra)
    return args


def calls(tree: SysfsTree, name: str) -> List[str]:
    log = tree.base / "bin" / ("%s.log" % name)
    return log.read_text().splitlines() if log.exists() else []


def dropin(tree: SysfsTree, name: str = "90-mlinfra-kvm") -> Path:
    return tree.etc / "default" / "grub.d" / ("%s.cfg" % name)


# -- Debian / Ubuntu: GRUB drop-in ----------------------------------------------------------------
def test_dropin_four_ways_with_iommu_auto(debian: SysfsTree) -> None:
    results = four_ways("kernel_cmdline", args_for(debian, iommu="auto", args=["iommu=pt"]))
    text = dropin(debian).read_text()
    assert text.splitlines()[-1] == 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT intel_iommu=on iommu=pt"'
    assert len(calls(debian, "update-grub")) == 1, "update-grub only on the changing run, never in check mode"
    for result in results.values():
        assert result["backend"] == "grub_dropin"
        assert result["args"] == ["intel_iommu=on", "iommu=pt"]
        assert result["reboot_required"] is True and result["pending"] == ["intel_iommu=on", "iommu=pt"]
    check = results["check"]
    assert check["diff"]["before"] == "" and "intel_iommu=on iommu=pt" in check["diff"]["after"]
    assert check["commands"] == [[str(debian.base / "bin" / "update-grub")]]
    assert results["apply_again"]["commands"] == []


def test_check_mode_writes_nothing(debian: SysfsTree) -> None:
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"]), check=True, diff=True)
    assert result["changed"] is True and not dropin(debian).exists() and calls(debian, "update-grub") == []


def test_reboot_not_required_when_running_kernel_has_args(debian: SysfsTree) -> None:
    debian.cmdline(RUNNING + " intel_iommu=on iommu=pt")
    result = run_module_process("kernel_cmdline", args_for(debian, args=["intel_iommu=on", "iommu=pt"]))
    assert result["changed"] is True and result["reboot_required"] is False and result["pending"] == []


def test_amd_cpu_picks_amd_iommu(debian: SysfsTree) -> None:
    debian.cpuinfo("amd")
    result = run_module_process("kernel_cmdline", args_for(debian, iommu="auto"))
    assert result["args"] == ["amd_iommu=on"] and "amd_iommu=on" in dropin(debian).read_text()


def test_iommu_auto_unknown_vendor_refused(debian: SysfsTree) -> None:
    debian.cpuinfo("CentaurHauls")
    result = run_module_process("kernel_cmdline", args_for(debian, iommu="auto"))
    assert result["failed"] and "option iommu" in result["msg"] and "iommu: intel" in result["msg"]
    assert not dropin(debian).exists()


def test_changed_args_replace_the_dropin(debian: SysfsTree) -> None:
    base = args_for(debian, name="60-hugepages")
    run_module_process("kernel_cmdline", dict(base, args=["hugepagesz=1G", "hugepages=4"]))
    result = run_module_process("kernel_cmdline", dict(base, args=["hugepagesz=1G", "hugepages=8"]), diff=True)
    assert result["changed"] is True
    assert "hugepages=4" in result["diff"]["before"] and "hugepages=8" in result["diff"]["after"]
    assert '"$GRUB_CMDLINE_LINUX_DEFAULT hugepagesz=1G hugepages=8"' in dropin(debian, "60-hugepages").read_text()
    assert len(calls(debian, "update-grub")) == 2


def test_absent_removes_args_then_the_file(debian: SysfsTree) -> None:
    debian.cmdline(RUNNING + " intel_iommu=on iommu=pt")
    base = args_for(debian)
    run_module_process("kernel_cmdline", dict(base, args=["intel_iommu=on", "iommu=pt"]))
    one = four_ways("kernel_cmdline", dict(base, args=["iommu=pt"], state="absent"))
    assert 'LINUX_DEFAULT intel_iommu=on"' in dropin(debian).read_text()
    assert one["apply"]["reboot_required"] is True and one["apply"]["pending"] == ["iommu=pt"]
    all_gone = run_module_process("kernel_cmdline", dict(base, state="absent"))
    assert all_gone["changed"] is True and not dropin(debian).exists()
    assert all_gone["pending"] == ["intel_iommu=on"], "still on the running kernel until the reboot"
    again = run_module_process("kernel_cmdline", dict(base, state="absent"))
    assert again["changed"] is False
    assert len(calls(debian, "update-grub")) == 3


@pytest.mark.parametrize("bad", ["intel_iommu=on iommu=pt", 'quiet"', "a='b'", "x=$(reboot)", "x=`id`",
                                 "x=$HOME", "x=a\\b", "x=a;b", "", "x=a\nb", "-foo"])
def test_args_that_break_grub_refused(debian: SysfsTree, bad: str) -> None:
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt", bad]))
    assert result["failed"] and result["changed"] is False
    assert result["msg"].startswith("option args: value %r" % bad)
    assert "one argument per list item" in result["msg"]
    assert not dropin(debian).exists() and calls(debian, "update-grub") == []


def test_bad_name_and_empty_args_refused(debian: SysfsTree) -> None:
    result = run_module_process("kernel_cmdline", args_for(debian, name="../grub", args=["iommu=pt"]))
    assert result["failed"] and "option name" in result["msg"]
    result = run_module_process("kernel_cmdline", args_for(debian))
    assert result["failed"] and "option args" in result["msg"] and "iommu: auto" in result["msg"]


def test_unknown_os_asks_for_backend(debian: SysfsTree) -> None:
    debian.os_release("alpine")
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"]))
    assert result["failed"] and "option backend" in result["msg"] and "grub_dropin" in result["msg"]


def test_update_grub_failure_reported(debian: SysfsTree) -> None:
    broken, _unused = debian.fake_command("update-grub-broken", rc=1)
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"],
                                                           update_grub_command=[str(broken)]))
    assert result["failed"] and "rc=1" in result["msg"]
    assert result["changed"] is True, "the drop-in was written before update-grub failed"


def grub_dir_listing(tree: SysfsTree) -> List[str]:
    return sorted(p.name for p in (tree.etc / "default" / "grub.d").iterdir())


def test_update_grub_failure_says_what_was_written_and_what_failed(debian: SysfsTree) -> None:
    flaky, _log = debian.flaky_command("update-grub-flaky", failures=1, rc=7)
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"], update_grub_command=[str(flaky)]))
    assert result["failed"] and result["changed"] is True, result
    marker = str(debian.etc / "default" / "grub.d" / ".90-mlinfra-kvm.update-grub-pending")
    assert result["written"] == [marker, str(dropin(debian))], result
    assert result["cmd"] == [str(flaky)] and result["rc"] == 7 and "broken on purpose" in result["stderr"]
    # The partial change as every runner reports it: what was done, and the action that failed.
    assert result["actions"] == ["write %s" % marker, "write %s" % dropin(debian)], result
    assert result["failed_action"] == "run %s" % flaky, result
    assert result["msg"].endswith("(already done: write %s; write %s)" % (marker, dropin(debian))), result


def test_a_missing_update_grub_is_named_and_the_write_reported(debian: SysfsTree) -> None:
    missing = str(debian.base / "bin" / "no-such-update-grub")
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"], update_grub_command=[missing]))
    assert result["failed"] and "Error executing command" not in result["msg"], result
    assert missing in result["msg"] and result["cmd"] == [missing]
    assert result["changed"] is True and str(dropin(debian)) in result["written"]
    assert "next run of this task runs" in result["msg"]


def test_an_update_grub_that_hangs_is_killed_and_named(debian: SysfsTree) -> None:
    hang = debian.base / "bin" / "update-grub-hangs"
    hang.parent.mkdir(exist_ok=True)
    hang.write_text("#!/bin/sh\nsleep 120\n")
    hang.chmod(0o755)
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"], update_grub_command=[str(hang)],
                                                           command_timeout=1), timeout=60)
    assert result["failed"] and result["changed"] is True, result
    assert str(hang) in result["msg"] and "within 1 s" in result["msg"] and result["cmd"] == [str(hang)]


@pytest.mark.parametrize("check_mode", [True, False])
def test_no_grub_defaults_is_refused_before_anything_is_written(debian: SysfsTree, check_mode: bool) -> None:
    (debian.etc / "default" / "grub").unlink()
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"]), check=check_mode)
    assert result["failed"] and result["changed"] is False, result
    assert str(debian.etc / "default" / "grub") in result["msg"] and "option backend" in result["msg"]
    assert "grubby" in result["msg"] and "install GRUB" in result["msg"]
    assert grub_dir_listing(debian) == [] and calls(debian, "update-grub") == []


def test_failed_update_grub_is_retried_by_the_next_run(debian: SysfsTree) -> None:
    """update-grub fails after the drop-in was written: the next run must not be a no-op."""
    flaky, log = debian.flaky_command("update-grub-flaky", failures=1)
    args = args_for(debian, args=["iommu=pt"], update_grub_command=[str(flaky)])
    marker = debian.etc / "default" / "grub.d" / ".90-mlinfra-kvm.update-grub-pending"
    first = run_module_process("kernel_cmdline", args)
    assert first["failed"] and first["changed"] is True, first
    assert "broken on purpose" in first["msg"] and "next run of this task runs" in first["msg"]
    assert first["commands"] == [[str(flaky)]]
    assert "iommu=pt" in dropin(debian).read_text() and marker.exists()
    check = run_module_process("kernel_cmdline", args, check=True)
    assert not check["failed"] and check["changed"] is True and check["commands"] == [[str(flaky)]], check
    assert len(log.read_text().splitlines()) == 1, "check mode runs nothing"
    second = run_module_process("kernel_cmdline", args)
    assert not second["failed"] and second["changed"] is True and second["commands"] == [[str(flaky)]], second
    assert not marker.exists()
    for check_mode in (True, False):
        third = run_module_process("kernel_cmdline", args, check=check_mode)
        assert not third["failed"] and third["changed"] is False and third["commands"] == [], third
    assert len(log.read_text().splitlines()) == 2


def test_failed_update_grub_after_removal_is_retried(debian: SysfsTree) -> None:
    run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"]))
    flaky, log = debian.flaky_command("update-grub-flaky", failures=1)
    args = args_for(debian, state="absent", update_grub_command=[str(flaky)])
    first = run_module_process("kernel_cmdline", args)
    assert first["failed"] and first["changed"] is True and "is removed but grub.cfg" in first["msg"], first
    assert not dropin(debian).exists()
    second = run_module_process("kernel_cmdline", args)
    assert not second["failed"] and second["changed"] is True, second
    assert run_module_process("kernel_cmdline", args)["changed"] is False
    assert len(log.read_text().splitlines()) == 2


def test_ubuntu_is_debian_family(debian: SysfsTree) -> None:
    debian.os_release("ubuntu", like="debian")
    result = run_module_process("kernel_cmdline", args_for(debian, args=["iommu=pt"]), check=True)
    assert result["backend"] == "grub_dropin"


# -- EL: grubby -------------------------------------------------------------------------------
GRUBBY = r'''#!%(python)s
import json, sys
state = %(state)r
kernels = json.load(open(state))
argv = sys.argv[1:]
open(state + ".log", "a").write(" ".join(argv) + "\n")
if argv == ["--info=ALL"]:
    for index, (kernel, args) in enumerate(kernels.items()):
        print("index=%%d" %% index)
        print("kernel=\"%%s\"" %% kernel)
        print("args=\"%%s\"" %% " ".join(args))
        print("root=\"UUID=1234\"")
    sys.exit(0)
assert argv[0] == "--update-kernel=ALL", argv
op, _, value = argv[1].partition("=")
for kernel, args in kernels.items():
    for arg in value.split():
        if op == "--args" and arg not in args:
            args.append(arg)
        if op == "--remove-args" and arg in args:
            args.remove(arg)
json.dump(kernels, open(state, "w"))
'''


@pytest.fixture
def el(tmp_path: Path) -> SysfsTree:
    tree = SysfsTree(tmp_path)
    tree.os_release("rocky", like="rhel centos fedora")
    tree.cmdline(RUNNING)
    state = tmp_path / "grubby.json"
    state.write_text(json.dumps({"/boot/vmlinuz-5.14.0-427": ["ro", "crashkernel=auto"],
                                 "/boot/vmlinuz-5.14.0-503": ["ro", "crashkernel=auto", "iommu=pt"]}))
    script = tmp_path / "grubby"
    script.write_text(GRUBBY % {"python": sys.executable, "state": str(state)})
    script.chmod(0o755)
    return tree


def grubby_args(tree: SysfsTree, **extra: Any) -> Dict[str, Any]:
    args = args_for(tree, grubby_command=[str(tree.base / "grubby")])
    args.update(extra)
    return args


def grubby_calls(tree: SysfsTree) -> List[str]:
    return (tree.base / "grubby.json.log").read_text().splitlines()


def test_grubby_four_ways(el: SysfsTree) -> None:
    results = four_ways("kernel_cmdline", grubby_args(el, iommu="intel", args=["iommu=pt"]))
    assert results["check"]["backend"] == "grubby"
    assert results["check"]["commands"] == [[str(el.base / "grubby"), "--update-kernel=ALL",
                                             "--args=intel_iommu=on iommu=pt"]]
    changes = [c for c in grubby_calls(el) if c != "--info=ALL"]
    assert changes == ["--update-kernel=ALL --args=intel_iommu=on iommu=pt"]
    kernels = json.loads((el.base / "grubby.json").read_text())
    assert all("intel_iommu=on" in a and "iommu=pt" in a for a in kernels.values())
    assert results["apply_again"]["reboot_required"] is True
    assert not (el.etc / "default" / "grub.d").exists(), "no drop-in on EL"


def test_grubby_absent_four_ways(el: SysfsTree) -> None:
    results = four_ways("kernel_cmdline", grubby_args(el, args=["iommu=pt"], state="absent"))
    assert results["apply"]["diff"]["before"]["kernels"]["/boot/vmlinuz-5.14.0-503"][-1] == "iommu=pt"
    assert [c for c in grubby_calls(el) if c != "--info=ALL"] == ["--update-kernel=ALL --remove-args=iommu=pt"]
    assert results["apply"]["reboot_required"] is False, "the running kernel never had it"


def test_grubby_absent_needs_args(el: SysfsTree) -> None:
    result = run_module_process("kernel_cmdline", grubby_args(el, state="absent"))
    assert result["failed"] and "option args" in result["msg"]
