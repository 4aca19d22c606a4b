"""nvidia_smi_info's run in process: a missing nvidia-smi, one that says there is no GPU and
one that fails are three different answers, and require_gpu turns "no GPU" into a failure
that still carries the facts; MIG devices named from the recorded H200 tables and the driver's
mig-minors table (tests/fixtures/mig). The module on the H200 capture is
tests/unit/plugins/modules/test_nvidia_smi_info.py."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_info import (
    NO_GPU_MESSAGE, argument_spec, parse_mig_minors, result_from, run_nvidia_smi_info)

from conftest import ROOT, SHARED

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


# -- MIG devices: the recorded H200 tables, replayed by tests/fixtures/mig/fake_nvidia_smi.py -------

MIG_FIXTURES = Path(ROOT) / "tests" / "fixtures" / "mig"
FAKE = MIG_FIXTURES / "fake_nvidia_smi.py"
MIG_MINORS = MIG_FIXTURES / "mig-minors"


@pytest.fixture
def mig_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake H200 in MIG mode with a 3g.71gb (GPU instance 1) and a 1g.18gb (GPU instance 2),
    each one compute instance, made by the fake's own -mig and -cgi ... -C as nvidia_mig would."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(tmp_path / "state.json"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)  # the fake's "#!/usr/bin/env python3", without a shim
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    for argv in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "9,19", "-C"]):
        subprocess.run([str(FAKE)] + argv, check=True, capture_output=True)
    return tmp_path / "state.json"


H200_MIG_DEVICES = [
    {"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0, "profile": "3g.71gb",
     "files": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]},
    {"index": 1, "gpu_instance_id": 2, "compute_instance_id": 0, "profile": "1g.18gb",
     "files": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]},
]


def test_the_mig_minors_table_is_read_as_the_driver_writes_it():
    minors = parse_mig_minors(MIG_MINORS.read_text(), str(MIG_MINORS))
    assert len(minors) == 2 + 32 * 15 * 9 and minors["config"] == 1 and minors["monitor"] == 2
    assert minors["gpu0/gi1/access"] == 12 and minors["gpu0/gi1/ci0/access"] == 13
    assert minors["gpu0/gi2/access"] == 21 and minors["gpu0/gi2/ci0/access"] == 22
    assert minors["gpu31/gi14/ci7/access"] == 4322


def test_a_mig_minors_line_of_another_shape_is_refused_naming_the_option():
    with pytest.raises(KvmError) as caught:
        parse_mig_minors("config 1\ngpu0/gi1/access twelve\n", "/x/mig-minors")
    assert caught.value.msg.startswith("option mig_minors_file: line 2 of /x/mig-minors is not '<capability> <minor>'")


def test_each_mig_device_gets_its_profile_and_its_gpu_and_capability_files(mig_h200):
    result = run_nvidia_smi_info(FakeModule(nvidia_smi=str(FAKE), mig_minors_file=str(MIG_MINORS)))
    gpu = result["gpus"][0]
    assert gpu["mig_enabled"] is True and gpu["minor_number"] == 0
    assert gpu["mig_devices"] == H200_MIG_DEVICES
    argvs = [call["argv"] for call in json.loads(mig_h200.read_text())["calls"][2:]]
    assert argvs == [["-q", "-x"], ["mig", "-i", "0", "-lgi"], ["mig", "-i", "0", "-lci"]]


def test_a_saved_xml_gives_the_files_but_no_profile(mig_h200, tmp_path):
    saved = tmp_path / "q.xml"
    saved.write_text(subprocess.run([str(FAKE), "-q", "-x"], check=True, capture_output=True, text=True).stdout)
    gpu = run_nvidia_smi_info(FakeModule(xml_file=str(saved), mig_minors_file=str(MIG_MINORS)))["gpus"][0]
    assert gpu["mig_devices"] == [dict(device, profile=None) for device in H200_MIG_DEVICES]


def test_without_mig_devices_the_table_is_not_read(tmp_path):
    if not CAPTURE.is_file():
        pytest.skip("fixture %s is missing" % CAPTURE)
    result = run_nvidia_smi_info(FakeModule(xml_file=str(CAPTURE), mig_minors_file=str(tmp_path / "absent")))
    assert result["gpus"][0]["mig_devices"] == [] and result["gpus"][0]["mig_enabled"] is False


def test_a_missing_or_foreign_mig_minors_table_is_named(mig_h200, tmp_path):
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=str(FAKE), mig_minors_file=str(tmp_path / "absent")))
    assert caught.value.msg.startswith("option mig_minors_file: cannot read %s (No such file" % (tmp_path / "absent"))
    other_gpu = tmp_path / "gpu1-only"
    other_gpu.write_text("config 1\nmonitor 2\ngpu1/gi1/access 147\ngpu1/gi1/ci0/access 148\n")
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=str(FAKE), mig_minors_file=str(other_gpu)))
    assert "has no line for gpu0/gi1/access or gpu0/gi1/ci0/access (GPU 0's MIG device 0)" in caught.value.msg


def test_a_mig_device_that_vanished_between_the_reads_is_named(mig_h200):
    state = json.loads(mig_h200.read_text())
    state["override"] = {"-lci": {"rc": 6, "output": "No compute instances found: Not Found"}}
    mig_h200.write_text(json.dumps(state))
    with pytest.raises(KvmError) as caught:
        run_nvidia_smi_info(FakeModule(nvidia_smi=str(FAKE), mig_minors_file=str(MIG_MINORS)))
    assert caught.value.msg == ("GPU 0: nvidia-smi -q -x lists MIG device 0 (GPU instance 1, compute instance 0) and "
                                "nvidia-smi mig -lci does not: the instances changed while they were read; run again")
