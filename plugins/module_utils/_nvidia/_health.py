# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a GPU healthy enough to train on: readings, XID classes and a verdict per GPU.

One reading per GPU (a plain dict, the same keys whether it came from NVML or from
``nvidia-smi -q -x``), the XIDs the driver logged for it, and :func:`judge`, which turns both
into ``healthy`` / ``degraded`` / ``unhealthy`` with the reasons and what to do about each.

This file imports only the standard library, on purpose: the gpu_health module uses it through
Ansible's module_utils, and the monitoring role installs the very same file beside the GPU
exporter (a standalone script), so the alerts and the train stage's refusal judge a GPU by the
same rules. No subprocess here; the callers run the commands, bounded.
"""
from __future__ import annotations

import re
from collections import namedtuple
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"
_RANK = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}

# What to do, from least to most disruptive (the words of NVIDIA's "Resolution Bucket").
NONE = "none"
RESTART_APP = "restart_app"
RESET_GPU = "reset_gpu"
DRAIN_REPLACE = "drain_and_replace"
ACTION_TEXT = {
    NONE: "nothing to do on the GPU",
    RESTART_APP: "restart the application; the GPU itself is usable",
    RESET_GPU: "drain the GPU's jobs and reset the GPU (nvidia-smi -r, or reboot the VM)",
    DRAIN_REPLACE: "drain the node and have the GPU inspected or replaced",
}

XidClass = namedtuple("XidClass", "name origin action verdict")

# NVIDIA's XID catalogue ("Xid Errors", docs.nvidia.com/deploy/xid-errors/, catalogue for Ampere
# and newer, read 2026-12): the number, NVIDIA's description, who causes it and the catalogue's
# immediate action mapped to ours. An XID from the application leaves the GPU usable (healthy,
# with a note); one that needs a reset or a replacement makes it unhealthy. The one table.
XID_CATALOGUE: Dict[int, XidClass] = {
    8: XidClass("GPU stopped processing (channel idle timeout)", "application", RESTART_APP, HEALTHY),
    13: XidClass("Graphics engine exception", "application", RESTART_APP, HEALTHY),
    31: XidClass("GPU memory page fault (MMU fault)", "application or driver", RESTART_APP, HEALTHY),
    32: XidClass("Invalid or corrupted push buffer stream", "driver or PCIe", RESTART_APP, DEGRADED),
    38: XidClass("Driver firmware error", "driver", RESET_GPU, UNHEALTHY),
    43: XidClass("GPU stopped processing (reset channel verification error)", "application", NONE, HEALTHY),
    45: XidClass("Preemptive cleanup, due to previous errors", "application or earlier XID", NONE, HEALTHY),
    48: XidClass("Double bit ECC error (DBE)", "hardware", RESET_GPU, UNHEALTHY),
    61: XidClass("Internal micro-controller breakpoint/warning", "driver or hardware", RESET_GPU, UNHEALTHY),
    62: XidClass("Internal micro-controller halt", "driver or hardware", RESET_GPU, UNHEALTHY),
    63: XidClass("ECC page retirement or row remapping recording event", "hardware", RESET_GPU, DEGRADED),
    64: XidClass("ECC page retirement or row remapper recording failure", "hardware", DRAIN_REPLACE, UNHEALTHY),
    68: XidClass("NVDEC0 exception", "application or hardware", RESTART_APP, HEALTHY),
    74: XidClass("NVLink error", "hardware (NVLink)", RESET_GPU, UNHEALTHY),
    79: XidClass("GPU has fallen off the bus", "hardware, PCIe or power", DRAIN_REPLACE, UNHEALTHY),
    92: XidClass("High single-bit ECC error rate", "hardware", NONE, DEGRADED),
    94: XidClass("Contained ECC error", "hardware", RESTART_APP, DEGRADED),
    95: XidClass("Uncontained ECC error", "hardware", RESET_GPU, UNHEALTHY),
    109: XidClass("Context switch timeout", "application or driver", RESTART_APP, HEALTHY),
    119: XidClass("GSP RPC timeout", "driver or firmware (GSP)", RESET_GPU, UNHEALTHY),
    120: XidClass("GSP error", "driver or firmware (GSP)", RESET_GPU, UNHEALTHY),
    140: XidClass("Unrecovered ECC error", "hardware", RESET_GPU, UNHEALTHY),
    154: XidClass("GPU recovery action changed", "driver", RESET_GPU, UNHEALTHY),
}
# An XID the table does not know: reported, and taken seriously until someone classifies it.
UNKNOWN_XID = XidClass("not in this collection's XID table", "unknown", RESET_GPU, DEGRADED)

# NVML's clocks event (throttle) reason bits; DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is this mask.
THROTTLE_BITS = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80), ("display_clocks_setting", 0x100),
)
# The reasons that mean the hardware is holding the GPU back (not idle, not a setting).
BAD_THROTTLES = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")

# NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.[0-7])?\): (\d+)")
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")
_QUANTITY = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")


def classify_xid(xid: int) -> XidClass:
    return XID_CATALOGUE.get(xid, UNKNOWN_XID)


def pci_key(bus_id: Optional[str]) -> Optional[Tuple[int, int, int]]:
    """(domain, bus, device) of a PCI address as NVML, nvidia-smi or the kernel log spell it."""
    match = _BUS_ID.match((bus_id or "").strip())
    if not match:
        return None
    return int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16)


def parse_kernel_xids(text: str) -> Dict[Tuple[int, int, int], List[int]]:
    """Every XID in a kernel log (dmesg, journal, /dev/kmsg), in order, by GPU PCI address."""
    found: Dict[Tuple[int, int, int], List[int]] = {}
    for line in (text or "").splitlines():
        match = _XID_LINE.search(line)
        key = pci_key(match.group(1)) if match else None
        if key is not None:
            found.setdefault(key, []).append(int(match.group(2)))
    return found


# --------------------------------------------------------------------------- readings

def _quantity(text: Optional[str], unit: str = "") -> Optional[float]:
    if text is None:
        return None
    match = _QUANTITY.match(text)
    if not match or match.group(2) != unit:
        return None  # N/A, [Not Supported] or another unit: no number rather than a wrong one
    return float(match.group(1))


def _int(text: Optional[str], unit: str = "") -> Optional[int]:
    value = _quantity(text, unit)
    return int(value) if value is not None else None


def _yes(text: Optional[str]) -> Optional[bool]:
    return {"yes": True, "no": False}.get((text or "").strip().lower())


def _find(elem: Any, path: str) -> Optional[str]:
    value = elem.findtext(path)
    return value.strip() if value is not None else None


def _sum(*values: Optional[int]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_from_xml(gpu: Any, scope: str) -> Tuple[Optional[int], Optional[int]]:
    """(single-bit, double-bit) totals of ``volatile`` or ``aggregate``. Hopper's nvidia-smi
    splits them into SRAM and DRAM; older drivers give single_bit/double_bit totals."""
    base = "ecc_errors/%s/" % scope
    sbe = _sum(_int(_find(gpu, base + "sram_correctable")), _int(_find(gpu, base + "dram_correctable")))
    dbe = _sum(_int(_find(gpu, base + "sram_uncorrectable_parity")),
               _int(_find(gpu, base + "sram_uncorrectable_secded")),
               _int(_find(gpu, base + "dram_uncorrectable")))
    if sbe is None:
        sbe = _int(_find(gpu, base + "single_bit/total"))
    if dbe is None:
        dbe = _int(_find(gpu, base + "double_bit/total"))
    return sbe, dbe


def _throttle_from_xml(gpu: Any) -> Dict[str, bool]:
    reasons: Dict[str, bool] = {}
    for section, prefix in (("clocks_event_reasons", "clocks_event_reason_"), ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        for name, _bit in THROTTLE_BITS:
            value = _find(gpu, "%s/%s%s" % (section, prefix, name))
            if value is not None and name not in reasons:
                reasons[name] = value.lower() == "active"
    return reasons


def _power_from_xml(gpu: Any) -> Optional[float]:
    for path in ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
                 "power_readings/power_draw"):
        value = _quantity(_find(gpu, path), "W")
        if value is not None:
            return value
    return None


def _temperature_from_xml(gpu: Any) -> Dict[str, Optional[float]]:
    """Absolute thresholds where the driver gives them; Hopper drivers give T.Limit margins
    instead (degrees left before the limit, slowdown at -2, shutdown at -8 on an H200)."""
    return {
        "gpu_temp": _quantity(_find(gpu, "temperature/gpu_temp"), "C"),
        "temp_slowdown": _quantity(_find(gpu, "temperature/gpu_temp_slow_threshold"), "C"),
        "temp_shutdown": _quantity(_find(gpu, "temperature/gpu_temp_max_threshold"), "C"),
        "temp_margin": _quantity(_find(gpu, "temperature/gpu_temp_tlimit"), "C"),
        "temp_margin_slowdown": _quantity(_find(gpu, "temperature/gpu_temp_slow_tlimit_threshold"), "C"),
        "temp_margin_shutdown": _quantity(_find(gpu, "temperature/gpu_temp_max_tlimit_threshold"), "C"),
    }


def reading_from_xml(index: int, gpu: Any) -> Dict[str, Any]:
    """The health reading of one ``<gpu>`` element of ``nvidia-smi -q -x``."""
    sbe_vol, dbe_vol = _ecc_from_xml(gpu, "volatile")
    sbe_agg, dbe_agg = _ecc_from_xml(gpu, "aggregate")
    link = "pci/pci_gpu_link_info/"
    reading = {
        "index": index,
        "uuid": _find(gpu, "uuid"),
        "name": _find(gpu, "product_name"),
        "pci_bus_id": _find(gpu, "pci/pci_bus_id") or gpu.get("id"),
        "source": "nvidia-smi",
        "ecc_mode": (_find(gpu, "ecc_mode/current_ecc") or "").lower() or None,
        "ecc_sbe_volatile": sbe_vol, "ecc_dbe_volatile": dbe_vol,
        "ecc_sbe_aggregate": sbe_agg, "ecc_dbe_aggregate": dbe_agg,
        "sram_threshold_exceeded": _yes(_find(gpu, "ecc_errors/aggregate/sram_threshold_exceeded")),
        "retired_pages_pending": _yes(_find(gpu, "retired_pages/pending_retirement")),
        "row_remap_pending": _yes(_find(gpu, "remapped_rows/remapped_row_pending")),
        "row_remap_failure": _yes(_find(gpu, "remapped_rows/remapped_row_failure")),
        "pcie_gen_current": _int(_find(gpu, link + "pcie_gen/current_link_gen")),
        "pcie_gen_max": _int(_find(gpu, link + "pcie_gen/max_link_gen")),
        "pcie_width_current": _int(_find(gpu, link + "link_widths/current_link_width"), "x"),
        "pcie_width_max": _int(_find(gpu, link + "link_widths/max_link_width"), "x"),
        "throttle": _throttle_from_xml(gpu),
        "power_w": _power_from_xml(gpu),
        "power_limit_w": _quantity(_find(gpu, "gpu_power_readings/current_power_limit"), "W")
        or _quantity(_find(gpu, "power_readings/power_limit"), "W"),
        "energy_mj": None,  # nvidia-smi -q has no energy counter; NVML has
        "nvlink": None,  # nvidia-smi -q -x does not list NVLink counters; NVML does
        "recovery_action": _find(gpu, "gpu_recovery_action"),
    }
    reading.update(_temperature_from_xml(gpu))
    return reading


def readings_from_xml_root(root: Any) -> List[Dict[str, Any]]:
    """One reading per ``<gpu>`` of a parsed ``<nvidia_smi_log>`` (lxml or ElementTree)."""
    return [reading_from_xml(index, gpu) for index, gpu in enumerate(root.findall("gpu"))]


def throttle_mask(reasons: Mapping[str, bool]) -> Optional[int]:
    """The NVML bitmask dcgm-exporter publishes, from the named reasons (None if none known)."""
    if not reasons:
        return None
    return sum(bit for name, bit in THROTTLE_BITS if reasons.get(name))


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip() if value is not None else None


NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))


def _nvml_nvlink(query: Any, nvml: Any) -> Optional[Dict[str, int]]:
    """Error counters summed over the active links; None where the GPU has no NVLink."""
    totals = {name: 0 for name, _counter in NVLINK_COUNTERS}
    active = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        if not query("nvmlDeviceGetNvLinkState", link):
            continue
        active += 1
        for name, counter in NVLINK_COUNTERS:
            totals[name] += int(query("nvmlDeviceGetNvLinkErrorCounter", link, counter) or 0)
    return dict(totals, links=active) if active else None


def reading_from_nvml(nvml: Any, index: int, optional: Any) -> Dict[str, Any]:
    """The same reading through NVML. ``optional(call, *args)`` returns None where the query is
    not supported (and re-raises a lost GPU): the caller decides what "not available" means.
    A call this pynvml does not have (an older nvidia-ml-py) is not available either."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def query(name: str, *args: Any) -> Any:
        call = getattr(nvml, name, None)
        return optional(call, handle, *args) if call is not None else None

    def ecc(kind: int, counter: int) -> Optional[int]:
        value = query("nvmlDeviceGetTotalEccErrors", kind, counter)
        return int(value) if value is not None else None

    remap = query("nvmlDeviceGetRemappedRows")
    mask = query("nvmlDeviceGetCurrentClocksEventReasons")
    if mask is None:
        mask = query("nvmlDeviceGetCurrentClocksThrottleReasons")
    power_mw = query("nvmlDeviceGetPowerUsage")
    limit_mw = query("nvmlDeviceGetEnforcedPowerLimit")
    energy = query("nvmlDeviceGetTotalEnergyConsumption")
    pending = query("nvmlDeviceGetRetiredPagesPendingStatus")
    bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    return {
        "index": index,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "pci_bus_id": bus_id,
        "source": "nvml",
        "ecc_mode": None,
        # NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / UNCORRECTED 1; NVML_VOLATILE_ECC 0 / NVML_AGGREGATE_ECC 1
        "ecc_sbe_volatile": ecc(0, 0), "ecc_dbe_volatile": ecc(1, 0),
        "ecc_sbe_aggregate": ecc(0, 1), "ecc_dbe_aggregate": ecc(1, 1),
        "sram_threshold_exceeded": None,
        "retired_pages_pending": bool(pending) if pending is not None else None,
        "row_remap_pending": bool(remap[2]) if remap is not None else None,
        "row_remap_failure": bool(remap[3]) if remap is not None else None,
        "pcie_gen_current": query("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": query("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width_current": query("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_width_max": query("nvmlDeviceGetMaxPcieLinkWidth"),
        "throttle": {name: bool(int(mask) & bit) for name, bit in THROTTLE_BITS} if mask is not None else {},
        "power_w": power_mw / 1000.0 if power_mw is not None else None,
        "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
        "energy_mj": int(energy) if energy is not None else None,
        "nvlink": _nvml_nvlink(query, nvml),
        "recovery_action": None,
        "gpu_temp": query("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0, _SLOWDOWN 1
        "temp_slowdown": query("nvmlDeviceGetTemperatureThreshold", 1),
        "temp_shutdown": query("nvmlDeviceGetTemperatureThreshold", 0),
        "temp_margin": None, "temp_margin_slowdown": None, "temp_margin_shutdown": None,
    }


# --------------------------------------------------------------------------- the verdict

def _reason(check: str, verdict: str, detail: str, action: str) -> Dict[str, str]:
    return {"check": check, "verdict": verdict, "detail": detail, "action": action,
            "what_to_do": ACTION_TEXT[action]}


def _memory_reasons(r: Mapping[str, Any]) -> Iterable[Dict[str, str]]:
    if r.get("ecc_dbe_volatile"):
        yield _reason("ecc", UNHEALTHY, "%d uncorrectable (double-bit) ECC errors since the last reset"
                      % r["ecc_dbe_volatile"], RESET_GPU)
    elif r.get("ecc_dbe_aggregate"):
        yield _reason("ecc", DEGRADED, "%d uncorrectable (double-bit) ECC errors in the GPU's lifetime, none "
                      "since the last reset" % r["ecc_dbe_aggregate"], NONE)
    if r.get("ecc_sbe_volatile"):
        yield _reason("ecc", HEALTHY, "%d corrected (single-bit) ECC errors since the last reset"
                      % r["ecc_sbe_volatile"], NONE)
    if r.get("sram_threshold_exceeded"):
        yield _reason("sram", UNHEALTHY, "SRAM uncorrectable error threshold exceeded", DRAIN_REPLACE)
    if r.get("row_remap_failure"):
        yield _reason("row_remap", UNHEALTHY, "row remapping failed: no spare rows left for a bad row", DRAIN_REPLACE)
    if r.get("row_remap_pending"):
        yield _reason("row_remap", DEGRADED, "a row remap is pending; it takes effect at the next GPU reset", RESET_GPU)
    if r.get("retired_pages_pending"):
        yield _reason("retired_pages", DEGRADED, "a page retirement is pending; it takes effect at the next GPU reset",
                      RESET_GPU)


def _pcie_reasons(r: Mapping[str, Any]) -> Iterable[Dict[str, str]]:
    width, width_max = r.get("pcie_width_current"), r.get("pcie_width_max")
    if width and width_max and width < width_max:
        yield _reason("pcie", DEGRADED, "PCIe link at x%d of x%d (a bad seat, riser or slot)" % (width, width_max),
                      DRAIN_REPLACE)
    gen, gen_max = r.get("pcie_gen_current"), r.get("pcie_gen_max")
    if gen and gen_max and gen < gen_max:
        if (r.get("throttle") or {}).get("gpu_idle"):
            # An idle GPU lowers its link speed to save power: that is normal.
            yield _reason("pcie", HEALTHY, "PCIe link at gen %d of %d while idle (power saving)" % (gen, gen_max), NONE)
        else:
            yield _reason("pcie", DEGRADED, "PCIe link at gen %d of %d while busy" % (gen, gen_max), DRAIN_REPLACE)


def _thermal_reasons(r: Mapping[str, Any]) -> Iterable[Dict[str, str]]:
    active = [name for name in BAD_THROTTLES if (r.get("throttle") or {}).get(name)]
    if active:
        yield _reason("throttle", DEGRADED, "clocks held back: %s" % ", ".join(active), NONE
                      if active == ["sw_thermal_slowdown"] else DRAIN_REPLACE)
    temp = r.get("gpu_temp")
    margin = r.get("temp_margin")
    if temp is not None and r.get("temp_shutdown") is not None and temp >= r["temp_shutdown"]:
        yield _reason("temperature", UNHEALTHY, "%g C, at or above the shutdown limit %g C" % (temp, r["temp_shutdown"]),
                      DRAIN_REPLACE)
    elif margin is not None and r.get("temp_margin_shutdown") is not None and margin <= r["temp_margin_shutdown"]:
        yield _reason("temperature", UNHEALTHY, "%g C left to T.Limit, at or past the shutdown margin %g C"
                      % (margin, r["temp_margin_shutdown"]), DRAIN_REPLACE)
    elif temp is not None and r.get("temp_slowdown") is not None and temp >= r["temp_slowdown"]:
        yield _reason("temperature", DEGRADED, "%g C, at or above the slowdown limit %g C" % (temp, r["temp_slowdown"]),
                      DRAIN_REPLACE)
    elif margin is not None and r.get("temp_margin_slowdown") is not None and margin <= r["temp_margin_slowdown"]:
        yield _reason("temperature", DEGRADED, "%g C left to T.Limit, at or past the slowdown margin %g C"
                      % (margin, r["temp_margin_slowdown"]), DRAIN_REPLACE)
    power, limit = r.get("power_w"), r.get("power_limit_w")
    if power is not None and limit and power > limit * 1.05:
        yield _reason("power", DEGRADED, "drawing %g W over its %g W limit" % (power, limit), DRAIN_REPLACE)


def _link_reasons(r: Mapping[str, Any]) -> Iterable[Dict[str, str]]:
    nvlink = r.get("nvlink") or {}
    errors = {k: v for k, v in nvlink.items() if k != "links" and v}
    if errors:
        yield _reason("nvlink", DEGRADED, "NVLink errors: %s" % ", ".join("%s %d" % kv for kv in sorted(errors.items())),
                      RESET_GPU)
    action = (r.get("recovery_action") or "").strip()
    if action and action.lower() not in ("none", "n/a"):
        yield _reason("recovery_action", UNHEALTHY, "the driver asks for recovery: %s" % action, RESET_GPU)


def _xid_reasons(xids: Iterable[int]) -> Iterable[Dict[str, str]]:
    seen: Dict[int, int] = {}
    for xid in xids:
        seen[xid] = seen.get(xid, 0) + 1
    for xid, count in sorted(seen.items()):
        cls = classify_xid(xid)
        yield _reason("xid", cls.verdict, "XID %d (%s; %s) logged %d time%s" % (
            xid, cls.name, cls.origin, count, "" if count == 1 else "s"), cls.action)


def judge(reading: Mapping[str, Any], xids: Iterable[int] = ()) -> Dict[str, Any]:
    """The verdict of one GPU: the worst of its reasons; notes (healthy reasons) are kept."""
    reasons = [*_memory_reasons(reading), *_pcie_reasons(reading), *_thermal_reasons(reading),
               *_link_reasons(reading), *_xid_reasons(xids)]
    verdict = max((r["verdict"] for r in reasons), key=_RANK.__getitem__, default=HEALTHY)
    problems = [r for r in reasons if r["verdict"] != HEALTHY]
    return {
        "verdict": verdict,
        "reasons": problems,
        "notes": [r for r in reasons if r["verdict"] == HEALTHY],
        "summary": "; ".join("%s (%s)" % (r["detail"], r["what_to_do"]) for r in problems) or "no problem found",
    }


def verdict_code(verdict: str) -> int:
    """0 healthy, 1 degraded, 2 unhealthy: the number an exporter publishes."""
    return _RANK[verdict]


def judge_all(readings: Iterable[Mapping[str, Any]], kernel_xids: Mapping[Tuple[int, int, int], List[int]]
              ) -> List[Dict[str, Any]]:
    """Each reading with its XIDs joined by PCI address and its verdict."""
    out = []
    for reading in readings:
        xids = kernel_xids.get(pci_key(reading.get("pci_bus_id")) or (-1, -1, -1), [])
        gpu = dict(reading, xids=list(xids), last_xid=xids[-1] if xids else 0)
        gpu.update(judge(reading, xids))
        out.append(gpu)
    return out
