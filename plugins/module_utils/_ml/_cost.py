# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one training run cost on premise, what the same GPU-hours cost in the cloud, and the
utilisation above which owning the GPUs is the cheaper choice. Pure arithmetic on declared
inputs (no I/O); every input is checked and a bad one is named.

On premise, per GPU-hour of the run:
  hardware   = price / (lifetime_years * 8760 h * utilisation)   (the GPU's price spread over the
               hours it is busy in its life; a server's share belongs in the price)
  energy     = kWh of the run * PUE * electricity price, the kWh measured (NVML's total-energy
               counter, the delta over the run) or declared power * GPU-hours (an upper bound
               when the power is the board's maximum)
Cloud: GPU-hours * the declared rate of the GPU model.
Break-even utilisation: cloud rate = hardware/(L*u) + energy per GPU-hour, solved for u:
  u* = price / (L * (cloud rate - energy per GPU-hour)); none when the cloud rate does not even
  cover the electricity.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping, Optional

from .._core._errors import InvalidInputError

HOURS_PER_YEAR = 8760.0
JOULES_PER_KWH = 3.6e6

# Board power (W) by model, for "declared power x time" where the inventory declares none:
# NVIDIA's datasheets (maximum thermal design power of the SXM form factor unless named),
# read 2026-12. It is the maximum: the energy it gives is an upper bound.
BOARD_POWER_W: Dict[str, float] = {
    "H200": 700.0,     # H200 SXM 141GB (H200 NVL: up to 600 W)
    "H100": 700.0,     # H100 SXM5 (H100 PCIe: 350 W)
    "A100": 400.0,     # A100 SXM4 (A100 PCIe: 250-300 W)
    "L40S": 350.0,
    "L4": 72.0,
    "V100": 300.0,     # V100 SXM2
    "T4": 70.0,
}


def model_key(name: Optional[str]) -> Optional[str]:
    """'NVIDIA H200' or 'NVIDIA A100-SXM4-80GB' -> 'H200' / 'A100'. A model not in BOARD_POWER_W
    keeps its name (without 'NVIDIA'), so that a cloud rate declared for it still matches."""
    if not name or not str(name).strip():
        return None
    tokens = re.split(r"[\s_/-]+", str(name).upper())
    for key in sorted(BOARD_POWER_W, key=len, reverse=True):
        if key in tokens:
            return key
    return " ".join(t for t in tokens if t and t != "NVIDIA") or None


def _number(option: str, value: Any, *, positive: bool = True, allow_zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(option, value, "is not a number", "give a number")
    if not math.isfinite(number):
        raise InvalidInputError(option, value, "is not finite", "give a finite number")
    if positive and (number < 0 or (number == 0 and not allow_zero)):
        raise InvalidInputError(option, value, "must be above 0" if not allow_zero else "must not be negative",
                                "give a positive value")
    return number


def _utilisation(value: Any) -> float:
    number = _number("pipeline_cost_utilisation", value)
    if not 0 < number <= 1:
        raise InvalidInputError("pipeline_cost_utilisation", value, "is outside (0, 1]",
                                "give the share of its life the GPU is busy, e.g. 0.5 for half the time")
    return number


def break_even_utilisation(hardware_price: float, lifetime_years: float, cloud_rate: float,
                           energy_cost_per_gpu_hour: float) -> Optional[float]:
    """The utilisation above which on premise is cheaper than the cloud rate; None if never."""
    margin = cloud_rate - energy_cost_per_gpu_hour
    if margin <= 0:
        return None
    return hardware_price / (lifetime_years * HOURS_PER_YEAR * margin)


def run_cost(duration_s: Any, gpus: Any, gpu_model: Optional[str] = None, *, power_w: Any = None,
             energy_j: Any = None, pue: Any = 1.0, electricity_price: Any, hardware_price: Any,
             lifetime_years: Any, utilisation: Any, cloud_rates: Optional[Mapping[str, Any]] = None,
             currency: str = "USD") -> Dict[str, Any]:
    """Cost of one run of ``duration_s`` seconds on ``gpus`` GPUs of ``gpu_model``."""
    duration = _number("duration_s", duration_s, allow_zero=True)
    count = _number("gpus", gpus, allow_zero=True)
    pue_value = _number("pipeline_cost_pue", pue)
    if pue_value < 1:
        raise InvalidInputError("pipeline_cost_pue", pue, "is below 1 (a facility uses at least its IT power)",
                                "give the data centre's power usage effectiveness, e.g. 1.5")
    price_kwh = _number("pipeline_cost_electricity_price", electricity_price)
    hw_price = _number("pipeline_cost_hardware_price", hardware_price)
    lifetime = _number("pipeline_cost_lifetime_years", lifetime_years)
    util = _utilisation(utilisation)
    key = model_key(gpu_model)
    gpu_hours = duration / 3600.0 * count

    declared = None if power_w in (None, "", 0, "0") else _number("pipeline_cost_gpu_power_w", power_w)
    power = declared if declared is not None else BOARD_POWER_W.get(key or "")
    if energy_j not in (None, ""):
        energy_kwh = _number("energy_j", energy_j, allow_zero=True) / JOULES_PER_KWH
        energy_source = "measured (NVML total-energy counter, delta over the run)"
    elif count == 0:
        energy_kwh, energy_source = 0.0, "no GPU"
    elif power is not None:
        energy_kwh = power * gpu_hours / 1000.0
        energy_source = ("declared power %g W x time" % power if declared is not None
                         else "board power %g W of %s (NVIDIA datasheet maximum) x time" % (power, key))
    else:
        raise InvalidInputError("pipeline_cost_gpu_power_w", power_w,
                                "is not set and the GPU model %r has no known board power" % (gpu_model,),
                                "declare the GPU's power in watts, or set pipeline_cost_gpu_model to one of %s"
                                % ", ".join(sorted(BOARD_POWER_W)))

    rates = {}
    for name, rate in (cloud_rates or {}).items():
        rates[str(name)] = _number("pipeline_cost_cloud_rates[%s]" % name, rate)
    amortised_per_gpu_hour = hw_price / (lifetime * HOURS_PER_YEAR * util)
    energy_cost = energy_kwh * pue_value * price_kwh
    energy_per_gpu_hour = (energy_cost / gpu_hours) if gpu_hours else (
        (power or 0) / 1000.0 * pue_value * price_kwh)
    hardware_cost = amortised_per_gpu_hour * gpu_hours
    on_premise = hardware_cost + energy_cost
    cloud_rate = rates.get(key or "")
    cloud = cloud_rate * gpu_hours if cloud_rate is not None else None
    result = {
        "currency": currency,
        "gpu_model": key,
        "gpus": count,
        "duration_s": duration,
        "gpu_hours": gpu_hours,
        "energy_kwh": energy_kwh,
        "energy_source": energy_source,
        "facility_energy_kwh": energy_kwh * pue_value,
        "pue": pue_value,
        "energy_cost": energy_cost,
        "hardware_cost": hardware_cost,
        "hardware_cost_per_gpu_hour": amortised_per_gpu_hour,
        "on_premise_cost": on_premise,
        "cloud_rate_per_gpu_hour": cloud_rate,
        "cloud_cost": cloud,
        "cloud_to_on_premise": (cloud / on_premise) if cloud is not None and on_premise else None,
        "break_even_utilisation": (break_even_utilisation(hw_price, lifetime, cloud_rate, energy_per_gpu_hour)
                                   if cloud_rate is not None else None),
        "utilisation": util,
    }
    result["line"] = cost_line(result)
    return result


def cost_line(r: Mapping[str, Any]) -> str:
    cur = r["currency"]
    if not r["gpus"]:
        return "cost: no GPU on the workers (a CPU-only run of %.0f s): no GPU time to price" % r["duration_s"]
    text = "cost: %.3f GPU-hours (%g x %s), %.3f kWh (%s), PUE %g: on premise %.2f %s (hardware %.2f at %.0f%% " \
           "utilisation + energy %.2f)" % (
               r["gpu_hours"], r["gpus"], r["gpu_model"] or "GPU", r["energy_kwh"], r["energy_source"], r["pue"],
               r["on_premise_cost"], cur, r["hardware_cost"], r["utilisation"] * 100, r["energy_cost"])
    if r["cloud_cost"] is None:
        return text + "; no cloud rate declared for %s" % (r["gpu_model"] or "this GPU")
    text += "; cloud %.2f %s at %g %s/GPU-hour" % (r["cloud_cost"], cur, r["cloud_rate_per_gpu_hour"], cur)
    if r["break_even_utilisation"] is None:
        return text + "; the cloud rate does not cover the electricity: on premise is never cheaper"
    return text + "; on premise is cheaper above %.1f%% utilisation" % (r["break_even_utilisation"] * 100)
