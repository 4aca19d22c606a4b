"""The cost calculator against worked examples written out by hand.

The seed's case: an A100 at about $3 per GPU-hour in the cloud against $10,000 amortised over
three years, said to be "7 times cheaper above 50 % utilisation". Worked out:
  three years             = 3 * 8760 h = 26,280 h
  at 50 % utilisation     = 13,140 busy hours; 10,000 / 13,140 = $0.761 per GPU-hour
  cloud / on premise      = 3 / 0.761 = 3.94: about 4 times cheaper at 50 %, not 7
  7 times cheaper needs   = 10,000 / (26,280 * u) <= 3 / 7 -> u >= 0.888 (89 % utilisation)
  break-even (hardware)   = 10,000 / (26,280 * 3) = 12.7 % utilisation
So the seed's numbers are not consistent: "7 times" holds only near full use (7.9x at 100 %),
and at 50 % it is about 4x (3.5x once electricity is counted: 400 W * PUE 1.58 * $0.15/kWh
= $0.0948 per GPU-hour; break-even 10,000 / (26,280 * (3 - 0.0948)) = 13.1 %).
"""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._cost import COST_FAMILIES, cost_textfile, run_cost

pytestmark = pytest.mark.unit

SEED = dict(gpu_model="NVIDIA A100-SXM4-80GB", pue=1.58, electricity_price=0.15, hardware_price=10000,
            lifetime_years=3, utilisation=0.5, cloud_rates={"A100": 3.0})


def test_the_seed_case_one_gpu_hour():
    r = run_cost(3600, 1, **SEED)
    assert r["gpu_model"] == "A100" and r["gpu_hours"] == pytest.approx(1.0)
    assert r["hardware_cost_per_gpu_hour"] == pytest.approx(10000 / 13140)            # 0.761
    assert r["energy_kwh"] == pytest.approx(0.4) and "board power 400 W" in r["energy_source"]
    assert r["energy_cost"] == pytest.approx(0.4 * 1.58 * 0.15)                       # 0.0948
    assert r["on_premise_cost"] == pytest.approx(10000 / 13140 + 0.0948)              # 0.856
    assert r["cloud_cost"] == pytest.approx(3.0)
    assert r["cloud_to_on_premise"] == pytest.approx(3.0 / (10000 / 13140 + 0.0948))  # 3.5, not 7
    assert r["break_even_utilisation"] == pytest.approx(10000 / (26280 * (3 - 0.0948)))  # 13.1 %
    assert "on premise is cheaper above 13.1% utilisation" in r["line"]


def test_seven_times_cheaper_needs_about_89_percent_utilisation_not_50():
    hardware_only = {**SEED, "electricity_price": 1e-12}  # the seed's claim counts no electricity
    at_half = run_cost(3600, 1, **hardware_only)["cloud_to_on_premise"]
    assert at_half == pytest.approx(3 * 13140 / 10000, rel=1e-6)   # 3.94
    assert at_half < 7
    u = 10000 * 7 / (26280 * 3)                                    # 0.888
    at_u, at_full = {**hardware_only, "utilisation": u}, {**hardware_only, "utilisation": 1}
    assert run_cost(3600, 1, **at_u)["cloud_to_on_premise"] == pytest.approx(7, rel=1e-6)
    assert run_cost(3600, 1, **at_full)["cloud_to_on_premise"] == pytest.approx(7.884, rel=1e-3)


def test_a_two_worker_h200_run_with_measured_energy():
    """Two H200 for 30 minutes, NVML said 1.8 MJ over the run (500 W average each):
    GPU-hours 1.0; 0.5 kWh; facility 0.5 * 1.2 = 0.6 kWh at 0.20 = 0.12; hardware 30,000 over
    4 years at 80 %: 30000 / (35040 * 0.8) = 1.0702 per GPU-hour; total 1.1902. Cloud at 4.5:
    4.5; break-even 30000 / (35040 * (4.5 - 0.12)) = 19.55 %."""
    r = run_cost(1800, 2, "NVIDIA H200", energy_j=1.8e6, pue=1.2, electricity_price=0.20, hardware_price=30000,
                 lifetime_years=4, utilisation=0.8, cloud_rates={"H200": 4.5, "A100": 3.0}, currency="EUR")
    assert r["gpu_hours"] == pytest.approx(1.0)
    assert r["energy_kwh"] == pytest.approx(0.5) and r["energy_source"].startswith("measured (NVML")
    assert r["energy_cost"] == pytest.approx(0.12)
    assert r["hardware_cost"] == pytest.approx(30000 / (35040 * 0.8))
    assert r["on_premise_cost"] == pytest.approx(30000 / (35040 * 0.8) + 0.12)
    assert r["cloud_cost"] == pytest.approx(4.5)
    assert r["break_even_utilisation"] == pytest.approx(30000 / (35040 * 4.38))
    assert "EUR" in r["line"]


def test_declared_power_wins_over_the_board_power_and_is_named():
    r = run_cost(7200, 1, "H200", power_w=350, pue=1.0, electricity_price=0.1, hardware_price=1, lifetime_years=1,
                 utilisation=1)
    assert r["energy_kwh"] == pytest.approx(0.7) and r["energy_source"] == "declared power 350 W x time"
    assert r["cloud_cost"] is None and "no cloud rate declared for H200" in r["line"]


def test_a_cloud_rate_below_the_electricity_never_breaks_even():
    r = run_cost(3600, 1, "A100", pue=2.0, electricity_price=1.0, hardware_price=1000, lifetime_years=1,
                 utilisation=1, cloud_rates={"A100": 0.5})
    assert r["break_even_utilisation"] is None and "never cheaper" in r["line"]


@pytest.mark.parametrize("change, variable", [
    ({"electricity_price": 0}, "pipeline_cost_electricity_price"),
    ({"electricity_price": -0.1}, "pipeline_cost_electricity_price"),
    ({"hardware_price": 0}, "pipeline_cost_hardware_price"),
    ({"lifetime_years": 0}, "pipeline_cost_lifetime_years"),
    ({"utilisation": 0}, "pipeline_cost_utilisation"),
    ({"utilisation": 1.5}, "pipeline_cost_utilisation"),
    ({"utilisation": "half"}, "pipeline_cost_utilisation"),
    ({"pue": 0.9}, "pipeline_cost_pue"),
    ({"cloud_rates": {"A100": -3}}, "pipeline_cost_cloud_rates[A100]"),
    ({"gpu_model": "RTX 4090"}, "pipeline_cost_gpu_power_w"),
])
def test_bad_input_names_the_variable(change, variable):
    with pytest.raises(InvalidInputError) as caught:
        args = {**SEED, **change}
        run_cost(3600, 1, **args)
    assert caught.value.details["option"] == variable
    assert caught.value.msg.startswith("option %s: value" % variable)


def test_an_unknown_model_with_declared_power_is_fine():
    args = {**SEED, "gpu_model": "RTX 4090", "power_w": 450, "cloud_rates": {"RTX 4090": 0.7}}
    r = run_cost(3600, 1, **args)
    assert r["gpu_model"] == "RTX 4090" and r["energy_kwh"] == pytest.approx(0.45) and r["cloud_cost"] == pytest.approx(0.7)


def test_a_run_without_gpu_costs_no_gpu_time_and_needs_no_power():
    r = run_cost(600, 0, None, **{k: v for k, v in SEED.items() if k != "gpu_model"})
    assert r["gpu_hours"] == 0 and r["energy_kwh"] == 0 and r["energy_source"] == "no GPU"
    assert r["on_premise_cost"] == 0 and r["cloud_cost"] is None
    assert r["line"] == "cost: no GPU on the workers (a CPU-only run of 600 s): no GPU time to price"


# ---------------------------------------------------------------------------------------------
# The textfile for node_exporter (cost_textfile), read back the way Prometheus would read it.

def _samples(text):
    """{(name, frozenset(labels)): value}, read by prometheus_client's parser (requirements.txt),
    not by the module's own reader, and checked to declare each family's TYPE once."""
    out = {}
    families = list(text_string_to_metric_families(text))
    assert len({f.name for f in families}) == len(families), [f.name for f in families]
    for family in families:
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def _value(text, name, **labels):
    return _samples(text)[(name, frozenset(labels.items()))]


def _priced(hours, **change):
    args = {**SEED, **change}
    return run_cost(hours * 3600, 1, **args)


def test_the_first_run_writes_gauges_and_counters_with_help_and_type():
    r = _priced(2)
    text = cost_textfile("", r, "demo", "team-a", mlflow_run_id="abc123", timestamp=1_700_000_000)
    for name, (kind, _help, _labels) in COST_FAMILIES.items():
        assert "# TYPE %s %s\n" % (name, kind) in text
        assert "# HELP %s " % name in text
    assert _value(text, "mlinfra_run_cost_last", pipeline="demo", account="team-a", currency="USD",
                  kind="on_premise") == pytest.approx(r["on_premise_cost"])
    assert _value(text, "mlinfra_run_cost_last", pipeline="demo", account="team-a", currency="USD",
                  kind="cloud") == pytest.approx(6.0)
    assert _value(text, "mlinfra_run_cost_total", pipeline="demo", account="team-a", currency="USD",
                  kind="hardware") == pytest.approx(r["hardware_cost"])
    assert _value(text, "mlinfra_run_gpu_hours_last", pipeline="demo", account="team-a") == pytest.approx(2.0)
    assert _value(text, "mlinfra_run_break_even_utilisation", pipeline="demo") == pytest.approx(
        r["break_even_utilisation"])
    assert _value(text, "mlinfra_run_last_timestamp_seconds", pipeline="demo", account="team-a",
                  mlflow_run_id="abc123") == 1_700_000_000
    assert _value(text, "mlinfra_runs_priced_total", pipeline="demo", account="team-a") == 1
    assert 'mlinfra_runs_priced_total{pipeline="demo",account="team-a"} 1\n' in text


def test_the_second_run_adds_to_the_counters_and_replaces_the_last_run():
    first, second = _priced(2), _priced(1)
    text = cost_textfile("", first, "demo", "team-a", mlflow_run_id="run1", timestamp=1000)
    text = cost_textfile(text, second, "demo", "team-a", mlflow_run_id="run2", timestamp=2000)
    assert _value(text, "mlinfra_run_cost_total", pipeline="demo", account="team-a", currency="USD",
                  kind="on_premise") == pytest.approx(first["on_premise_cost"] + second["on_premise_cost"])
    assert _value(text, "mlinfra_run_gpu_hours_total", pipeline="demo", account="team-a") == pytest.approx(3.0)
    assert _value(text, "mlinfra_runs_priced_total", pipeline="demo", account="team-a") == 2
    assert _value(text, "mlinfra_run_cost_last", pipeline="demo", account="team-a", currency="USD",
                  kind="on_premise") == pytest.approx(second["on_premise_cost"])
    stamps = [k for k in _samples(text) if k[0] == "mlinfra_run_last_timestamp_seconds"]
    assert stamps == [("mlinfra_run_last_timestamp_seconds",
                       frozenset({("pipeline", "demo"), ("account", "team-a"), ("mlflow_run_id", "run2")}))]


def test_a_different_account_and_pipeline_keep_both():
    text = cost_textfile("", _priced(2), "demo", "team-a", timestamp=1000)
    text = cost_textfile(text, _priced(1), "demo", "", timestamp=2000)           # ssh: no account
    text = cost_textfile(text, _priced(4), "nightly", "team-b", timestamp=3000)
    assert _value(text, "mlinfra_run_gpu_hours_total", pipeline="demo", account="team-a") == pytest.approx(2)
    assert _value(text, "mlinfra_run_gpu_hours_total", pipeline="demo", account="-") == pytest.approx(1)
    assert _value(text, "mlinfra_run_gpu_hours_total", pipeline="nightly", account="team-b") == pytest.approx(4)
    # The last run per pipeline: demo's is the account-less one, nightly's its own.
    last = sorted(dict(k[1])["account"] for k in _samples(text) if k[0] == "mlinfra_run_gpu_hours_last")
    assert last == ["-", "team-b"]


def test_no_cloud_rate_writes_no_cloud_sample_and_no_break_even():
    r = _priced(1, cloud_rates={})
    assert r["cloud_cost"] is None and r["break_even_utilisation"] is None
    text = cost_textfile("", r, "demo", "a", timestamp=1)
    assert 'kind="cloud"' not in text
    assert "mlinfra_run_break_even_utilisation" not in text
    assert 'kind="on_premise"' in text


def test_a_hostile_label_value_is_escaped_and_reads_back_the_same():
    hostile = 'te"am\\b\n<img src=x onerror=alert(1)>'
    text = cost_textfile("", _priced(1), 'pipe"line', hostile, mlflow_run_id='r"1', timestamp=1)
    assert 'account="te\\"am\\\\b\\n<img src=x onerror=alert(1)>"' in text
    assert 'pipeline="pipe\\"line"' in text
    for line in text.splitlines():      # one sample per line: the newline did not break one
        assert line.startswith(("# ", "mlinfra_run"))
    again = cost_textfile(text, _priced(1), 'pipe"line', hostile, timestamp=2)
    assert _value(again, "mlinfra_runs_priced_total", pipeline='pipe"line', account=hostile) == 2


@pytest.mark.parametrize("garbage", [
    'mlinfra_run_cost_total{pipeline="demo",account="a",currency="USD",kind="energy"} lots\n',
    'mlinfra_run_cost_total{pipeline="demo",account="a",currency="USD",kind="energy"} -1\n',
    'mlinfra_run_cost_total{pipeline="demo",account="a",currency="USD",kind="energy"} NaN\n',
    'mlinfra_run_gpu_hours_total{pipeline="demo"} 3\n',                     # a label missing
    'mlinfra_runs_priced_total{pipeline="demo,account="a"} 3\n',             # a broken quote
    'mlinfra_runs_priced_total garbage here\n',
])
def test_a_damaged_sample_of_the_cost_families_refuses_the_whole_previous_text(garbage):
    good = cost_textfile("", _priced(1), "demo", "a", timestamp=1)
    with pytest.raises(InvalidInputError) as caught:
        cost_textfile(good + garbage, _priced(1), "demo", "a", timestamp=2)
    assert caught.value.details["option"] == "previous_text"
    assert "mlinfra_run_cost.prom" in caught.value.msg


def test_lines_that_are_not_cost_samples_are_ignored():
    good = cost_textfile("", _priced(2), "demo", "a", timestamp=1)
    noise = "\x00\x7fnot prometheus at all\n# a comment\n\nnode_load1 0.5\nsome_other{x=\"1\"} 2\n"
    text = cost_textfile(noise + good + noise, _priced(1), "demo", "a", timestamp=2)
    assert _value(text, "mlinfra_run_gpu_hours_total", pipeline="demo", account="a") == pytest.approx(3)
    assert "node_load1" not in text and "not prometheus" not in text
    assert cost_textfile("\x00garbage\n", _priced(1), "demo", "a", timestamp=2) == cost_textfile(
        "", _priced(1), "demo", "a", timestamp=2)


def test_counters_never_go_down_over_many_runs():
    text, before = "", {}
    runs = [(1, "a", None), (0, "a", None), (2, "b", {}), (0.5, "a", {}), (3, "", None)]
    for n, (hours, account, rates) in enumerate(runs):
        change = {} if rates is None else {"cloud_rates": rates}
        text = cost_textfile(text, _priced(hours, **change), "demo", account, timestamp=n)
        now = {k: v for k, v in _samples(text).items() if k[0].endswith("_total")}
        assert set(before) <= set(now), set(before) - set(now)
        assert all(now[k] >= before[k] for k in before), [(k, before[k], now[k]) for k in before if now[k] < before[k]]
        before = now
    assert before[("mlinfra_runs_priced_total", frozenset({("pipeline", "demo"), ("account", "a")}))] == 3


@pytest.mark.parametrize("pipeline, result, problem", [
    ("", None, "pipeline"),
    ("demo", {"currency": "USD"}, "result.gpu_hours"),
    ("demo", "not a dict", "result"),
])
def test_bad_arguments_are_named(pipeline, result, problem):
    with pytest.raises(InvalidInputError) as caught:
        cost_textfile("", _priced(1) if result is None else result, pipeline, "a", timestamp=1)
    assert caught.value.details["option"] == problem
