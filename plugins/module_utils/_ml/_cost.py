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
from typing import Any, Dict, Mapping, Optional, Tuple

from .._core._errors import InvalidInputError
from ._stage_metrics import escape_label

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


# ---------------------------------------------------------------------------------------------
# The cost for Prometheus: node_exporter's textfile collector reads mlinfra_run_cost.prom.

TEXTFILE_NAME = "mlinfra_run_cost.prom"
COST_KINDS = (("on_premise", "on_premise_cost"), ("cloud", "cloud_cost"), ("hardware", "hardware_cost"),
              ("energy", "energy_cost"))
# name: (type, help, label names in order). The *_last gauges and the timestamp are the last
# run per pipeline; the *_total counters add every priced run to what the previous file held.
COST_FAMILIES = {
    "mlinfra_run_cost_last": ("gauge", "Cost of the pipeline's last priced train run, by kind "
                              "(on_premise = hardware + energy; cloud = the same GPU-hours at the declared rate).",
                              ("pipeline", "account", "currency", "kind")),
    "mlinfra_run_gpu_hours_last": ("gauge", "GPU-hours of the pipeline's last priced train run.",
                                   ("pipeline", "account")),
    "mlinfra_run_break_even_utilisation": ("gauge", "Utilisation (0-1) above which on premise was cheaper than the "
                                           "cloud rate, at the pipeline's last priced run.", ("pipeline",)),
    "mlinfra_run_last_timestamp_seconds": ("gauge", "When the pipeline's last train run was priced (Unix seconds).",
                                           ("pipeline", "account", "mlflow_run_id")),
    "mlinfra_run_cost_total": ("counter", "Cost of every priced train run, by kind.",
                               ("pipeline", "account", "currency", "kind")),
    "mlinfra_run_gpu_hours_total": ("counter", "GPU-hours of every priced train run.", ("pipeline", "account")),
    "mlinfra_runs_priced_total": ("counter", "Train runs priced.", ("pipeline", "account")),
}
NO_ACCOUNT = "-"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*$")
_LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")
Series = Tuple[Tuple[str, str], ...]


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _refuse(number: int, line: str, problem: str) -> InvalidInputError:
    return InvalidInputError("previous_text", "line %d: %s" % (number, line[:200]), problem,
                             "fix or remove %s (its counters then start again from this run)" % TEXTFILE_NAME)


def _parse_labels(text: str, number: int, line: str) -> Dict[str, str]:
    labels: Dict[str, str] = {}
    pos = 0
    while pos < len(text.rstrip()):
        match = _LABEL_PAIR.match(text, pos)
        if not match or match.end() == pos:
            raise _refuse(number, line, "has labels that do not parse")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
        if match.group(3) != ",":
            break
    if text[pos:].strip():
        raise _refuse(number, line, "has labels that do not parse")
    return labels


def parse_cost_textfile(text: Optional[str]) -> Dict[str, Dict[Series, float]]:
    """The mlinfra_run_* samples of a previous textfile: family -> {label pairs: value}.

    The rule: comments, blank lines, samples of other metrics and lines that name no mlinfra_run_*
    metric are ignored (and not written again). A line that names an mlinfra_run_* metric and is
    not a sample, or a sample of one of COST_FAMILIES must parse, carry exactly the family's labels and a
    finite value that is not negative; anything else refuses the whole text (InvalidInputError),
    so a damaged file is never overwritten with counters that silently went back to zero.
    """
    out: Dict[str, Dict[Series, float]] = {name: {} for name in COST_FAMILIES}
    for number, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        name = match.group(1) if match else line.split("{", 1)[0].split(None, 1)[0]
        if name not in COST_FAMILIES:
            if not match and name.startswith("mlinfra_run"):
                raise _refuse(number, line, "is not a sample in Prometheus' text format")
            continue
        if not match:
            raise _refuse(number, line, "is not a sample in Prometheus' text format")
        labels = _parse_labels(match.group(2) or "", number, line)
        wanted = COST_FAMILIES[name][2]
        if sorted(labels) != sorted(wanted):
            raise _refuse(number, line, "has the labels %s, not %s" % (sorted(labels), list(wanted)))
        try:
            value = float(match.group(3))
        except ValueError:
            raise _refuse(number, line, "has a value that is not a number")
        if not math.isfinite(value) or value < 0:
            raise _refuse(number, line, "has a value that is not a finite number of 0 or more")
        out[name][tuple((key, labels[key]) for key in wanted)] = value
    return out


def _format(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 2 ** 53 else repr(number)


def cost_textfile(previous_text: Optional[str], result: Mapping[str, Any], pipeline: str, account: Optional[str] = "",
                  mlflow_run_id: Optional[str] = "", timestamp: Any = None) -> str:
    """The whole mlinfra_run_cost.prom after one priced run (``result`` is run_cost()'s dict).

    The last-run gauges of ``pipeline`` are replaced (those of other pipelines in the previous
    text are kept); the counters are the previous text's values plus this run's, so that
    ``increase(...[1d])`` gives the cost per day and the ``account`` label the cost per account.
    An empty account (the ssh scheduler has none) is written as account="-". A null cloud cost
    adds no cloud sample, a null break-even utilisation writes no gauge. ``previous_text``
    follows parse_cost_textfile's rule: damaged mlinfra_run_* samples refuse the whole text.
    """
    if not isinstance(pipeline, str) or not pipeline.strip():
        raise InvalidInputError("pipeline", pipeline, "is empty", "give the pipeline's name (its metrics label)")
    if not isinstance(result, Mapping):
        raise InvalidInputError("result", result, "is not a mapping", "give run_cost's result")
    account_label = str(account) if account not in (None, "") else NO_ACCOUNT
    currency = result.get("currency")
    if not isinstance(currency, str) or not currency:
        raise InvalidInputError("result.currency", currency, "is not a currency", "give run_cost's result")
    gpu_hours = _number("result.gpu_hours", result.get("gpu_hours"), allow_zero=True)
    costs = []
    for kind, key in COST_KINDS:
        if key == "cloud_cost" and result.get(key) is None:
            continue
        costs.append((kind, _number("result.%s" % key, result.get(key), allow_zero=True)))
    break_even = result.get("break_even_utilisation")
    if break_even is not None:
        break_even = _number("result.break_even_utilisation", break_even, allow_zero=True)
    when = _number("timestamp", timestamp, allow_zero=True)

    families = parse_cost_textfile(previous_text)
    for name, (kind_of, _text, _labels) in COST_FAMILIES.items():
        if kind_of == "gauge":  # the last run of this pipeline replaces its previous last run
            families[name] = {series: v for series, v in families[name].items() if dict(series)["pipeline"] != pipeline}
    run = (("pipeline", pipeline), ("account", account_label))
    for kind, value in costs:
        families["mlinfra_run_cost_last"][run + (("currency", currency), ("kind", kind))] = value
        total = families["mlinfra_run_cost_total"]
        series = run + (("currency", currency), ("kind", kind))
        total[series] = total.get(series, 0.0) + value
    families["mlinfra_run_gpu_hours_last"][run] = gpu_hours
    if break_even is not None:
        families["mlinfra_run_break_even_utilisation"][(("pipeline", pipeline),)] = break_even
    families["mlinfra_run_last_timestamp_seconds"][run + (("mlflow_run_id", str(mlflow_run_id or "")),)] = when
    hours = families["mlinfra_run_gpu_hours_total"]
    hours[run] = hours.get(run, 0.0) + gpu_hours
    runs = families["mlinfra_runs_priced_total"]
    runs[run] = runs.get(run, 0) + 1

    lines = []
    for name, (kind_of, text, _labels) in COST_FAMILIES.items():
        if not families[name]:
            continue
        lines += ["# HELP %s %s" % (name, text), "# TYPE %s %s" % (name, kind_of)]
        for series in sorted(families[name]):
            labels = ",".join('%s="%s"' % (key, escape_label(value)) for key, value in series)
            lines.append("%s{%s} %s" % (name, labels, _format(families[name][series])))
    return "\n".join(lines) + "\n"
