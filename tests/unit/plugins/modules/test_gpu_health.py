"""gpu_health through the real module: the H200 capture and its one-way mutations, kernel logs with
XID 79 and XID 13, a nvidia-smi stand-in, and a worker without GPU."""
from __future__ import annotations

import stat

import pytest

from nvidia_fixtures import GPU_HEALTH as FIXTURES, gpu_xml

pytestmark = pytest.mark.unit


def xml(name: str) -> str:
    return str(gpu_xml(name))


def judge(run_module, xml_name: str, log: str = "", check: bool = False) -> dict:
    args = {"xml_file": xml(xml_name), "source": "nvidia-smi"}
    args.update({"kernel_log_file": str(FIXTURES / log)} if log else {"kernel_log": "none"})
    result = run_module("gpu_health", args, check=check)
    assert not result["failed"], result
    assert result["changed"] is False
    return result


def test_the_real_capture_is_healthy_in_check_mode_too(run_module):
    for check in (False, True):
        result = judge(run_module, "capture", check=check)
        assert result["verdict"] == "healthy" and result["unhealthy"] == [] and result["degraded"] == []
        assert result["msg"] == "1 GPU: 1 healthy"
        assert result["gpus"][0]["uuid"] == "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"


@pytest.mark.parametrize("fixture, log, verdict, words", [
    ("dbe.xml", "", "unhealthy", "2 uncorrectable (double-bit) ECC errors"),
    ("row-remap-pending.xml", "", "degraded", "row remap is pending"),
    ("pcie-x8.xml", "", "degraded", "PCIe link at x8 of x16"),
    ("thermal-throttle.xml", "", "degraded", "hw_thermal_slowdown"),
    ("capture", "xid79.log", "unhealthy", "XID 79 (GPU has fallen off the bus"),
])
def test_each_fault_gives_its_verdict_naming_the_gpu(run_module, fixture, log, verdict, words):
    result = judge(run_module, fixture, log)
    assert result["verdict"] == verdict
    lines = result["unhealthy"] if verdict == "unhealthy" else result["degraded"]
    (line,) = lines
    assert line.startswith("GPU 0 NVIDIA H200 (GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2, 00000000:00:06.0)")
    assert words in line


def test_an_application_xid_leaves_the_gpu_healthy_with_a_note(run_module):
    result = judge(run_module, "capture", "xid13.log")
    gpu = result["gpus"][0]
    assert result["verdict"] == "healthy" and gpu["xids"] == [13, 13] and gpu["last_xid"] == 13
    (note,) = gpu["notes"]
    assert note["action"] == "restart_app" and "logged 2 times" in note["detail"]
    assert result["kernel_log"].endswith("xid13.log")


def test_the_run_path_with_a_stand_in_nvidia_smi(run_module, tmp_path):
    binary = tmp_path / "nvidia-smi"
    binary.write_text('#!/bin/sh\ntest "$1 $2" = "-q -x" || exit 3\ncat %s\n' % xml("dbe.xml"))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    result = run_module("gpu_health", {"nvidia_smi": str(binary), "source": "nvidia-smi", "kernel_log": "none"})
    assert not result["failed"], result
    assert result["source"] == "nvidia-smi" and result["verdict"] == "unhealthy"


def test_a_worker_without_gpu_passes_and_says_so(run_module, tmp_path):
    result = run_module("gpu_health", {"nvidia_smi": str(tmp_path / "absent"), "source": "nvidia-smi"})
    assert not result["failed"], result
    assert result["gpus"] == [] and result["verdict"] is None and result["unhealthy"] == []
    assert result["msg"].startswith("no GPU visible, nothing to judge")


def test_a_hanging_nvidia_smi_is_killed_and_named(run_module, tmp_path):
    binary = tmp_path / "nvidia-smi"
    binary.write_text("#!/bin/sh\nexec sleep 60\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    result = run_module("gpu_health", {"nvidia_smi": str(binary), "source": "nvidia-smi", "command_timeout": 1})
    assert result["failed"] and "did not finish within 1 s" in result["msg"]


def test_an_unreadable_kernel_log_file_fails_naming_the_option(run_module, tmp_path):
    result = run_module("gpu_health", {"xml_file": xml("capture"), "kernel_log_file": str(tmp_path / "nope")})
    assert result["failed"] and "option kernel_log_file" in result["msg"]


def test_command_timeout_below_one_is_refused(run_module):
    result = run_module("gpu_health", {"xml_file": xml("capture"), "command_timeout": 0})
    assert result["failed"] and "option command_timeout" in result["msg"]
