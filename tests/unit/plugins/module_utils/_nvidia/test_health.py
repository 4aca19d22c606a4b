"""The health verdict's rules, on readings made from the real H200 capture mutated one way each,
and the XID table against NVIDIA's catalogue numbers."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _health

from nvidia_fixtures import CAPTURE, GPU_HEALTH as FIXTURES, gpu_xml

pytestmark = pytest.mark.unit


def reading(name: str) -> dict:
    (only,) = _health.readings_from_xml_root(ET.fromstring(gpu_xml(name).read_bytes()))
    return only


def test_the_real_capture_reads_every_field_and_is_healthy():
    r = reading("capture")
    assert (r["pcie_gen_current"], r["pcie_gen_max"], r["pcie_width_current"], r["pcie_width_max"]) == (5, 5, 16, 16)
    assert (r["ecc_sbe_volatile"], r["ecc_dbe_volatile"], r["ecc_sbe_aggregate"], r["ecc_dbe_aggregate"]) == (0, 0, 0, 0)
    assert r["row_remap_pending"] is False and r["row_remap_failure"] is False
    assert r["retired_pages_pending"] is None  # N/A on Hopper (row remapping replaced it)
    assert r["gpu_temp"] == 40 and r["temp_margin"] == 47 and r["temp_margin_slowdown"] == -2
    assert r["power_w"] == 130.16 and r["power_limit_w"] == 700
    assert _health.throttle_mask(r["throttle"]) == 0
    verdict = _health.judge(r)
    assert verdict["verdict"] == "healthy" and verdict["reasons"] == []


@pytest.mark.parametrize("fixture, verdict, check, action", [
    ("dbe.xml", "unhealthy", "ecc", "reset_gpu"),
    ("row-remap-pending.xml", "degraded", "row_remap", "reset_gpu"),
    ("pcie-x8.xml", "degraded", "pcie", "drain_and_replace"),
    ("thermal-throttle.xml", "degraded", "throttle", "drain_and_replace"),
])
def test_each_mutation_gives_its_verdict(fixture, verdict, check, action):
    judged = _health.judge(reading(fixture))
    assert judged["verdict"] == verdict, judged
    assert [(r["check"], r["action"]) for r in judged["reasons"]] == [(check, action)]


def test_the_pcie_reason_names_the_widths():
    (reason,) = _health.judge(reading("pcie-x8.xml"))["reasons"]
    assert "x8 of x16" in reason["detail"]


def test_thermal_throttle_sets_nvml_bit_0x40():
    assert _health.throttle_mask(reading("thermal-throttle.xml")["throttle"]) == 0x40


@pytest.mark.parametrize("log, verdict, action", [("xid79.log", "unhealthy", "drain_and_replace"),
                                                  ("xid13.log", "healthy", "restart_app")])
def test_kernel_log_xids_join_the_gpu_by_pci_address(log, verdict, action):
    xids = _health.parse_kernel_xids((FIXTURES / log).read_text())
    (gpu,) = _health.judge_all([reading("capture")], xids)
    assert gpu["verdict"] == verdict
    assert gpu["last_xid"] == int(log[3:5])
    (entry,) = gpu["reasons"] or gpu["notes"]
    assert entry["check"] == "xid" and entry["action"] == action


def test_xids_of_another_gpu_do_not_count():
    xids = _health.parse_kernel_xids("NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus.\n")
    (gpu,) = _health.judge_all([reading("capture")], xids)
    assert gpu["verdict"] == "healthy" and gpu["xids"] == []


@pytest.mark.parametrize("xid, action", [
    (13, "restart_app"), (31, "restart_app"), (43, "none"), (45, "none"), (48, "reset_gpu"), (61, "reset_gpu"),
    (62, "reset_gpu"), (63, "reset_gpu"), (64, "drain_and_replace"), (74, "reset_gpu"), (79, "drain_and_replace"),
    (92, "none"), (94, "restart_app"), (95, "reset_gpu"), (119, "reset_gpu"), (120, "reset_gpu")])
def test_xid_catalogue_actions(xid, action):
    assert _health.classify_xid(xid).action == action


def test_an_unknown_xid_is_not_called_healthy():
    assert _health.classify_xid(9999).verdict == "degraded"


def test_every_catalogue_entry_is_consistent():
    for xid, cls in _health.XID_CATALOGUE.items():
        assert cls.action in _health.ACTION_TEXT, xid
        # an XID that needs the GPU reset or replaced never leaves it "healthy"
        if cls.action in ("reset_gpu", "drain_and_replace"):
            assert cls.verdict != "healthy", xid


def test_nvlink_errors_and_lifetime_dbe_degrade():
    r = dict(reading("capture"), nvlink={"links": 4, "replay": 0, "recovery": 3, "crc_flit": 0, "crc_data": 0},
             ecc_dbe_aggregate=1)
    judged = _health.judge(r)
    assert judged["verdict"] == "degraded"
    assert sorted(x["check"] for x in judged["reasons"]) == ["ecc", "nvlink"]


def test_gen_below_max_is_normal_when_idle_only():
    idle = dict(reading("capture"), pcie_gen_current=1, throttle={"gpu_idle": True})
    busy = dict(reading("capture"), pcie_gen_current=1, throttle={"gpu_idle": False})
    assert _health.judge(idle)["verdict"] == "healthy"
    assert _health.judge(busy)["verdict"] == "degraded"


def test_past_the_shutdown_margin_is_unhealthy():
    assert _health.judge(dict(reading("capture"), temp_margin=-9))["verdict"] == "unhealthy"
    assert _health.judge(dict(reading("capture"), temp_margin=-3))["verdict"] == "degraded"


@pytest.mark.parametrize("name", ["dbe.xml", "row-remap-pending.xml", "pcie-x8.xml", "thermal-throttle.xml"])
def test_each_fixture_is_the_capture_with_one_line_changed(name):
    if not CAPTURE.is_file():
        pytest.skip("capture %s is missing" % CAPTURE)
    real, mutated = CAPTURE.read_text().splitlines(), (FIXTURES / name).read_text().splitlines()
    assert len(real) == len(mutated)
    assert sum(1 for a, b in zip(real, mutated) if a != b) == 1
