"""gpu_health's run in process, where the module test cannot reach: NVML (a stand-in module,
since a test host has no GPU), the choice between NVML and nvidia-smi, and a kernel log that
cannot be read. The rules are test_health.py's; the module on the H200 capture is
tests/unit/plugins/modules/test_gpu_health.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _health_runner
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._health_runner import argument_spec, run_gpu_health

from conftest import SHARED

pytestmark = pytest.mark.unit

CAPTURE = Path(SHARED) / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"


class FakeModule:
    def __init__(self, **params: Any) -> None:
        self.params: Dict[str, Any] = {name: spec.get("default") for name, spec in argument_spec().items()}
        self.params.update(params)

    def get_bin_path(self, name: str, opt_dirs: Any = None) -> None:
        return None


class LostGpuNvml:
    """pynvml on a host whose only GPU NVML cannot open (fallen off the bus)."""

    class NVMLError(Exception):
        value = 15

    def __init__(self) -> None:
        self.calls: List[str] = []

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        raise self.NVMLError("GPU is lost")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")


def capture() -> str:
    if not CAPTURE.is_file():
        pytest.skip("fixture %s is missing" % CAPTURE)
    return str(CAPTURE)


def test_a_gpu_nvml_cannot_read_is_unhealthy_and_nvml_is_shut_down(monkeypatch):
    nvml = LostGpuNvml()
    monkeypatch.setattr(_health_runner, "load_nvml", lambda: (nvml, None))
    result = run_gpu_health(FakeModule(kernel_log="none"))
    assert nvml.calls == ["shutdown"]
    assert result["source"] == "nvml" and result["verdict"] == "unhealthy" and result["kernel_log"] == "not read (kernel_log=none)"
    (gpu,) = result["gpus"]
    assert gpu["reasons"][0]["check"] == "read" and gpu["reasons"][0]["action"] == "drain_and_replace"
    assert gpu["summary"].startswith("NVML cannot read this GPU: GPU is lost (")
    assert result["unhealthy"] == ["GPU 0 unknown (no UUID, no PCI address): %s" % gpu["summary"]]


def test_source_nvml_without_nvml_is_no_gpu_with_the_reason(monkeypatch):
    monkeypatch.setattr(_health_runner, "load_nvml", lambda: (None, "pynvml (nvidia-ml-py) is not installed"))
    result = run_gpu_health(FakeModule(source="nvml"))
    assert result["gpus"] == [] and result["gpu_visible"] is False and result["verdict"] is None
    assert result["msg"] == "no GPU visible, nothing to judge (pynvml (nvidia-ml-py) is not installed)"
    assert result["kernel_log"] == "not read (no GPU)"


def test_auto_falls_back_to_nvidia_smi_and_an_xml_file_never_asks_nvml(monkeypatch):
    monkeypatch.setattr(_health_runner, "load_nvml", lambda: (None, "NVML did not initialise"))
    assert run_gpu_health(FakeModule())["msg"].startswith("no GPU visible, nothing to judge (nvidia-smi not found (PATH, ")

    def never() -> Any:
        raise AssertionError("NVML was asked although xml_file was given")
    monkeypatch.setattr(_health_runner, "load_nvml", never)
    result = run_gpu_health(FakeModule(xml_file=capture(), kernel_log="none"))
    assert result["source"] == "xml_file" and result["verdict"] == "healthy"


def test_a_kernel_log_no_command_can_read_leaves_the_xids_unknown(monkeypatch, tmp_path):
    monkeypatch.setitem(_health_runner.KERNEL_LOG_COMMANDS, "dmesg", [str(tmp_path / "dmesg")])
    monkeypatch.setitem(_health_runner.KERNEL_LOG_COMMANDS, "journal", [str(tmp_path / "journalctl")])
    result = run_gpu_health(FakeModule(xml_file=capture()))
    assert result["kernel_log"].startswith("unreadable (%s: " % (tmp_path / "dmesg"))
    assert result["kernel_log"].endswith("): XIDs unknown") and str(tmp_path / "journalctl") in result["kernel_log"]
    assert result["verdict"] == "healthy"
