"""nvidia_smi_info's run in process: a missing nvidia-smi, one that says there is no GPU and
one that fails are three different answers, and require_gpu turns "no GPU" into a failure
that still carries the facts. The module on the H200 capture is
tests/unit/plugins/modules/test_nvidia_smi_info.py."""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_info import (
    NO_GPU_MESSAGE, argument_spec, result_from, run_nvidia_smi_info)

from conftest import SHARED

pytestmark = pytest.mark.unit

CAPTURE = Path(SHARED) / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"


class FakeModule:
    def __init__(self, on_path: Optional[str] = None, **params: Any) -> None:
        self.params: Dict[str, Any] = {name: spec.get("default") for name, spec in argument_spec().items()}
        self.params.update(params)
        self.on_path = on_path
        self.looked_up: List[str] = []

    def get_bin_path(self, name: str, opt_dirs: Optional[List[str]] = None) -> Optional[str]:
        self.looked_up.append(name)
        return self.on_path


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_no_nvidia_smi_is_an_answer_naming_where_it_looked():
    module = FakeModule()
    result = run_nvidia_smi_info(module)
    assert module.looked_up == ["nvidia-smi"]
    assert result["gpu_visible"] is False and result["msg"] == NO_GPU_MESSAGE and result["nvidia_smi"] is None
    assert result["reason"].startswith("nvidia-smi not found (looked in PATH, /usr/bin, /usr/local/nvidia/bin")
    assert result["ansible_facts"] == {"nvidia_smi": {"gpus": [], "gpu_count": 0, "gpu_visible": False,
                                                      "driver_version": None, "cuda_version": None}}


def test_nvidia_smi_that_finds_no_device_is_an_answer_and_a_failure_only_when_one_is_required(tmp_path):
    binary = fake_smi(tmp_path, "echo 'No devices were found'; exit 6")
    result = run_nvidia_smi_info(FakeModule(nvidia_smi=binary))
    assert result["gpu_visible"] is False and result["nvidia_smi"] == binary
    assert result["reason"] == "nvidia-smi exited 6: No devices were found"
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=binary, require_gpu=True))
    assert caught.value.msg == "%s (require_gpu=true): nvidia-smi exited 6: No devices were found" % NO_GPU_MESSAGE
    assert caught.value.details["gpu_visible"] is False and caught.value.details["gpus"] == []


def test_nvidia_smi_that_fails_otherwise_is_a_failure(tmp_path):
    binary = fake_smi(tmp_path, "echo 'Unknown Error' >&2; exit 255")
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=binary))
    assert caught.value.msg == "nvidia-smi -q -x exited 255: Unknown Error"


def test_a_command_timeout_below_one_is_refused_once_nvidia_smi_is_found(tmp_path):
    with pytest.raises(InvalidInputError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=fake_smi(tmp_path, "exit 0"), command_timeout=0))
    assert caught.value.details["option"] == "command_timeout"


def test_an_unreadable_xml_file_is_named(tmp_path):
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(xml_file=str(tmp_path / "absent.xml")))
    assert caught.value.msg.startswith("option xml_file: cannot read %s: " % (tmp_path / "absent.xml"))


def test_the_h200_capture_is_one_visible_gpu():
    if not CAPTURE.is_file():
        pytest.skip("fixture %s is missing" % CAPTURE)
    result = run_nvidia_smi_info(FakeModule(xml_file=str(CAPTURE), require_gpu=True))
    assert result["msg"] == "1 GPU visible (NVIDIA H200), driver 580.159.04, CUDA 13.0"
    assert result["reason"] is None and result["nvidia_smi"] is None and result["changed"] is False


def test_result_from_names_each_model_once():
    facts = {"gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}, {"name": None}],
             "driver_version": "580.159.04", "cuda_version": "13.0"}
    result = result_from(facts, "/usr/bin/nvidia-smi", "ignored when GPUs are visible")
    assert result["msg"] == "3 GPUs visible (NVIDIA H200, unknown), driver 580.159.04, CUDA 13.0"
    assert result["reason"] is None and result["gpu_count"] == 3
