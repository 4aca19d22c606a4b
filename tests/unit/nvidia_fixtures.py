"""The NVIDIA fixtures the unit tests of the GPU modules share: the nvidia-smi XML captured on the
H200 passthrough guest and its one-line mutations (tests/fixtures/gpu-health), and the recorded
H200 nvidia-smi stand-in (tests/fixtures/mig) put in MIG mode with GPU instances of its own."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED

CAPTURE = Path(SHARED) / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"
GPU_HEALTH = Path(ROOT) / "tests" / "fixtures" / "gpu-health"
MIG = Path(ROOT) / "tests" / "fixtures" / "mig"
FAKE_NVIDIA_SMI = MIG / "fake_nvidia_smi.py"


def gpu_xml(name: str) -> Path:
    """The capture ("capture") or a fixture of tests/fixtures/gpu-health; the test is skipped
    where it is missing (the capture lives in the shared checkout)."""
    path = CAPTURE if name == "capture" else GPU_HEALTH / name
    if not path.is_file():
        pytest.skip("fixture %s is missing" % path)
    return path


def fake_smi_in_mig_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiles: str) -> Path:
    """The stand-in with GPU 0 in MIG mode and GPU instances of profiles (ids, as -cgi takes
    them: "9,19"), each with its compute instance, made by its own -mig and -cgi. Returns its path."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(tmp_path / "state.json"))
    for argv in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", profiles, "-C"]):
        subprocess.run([sys.executable, str(FAKE_NVIDIA_SMI)] + argv, check=True, capture_output=True)
    return FAKE_NVIDIA_SMI
