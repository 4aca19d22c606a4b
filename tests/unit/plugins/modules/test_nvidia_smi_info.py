"""nvidia_smi_info: the captured H200 passthrough guest's `nvidia-smi -q -x`, a host without
nvidia-smi, nvidia-smi stand-ins that say "no devices" / "no driver" or print garbage, and the
recorded H200 tables' stand-in (tests/fixtures/mig) in MIG mode."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from conftest import ROOT, SHARED
from nvidia_fixtures import fake_smi_in_mig_mode

FIXTURE = Path(SHARED) / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"
MIG = Path(ROOT) / "tests" / "fixtures" / "mig"


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.unit
def test_h200_capture(run_module):
    if not FIXTURE.is_file():
        pytest.skip("fixture %s is missing" % FIXTURE)
    result = run_module("nvidia_smi_info", {"xml_file": str(FIXTURE)}, check=True)
    assert not result["failed"], result
    assert result["changed"] is False
    assert result["gpu_visible"] is True and result["gpu_count"] == 1
    gpu = result["gpus"][0]
    # Cross-checked with nvidia-smi.txt (the human-readable capture of the same guest).
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["memory_total_mib"] == 143771
    assert gpu["driver_version"] == result["driver_version"] == "580.159.04"
    assert gpu["cuda_version"] == result["cuda_version"] == "13.0"
    assert gpu["mig_mode"] == "disabled" and gpu["mig_enabled"] is False and gpu["mig_devices"] == []
    assert gpu["virtualization_mode"] == "Pass-Through"
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["pci_device_id"] == "0x233510de"
    assert gpu["uuid"] == "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"
    assert result["msg"].startswith("1 GPU visible (NVIDIA H200)")
    assert result["ansible_facts"]["nvidia_smi"]["gpus"] == result["gpus"]


@pytest.mark.unit
def test_fake_binary_printing_the_capture(run_module, tmp_path):
    """The run path (not xml_file): a stand-in nvidia-smi that prints the capture."""
    binary = fake_smi(tmp_path, 'test "$1 $2" = "-q -x" || exit 3\ncat %s' % FIXTURE)
    result = run_module("nvidia_smi_info", {"nvidia_smi": binary})
    assert not result["failed"], result
    assert result["nvidia_smi"] == binary
    assert [g["name"] for g in result["gpus"]] == ["NVIDIA H200"]


@pytest.mark.unit
def test_missing_binary_reports_no_gpu(run_module, tmp_path):
    result = run_module("nvidia_smi_info", {"nvidia_smi": str(tmp_path / "absent")})
    assert not result["failed"], result
    assert result["gpus"] == [] and result["gpu_visible"] is False
    assert result["msg"] == "no GPU visible"
    assert "not found" in result["reason"]


@pytest.mark.unit
@pytest.mark.parametrize("body", [
    'echo "No devices were found"; exit 6',
    "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9",
])
def test_no_device_or_no_driver_reports_no_gpu(run_module, tmp_path, body):
    result = run_module("nvidia_smi_info", {"nvidia_smi": fake_smi(tmp_path, body)})
    assert not result["failed"], result
    assert result["msg"] == "no GPU visible" and result["gpus"] == []


@pytest.mark.unit
def test_empty_log_reports_no_gpu(run_module, tmp_path):
    body = "cat <<'X'\n<?xml version=\"1.0\" ?>\n<nvidia_smi_log><driver_version>535.261.03</driver_version>" \
           "<attached_gpus>0</attached_gpus></nvidia_smi_log>\nX"
    result = run_module("nvidia_smi_info", {"nvidia_smi": fake_smi(tmp_path, body)})
    assert not result["failed"], result
    assert result["msg"] == "no GPU visible"
    assert result["driver_version"] == "535.261.03"


@pytest.mark.unit
def test_require_gpu_fails_without_one(run_module, tmp_path):
    result = run_module("nvidia_smi_info", {"nvidia_smi": fake_smi(tmp_path, 'echo "No devices were found"; exit 6'),
                                            "require_gpu": True})
    assert result["failed"] is True
    assert "no GPU visible" in result["msg"]


@pytest.mark.unit
def test_other_failures_and_garbage_fail(run_module, tmp_path):
    crashed = run_module("nvidia_smi_info", {"nvidia_smi": fake_smi(tmp_path, "echo Segmentation fault; exit 139")})
    assert crashed["failed"] is True and "exited 139" in crashed["msg"]
    garbage = tmp_path / "garbage.xml"
    garbage.write_text("<nvidia_smi_log><gpu>")
    assert run_module("nvidia_smi_info", {"xml_file": str(garbage)})["failed"] is True
    wrong = tmp_path / "wrong.xml"
    wrong.write_text("<domain/>")
    result = run_module("nvidia_smi_info", {"xml_file": str(wrong)})
    assert result["failed"] is True and "nvidia_smi_log" in result["msg"]


@pytest.mark.unit
def test_dtd_and_entities_are_not_loaded(run_module, tmp_path):
    """The DOCTYPE names a DTD file; an entity pointing at a local file must not be expanded."""
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    doc = tmp_path / "evil.xml"
    doc.write_text('<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file://%s">]>\n'
                   '<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>' % secret)
    result = run_module("nvidia_smi_info", {"xml_file": str(doc)})
    assert "TOPSECRET" not in repr(result)


@pytest.mark.unit
def test_stdlib_fallback_parses_the_same(tmp_path):
    """Guests without python3-lxml fall back to ElementTree: same facts."""
    import importlib
    from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _smi_xml
    with_lxml = _smi_xml.parse_log(FIXTURE.read_bytes())
    try:
        _smi_xml.HAS_LXML = False
        without = _smi_xml.parse_log(FIXTURE.read_bytes())
    finally:
        importlib.reload(_smi_xml)
    assert without == with_lxml


@pytest.mark.unit
def test_a_hanging_nvidia_smi_is_killed_and_named(run_module, tmp_path):
    binary = fake_smi(tmp_path, "sleep 120")
    result = run_module("nvidia_smi_info", {"nvidia_smi": binary, "command_timeout": 1}, timeout=60)
    assert result["failed"] and binary in result["msg"] and "within 1 s" in result["msg"], result
    assert "command_timeout" in result["msg"]


@pytest.mark.unit
def test_mig_devices_as_facts_with_their_profiles_and_files(run_module, tmp_path, monkeypatch):
    """Two MIG devices made by the stand-in's own -mig and -cgi; their capability files named by
    the driver's mig-minors table (tests/fixtures/mig/mig-minors), ready for slurm_config's files."""
    smi = fake_smi_in_mig_mode(tmp_path, monkeypatch, "9,19")
    result = run_module("nvidia_smi_info", {"nvidia_smi": str(smi),
                                            "mig_minors_file": str(MIG / "mig-minors")}, check=True)
    assert not result["failed"], result
    devices = result["gpus"][0]["mig_devices"]
    assert [(d["profile"], d["gpu_instance_id"], d["compute_instance_id"], d["files"]) for d in devices] == [
        ("3g.71gb", 1, 0, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]),
        ("1g.18gb", 2, 0, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"])]
    assert result["ansible_facts"]["nvidia_smi"]["gpus"][0]["mig_devices"] == devices
    missing = run_module("nvidia_smi_info", {"nvidia_smi": str(MIG / "fake_nvidia_smi.py"),
                                             "mig_minors_file": str(tmp_path / "absent")})
    assert missing["failed"] and missing["msg"].startswith("option mig_minors_file: cannot read"), missing
