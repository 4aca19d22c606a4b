"""The GPU exporter against what it reported on a real H200 (tests/device/h200_gpu_exporter.sh).

The device run scraped the exporter idle and under a bf16 matmul load (16 GiB held, about 655
TFLOP/s), through NVML, through `nvidia-smi -q -x` and over HTTP, and saved nvidia-smi's XML
beside it. These tests hold the recorded outputs to what a DCGM dashboard needs (non-zero
utilisation and memory in use under load, the same series identity whatever the source) and
re-derive the series from the recorded XML with today's parser, so a parser change that
loses a value on real hardware fails here, without the hardware.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Tuple

import pytest

# The gx fixture: the exporter imported in-process, one loader for both test files.
from test_gpu_exporter import gx  # noqa: F401  # pylint: disable=unused-import

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "h200-exporter"
HOST = "h200-device"  # --hostname of the device run
LOAD_FB_BALLAST_MIB = 16 * 1024  # the load script holds a 16 GiB tensor

Labels = Tuple[Tuple[str, str], ...]
_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Dict[str, Dict[Labels, float]]:
    """Samples by metric name and label set; every non-comment line must parse."""
    series: Dict[str, Dict[Labels, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, "not an exposition line: %r" % line
        labels = tuple(sorted(_LABEL.findall(match.group("labels") or "")))
        series.setdefault(match.group("name"), {})[labels] = float(match.group("value"))
    return series


def only_value(series: Dict[str, Dict[Labels, float]], name: str) -> float:
    samples = series[name]
    assert len(samples) == 1, "%s: expected one GPU, got %r" % (name, samples)
    return next(iter(samples.values()))


def recorded(name: str) -> Dict[str, Dict[Labels, float]]:
    path = RECORDED / name
    if not path.is_file():
        pytest.skip("recorded device output %s is missing" % path)
    return parse_exposition(path.read_text())


@pytest.mark.parametrize("name", ["load-nvml.prom", "load-nvidia-smi.prom", "load-http.prom"])
def test_under_load_the_gpu_is_busy_and_holds_memory(name: str) -> None:
    series = recorded(name)
    assert only_value(series, "DCGM_FI_DEV_GPU_UTIL") > 0
    assert only_value(series, "DCGM_FI_DEV_FB_USED") >= LOAD_FB_BALLAST_MIB
    idle = recorded("idle-nvml.prom")
    assert only_value(series, "DCGM_FI_DEV_POWER_USAGE") > only_value(idle, "DCGM_FI_DEV_POWER_USAGE")


def test_idle_gpu_reads_idle() -> None:
    idle = recorded("idle-nvml.prom")
    assert only_value(idle, "DCGM_FI_DEV_GPU_UTIL") == 0
    assert only_value(idle, "DCGM_FI_DEV_FB_USED") < 1024
    # Used plus free is the whole frame buffer a dashboard divides by (H200: about 140 GB).
    total = only_value(idle, "DCGM_FI_DEV_FB_USED") + only_value(idle, "DCGM_FI_DEV_FB_FREE")
    assert 130_000 < total < 145_000


def test_every_source_gives_the_same_series_identity() -> None:
    """A dashboard or alert keyed on labels must not split when NVML falls back to nvidia-smi."""
    nvml, smi = recorded("load-nvml.prom"), recorded("load-nvidia-smi.prom")
    dcgm = sorted(n for n in nvml if n.startswith("DCGM_FI_DEV_"))
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"} <= set(dcgm)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP"):
        assert set(nvml[name]) == set(smi[name]), name
    labels = dict(next(iter(nvml["DCGM_FI_DEV_GPU_UTIL"])))
    assert labels["modelName"] == "NVIDIA H200" and labels["Hostname"] == HOST
    assert labels["UUID"].startswith("GPU-") and labels["gpu"] == "0"


@pytest.mark.parametrize("capture, busy", [("load-nvidia-smi-q.xml", True), ("idle-nvidia-smi-q.xml", False)])
def test_todays_parser_reads_the_recorded_xml(gx, capture: str, busy: bool) -> None:
    path = RECORDED / capture
    if not path.is_file():
        pytest.skip("recorded device output %s is missing" % path)
    gpus = gx.parse_nvidia_smi_xml(path.read_bytes())
    text = gx.render_metrics(gx.Snapshot(source="nvidia-smi", up=True, gpus=gpus), HOST)
    series = parse_exposition(text)
    util = only_value(series, "DCGM_FI_DEV_GPU_UTIL")
    fb_used = only_value(series, "DCGM_FI_DEV_FB_USED")
    if busy:
        assert util > 0 and fb_used >= LOAD_FB_BALLAST_MIB
    else:
        assert util == 0 and fb_used < 1024
    # Same identity as the exporter's live NVML output on that machine.
    assert set(series["DCGM_FI_DEV_GPU_UTIL"]) == set(recorded("load-nvml.prom")["DCGM_FI_DEV_GPU_UTIL"])
