#!/usr/bin/python3
"""mlinfra-gpu-exporter: NVIDIA GPU metrics for Prometheus, in dcgm-exporter's dialect.

NVIDIA's dcgm-exporter needs DCGM, which Debian does not package, so GPU guests run this
single-file exporter instead. It exposes the same series names and labels as dcgm-exporter
(DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, ... with gpu, UUID, pci_bus_id, device,
modelName, Hostname and, for MIG instances, GPU_I_PROFILE and GPU_I_ID), so that Grafana
dashboard 12239 and alert rules written for DCGM work unchanged.

GPUs are read through NVML when the `pynvml` module (PyPI: nvidia-ml-py) imports and
initialises, otherwise by running `nvidia-smi -q -x`. Both sources produce the same records
(GpuRecord, MigInstance), so the exposition does not depend on where the numbers came from.
XID errors come from the kernel log (/dev/kmsg), where the NVIDIA driver reports them.

Health (ECC, row remapping, PCIe link, throttle reasons, NVLink) and the verdict per GPU come from
the collection's gpu_health rules (plugins/module_utils/_nvidia/_health.py), which the monitoring
role installs as HEALTH_MODULE_DIRS[0]/mlinfra_gpu_health.py; the exporter and the train stage's
check then judge a GPU the same way. Without that file the exporter still serves everything
else, and says so once in its log.

Only the standard library is required (Python 3.11).
"""
from __future__ import annotations

import argparse
import errno
import http.server
import importlib.util
import logging
import math
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET  # parses our own nvidia-smi's output, never foreign input
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

LOG = logging.getLogger("mlinfra-gpu-exporter")

DEFAULT_PORT = 9400  # dcgm-exporter's port: scrape configs written for DCGM keep working
DEFAULT_LISTEN = "0.0.0.0:%d" % DEFAULT_PORT
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_PROFILE = "unknown"

Number = Union[int, float]

# Where the health rules are looked for: where the monitoring role installs them, beside this
# script, and in the collection's own tree (a checkout or an installed collection).
HEALTH_MODULE_DIRS = ("/usr/local/lib/mlinfra-gpu-exporter", os.path.dirname(os.path.realpath(__file__)))
HEALTH_MODULE_NAME = "mlinfra_gpu_health.py"
HEALTH_IN_COLLECTION = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, os.pardir, os.pardir,
                                    "plugins", "module_utils", "_nvidia", "_health.py")


def load_health() -> tuple[Any, Optional[str]]:
    """(the health module, None), or (None, why not)."""
    candidates = [os.path.join(d, HEALTH_MODULE_NAME) for d in HEALTH_MODULE_DIRS] + [HEALTH_IN_COLLECTION]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        spec = importlib.util.spec_from_file_location("mlinfra_gpu_health", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:  # a broken copy must not stop the exporter
            return None, "%s does not load: %s: %s" % (path, type(exc).__name__, exc)
        return module, None
    return None, "the health rules are not installed (looked for %s)" % ", ".join(candidates)


HEALTH, HEALTH_MISSING = load_health()


class ReadError(Exception):
    """Reading the GPUs failed in a way we understand: one line in the log, no traceback."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance, the entity dcgm-exporter labels with GPU_I_ID/GPU_I_PROFILE."""

    gpu_instance_id: int
    profile: str  # "3g.71gb": nvidia-smi -L's name without the "MIG " prefix, as DCGM writes it
    fb_used_mib: Optional[int] = None
    fb_free_mib: Optional[int] = None


@dataclass(frozen=True)
class GpuRecord:
    """What one read knows about one GPU. None means the source said N/A (or not supported):
    such a value is left out of the exposition, never turned into 0."""

    index: int  # NVML index; nvidia-smi lists GPUs in the same order
    uuid: str
    name: str
    pci_bus_id: str  # normalised to NVML's form, 00000000:00:06.0
    minor_number: Optional[int] = None
    driver_version: Optional[str] = None
    gpu_util: Optional[Number] = None
    mem_copy_util: Optional[Number] = None
    enc_util: Optional[Number] = None
    dec_util: Optional[Number] = None
    fb_used_mib: Optional[int] = None
    fb_free_mib: Optional[int] = None
    gpu_temp: Optional[Number] = None
    memory_temp: Optional[Number] = None
    power_w: Optional[Number] = None
    energy_mj: Optional[int] = None
    sm_clock_mhz: Optional[Number] = None
    mem_clock_mhz: Optional[Number] = None
    pcie_replays: Optional[int] = None
    correctable_remapped_rows: Optional[int] = None
    uncorrectable_remapped_rows: Optional[int] = None
    row_remap_failure: Optional[int] = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    last_xid: Optional[int] = None  # joined from the kernel log by the Collector, not by sources
    # The health rules' reading (None without them) and its verdict, judged by the Collector with
    # the XIDs. Not part of the record's identity: each source words its reading its own way
    # (source, thresholds), and the test of the two sources compares those values apart.
    health: Optional[Mapping[str, Any]] = field(default=None, compare=False)
    verdict: Optional[Mapping[str, Any]] = field(default=None, compare=False)

    @property
    def device(self) -> str:
        # DCGM names the device node, /dev/nvidia<minor>; the index is the best guess without it.
        return "nvidia%d" % (self.minor_number if self.minor_number is not None else self.index)


@dataclass(frozen=True)
class Reading:
    """The result of one successful read. No GPU is a valid answer, with a reason to log."""

    gpus: tuple[GpuRecord, ...] = ()
    no_gpu_reason: Optional[str] = None


@dataclass(frozen=True)
class Snapshot:
    source: str
    up: bool
    gpus: tuple[GpuRecord, ...] = ()


class OnceLog:
    """Logs each distinct message once, so a broken GPU or a GPU-less guest does not write a
    line at every scrape; forget() re-arms it when things recover."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def log(self, level: int, message: str, exc_info: bool = False) -> bool:
        with self._lock:
            if message in self._seen:
                return False
            self._seen.add(message)
        self._logger.log(level, message, exc_info=exc_info)
        return True

    def forget(self) -> bool:
        with self._lock:
            had = bool(self._seen)
            self._seen.clear()
        return had


# --------------------------------------------------------------------------- parsing helpers

_QUANTITY = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def parse_quantity(text: Optional[str], unit: str = "") -> Optional[Number]:
    """'143156 MiB' -> 143156, '130.16 W' -> 130.16. 'N/A', '[Not Supported]', '' and a value
    in another unit than the one expected give None: a wrong number is worse than none."""
    if text is None:
        return None
    match = _QUANTITY.match(text)
    if not match or match.group(2) != unit:
        return None
    number = match.group(1)
    return float(number) if "." in number else int(number)


def parse_int(text: Optional[str], unit: str = "") -> Optional[int]:
    value = parse_quantity(text, unit)
    return value if isinstance(value, int) else None


def parse_yes_no(text: Optional[str]) -> Optional[int]:
    word = (text or "").strip().lower()
    return {"yes": 1, "no": 0}.get(word)


def pci_key(bus_id: str) -> Optional[tuple[int, int, int]]:
    """(domain, bus, device) of a PCI address in any of the spellings NVML, nvidia-smi and the
    kernel log use (00000000:00:06.0, 0000:00:06.0, 0000:00:06)."""
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return None
    return int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16)


def normalize_bus_id(bus_id: str) -> str:
    """NVML's spelling, which dcgm-exporter puts in pci_bus_id: 8-digit domain, upper case."""
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return bus_id.strip()
    domain, bus, dev, func = match.groups()
    return "%08X:%02X:%02X.%X" % (int(domain or "0", 16), int(bus, 16), int(dev, 16), int(func or "0"))


def _text(value: Any) -> Optional[str]:
    """pynvml returns bytes or str depending on its version and on the call."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip()


def _find(elem: ET.Element, path: str) -> Optional[str]:
    value = elem.findtext(path)
    return value.strip() if value is not None else None


# --------------------------------------------------------------------------- nvidia-smi source

_MIG_LIST_GPU = re.compile(r"^GPU\s+\d+:.*\(UUID:\s*([^)\s]+)\s*\)")
_MIG_LIST_DEVICE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):")


def parse_mig_profiles(listing: str) -> dict[str, dict[int, str]]:
    """`nvidia-smi -L` -> {GPU UUID: {MIG device index: profile}}.

    `nvidia-smi -q -x` gives each MIG device's GPU instance id and memory but not its profile
    name, which dcgm-exporter puts in GPU_I_PROFILE; -L names it per MIG device index."""
    profiles: dict[str, dict[int, str]] = {}
    current: Optional[dict[int, str]] = None
    for line in listing.splitlines():
        gpu = _MIG_LIST_GPU.match(line)
        if gpu:
            current = profiles.setdefault(gpu.group(1), {})
            continue
        mig = _MIG_LIST_DEVICE.match(line)
        if mig and current is not None:
            current[int(mig.group(2))] = mig.group(1)
    return profiles


def parse_xml_root(data: bytes) -> ET.Element:
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ReadError("nvidia-smi -q -x printed no valid XML (%s)" % exc) from None
    if root.tag != "nvidia_smi_log":
        raise ReadError("nvidia-smi -q -x printed <%s>, not <nvidia_smi_log>" % root.tag)
    return root


def has_mig_devices(root: ET.Element) -> bool:
    return root.find("gpu/mig_devices/mig_device") is not None


def _power_from_xml(gpu: ET.Element) -> Optional[Number]:
    # DCGM_FI_DEV_POWER_USAGE is NVML's nvmlDeviceGetPowerUsage, which on Ampere and newer is
    # the 1 s average: that is average_power_draw. Older GPUs only have the instant reading, and
    # drivers before R530 only <power_readings><power_draw>.
    for path in ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
                 "power_readings/power_draw"):
        value = parse_quantity(_find(gpu, path), "W")
        if value is not None:
            return value
    return None


def _mig_instances_from_xml(gpu: ET.Element, profiles: Mapping[int, str]) -> tuple[MigInstance, ...]:
    instances: dict[int, MigInstance] = {}
    for dev in gpu.findall("mig_devices/mig_device"):
        gi_id = parse_int(_find(dev, "gpu_instance_id"))
        # A GPU instance split into several compute instances is listed once per compute
        # instance, with the GPU instance's memory each time; DCGM reports the GPU instance once.
        if gi_id is None or gi_id in instances:
            continue
        index = parse_int(_find(dev, "index"))
        instances[gi_id] = MigInstance(
            gpu_instance_id=gi_id,
            profile=profiles.get(index, UNKNOWN_PROFILE) if index is not None else UNKNOWN_PROFILE,
            fb_used_mib=parse_int(_find(dev, "fb_memory_usage/used"), "MiB"),
            fb_free_mib=parse_int(_find(dev, "fb_memory_usage/free"), "MiB"))
    return tuple(sorted(instances.values(), key=lambda inst: inst.gpu_instance_id))


def gpu_from_xml(index: int, gpu: ET.Element, driver: Optional[str],
                 profiles: Mapping[int, str]) -> GpuRecord:
    uuid = _find(gpu, "uuid") or ""
    mig_enabled = (_find(gpu, "mig_mode/current_mig") or "").lower() == "enabled"
    return GpuRecord(
        index=index,
        uuid=uuid,
        name=_find(gpu, "product_name") or "",
        pci_bus_id=normalize_bus_id(_find(gpu, "pci/pci_bus_id") or gpu.get("id", "")),
        minor_number=parse_int(_find(gpu, "minor_number")),
        driver_version=driver,
        gpu_util=parse_quantity(_find(gpu, "utilization/gpu_util"), "%"),
        mem_copy_util=parse_quantity(_find(gpu, "utilization/memory_util"), "%"),
        enc_util=parse_quantity(_find(gpu, "utilization/encoder_util"), "%"),
        dec_util=parse_quantity(_find(gpu, "utilization/decoder_util"), "%"),
        fb_used_mib=parse_int(_find(gpu, "fb_memory_usage/used"), "MiB"),
        fb_free_mib=parse_int(_find(gpu, "fb_memory_usage/free"), "MiB"),
        gpu_temp=parse_quantity(_find(gpu, "temperature/gpu_temp"), "C"),
        memory_temp=parse_quantity(_find(gpu, "temperature/memory_temp"), "C"),
        power_w=_power_from_xml(gpu),
        energy_mj=None,  # nvidia-smi -q has no energy counter; NVML has
        sm_clock_mhz=parse_quantity(_find(gpu, "clocks/sm_clock"), "MHz"),
        mem_clock_mhz=parse_quantity(_find(gpu, "clocks/mem_clock"), "MHz"),
        pcie_replays=parse_int(_find(gpu, "pci/replay_counter")),
        correctable_remapped_rows=parse_int(_find(gpu, "remapped_rows/remapped_row_corr")),
        uncorrectable_remapped_rows=parse_int(_find(gpu, "remapped_rows/remapped_row_unc")),
        row_remap_failure=parse_yes_no(_find(gpu, "remapped_rows/remapped_row_failure")),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances_from_xml(gpu, profiles) if mig_enabled else (),
        health=HEALTH.reading_from_xml(index, gpu) if HEALTH is not None else None)


def gpus_from_xml(root: ET.Element,
                  mig_profiles: Optional[Mapping[str, Mapping[int, str]]] = None) -> tuple[GpuRecord, ...]:
    driver = _find(root, "driver_version") or None
    profiles = mig_profiles or {}
    return tuple(gpu_from_xml(index, gpu, driver, profiles.get(_find(gpu, "uuid") or "", {}))
                 for index, gpu in enumerate(root.findall("gpu")))


def parse_nvidia_smi_xml(data: bytes,
                         mig_profiles: Optional[Mapping[str, Mapping[int, str]]] = None) -> tuple[GpuRecord, ...]:
    """`nvidia-smi -q -x` output (and optionally parse_mig_profiles of `-L`) -> records."""
    return gpus_from_xml(parse_xml_root(data), mig_profiles)


# nvidia-smi's answers on a guest without a usable GPU (exit 6: no device, 9: no driver).
# "Unable to determine the device handle" is deliberately not one of them: that is how a GPU
# that fell off the bus looks, a failure to report (up 0), not a GPU-less guest.
_NO_GPU_EXIT_CODES = (6, 9)
_NO_GPU_TEXT = re.compile(r"no devices were found|couldn't communicate with the nvidia driver", re.I)


def _last_line(*outputs: bytes) -> str:
    lines = [line.strip() for out in outputs for line in out.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else ""


class NvidiaSmiSource:
    name = "nvidia-smi"

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout
        self._warn = OnceLog(LOG)

    def _binary(self) -> Optional[str]:
        # Looked up at every read: a driver installed after the exporter started is picked up.
        if os.sep in self.nvidia_smi:
            return self.nvidia_smi if os.path.exists(self.nvidia_smi) else None
        return shutil.which(self.nvidia_smi)

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        env = dict(os.environ, LC_ALL="C")  # stable, parseable wording of messages
        try:
            return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=self.timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise ReadError("%s did not answer within %gs" % (" ".join(argv), self.timeout)) from None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            raise ReadError("cannot run %s: %s" % (argv[0], exc.strerror or exc)) from None

    def _mig_profiles(self, binary: str) -> dict[str, dict[int, str]]:
        try:
            proc = self._run([binary, "-L"])
        except (ReadError, OSError) as exc:
            problem = str(exc)
        else:
            if proc.returncode == 0:
                return parse_mig_profiles(proc.stdout.decode("utf-8", "replace"))
            problem = "exited %d: %s" % (proc.returncode, _last_line(proc.stdout, proc.stderr))
        self._warn.log(logging.WARNING, "MIG profile names unknown (%s -L %s): GPU_I_PROFILE=%s"
                       % (binary, problem, UNKNOWN_PROFILE))
        return {}

    def read(self) -> Reading:
        binary = self._binary()
        if binary is None:
            return Reading(no_gpu_reason="nvidia-smi not found (%s)" % self.nvidia_smi)
        try:
            proc = self._run([binary, "-q", "-x"])
        except FileNotFoundError:  # removed between the lookup and the exec
            return Reading(no_gpu_reason="nvidia-smi not found (%s)" % binary)
        if proc.returncode != 0:
            message = _last_line(proc.stdout, proc.stderr)
            if proc.returncode in _NO_GPU_EXIT_CODES or _NO_GPU_TEXT.search(message):
                return Reading(no_gpu_reason="nvidia-smi reports no GPU (exit %d: %s)"
                               % (proc.returncode, message or "no output"))
            raise ReadError("%s -q -x exited %d: %s" % (binary, proc.returncode, message or "no output"))
        root = parse_xml_root(proc.stdout)
        profiles = self._mig_profiles(binary) if has_mig_devices(root) else {}
        gpus = gpus_from_xml(root, profiles)
        if not gpus:
            return Reading(no_gpu_reason="nvidia-smi lists no GPU")
        return Reading(gpus)


# --------------------------------------------------------------------------- NVML source

_NVML_GPU_IS_LOST = 15  # pynvml.NVML_ERROR_GPU_IS_LOST
_MIG_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(\S+)")


def load_nvml() -> tuple[Any, Optional[str]]:
    """(pynvml, None) when NVML is usable, else (None, why not)."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py
    except ImportError:
        return None, "the pynvml module (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, "NVML did not initialise: %s" % (exc or type(exc).__name__)
    return pynvml, None


def _nvml_optional(nvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """An NVML query whose failure means 'not available here' (N/A), except a lost GPU, which
    must fail the whole read so that it shows as up 0 and not as a GPU with fewer metrics."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", _NVML_GPU_IS_LOST):
            raise
        return None


def _nvml_memory_mib(nvml: Any, handle: Any) -> tuple[Optional[int], Optional[int]]:
    # The v2 structure reports reserved memory apart, as nvidia-smi and DCGM do; v1's "used"
    # includes it. Old pynvml has no version argument, old drivers no v2 call.
    info = None
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (nvml.NVMLError, TypeError):
            info = None
    if info is None:
        info = _nvml_optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    if info is None:
        return None, None
    return int(info.used) >> 20, int(info.free) >> 20  # bytes -> MiB, truncated as DCGM does


def _nvml_memory_temp(nvml: Any, handle: Any) -> Optional[int]:
    field_id = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", None)
    if field_id is None:
        return None
    values = _nvml_optional(nvml, nvml.nvmlDeviceGetFieldValues, handle, [field_id])
    if not values or values[0].nvmlReturn != 0:
        return None
    return int(values[0].value.uiVal)


def mig_profile_from_name(name: Optional[str]) -> str:
    """NVML names a MIG device '<parent name> MIG 3g.71gb'."""
    match = _MIG_PROFILE_IN_NAME.search(name or "")
    return match.group(1) if match else UNKNOWN_PROFILE


def _nvml_mig_instances(nvml: Any, handle: Any) -> tuple[bool, tuple[MigInstance, ...]]:
    mode = _nvml_optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return False, ()
    instances: dict[int, MigInstance] = {}
    for slot in range(_nvml_optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _nvml_optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:  # an empty slot
            continue
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        if gi_id in instances:  # another compute instance of the same GPU instance
            continue
        used, free = _nvml_memory_mib(nvml, mig)
        name = _text(_nvml_optional(nvml, nvml.nvmlDeviceGetName, mig))
        instances[gi_id] = MigInstance(gi_id, mig_profile_from_name(name), used, free)
    return True, tuple(sorted(instances.values(), key=lambda inst: inst.gpu_instance_id))


def gpu_from_nvml(nvml: Any, index: int, driver: Optional[str]) -> GpuRecord:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def optional(call: Callable[..., Any], *args: Any) -> Any:
        return _nvml_optional(nvml, call, handle, *args)

    util = optional(nvml.nvmlDeviceGetUtilizationRates)
    enc = optional(nvml.nvmlDeviceGetEncoderUtilization)
    dec = optional(nvml.nvmlDeviceGetDecoderUtilization)
    power_mw = optional(nvml.nvmlDeviceGetPowerUsage)
    remap = optional(nvml.nvmlDeviceGetRemappedRows)
    used, free = _nvml_memory_mib(nvml, handle)
    mig_enabled, instances = _nvml_mig_instances(nvml, handle)
    energy = optional(nvml.nvmlDeviceGetTotalEnergyConsumption)
    replays = optional(nvml.nvmlDeviceGetPcieReplayCounter)
    return GpuRecord(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)) or "",
        name=_text(nvml.nvmlDeviceGetName(handle)) or "",
        pci_bus_id=normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId) or ""),
        minor_number=optional(nvml.nvmlDeviceGetMinorNumber),
        driver_version=driver,
        gpu_util=util.gpu if util is not None else None,
        mem_copy_util=util.memory if util is not None else None,
        enc_util=enc[0] if enc is not None else None,
        dec_util=dec[0] if dec is not None else None,
        fb_used_mib=used,
        fb_free_mib=free,
        gpu_temp=optional(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        memory_temp=_nvml_memory_temp(nvml, handle),
        power_w=power_mw / 1000.0 if power_mw is not None else None,
        energy_mj=int(energy) if energy is not None else None,
        sm_clock_mhz=optional(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        mem_clock_mhz=optional(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
        pcie_replays=int(replays) if replays is not None else None,
        correctable_remapped_rows=int(remap[0]) if remap is not None else None,
        uncorrectable_remapped_rows=int(remap[1]) if remap is not None else None,
        row_remap_failure=int(bool(remap[3])) if remap is not None else None,
        mig_enabled=mig_enabled,
        mig_instances=instances,
        health=(HEALTH.reading_from_nvml(nvml, index, lambda call, *args: _nvml_optional(nvml, call, *args))
                if HEALTH is not None else None))


def read_nvml(nvml: Any) -> Reading:
    count = nvml.nvmlDeviceGetCount()
    if not count:
        return Reading(no_gpu_reason="NVML lists no GPU")
    driver = _text(_nvml_optional(nvml, nvml.nvmlSystemGetDriverVersion)) or None
    return Reading(tuple(gpu_from_nvml(nvml, index, driver) for index in range(count)))


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml: Any = None, loader: Callable[[], tuple[Any, Optional[str]]] = load_nvml) -> None:
        self._nvml = nvml
        self._loader = loader

    def read(self) -> Reading:
        if self._nvml is None:
            # Retried at each read when asked for explicitly: the driver may load after us.
            self._nvml, reason = self._loader()
            if self._nvml is None:
                return Reading(no_gpu_reason=reason)
        try:
            return read_nvml(self._nvml)
        except self._nvml.NVMLError as exc:
            raise ReadError("NVML: %s" % (exc or type(exc).__name__)) from None


# --------------------------------------------------------------------------- XID errors

# NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.[0-7])?\): (\d+)")


XIDS_KEPT = 256


class KernelXidWatcher:
    """The last XID per GPU, from the kernel log.

    DCGM_FI_DEV_XID_ERRORS is "the value of the last XID": neither nvidia-smi -q nor an NVML
    query holds it (DCGM listens for NVML events), but the driver logs every XID to the kernel
    log, which serves both sources the same way. The file is opened once and read on from
    where the last poll stopped; /dev/kmsg starts at the oldest record still in the ring, so
    an XID since boot is known even after an exporter restart."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._failed = False
        self._partial = b""
        self._last: dict[tuple[int, int, int], int] = {}
        self._all: dict[tuple[int, int, int], list[int]] = {}
        self._warn = OnceLog(LOG)

    def _open(self) -> bool:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._give_up("cannot open %s: %s" % (self.path, exc.strerror or exc))
            return False
        return True

    def _give_up(self, why: str) -> None:
        self._failed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._warn.log(logging.WARNING, "XID errors unknown (%s): DCGM_FI_DEV_XID_ERRORS stays 0" % why)

    def _feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for the rest
        for line in lines:
            match = _XID.search(line.decode("utf-8", "replace"))
            if match:
                key = pci_key(match.group(1))
                if key is not None:
                    self._last[key] = int(match.group(2))
                    seen = self._all.setdefault(key, [])
                    seen.append(int(match.group(2)))
                    del seen[:-XIDS_KEPT]  # the verdict needs which XIDs, not every repeat

    def all_xids(self) -> dict[tuple[int, int, int], list[int]]:
        """Every XID seen per GPU since the log's start (the last XIDS_KEPT), for the verdict."""
        return {key: list(xids) for key, xids in self._all.items()}

    def poll(self) -> dict[tuple[int, int, int], int]:
        if self._failed or (self._fd is None and not self._open()):
            return dict(self._last)
        while self._fd is not None:
            try:
                chunk = os.read(self._fd, 65536)  # /dev/kmsg hands one whole record per read
            except BlockingIOError:
                break  # nothing new
            except BrokenPipeError:
                continue  # records overwritten before we read them; the next read skips ahead
            except OSError as exc:
                self._give_up("cannot read %s: %s" % (self.path, exc.strerror or exc))
                break
            if not chunk:
                break  # a plain file: the end of what is written so far
            self._feed(chunk)
        return dict(self._last)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --------------------------------------------------------------------------- exposition


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # gauge or counter, as in dcgm-exporter's default-counters.csv
    help: str
    value: Callable[[GpuRecord], Optional[Number]]
    # Values a MIG GPU instance has of its own (memory). Device-wide values (temperature,
    # power, clocks, XID) are repeated on each instance's series, as dcgm-exporter does.
    instance_value: Optional[Callable[[MigInstance], Optional[Number]]] = None


DCGM_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    MetricSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: g.mem_clock_mhz),
    MetricSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda g: g.memory_temp),
    MetricSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.gpu_temp),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.power_w),
    MetricSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
               "Total energy consumption since boot (in mJ).", lambda g: g.energy_mj),
    MetricSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
               lambda g: g.pcie_replays),
    MetricSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.gpu_util),
    MetricSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda g: g.mem_copy_util),
    MetricSpec("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda g: g.enc_util),
    MetricSpec("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda g: g.dec_util),
    # The value of the last XID, not a count: alert on a change, an alert on != 0 never clears.
    MetricSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
               lambda g: g.last_xid),
    MetricSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
               lambda g: g.fb_free_mib, lambda i: i.fb_free_mib),
    MetricSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
               lambda g: g.fb_used_mib, lambda i: i.fb_used_mib),
    MetricSpec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
               "Number of remapped rows for uncorrectable errors", lambda g: g.uncorrectable_remapped_rows),
    MetricSpec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
               "Number of remapped rows for correctable errors", lambda g: g.correctable_remapped_rows),
    MetricSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
               lambda g: g.row_remap_failure),
    # From the health rules (absent when they are not installed, or the source says N/A).
    MetricSpec("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
               lambda g: _health_value(g, "ecc_sbe_volatile")),
    MetricSpec("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
               lambda g: _health_value(g, "ecc_dbe_volatile")),
    MetricSpec("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.",
               lambda g: _health_value(g, "ecc_sbe_aggregate")),
    MetricSpec("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.",
               lambda g: _health_value(g, "ecc_dbe_aggregate")),
    MetricSpec("DCGM_FI_DEV_RETIRED_PENDING", "gauge", "Whether a page retirement is pending (1) or not (0).",
               lambda g: _health_value(g, "retired_pages_pending")),
    MetricSpec("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending (1) or not (0).",
               lambda g: _health_value(g, "row_remap_pending")),
    MetricSpec("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe link generation in use.",
               lambda g: _health_value(g, "pcie_gen_current")),
    MetricSpec("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "Highest PCIe link generation the GPU supports.",
               lambda g: _health_value(g, "pcie_gen_max")),
    MetricSpec("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe link width in use (lanes).",
               lambda g: _health_value(g, "pcie_width_current")),
    MetricSpec("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "Widest PCIe link the GPU supports (lanes).",
               lambda g: _health_value(g, "pcie_width_max")),
    MetricSpec("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
               "Current clock throttle reasons (NVML bitmask: 0x8 HW slowdown, 0x20 SW thermal, "
               "0x40 HW thermal, 0x80 HW power brake).",
               lambda g: HEALTH.throttle_mask(g.health.get("throttle") or {}) if g.health is not None else None),
    MetricSpec("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors.",
               lambda g: _nvlink_value(g, "crc_flit")),
    MetricSpec("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors.",
               lambda g: _nvlink_value(g, "crc_data")),
    MetricSpec("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
               lambda g: _nvlink_value(g, "replay")),
    MetricSpec("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors.",
               lambda g: _nvlink_value(g, "recovery")),
    MetricSpec("mlinfra_gpu_health_verdict", "gauge",
               "The gpu_health verdict: 0 healthy, 1 degraded, 2 unhealthy (the reasons are in mlinfra_gpu_health_problem).",
               lambda g: HEALTH.verdict_code(g.verdict["verdict"]) if g.verdict is not None else None),
)

HEALTH_PROBLEM_METRIC = "mlinfra_gpu_health_problem"


def _health_value(gpu: GpuRecord, key: str) -> Optional[Number]:
    value = gpu.health.get(key) if gpu.health is not None else None
    return int(value) if isinstance(value, bool) else value


def _nvlink_value(gpu: GpuRecord, key: str) -> Optional[Number]:
    links = gpu.health.get("nvlink") if gpu.health is not None else None
    return links.get(key) if links else None  # no series on a GPU without NVLink


UP_METRIC = "mlinfra_gpu_exporter_up"
GPUS_METRIC = "mlinfra_gpu_exporter_gpus"


def escape_label_value(value: str) -> str:
    # The text format's three escapes; backslash first so the others are not doubled.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: Number) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def format_sample(name: str, labels: Sequence[tuple[str, str]], value: Number) -> str:
    body = ",".join('%s="%s"' % (key, escape_label_value(val)) for key, val in labels)
    return "%s{%s} %s" % (name, body, format_value(value)) if body else "%s %s" % (name, format_value(value))


def format_family(name: str, kind: str, help_text: str, samples: Sequence[str]) -> list[str]:
    return ["# HELP %s %s" % (name, escape_help(help_text)), "# TYPE %s %s" % (name, kind), *samples]


def entity_labels(gpu: GpuRecord, hostname: str, instance: Optional[MigInstance]) -> list[tuple[str, str]]:
    # dcgm-exporter's order; GPU_I_* only on MIG instance series.
    labels = [("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
              ("device", gpu.device), ("modelName", gpu.name)]
    if instance is not None:
        labels += [("GPU_I_PROFILE", instance.profile), ("GPU_I_ID", str(instance.gpu_instance_id))]
    labels.append(("Hostname", hostname))
    if gpu.driver_version:
        labels.append(("DCGM_FI_DRIVER_VERSION", gpu.driver_version))
    return labels


def health_problems(snapshot: Snapshot, hostname: str) -> list[str]:
    """One series per reason a GPU is not healthy, labelled with what to do, so that an alert can
    say it; a healthy GPU has none."""
    samples = []
    for gpu in snapshot.gpus:
        for reason in (gpu.verdict or {}).get("reasons", ()):
            labels = entity_labels(gpu, hostname, None) + [
                ("check", reason["check"]), ("verdict", reason["verdict"]), ("action", reason["action"]),
                ("detail", reason["detail"]), ("what_to_do", reason["what_to_do"])]
            samples.append(format_sample(HEALTH_PROBLEM_METRIC, labels, 1))
    if not samples:
        return []
    return format_family(HEALTH_PROBLEM_METRIC, "gauge", "1 per reason a GPU is degraded or unhealthy.", samples)


def monitored_entities(gpu: GpuRecord) -> Iterator[Optional[MigInstance]]:
    """dcgm-exporter's default ("flex") choice: a GPU with MIG instances is monitored through
    its instances, one without as the whole GPU. None stands for the whole GPU."""
    if gpu.mig_enabled and gpu.mig_instances:
        yield from gpu.mig_instances
    else:
        yield None


def render_metrics(snapshot: Snapshot, hostname: str) -> str:
    lines: list[str] = []
    for spec in DCGM_METRICS:
        samples = []
        for gpu in snapshot.gpus:
            for instance in monitored_entities(gpu):
                if instance is not None and spec.instance_value is not None:
                    value = spec.instance_value(instance)
                else:
                    value = spec.value(gpu)
                if value is None:  # N/A: absent, never 0
                    continue
                samples.append(format_sample(spec.name, entity_labels(gpu, hostname, instance), value))
        if samples:  # a family without samples would only be noise (and a GPU-less guest has none)
            lines += format_family(spec.name, spec.kind, spec.help, samples)
    lines += health_problems(snapshot, hostname)
    lines += format_family(UP_METRIC, "gauge",
                           "1 if the last read of the GPUs succeeded (also with no GPU), 0 if it failed.",
                           [format_sample(UP_METRIC, [("source", snapshot.source)], int(snapshot.up))])
    if snapshot.up:  # after a failed read the count is unknown, and 0 would say "GPU-less"
        lines += format_family(GPUS_METRIC, "gauge", "Number of GPUs the last read found.",
                               [format_sample(GPUS_METRIC, [], len(snapshot.gpus))])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- collector


class Collector:
    """Reads the GPUs at most once per min_interval and serves the last result in between, so
    that several Prometheus servers (or an impatient one) do not multiply nvidia-smi runs."""

    def __init__(self, source: Any, hostname: str, min_interval: float = 5.0,
                 xid_watcher: Optional[KernelXidWatcher] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.hostname = hostname
        self.min_interval = min_interval
        self.xid_watcher = xid_watcher
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: Optional[Snapshot] = None
        self._read_at = 0.0
        self._problems = OnceLog(LOG)
        self._health_warn = OnceLog(LOG)

    def snapshot(self) -> Snapshot:
        with self._lock:  # concurrent scrapes wait for one read instead of starting their own
            now = self._clock()
            if self._cached is None or now - self._read_at >= self.min_interval:
                self._cached = self._read()
                self._read_at = now
            return self._cached

    def exposition(self) -> str:
        return render_metrics(self.snapshot(), self.hostname)

    def _read(self) -> Snapshot:
        name = self.source.name
        try:
            reading = self.source.read()
        except ReadError as exc:
            self._problems.log(logging.ERROR, "reading GPUs failed: %s" % exc)
            return Snapshot(name, False)
        except Exception as exc:  # an unforeseen failure: keep serving, report it once
            self._problems.log(logging.ERROR, "reading GPUs failed unexpectedly: %s: %s"
                               % (type(exc).__name__, exc), exc_info=True)
            return Snapshot(name, False)
        if reading.no_gpu_reason and not reading.gpus:
            self._problems.log(logging.WARNING, "no GPU to export: %s" % reading.no_gpu_reason)
            return Snapshot(name, True)
        if self._problems.forget():
            LOG.info("reading GPUs works again: %d GPU(s) through %s", len(reading.gpus), name)
        xids = self.xid_watcher.poll() if self.xid_watcher is not None else {}
        history = self.xid_watcher.all_xids() if self.xid_watcher is not None else {}
        if HEALTH is None:
            self._health_warn.log(logging.WARNING, "GPU health series not exported: %s" % HEALTH_MISSING)
        return Snapshot(name, True, tuple(replace(gpu, last_xid=_last_xid(xids, gpu),
                                                  verdict=_verdict(gpu, history)) for gpu in reading.gpus))


def _verdict(gpu: GpuRecord, history: Mapping[tuple[int, int, int], list[int]]) -> Optional[Mapping[str, Any]]:
    if HEALTH is None or gpu.health is None:
        return None
    key = pci_key(gpu.pci_bus_id)
    return HEALTH.judge(gpu.health, history.get(key, []) if key is not None else [])


def _last_xid(xids: Mapping[tuple[int, int, int], int], gpu: GpuRecord) -> int:
    key = pci_key(gpu.pci_bus_id)
    return xids.get(key, 0) if key is not None else 0  # 0: no XID known, as DCGM starts


def make_source(kind: str, nvidia_smi: str, timeout: float) -> Any:
    if kind == "nvidia-smi":
        return NvidiaSmiSource(nvidia_smi, timeout)
    if kind == "nvml":
        return NvmlSource()
    nvml, reason = load_nvml()
    if nvml is not None:
        return NvmlSource(nvml)
    LOG.info("reading GPUs with nvidia-smi: %s", reason)
    return NvidiaSmiSource(nvidia_smi, timeout)


# --------------------------------------------------------------------------- outputs


def write_textfile(path: str, text: str) -> None:
    """Write for node-exporter's textfile collector: a temporary file in the same directory,
    renamed over the target, so that a scrape never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # node-exporter usually runs as another user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "mlinfra-gpu-exporter"
    server: "MetricsServer"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body, status, ctype = self.server.collector.exposition().encode("utf-8"), 200, CONTENT_TYPE
            except Exception as exc:  # never a traceback to the client
                self.server.errors.log(logging.ERROR, "rendering metrics failed: %s: %s"
                                       % (type(exc).__name__, exc), exc_info=True)
                body, status, ctype = b"internal error, see the exporter's log\n", 500, "text/plain; charset=utf-8"
        elif path == "/":
            body, status, ctype = (b"<html><head><title>mlinfra GPU exporter</title></head><body>"
                                   b"<a href=\"/metrics\">/metrics</a></body></html>\n", 200,
                                   "text/html; charset=utf-8")
        else:
            body, status, ctype = b"not found; metrics are at /metrics\n", 404, "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # a line per scrape would drown the journal


class MetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], collector: Collector) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.collector = collector
        self.errors = OnceLog(LOG)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the address up in DNS (getfqdn), which can stall the
        # start on a guest without a resolver; the name is not needed.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


# --------------------------------------------------------------------------- command line


def listen_address(text: str) -> tuple[str, int]:
    """'0.0.0.0:9400', '[::]:9400', ':9400' (all IPv4 addresses) -> (host, port)."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]*):(\d+)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError("expected HOST:PORT (e.g. 0.0.0.0:9400 or [::]:9400), got %r" % text)
    host = match.group(1) if match.group(1) is not None else (match.group(3) or "0.0.0.0")
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise argparse.ArgumentTypeError("port %d is out of range (0-65535)" % port)
    return host, port


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds, got %r" % text) from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("expected 0 or more seconds, got %r" % text)
    return value


def positive_seconds(text: str) -> float:
    value = non_negative_seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected more than 0 seconds, got %r" % text)
    return value


def prom_path(text: str) -> str:
    if not text.endswith(".prom"):
        raise argparse.ArgumentTypeError("node-exporter's textfile collector reads only *.prom files, got %r" % text)
    if not os.path.isdir(os.path.dirname(os.path.abspath(text))):
        raise argparse.ArgumentTypeError("directory of %r does not exist" % text)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlinfra-gpu-exporter",
        description="Export NVIDIA GPU metrics for Prometheus under dcgm-exporter's names and labels "
                    "(DCGM_FI_DEV_*), so that DCGM dashboards (Grafana 12239) and alert rules work "
                    "without DCGM. Reads NVML through pynvml when available, else `nvidia-smi -q -x`.",
        epilog="Modes: serve http://LISTEN/metrics (default); --once: print the metrics and exit "
               "(exit status 1 if reading the GPUs failed); --textfile: write them for node-exporter's "
               "textfile collector every --interval seconds, or once with --once. "
               "Health: mlinfra_gpu_exporter_up{source} (0: the read failed) and mlinfra_gpu_exporter_gpus. "
               "Example: mlinfra-gpu-exporter --listen 127.0.0.1:9400 --min-interval 10",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--listen", type=listen_address, default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help="address to serve /metrics on (port 0: any free port, logged at start)")
    parser.add_argument("--source", choices=("auto", "nvml", "nvidia-smi"), default="auto",
                        help="where to read GPUs: auto uses NVML if pynvml imports and initialises, "
                             "else nvidia-smi")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH",
                        help="nvidia-smi to run (a name is looked up in PATH at each read)")
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, metavar="SECONDS",
                        help="how long one nvidia-smi run may take")
    parser.add_argument("--min-interval", type=non_negative_seconds, default=5.0, metavar="SECONDS",
                        help="read the GPUs at most this often; scrapes in between get the last reading")
    parser.add_argument("--hostname", default=None, metavar="NAME",
                        help="value of the Hostname label (default: this machine's host name)")
    parser.add_argument("--kmsg", default="/dev/kmsg", metavar="PATH",
                        help="kernel log to read XID errors from ('' to not read it: XID stays 0)")
    parser.add_argument("--once", action="store_true",
                        help="read once, print the metrics to stdout (or write --textfile) and exit")
    parser.add_argument("--textfile", type=prom_path, default=None, metavar="PATH.prom",
                        help="instead of serving HTTP, write the metrics atomically to this file")
    parser.add_argument("--interval", type=positive_seconds, default=15.0, metavar="SECONDS",
                        help="with --textfile and without --once: seconds between writes")
    return parser


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds serve_forever/sleep in the main thread: a clean exit


def serve(collector: Collector, address: tuple[str, int]) -> int:
    try:
        server = MetricsServer(address, collector)
    except OSError as exc:
        LOG.error("cannot listen on %s:%d: %s", address[0], address[1], exc.strerror or exc)
        return 1
    host, port = server.server_address[:2]
    LOG.info("listening on http://%s:%d/metrics (source %s)",
             "[%s]" % host if ":" in host else host, port, collector.source.name)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def write_loop(collector: Collector, path: str, interval: float) -> int:
    failures = OnceLog(LOG)
    try:
        while True:
            try:
                write_textfile(path, collector.exposition())
                failures.forget()
            except OSError as exc:
                failures.log(logging.ERROR, "cannot write %s: %s" % (path, exc.strerror or exc))
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="mlinfra-gpu-exporter: %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    hostname = args.hostname or socket.gethostname()
    source = make_source(args.source, args.nvidia_smi, args.timeout)
    xids = KernelXidWatcher(args.kmsg) if args.kmsg else None
    collector = Collector(source, hostname, args.min_interval, xids)
    try:
        if args.once:
            snapshot = collector.snapshot()
            text = render_metrics(snapshot, hostname)
            if args.textfile:
                try:
                    write_textfile(args.textfile, text)
                except OSError as exc:
                    LOG.error("cannot write %s: %s", args.textfile, exc.strerror or exc)
                    return 1
            else:
                sys.stdout.write(text)
                sys.stdout.flush()
            return 0 if snapshot.up else 1
        if args.textfile:
            return write_loop(collector, args.textfile, args.interval)
        return serve(collector, args.listen)
    finally:
        if xids is not None:
            xids.close()


if __name__ == "__main__":
    sys.exit(main())
