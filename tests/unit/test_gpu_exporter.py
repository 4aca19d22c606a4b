"""mlinfra_gpu_exporter (roles/monitoring/files): dcgm-exporter-compatible GPU metrics.

Driven by the real H200 passthrough capture in shared/fixtures, by MIG variants of it built
here following nvidia-smi's <mig_devices> schema, and by stand-in nvidia-smi executables and a
stand-in pynvml module. HTTP tests bind 127.0.0.1 only, on a port the exporter picks itself.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import shlex
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "roles" / "monitoring" / "files" / "mlinfra_gpu_exporter.py"
FIXTURES = ROOT.parent / "shared" / "fixtures" / "h200-passthrough-guest"
CAPTURE = FIXTURES / "nvidia-smi-q.xml"

UUID = "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"
BUS_ID = "00000000:00:06.0"
HOST = "test-host"
DCGM_LABELS = {"gpu": "0", "UUID": UUID, "pci_bus_id": BUS_ID, "device": "nvidia0",
               "modelName": "NVIDIA H200", "Hostname": HOST, "DCGM_FI_DRIVER_VERSION": "580.159.04"}
HEALTH = {"mlinfra_gpu_exporter_up", "mlinfra_gpu_exporter_gpus"}
LOST_GPU_MESSAGE = "Unable to determine the device handle for GPU0000:00:06.0: Unknown Error"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def gx():
    """The exporter imported in-process (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("mlinfra_gpu_exporter", EXPORTER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the role
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def capture() -> str:
    if not CAPTURE.is_file():
        pytest.skip("fixture %s is missing" % CAPTURE)
    return CAPTURE.read_text()


def replace_once(text: str, old: str, new: str) -> str:
    """A fixture edit that must hit exactly once, so a changed capture fails loudly here."""
    assert text.count(old) == 1, "expected exactly one %r in the capture" % old
    return text.replace(old, new)


def mig_device(index: int, gi: int, ci: int, sms: int, used: int, free: int) -> str:
    # nvidia-smi's <mig_device> (nvsmi_device_v12/v13.dtd): ids, attributes, memory of the GI.
    return ("<mig_device><index>%d</index><gpu_instance_id>%d</gpu_instance_id>"
            "<compute_instance_id>%d</compute_instance_id><device_attributes><shared>"
            "<multiprocessor_count>%d</multiprocessor_count><copy_engine_count>4</copy_engine_count>"
            "<encoder_count>0</encoder_count><decoder_count>4</decoder_count><ofa_count>0</ofa_count>"
            "<jpg_count>4</jpg_count></shared></device_attributes><ecc_error_count><volatile_count>"
            "<sram_uncorrectable>0</sram_uncorrectable></volatile_count></ecc_error_count>"
            "<fb_memory_usage><total>71424 MiB</total><reserved>0 MiB</reserved><used>%d MiB</used>"
            "<free>%d MiB</free></fb_memory_usage><bar1_memory_usage><total>131072 MiB</total>"
            "<used>0 MiB</used><free>131072 MiB</free></bar1_memory_usage></mig_device>"
            % (index, gi, ci, sms, used, free))


# A 4g.71gb + 3g.71gb split of the H200 (placements {0}:4 and {4}:4 in nvidia-smi.txt).
MIG_DEVICES = [mig_device(0, 1, 0, 64, 20480, 50943), mig_device(1, 2, 0, 60, 13, 71410)]
MIG_LISTING = ("GPU 0: NVIDIA H200 (UUID: %s)\n"
               "  MIG 4g.71gb      Device  0: (UUID: MIG-0f6b7a8e-1c2d-5e3f-9a4b-1c2d3e4f5a6b)\n"
               "  MIG 3g.71gb      Device  1: (UUID: MIG-7d9e1f20-3a4b-5c6d-8e9f-0a1b2c3d4e5f)\n" % UUID)


def mig_capture(capture: str, devices: Optional[List[str]] = None) -> str:
    """The capture as nvidia-smi prints it with MIG on: instances listed (MIG_DEVICES unless given), utilisation N/A."""
    if devices is None:
        devices = MIG_DEVICES
    xml = replace_once(capture, "<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>")
    xml = replace_once(xml, "<pending_mig>Disabled</pending_mig>", "<pending_mig>Enabled</pending_mig>")
    xml, hits = re.subn(r"<mig_devices>\s*None\s*</mig_devices>",
                        "<mig_devices>%s</mig_devices>" % "".join(devices), xml)
    assert hits == 1
    xml = replace_once(xml, "<gpu_util>0 %</gpu_util>", "<gpu_util>N/A</gpu_util>")
    return replace_once(xml, "<memory_util>0 %</memory_util>", "<memory_util>N/A</memory_util>")


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_nvidia_smi(tmp_path: Path, xml: Optional[str] = None, listing: Optional[str] = None,
                    failure: Optional[str] = None) -> Path:
    """A stand-in nvidia-smi: records its arguments in calls.log and prints `xml` for -q -x
    and `listing` for -L; `failure` replaces the -q -x branch (a shell snippet)."""
    xml_file, list_file = tmp_path / "smi-q.xml", tmp_path / "smi-L.txt"
    if xml is not None:
        xml_file.write_text(xml)
    if listing is not None:
        list_file.write_text(listing)
    query = failure or "cat %s" % shlex.quote(str(xml_file))
    lister = "cat %s" % shlex.quote(str(list_file)) if listing is not None else "echo 'No MIG listing' >&2; exit 1"
    return write_executable(tmp_path / "nvidia-smi", "\n".join([
        "#!/bin/sh",
        'echo "$*" >> %s' % shlex.quote(str(tmp_path / "calls.log")),
        'case "$*" in',
        '  "-q -x") %s ;;' % query,
        '  "-L") %s ;;' % lister,
        '  *) echo "unexpected arguments: $*" >&2; exit 2 ;;',
        "esac", ""]))


def calls(tmp_path: Path) -> List[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def run_exporter(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXPORTER), *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL, check=False)


def run_once(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    # --kmsg '' keeps the machine's own kernel log out of the tests unless a test gives one.
    return run_exporter("--once", "--hostname", HOST, "--kmsg", "", *args, env=env)


# --- a strict reader of the Prometheus text format (0.0.4) -------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(r"^(%s)(?:\{((?:%s)(?:,%s)*)?\})? (\S+)$" % (_NAME, _LABEL, _LABEL))
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_HELP = re.compile(r"^# HELP (%s) (.*)$" % _NAME)
_TYPE = re.compile(r"^# TYPE (%s) (gauge|counter|histogram|summary|untyped)$" % _NAME)


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], value)


@dataclass
class Family:
    help: Optional[str] = None
    type: Optional[str] = None
    samples: List[Tuple[Dict[str, str], float]] = None


def parse_exposition(text: str) -> Dict[str, Family]:
    """Families by name; asserts every line is valid and HELP/TYPE come once, before samples."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    assert "N/A" not in text
    families: Dict[str, Family] = {}
    series = set()
    for line in text.splitlines():
        help_match, type_match, sample = _HELP.match(line), _TYPE.match(line), _SAMPLE.match(line)
        if help_match:
            family = families.setdefault(help_match.group(1), Family(samples=[]))
            assert family.help is None and not family.samples, "HELP repeated or late: %r" % line
            family.help = help_match.group(2)
        elif type_match:
            family = families.setdefault(type_match.group(1), Family(samples=[]))
            assert family.type is None and not family.samples, "TYPE repeated or late: %r" % line
            family.type = type_match.group(2)
        elif sample:
            name, labels_text, value = sample.groups()
            assert name in families and families[name].type, "sample before its TYPE: %r" % line
            labels = {k: unescape(v) for k, v in _LABEL_PAIR.findall(labels_text or "")}
            key = (name, tuple(sorted(labels.items())))
            assert key not in series, "duplicate series: %r" % line
            series.add(key)
            number = float(value)
            assert not math.isnan(number), line
            families[name].samples.append((labels, number))
        else:
            raise AssertionError("not a valid exposition line: %r" % line)
    for name, family in families.items():
        assert family.help and family.type, "%s lacks HELP or TYPE" % name
        assert family.samples, "%s has no sample" % name
    return families


def only_value(families: Dict[str, Family], name: str) -> Tuple[Dict[str, str], float]:
    assert name in families, "%s missing from %s" % (name, sorted(families))
    samples = families[name].samples
    assert len(samples) == 1, samples
    return samples[0]


# --- the exporter as an HTTP server ------------------------------------------------------

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 stays local


def fetch(url: str) -> Tuple[int, str, str]:
    try:
        with _NO_PROXY.open(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@dataclass
class Server:
    url: str
    log: Path
    proc: subprocess.Popen

    def scrape(self) -> str:
        status, ctype, body = fetch(self.url + "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype, body)
        return body

    def stderr(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def serving(tmp_path: Path, *args: str) -> Iterator[Server]:
    """Starts the exporter on 127.0.0.1, port 0 (it logs the port it got), and stops it
    whatever happens in the test."""
    log = tmp_path / "exporter.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(EXPORTER), "--listen", "127.0.0.1:0",
                                 "--hostname", HOST, "--kmsg", "", *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
            if match:
                break
            assert proc.poll() is None, "exporter exited %s:\n%s" % (proc.returncode, log.read_text())
            assert time.monotonic() < deadline, "exporter did not start:\n%s" % log.read_text()
            time.sleep(0.05)
        yield Server("http://127.0.0.1:%s" % match.group(1), log, proc)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the exporter's clean stop), then SIGKILL if it does not end within 15 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- parsing the capture


def test_h200_capture_parses_to_exact_values(gx, capture):
    gpus = gx.parse_nvidia_smi_xml(capture.encode())
    assert len(gpus) == 1
    gpu = gpus[0]
    # Every number below is read off nvidia-smi-q.xml (the -q -x capture, not nvidia-smi.txt,
    # which was taken a moment apart: its power reading differs).
    assert (gpu.index, gpu.uuid, gpu.name, gpu.pci_bus_id) == (0, UUID, "NVIDIA H200", BUS_ID)
    assert (gpu.minor_number, gpu.device, gpu.driver_version) == (0, "nvidia0", "580.159.04")
    assert (gpu.fb_used_mib, gpu.fb_free_mib) == (0, 143156)
    assert (gpu.gpu_temp, gpu.memory_temp) == (40, 41)
    assert gpu.power_w == pytest.approx(130.16)  # average_power_draw, what NVML's power usage is
    assert (gpu.gpu_util, gpu.mem_copy_util, gpu.enc_util, gpu.dec_util) == (0, 0, 0, 0)
    assert (gpu.sm_clock_mhz, gpu.mem_clock_mhz) == (1980, 3201)
    assert (gpu.pcie_replays, gpu.correctable_remapped_rows, gpu.uncorrectable_remapped_rows,
            gpu.row_remap_failure) == (0, 0, 0, 0)
    assert gpu.energy_mj is None  # not in nvidia-smi -q: absent rather than 0
    assert gpu.mig_enabled is False and gpu.mig_instances == ()
    assert gpu.last_xid is None  # joined later, from the kernel log


def test_power_falls_back_to_instant_then_absent(gx, capture):
    no_avg = replace_once(capture, "<average_power_draw>130.16 W</average_power_draw>",
                          "<average_power_draw>N/A</average_power_draw>")
    assert gx.parse_nvidia_smi_xml(no_avg.encode())[0].power_w == pytest.approx(131.60)
    none = replace_once(no_avg, "<instant_power_draw>131.60 W</instant_power_draw>",
                        "<instant_power_draw>N/A</instant_power_draw>")
    assert gx.parse_nvidia_smi_xml(none.encode())[0].power_w is None


@pytest.mark.parametrize("text,unit,expected", [
    ("143156 MiB", "MiB", 143156), ("130.16 W", "W", 130.16), ("0 %", "%", 0), ("-8 C", "C", -8),
    ("N/A", "MiB", None), ("[N/A]", "C", None), ("[Not Supported]", "W", None), ("", "", None),
    ("12 KiB", "MiB", None),  # another unit than expected: no guessing
])
def test_parse_quantity(gx, text, unit, expected):
    assert gx.parse_quantity(text, unit) == expected


def test_mig_devices_and_listing(gx, capture):
    # Two compute instances of GPU instance 2: DCGM reports the GPU instance once.
    devices = MIG_DEVICES + [mig_device(2, 2, 1, 60, 13, 71410)]
    listing = MIG_LISTING + "  MIG 3g.71gb      Device  2: (UUID: MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee)\n"
    profiles = gx.parse_mig_profiles(listing)
    assert profiles == {UUID: {0: "4g.71gb", 1: "3g.71gb", 2: "3g.71gb"}}
    gpu = gx.parse_nvidia_smi_xml(mig_capture(capture, devices).encode(), profiles)[0]
    assert gpu.mig_enabled is True and gpu.gpu_util is None and gpu.mem_copy_util is None
    assert gpu.mig_instances == (gx.MigInstance(1, "4g.71gb", 20480, 50943),
                                 gx.MigInstance(2, "3g.71gb", 13, 71410))
    # Without the listing the instances stay distinct, under an honest profile name.
    unnamed = gx.parse_nvidia_smi_xml(mig_capture(capture).encode())[0]
    assert [(i.gpu_instance_id, i.profile) for i in unnamed.mig_instances] == [(1, "unknown"), (2, "unknown")]


def test_listen_address(gx):
    assert gx.listen_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert gx.listen_address("[::]:9400") == ("::", 9400)
    assert gx.listen_address(":9400") == ("0.0.0.0", 9400)
    for bad in ("9400", "host", "1.2.3.4:65536", "[::]"):
        with pytest.raises(Exception):
            gx.listen_address(bad)


# --------------------------------------------------------------------------- --once exposition


def test_once_h200_exposition(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(smi))
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    expected = {
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", 0), "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", 0),
        "DCGM_FI_DEV_ENC_UTIL": ("gauge", 0), "DCGM_FI_DEV_DEC_UTIL": ("gauge", 0),
        "DCGM_FI_DEV_FB_USED": ("gauge", 0), "DCGM_FI_DEV_FB_FREE": ("gauge", 143156),
        "DCGM_FI_DEV_GPU_TEMP": ("gauge", 40), "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", 41),
        "DCGM_FI_DEV_POWER_USAGE": ("gauge", 130.16), "DCGM_FI_DEV_SM_CLOCK": ("gauge", 1980),
        "DCGM_FI_DEV_MEM_CLOCK": ("gauge", 3201), "DCGM_FI_DEV_XID_ERRORS": ("gauge", 0),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", 0),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", 0),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", 0),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", 0),
        # from the health rules, read in the same capture (nvidia-smi.txt: Gen 5, 16x, ECC 0)
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", 0), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", 0),
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", 0), "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", 0),
        "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", 0),
        "DCGM_FI_DEV_PCIE_LINK_GEN": ("gauge", 5), "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("gauge", 5),
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("gauge", 16), "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("gauge", 16),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", 0),
        "mlinfra_gpu_health_verdict": ("gauge", 0),
    }
    assert set(families) == set(expected) | HEALTH  # no energy family: nvidia-smi has no counter
    for name, (kind, value) in expected.items():
        assert families[name].type == kind, name
        labels, got = only_value(families, name)
        assert labels == DCGM_LABELS, name
        assert got == pytest.approx(value), name
    assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvidia-smi"}, 1)
    assert only_value(families, "mlinfra_gpu_exporter_gpus") == ({}, 1)
    # dcgm-exporter's label order, so that the lines look like DCGM's to a human as well.
    line = next(l for l in result.stdout.splitlines() if l.startswith("DCGM_FI_DEV_FB_FREE{"))
    assert line == ('DCGM_FI_DEV_FB_FREE{gpu="0",UUID="%s",pci_bus_id="%s",device="nvidia0",'
                    'modelName="NVIDIA H200",Hostname="%s",DCGM_FI_DRIVER_VERSION="580.159.04"} 143156'
                    % (UUID, BUS_ID, HOST))
    assert calls(tmp_path) == ["-q -x"]  # no -L when MIG is off


def test_once_values_reported_na_are_omitted(tmp_path, capture):
    xml = replace_once(capture, "<memory_temp>41 C</memory_temp>", "<memory_temp>N/A</memory_temp>")
    # The current SM clock, inside <clocks> (<max_clocks> has one too, which is not read).
    xml, hits = re.subn(r"(<clocks>\s*<graphics_clock>[^<]*</graphics_clock>\s*)<sm_clock>1980 MHz</sm_clock>",
                        r"\1<sm_clock>N/A</sm_clock>", xml)
    assert hits == 1
    xml = replace_once(xml, "<gpu_util>0 %</gpu_util>", "<gpu_util>[N/A]</gpu_util>")
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, xml)))
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    for absent in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL"):
        assert absent not in families and absent not in result.stdout
    assert only_value(families, "DCGM_FI_DEV_GPU_TEMP")[1] == 40


def test_once_mig_instances_carry_gpu_i_labels(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, mig_capture(capture), MIG_LISTING)
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(smi))
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)

    def by_instance(name):
        return {(labels["GPU_I_ID"], labels["GPU_I_PROFILE"]): value for labels, value in families[name].samples}

    assert by_instance("DCGM_FI_DEV_FB_USED") == {("1", "4g.71gb"): 20480, ("2", "3g.71gb"): 13}
    assert by_instance("DCGM_FI_DEV_FB_FREE") == {("1", "4g.71gb"): 50943, ("2", "3g.71gb"): 71410}
    # Device-wide values are repeated on each instance's series, as dcgm-exporter does.
    assert by_instance("DCGM_FI_DEV_GPU_TEMP") == {("1", "4g.71gb"): 40, ("2", "3g.71gb"): 40}
    # nvidia-smi says N/A for utilisation in MIG mode: no series at all, not zeros.
    assert "DCGM_FI_DEV_GPU_UTIL" not in families and "DCGM_FI_DEV_MEM_COPY_UTIL" not in families
    for name, family in families.items():
        if name.startswith("DCGM_"):
            for labels, _unused in family.samples:  # the whole GPU is monitored through its instances
                assert labels["UUID"] == UUID and labels["gpu"] == "0" and labels["device"] == "nvidia0"
                assert "GPU_I_ID" in labels and "GPU_I_PROFILE" in labels, (name, labels)
    line = next(l for l in result.stdout.splitlines()
                if l.startswith("DCGM_FI_DEV_FB_USED{") and 'GPU_I_ID="1"' in l)
    assert ',modelName="NVIDIA H200",GPU_I_PROFILE="4g.71gb",GPU_I_ID="1",Hostname="%s",' % HOST in line
    assert only_value(families, "mlinfra_gpu_exporter_gpus")[1] == 1  # GPUs, not instances
    assert calls(tmp_path) == ["-q -x", "-L"]


def test_once_mig_without_listing_warns_once(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, mig_capture(capture), listing=None)  # -L exits 1
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(smi))
    assert result.returncode == 0, result.stderr
    profiles = {labels["GPU_I_PROFILE"] for labels, _unused in parse_exposition(result.stdout)["DCGM_FI_DEV_FB_USED"].samples}
    assert profiles == {"unknown"}
    assert result.stderr.count("MIG profile names unknown") == 1


def test_model_name_with_quote_backslash_newline_is_escaped(tmp_path, capture, gx):
    xml = replace_once(capture, "<product_name>NVIDIA H200</product_name>",
                       "<product_name>NVIDIA &quot;H200&quot; \\ test&#10;line</product_name>")
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, xml)))
    assert result.returncode == 0, result.stderr
    assert 'modelName="NVIDIA \\"H200\\" \\\\ test\\nline"' in result.stdout
    labels, _unused = only_value(parse_exposition(result.stdout), "DCGM_FI_DEV_GPU_TEMP")
    assert labels["modelName"] == 'NVIDIA "H200" \\ test\nline'
    # The renderer itself, without nvidia-smi around it.
    gpu = gx.GpuRecord(index=3, uuid="GPU-x", name='a"b', pci_bus_id=BUS_ID, gpu_temp=50)
    text = gx.render_metrics(gx.Snapshot("nvidia-smi", True, (gpu,)), 'host"1')
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-x",pci_bus_id="%s",device="nvidia3",modelName="a\\"b",' \
           'Hostname="host\\"1"} 50\n' % BUS_ID in text
    parse_exposition(text)


def test_xid_from_kernel_log(tmp_path, capture, gx):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1001,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n"
        "4,1002,6000000,-;NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python, Graphics Exception\n"
        "4,1003,7000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n"
        "4,1004,8000000,-;NVRM: Xid (PCI:0000:00:06): 31, pid=4242, name=python, MMU Fault\n"
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:00:06.0\n")
    smi = fake_nvidia_smi(tmp_path, capture)
    result = run_exporter("--once", "--hostname", HOST, "--source", "nvidia-smi", "--nvidia-smi", str(smi),
                          "--kmsg", str(kmsg))
    assert result.returncode == 0, result.stderr
    # The last XID of *this* GPU; the other bus's 79 belongs to another GPU.
    assert only_value(parse_exposition(result.stdout), "DCGM_FI_DEV_XID_ERRORS") == (DCGM_LABELS, 31)

    watcher = gx.KernelXidWatcher(str(kmsg))
    try:
        assert watcher.poll() == {(0, 0, 6): 31, (0, 0x3B, 0): 79}
        with open(kmsg, "a") as log:  # read on from where it stopped, half a line at a time
            log.write("4,1005,9000000,-;NVRM: Xid (PCI:0000:00:06): 4")
        assert watcher.poll()[(0, 0, 6)] == 31
        with open(kmsg, "a") as log:
            log.write("8, pid=1, name=python, DBE\n")
        assert watcher.poll()[(0, 0, 6)] == 48
    finally:
        watcher.close()


def test_unreadable_kernel_log_means_xid_zero_and_one_warning(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    result = run_exporter("--once", "--hostname", HOST, "--source", "nvidia-smi", "--nvidia-smi", str(smi),
                          "--kmsg", str(tmp_path / "no-kmsg"))
    assert result.returncode == 0, result.stderr
    assert only_value(parse_exposition(result.stdout), "DCGM_FI_DEV_XID_ERRORS")[1] == 0
    assert result.stderr.count("XID errors unknown") == 1


# --------------------------------------------------------------------------- textfile mode


def test_textfile_is_written_atomically(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    target = out_dir / "mlinfra_gpu.prom"
    target.write_text("stale\n")
    args = ("--source", "nvidia-smi", "--nvidia-smi", str(smi))
    result = run_once(*args, "--textfile", str(target))
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert target.read_text() == run_once(*args).stdout  # the same exposition as --once prints
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in out_dir.iterdir()) == ["mlinfra_gpu.prom"]  # no temp file left


def test_textfile_loop_writes_until_sigterm(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    target = tmp_path / "gpu.prom"
    proc = subprocess.Popen([sys.executable, str(EXPORTER), "--hostname", HOST, "--kmsg", "",
                             "--source", "nvidia-smi", "--nvidia-smi", str(smi), "--min-interval", "0",
                             "--textfile", str(target), "--interval", "0.2"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while calls(tmp_path).count("-q -x") < 2:  # a second write: it loops
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        assert "DCGM_FI_DEV_FB_FREE{" in target.read_text()
    finally:
        stop(proc)
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert "Traceback" not in proc.stderr.read().decode()


# --------------------------------------------------------------------------- HTTP server


def test_http_server_scraped_twice(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    with serving(tmp_path, "--source", "nvidia-smi", "--nvidia-smi", str(smi), "--min-interval", "0") as server:
        first, second = server.scrape(), server.scrape()
        for body in (first, second):
            families = parse_exposition(body)
            assert only_value(families, "DCGM_FI_DEV_FB_FREE") == (DCGM_LABELS, 143156)
            assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvidia-smi"}, 1)
        assert calls(tmp_path) == ["-q -x", "-q -x"]  # --min-interval 0: each scrape reads
        status, _unused, body = fetch(server.url + "/nowhere")
        assert status == 404 and "/metrics" in body
        status, ctype, body = fetch(server.url + "/")
        assert status == 200 and 'href="/metrics"' in body
    assert server.proc.returncode == 0
    assert "Traceback" not in server.stderr()


def test_http_scrapes_within_min_interval_share_one_read(tmp_path, capture):
    smi = fake_nvidia_smi(tmp_path, capture)
    with serving(tmp_path, "--source", "nvidia-smi", "--nvidia-smi", str(smi), "--min-interval", "300") as server:
        assert server.scrape() == server.scrape()
        assert calls(tmp_path) == ["-q -x"]


def test_gpu_less_guest_exports_health_only_and_logs_once(tmp_path):
    missing = tmp_path / "no" / "nvidia-smi"
    with serving(tmp_path, "--source", "nvidia-smi", "--nvidia-smi", str(missing), "--min-interval", "0") as server:
        for body in (server.scrape(), server.scrape()):
            families = parse_exposition(body)
            assert set(families) == HEALTH
            assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvidia-smi"}, 1)
            assert only_value(families, "mlinfra_gpu_exporter_gpus") == ({}, 0)
        log = server.stderr()
    assert log.count("no GPU to export") == 1 and str(missing) in log, log
    assert "Traceback" not in log


@pytest.mark.parametrize("snippet", [
    'echo "No devices were found"; exit 6',
    "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9",
    "echo '<?xml version=\"1.0\" ?><nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>'",
])
def test_nvidia_smi_without_gpu_is_gpu_less_not_down(tmp_path, snippet):
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, failure=snippet)))
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    assert set(families) == HEALTH
    assert only_value(families, "mlinfra_gpu_exporter_up")[1] == 1
    assert only_value(families, "mlinfra_gpu_exporter_gpus")[1] == 0
    assert result.stderr.count("no GPU to export") == 1


def test_failing_nvidia_smi_is_up_0_without_traceback(tmp_path):
    # How nvidia-smi answers once a GPU fell off the bus: a failure, not a GPU-less guest.
    smi = fake_nvidia_smi(tmp_path, failure='echo "%s"; exit 1' % LOST_GPU_MESSAGE)
    with serving(tmp_path, "--source", "nvidia-smi", "--nvidia-smi", str(smi), "--min-interval", "0") as server:
        bodies = [server.scrape(), server.scrape()]
        log = server.stderr()
    for body in bodies:
        families = parse_exposition(body)
        assert set(families) == {"mlinfra_gpu_exporter_up"}  # the GPU count is unknown, not 0
        assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvidia-smi"}, 0)
        assert "Traceback" not in body and LOST_GPU_MESSAGE not in body
    assert calls(tmp_path) == ["-q -x", "-q -x"]
    assert log.count("reading GPUs failed") == 1 and "exited 1: %s" % LOST_GPU_MESSAGE in log, log
    assert "Traceback" not in log


@pytest.mark.parametrize("snippet,extra,logged", [
    ('echo "%s"; exit 1' % LOST_GPU_MESSAGE, (), "exited 1"),
    ("echo 'Segmentation fault' >&2; exit 139", (), "exited 139: Segmentation fault"),
    ("echo '<nvidia_smi_log><gpu>'", (), "no valid XML"),
    ("sleep 5", ("--timeout", "0.5"), "did not answer within 0.5s"),
])
def test_once_read_failures(tmp_path, snippet, extra, logged):
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, failure=snippet)),
                      *extra)
    assert result.returncode == 1
    assert only_value(parse_exposition(result.stdout), "mlinfra_gpu_exporter_up")[1] == 0
    assert logged in result.stderr and "Traceback" not in result.stderr, result.stderr


# --------------------------------------------------------------------------- NVML source

FAKE_PYNVML = '''
"""A stand-in for pynvml (nvidia-ml-py) answering what the H200 of the capture would."""
import os

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_DEVICE_MIG_ENABLE = 1
NVML_ERROR_GPU_IS_LOST = 15
nvmlMemory_v2 = 0x02000028
MIB = 1 << 20
STATE = {"lost": False, "energy": 12345678901, "mig": []}  # mig: (gi, ci, profile, used, free)


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded", 15: "GPU is lost"}[self.value]


class S:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _mig(handle):
    return STATE["mig"][handle[1]] if handle[0] == "mig" else None


def nvmlInit():
    if os.environ.get("FAKE_NVML_NO_DRIVER"):
        raise NVMLError(9)


def nvmlSystemGetDriverVersion():
    return "580.159.04"


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(index):
    if STATE["lost"]:
        raise NVMLError(15)
    return ("gpu", index)


def nvmlDeviceGetUUID(handle):
    return b"GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"  # bytes, as older pynvml returns


def nvmlDeviceGetName(handle):
    mig = _mig(handle)
    return "NVIDIA H200 MIG " + mig[2] if mig else "NVIDIA H200"


def nvmlDeviceGetPciInfo(handle):
    return S(busId=b"00000000:00:06.0", busIdLegacy=b"0000:00:06.0")


def nvmlDeviceGetMinorNumber(handle):
    return 0


def nvmlDeviceGetMemoryInfo(handle, version=None):
    mig = _mig(handle)
    if mig:
        return S(total=71424 * MIB, reserved=0, used=mig[3] * MIB, free=mig[4] * MIB)
    if version is None:  # v1: reserved memory counted as used
        return S(total=143771 * MIB, used=616 * MIB, free=143156 * MIB + 524287)
    return S(total=143771 * MIB, reserved=616 * MIB, used=0, free=143156 * MIB + 524287)


def nvmlDeviceGetTemperature(handle, sensor):
    assert sensor == NVML_TEMPERATURE_GPU
    return 40


def nvmlDeviceGetFieldValues(handle, field_ids):
    assert field_ids == [NVML_FI_DEV_MEMORY_TEMP]
    return [S(nvmlReturn=0, value=S(uiVal=41))]


def nvmlDeviceGetPowerUsage(handle):
    return 130160  # mW


def nvmlDeviceGetTotalEnergyConsumption(handle):
    if STATE["energy"] is None:
        raise NVMLError(3)
    return STATE["energy"]


def nvmlDeviceGetClockInfo(handle, clock):
    return {NVML_CLOCK_SM: 1980, NVML_CLOCK_MEM: 3201}[clock]


def nvmlDeviceGetUtilizationRates(handle):
    if STATE["mig"]:
        raise NVMLError(3)  # as NVML does in MIG mode
    return S(gpu=0, memory=0)


def nvmlDeviceGetEncoderUtilization(handle):
    return [0, 167000]


def nvmlDeviceGetDecoderUtilization(handle):
    return [0, 167000]


def nvmlDeviceGetPcieReplayCounter(handle):
    return 0


def nvmlDeviceGetRemappedRows(handle):
    return (0, 0, 0, 0)


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    return STATE.get("ecc", {}).get((error_type, counter_type), 0)


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    raise NVMLError(3)  # Hopper: N/A (row remapping replaced page retirement), as in the capture


def nvmlDeviceGetCurrPcieLinkGeneration(handle):
    return 5


def nvmlDeviceGetMaxPcieLinkGeneration(handle):
    return 5


def nvmlDeviceGetCurrPcieLinkWidth(handle):
    return STATE.get("width", 16)


def nvmlDeviceGetMaxPcieLinkWidth(handle):
    return 16


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return STATE.get("reasons", 0)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return 700000  # mW


def nvmlDeviceGetNvLinkState(handle, link):
    raise NVMLError(3)  # a PCIe H200: no NVLink


def nvmlDeviceGetMigMode(handle):
    mode = NVML_DEVICE_MIG_ENABLE if STATE["mig"] else 0
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(handle):
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle, index):
    if index >= len(STATE["mig"]):
        raise NVMLError(6)
    return ("mig", index)


def nvmlDeviceGetGpuInstanceId(handle):
    return _mig(handle)[0]
'''


@pytest.fixture
def fake_nvml(tmp_path):
    path = tmp_path / "pynvml.py"
    path.write_text(FAKE_PYNVML)
    spec = importlib.util.spec_from_file_location("fake_pynvml_%d" % id(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nvml_and_nvidia_smi_give_the_same_records(gx, capture, fake_nvml):
    fake_nvml.STATE["energy"] = None  # nvidia-smi -q has no energy counter
    assert gx.read_nvml(fake_nvml) == gx.Reading(gx.parse_nvidia_smi_xml(capture.encode()))


def test_nvml_and_nvidia_smi_give_the_same_mig_records(gx, capture, fake_nvml):
    fake_nvml.STATE.update(energy=None, mig=[(1, 0, "4g.71gb", 20480, 50943), (2, 0, "3g.71gb", 13, 71410),
                                             (2, 1, "3g.71gb", 13, 71410)])
    from_smi = gx.parse_nvidia_smi_xml(mig_capture(capture).encode(), gx.parse_mig_profiles(MIG_LISTING))
    assert gx.read_nvml(fake_nvml).gpus == from_smi


def test_nvml_lost_gpu_is_a_failed_read(gx, fake_nvml, caplog):
    fake_nvml.STATE["lost"] = True
    collector = gx.Collector(gx.NvmlSource(fake_nvml), HOST, min_interval=0)
    for _unused in range(2):
        families = parse_exposition(collector.exposition())
        assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvml"}, 0)
    assert [r.getMessage() for r in caplog.records] == ["reading GPUs failed: NVML: GPU is lost"]


def test_once_through_nvml(tmp_path, capture):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = run_once("--nvidia-smi", str(tmp_path / "absent"), env=env)  # auto picks NVML
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    assert only_value(families, "mlinfra_gpu_exporter_up") == ({"source": "nvml"}, 1)
    assert only_value(families, "DCGM_FI_DEV_POWER_USAGE") == (DCGM_LABELS, pytest.approx(130.16))
    assert only_value(families, "DCGM_FI_DEV_FB_FREE") == (DCGM_LABELS, 143156)
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert only_value(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[1] == 12345678901


def test_auto_falls_back_to_nvidia_smi_when_nvml_does_not_initialise(tmp_path, capture):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), FAKE_NVML_NO_DRIVER="1")
    result = run_once("--nvidia-smi", str(fake_nvidia_smi(tmp_path, capture)), env=env)
    assert result.returncode == 0, result.stderr
    assert only_value(parse_exposition(result.stdout), "mlinfra_gpu_exporter_up") == ({"source": "nvidia-smi"}, 1)
    assert "NVML did not initialise: Driver Not Loaded" in result.stderr


def test_explicit_nvml_without_pynvml_is_gpu_less(tmp_path):
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is installed for this Python")
    result = run_once("--source", "nvml")
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    assert set(families) == HEALTH and only_value(families, "mlinfra_gpu_exporter_gpus")[1] == 0
    assert result.stderr.count("pynvml") == 1


# --------------------------------------------------------------------------- collector logic


class StubSource:
    name = "stub"

    def __init__(self, gx, outcomes):
        self.gx, self.outcomes, self.reads = gx, list(outcomes), 0

    def read(self):
        self.reads += 1
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_collector_caches_for_min_interval(gx):
    now = [100.0]
    gpu = gx.GpuRecord(index=0, uuid=UUID, name="NVIDIA H200", pci_bus_id=BUS_ID)
    source = StubSource(gx, [gx.Reading((gpu,))])
    collector = gx.Collector(source, HOST, min_interval=5, clock=lambda: now[0])
    collector.snapshot()
    now[0] += 4.9
    collector.snapshot()
    assert source.reads == 1
    now[0] += 0.1
    snapshot = collector.snapshot()
    assert source.reads == 2
    assert snapshot.gpus[0].last_xid == 0  # no kernel log read: "none known", as DCGM starts


def test_collector_logs_each_problem_once_and_again_after_recovery(gx, caplog):
    caplog.set_level(logging.INFO, logger="mlinfra-gpu-exporter")
    gpu = gx.GpuRecord(index=0, uuid=UUID, name="NVIDIA H200", pci_bus_id=BUS_ID)
    broken, other = gx.ReadError("nvidia-smi exited 1: boom"), gx.ReadError("nvidia-smi exited 2: bang")
    source = StubSource(gx, [broken, broken, other, gx.Reading((gpu,)), broken, ValueError("odd")])
    collector = gx.Collector(source, HOST, min_interval=0)
    ups = [collector.snapshot().up for _unused in range(6)]
    assert ups == [False, False, False, True, False, False]
    messages = [r.getMessage().splitlines()[0] for r in caplog.records]
    assert messages == ["reading GPUs failed: nvidia-smi exited 1: boom",
                        "reading GPUs failed: nvidia-smi exited 2: bang",
                        "reading GPUs works again: 1 GPU(s) through stub",
                        "reading GPUs failed: nvidia-smi exited 1: boom",
                        "reading GPUs failed unexpectedly: ValueError: odd"]


# --------------------------------------------------------------------------- command line


def test_help():
    result = run_exporter("--help")
    assert result.returncode == 0
    for word in ("dcgm-exporter", "--listen", "--nvidia-smi", "--min-interval", "--once", "--textfile",
                 "--source", "0.0.0.0:9400", "mlinfra_gpu_exporter_up"):
        assert word in result.stdout, word


@pytest.mark.parametrize("args,message", [
    (["--listen", "nonsense"], "expected HOST:PORT"),
    (["--listen", "127.0.0.1:70000"], "out of range"),
    (["--min-interval", "-1"], "expected 0 or more seconds"),
    (["--min-interval", "soon"], "expected a number of seconds"),
    (["--timeout", "0"], "more than 0 seconds"),
    (["--source", "dcgm"], "invalid choice"),
    (["--textfile", "/tmp/gpu.txt"], "only *.prom"),
    (["--textfile", "/nonexistent-dir/gpu.prom"], "does not exist"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_arguments(args, message):
    result = run_exporter(*args)
    assert result.returncode == 2
    assert "usage: mlinfra-gpu-exporter" in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_a_clear_error(tmp_path):
    with serving(tmp_path, "--source", "nvidia-smi", "--nvidia-smi", str(tmp_path / "absent")) as server:
        port = server.url.rsplit(":", 1)[1]
        result = run_exporter("--listen", "127.0.0.1:%s" % port, "--kmsg", "", "--source", "nvidia-smi")
    assert result.returncode == 1
    assert "cannot listen on 127.0.0.1:%s" % port in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- GPU health under DCGM's names

HEALTH_FIXTURES = ROOT / "tests" / "fixtures" / "gpu-health"
HEALTH_RULES = ROOT / "plugins" / "module_utils" / "_nvidia" / "_health.py"


@pytest.mark.parametrize("xml, log, series, value, verdict", [
    ("capture", "", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0, 0),
    ("dbe.xml", "", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2, 2),
    ("row-remap-pending.xml", "", "DCGM_FI_DEV_ROW_REMAP_PENDING", 1, 1),
    ("pcie-x8.xml", "", "DCGM_FI_DEV_PCIE_LINK_WIDTH", 8, 1),
    ("thermal-throttle.xml", "", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0x40, 1),
    ("capture", "xid79.log", "DCGM_FI_DEV_XID_ERRORS", 79, 2),
    ("capture", "xid13.log", "DCGM_FI_DEV_XID_ERRORS", 13, 0),
])
def test_each_health_fixture_exports_its_value_and_verdict(tmp_path, capture, xml, log, series, value, verdict):
    """The values tests/unit/monitoring/alerts.test.yml feeds promtool come from here."""
    text = capture if xml == "capture" else (HEALTH_FIXTURES / xml).read_text()
    smi = fake_nvidia_smi(tmp_path, text)
    kmsg = ["--kmsg", str(HEALTH_FIXTURES / log)] if log else []
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(smi), *kmsg)
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    labels, got = only_value(families, series)
    assert labels == DCGM_LABELS and got == value
    assert only_value(families, "mlinfra_gpu_health_verdict")[1] == verdict
    problems = families.get("mlinfra_gpu_health_problem")
    if verdict:
        (problem,) = problems.samples
        assert problem[0]["what_to_do"] and problem[0]["UUID"] == UUID
    else:
        assert problems is None  # a healthy GPU has no problem series (XID 13 is only a note)


def test_without_the_health_rules_the_exporter_still_serves_and_says_why(tmp_path, capture):
    """A copy of the script alone (the role installs the rules beside it; here they are absent)."""
    alone = tmp_path / "bin" / "mlinfra-gpu-exporter"
    alone.parent.mkdir()
    alone.write_text(EXPORTER.read_text())
    if Path("/usr/local/lib/mlinfra-gpu-exporter/mlinfra_gpu_health.py").exists():
        pytest.skip("this machine has the health rules installed where the exporter looks first")
    smi = fake_nvidia_smi(tmp_path, capture)
    result = subprocess.run([sys.executable, str(alone), "--once", "--hostname", HOST, "--kmsg", "",
                             "--source", "nvidia-smi", "--nvidia-smi", str(smi)],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, result.stderr
    families = parse_exposition(result.stdout)
    assert "DCGM_FI_DEV_FB_FREE" in families and "mlinfra_gpu_health_verdict" not in families
    assert "GPU health series not exported: the health rules are not installed" in result.stderr


def test_the_health_rules_installed_beside_the_script_are_used(tmp_path, capture):
    """The layout the monitoring role installs: the rules under their exporter-side name."""
    (tmp_path / "bin").mkdir()
    alone = tmp_path / "bin" / "mlinfra-gpu-exporter"
    alone.write_text(EXPORTER.read_text())
    (tmp_path / "bin" / "mlinfra_gpu_health.py").write_text(HEALTH_RULES.read_text())
    smi = fake_nvidia_smi(tmp_path, (HEALTH_FIXTURES / "dbe.xml").read_text())
    result = subprocess.run([sys.executable, str(alone), "--once", "--hostname", HOST, "--kmsg", "",
                             "--source", "nvidia-smi", "--nvidia-smi", str(smi)],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, result.stderr
    assert only_value(parse_exposition(result.stdout), "mlinfra_gpu_health_verdict")[1] == 2


@pytest.mark.parametrize("xml, log", [("capture", "xid79.log"), ("dbe.xml", "")])
def test_the_alert_tests_feed_promtool_what_the_exporter_publishes(tmp_path, capture, xml, log):
    """The mlinfra_gpu_health_problem series of tests/unit/monitoring/alerts.test.yml carry the
    exporter's own reason labels for the fixtures, so the GPUUnhealthy summary tested there is
    the one a real alert shows."""
    text = capture if xml == "capture" else (HEALTH_FIXTURES / xml).read_text()
    kmsg = ["--kmsg", str(HEALTH_FIXTURES / log)] if log else []
    result = run_once("--source", "nvidia-smi", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, text)), *kmsg)
    problems = parse_exposition(result.stdout)["mlinfra_gpu_health_problem"].samples
    import yaml
    tests = yaml.safe_load((ROOT / "tests" / "unit" / "monitoring" / "alerts.test.yml").read_text())["tests"]
    fed = {series["series"] for group in tests for series in group.get("input_series", [])
           if series["series"].startswith("mlinfra_gpu_health_problem{")}
    for labels, _value in problems:
        wanted = 'detail="%s",what_to_do="%s"' % (labels["detail"], labels["what_to_do"])
        assert any(wanted in series for series in fed), wanted


HEALTH_COMPARED = ("ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
                   "retired_pages_pending", "row_remap_pending", "row_remap_failure", "pcie_gen_current",
                   "pcie_gen_max", "pcie_width_current", "pcie_width_max", "power_limit_w", "nvlink", "gpu_temp")


def test_nvml_and_nvidia_smi_give_the_same_health_reading(gx, capture, fake_nvml):
    if gx.HEALTH is None:
        pytest.skip("the health rules did not load: %s" % gx.HEALTH_MISSING)
    (from_nvml,) = gx.read_nvml(fake_nvml).gpus
    (from_smi,) = gx.parse_nvidia_smi_xml(capture.encode())
    assert from_nvml.health["source"] == "nvml" and from_smi.health["source"] == "nvidia-smi"
    assert {k: from_nvml.health[k] for k in HEALTH_COMPARED} == {k: from_smi.health[k] for k in HEALTH_COMPARED}
    assert gx.HEALTH.throttle_mask(from_nvml.health["throttle"]) == gx.HEALTH.throttle_mask(from_smi.health["throttle"]) == 0
    assert gx.HEALTH.judge(from_nvml.health)["verdict"] == "healthy"


def test_nvml_faults_reach_the_verdict(gx, fake_nvml):
    """The dbe.xml / pcie-x8.xml / thermal-throttle.xml faults, as NVML reports them."""
    if gx.HEALTH is None:
        pytest.skip("the health rules did not load: %s" % gx.HEALTH_MISSING)
    fake_nvml.STATE.update(ecc={(1, 0): 2, (1, 1): 2}, width=8, reasons=0x40)
    try:
        (gpu,) = gx.read_nvml(fake_nvml).gpus
    finally:
        for key in ("ecc", "width", "reasons"):
            fake_nvml.STATE.pop(key, None)
    judged = gx.HEALTH.judge(gpu.health)
    assert judged["verdict"] == "unhealthy"
    assert sorted(r["check"] for r in judged["reasons"]) == ["ecc", "pcie", "throttle"]
