"""mlinfra.kvm.ml_stage's Prometheus textfile (metrics_textfile_dir, metrics_labels).

The module runs as a real process (as in test_ml_stage.py) against a tiny project in
tmp_path; the .prom file it leaves is parsed back with a strict exposition-format parser,
and with prometheus_client's own parser when it is importable.
"""
from __future__ import annotations

import json
import re
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from conftest import COLLECTIONS
from test_ml_stage import _project, args, ml, ok, runs, snapshot, warnings

sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_metrics as SM  # noqa: E402

pytestmark = pytest.mark.unit

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the strict parser below still checks every line
    text_string_to_metric_families = None

P = "mlinfra_stage_"
RUN_SERIES = {P + "last_run_timestamp_seconds", P + "last_run_duration_seconds", P + "last_run_success"}
TYPES = {P + "last_run_timestamp_seconds": "gauge", P + "last_run_duration_seconds": "gauge",
         P + "last_run_success": "gauge", P + "last_success_timestamp_seconds": "gauge",
         P + "skipped_total": "counter", P + "runs_total": "counter"}

# -- a strict reader of the text exposition format (0.0.4) -------------------------------
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_SAMPLE = re.compile(r"^(%s)\{(.*)\} (\S+)$" % _NAME)
_VALUE = re.compile(r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)$")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

Series = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def _labels(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, "bad label set %r at %d" % (text, pos)
        assert m.group(1) not in out, "label %s twice in %r" % (m.group(1), text)
        out[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pos = m.end()
        if pos < len(text):
            assert text[pos] == ",", text
            pos += 1
    return out


def parse(text: str) -> Tuple[Series, Dict[str, Tuple[str, str]]]:
    """{(name, sorted labels): value} and {name: (type, help)}; asserts the format."""
    assert text.endswith("\n") and "\r" not in text
    series: Series = {}
    meta: Dict[str, Tuple[str, str]] = {}
    helps: Dict[str, str] = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _unused, help_text = line[len("# HELP "):].partition(" ")
            assert re.match("^%s$" % _NAME, name) and help_text and name not in helps, line
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, typ = line[len("# TYPE "):].split(" ")
            assert name in helps and name not in meta and typ in ("gauge", "counter"), line
            meta[name] = (typ, helps[name])
            family = name
        else:
            m = _SAMPLE.match(line)
            assert m, "not a sample line: %r" % line
            name, labels, value = m.groups()
            assert name == family, "sample %s outside its family %s" % (name, family)
            assert _VALUE.match(value), value
            key = (name, tuple(sorted(_labels(labels).items())))
            assert key not in series, "duplicate series %s" % (key,)
            series[key] = float(value)
    return series, meta


def read_prom(path: Path) -> Tuple[Series, Dict[str, Tuple[str, str]]]:
    text = path.read_text()
    series, meta = parse(text)
    if text_string_to_metric_families is not None:
        seen = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                seen[(s.name, tuple(sorted(s.labels.items())))] = s.value
                assert TYPES[s.name] == fam.type, (s.name, fam.type)
        assert seen == series, (seen, series)
    return series, meta


def value(series: Series, name: str, **labels: str) -> float:
    return series[(P + name, tuple(sorted(labels.items())))]


def names(series: Series) -> set:
    return {name for name, _unused in series}


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return _project(tmp_path)


@pytest.fixture
def prom(tmp_path: Path) -> Path:
    d = tmp_path / "node-exporter"
    d.mkdir()
    return d


def margs(proj: Path, prom: Path, **over: Any) -> Dict[str, Any]:
    return args(proj, metrics_textfile_dir=str(prom), metrics_labels={"pipeline": "nightly"}, **over)


BASE = {"stage": "prep", "pipeline": "nightly"}


def run_labels(run_id: str = "") -> Dict[str, str]:
    return dict(BASE, mlflow_run_id=run_id)


# -- success, skip, failure ---------------------------------------------------------------
def test_success_run_writes_every_series(proj: Path, prom: Path) -> None:
    t0 = time.time()
    res = ok(margs(proj, prom))
    t1 = time.time()
    path = prom / "mlinfra_stage_prep.prom"
    assert res["changed"] is True and res["ran"] is True
    assert res["metrics_textfile"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in prom.iterdir()) == ["mlinfra_stage_prep.prom"]  # no temp file left
    series, meta = read_prom(path)
    assert set(meta) == set(TYPES) and all(meta[n][0] == TYPES[n] for n in TYPES)
    assert names(series) == set(TYPES)
    for name in RUN_SERIES:  # the run series carry mlflow_run_id, the others do not
        assert [dict(k) for n, k in series if n == name] == [run_labels()]
    assert value(series, "last_run_success", **run_labels()) == 1
    ended = value(series, "last_run_timestamp_seconds", **run_labels())
    assert t0 - 0.01 <= ended <= t1 + 0.01
    assert value(series, "last_success_timestamp_seconds", **BASE) == ended
    assert 0 <= value(series, "last_run_duration_seconds", **run_labels()) <= res["duration"] + 0.01
    assert value(series, "skipped_total", **BASE) == 0
    assert value(series, "runs_total", result="success", **BASE) == 1
    assert value(series, "runs_total", result="failure", **BASE) == 0
    stats = json.loads((proj / ".ml_stage" / "prep.runstats.json").read_text())
    assert stats["runs_total"] == {"success": 1, "failure": 0} and stats["last_run"]["success"] is True


def test_up_to_date_run_counts_a_skip_and_is_not_changed(proj: Path, prom: Path) -> None:
    ok(margs(proj, prom))
    path = prom / "mlinfra_stage_prep.prom"
    first, _unused = read_prom(path)
    for n in (1, 2):
        res = ok(margs(proj, prom))
        assert res["changed"] is False and res["ran"] is False and res["metrics_textfile"] == str(path)
        series, _unused = read_prom(path)
        assert value(series, "skipped_total", **BASE) == n
        assert value(series, "runs_total", result="success", **BASE) == 1
        for name in ("last_run_timestamp_seconds", "last_run_duration_seconds", "last_run_success"):
            assert value(series, name, **run_labels()) == value(first, name, **run_labels())
        assert value(series, "last_success_timestamp_seconds", **BASE) == \
            value(first, "last_success_timestamp_seconds", **BASE)
    # frozen although due: a skip, never a success
    res = ok(margs(proj, prom, frozen=True, params={"lr": 9}))
    assert res["changed"] is False and res["would_run"] is True
    series, _unused = read_prom(path)
    assert value(series, "skipped_total", **BASE) == 3
    assert value(series, "runs_total", result="success", **BASE) == 1
    assert runs(proj) == 1


def test_failure_writes_success_0_and_keeps_the_last_success(proj: Path, prom: Path) -> None:
    ok(margs(proj, prom))
    path = prom / "mlinfra_stage_prep.prom"
    before, _unused = read_prom(path)
    last_success = value(before, "last_success_timestamp_seconds", **BASE)
    time.sleep(0.05)
    res = ml(margs(proj, prom, params={"lr": 0.5}, secret_env={"FAIL": "yes-fail"}))
    assert res["failed"] and res["rc"] == 3 and "previous lock is kept" in res["msg"]
    assert res["metrics_textfile"] == str(path)
    series, _unused = read_prom(path)
    assert value(series, "last_run_success", **run_labels()) == 0
    assert value(series, "runs_total", result="failure", **BASE) == 1
    assert value(series, "runs_total", result="success", **BASE) == 1
    assert value(series, "last_success_timestamp_seconds", **BASE) == last_success
    assert value(series, "last_run_timestamp_seconds", **run_labels()) > last_success
    # a timeout is a failure too
    res = ml(margs(proj, prom, env={"SLEEP": "30"}, timeout=1))
    assert res["failed"] and "timed out" in res["msg"]
    series, _unused = read_prom(path)
    assert value(series, "runs_total", result="failure", **BASE) == 2
    assert value(series, "last_run_duration_seconds", **run_labels()) >= 1
    assert value(series, "last_success_timestamp_seconds", **BASE) == last_success
    # and the next success moves it
    res = ok(margs(proj, prom, force=True))
    assert res["ran"] is True
    series, _unused = read_prom(path)
    assert value(series, "last_run_success", **run_labels()) == 1
    assert value(series, "last_success_timestamp_seconds", **BASE) > last_success


def test_first_run_failing_has_no_last_success(proj: Path, prom: Path) -> None:
    res = ml(margs(proj, prom, secret_env={"FAIL": "yes-fail"}))
    assert res["failed"]
    series, _unused = read_prom(prom / "mlinfra_stage_prep.prom")
    assert P + "last_success_timestamp_seconds" not in names(series)
    assert value(series, "last_run_success", **run_labels()) == 0


# -- labels ---------------------------------------------------------------------------------
def test_label_values_are_escaped_and_stage_name_sanitised(proj: Path, prom: Path) -> None:
    nasty = 'a "quoted" \\ back\nslash'
    res = ok(args(proj, name="prep.v2-x", metrics_textfile_dir=str(prom),
                  metrics_labels={"pipeline": nasty, "team": 7}))
    path = prom / "mlinfra_stage_prep_v2_x.prom"
    assert res["metrics_textfile"] == str(path)
    text = path.read_text()
    assert 'pipeline="a \\"quoted\\" \\\\ back\\nslash"' in text
    series, _unused = read_prom(path)
    labels = {"stage": "prep.v2-x", "pipeline": nasty, "team": "7"}
    assert value(series, "runs_total", result="success", **labels) == 1


BAD_LABELS = [
    ({"1st": "x"}, "'1st' is not a valid Prometheus label name", "[a-zA-Z_][a-zA-Z0-9_]*"),
    ({"pipe-line": "x"}, "'pipe-line' is not a valid Prometheus label name", "use letters"),
    ({"stage": "x"}, "'stage' is a label ml_stage sets itself", "rename it"),
    ({"mlflow_run_id": "x"}, "'mlflow_run_id' is a label ml_stage sets itself", "rename it"),
    ({"result": "x"}, "'result' is a label ml_stage sets itself", "rename it"),
    ({"__name__": "x"}, "'__name__' starts with '__'", "choose a name"),
    ({"pipeline": {"nested": 1}}, "is not a string", "give each label a string value"),
]


@pytest.mark.parametrize("labels,problem,fix", BAD_LABELS, ids=[str(list(b[0])[0]) for b in BAD_LABELS])
def test_bad_label_fails_before_anything_runs(proj: Path, prom: Path, labels: Dict[str, Any],
                                              problem: str, fix: str) -> None:
    for check in (True, False):
        res = ml(args(proj, metrics_textfile_dir=str(prom), metrics_labels=labels), check=check)
        assert res["failed"], res
        assert res["msg"].startswith("option metrics_labels: value "), res["msg"]
        assert problem in res["msg"] and fix in res["msg"], res["msg"]
    assert runs(proj) == 0 and not (proj / ".ml_stage").exists() and list(prom.iterdir()) == []


# -- the directory cannot take the file -------------------------------------------------------
def test_missing_directory_warns_and_the_run_goes_on(proj: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    res = ok(args(proj, metrics_textfile_dir=str(missing)))
    assert res["changed"] is True and res["ran"] is True and res["metrics_textfile"] is None
    warned = [w for w in warnings(res) if "metrics_textfile_dir" in w]
    assert warned and str(missing) in warned[0] and "does not exist" in warned[0], warnings(res)
    assert "create it" in warned[0] and not missing.exists()
    assert (proj / ".ml_stage" / "prep.lock.json").exists()
    # the statistics were kept: once the directory exists the file shows the whole story
    missing.mkdir()
    res = ok(args(proj, metrics_textfile_dir=str(missing)))
    assert res["changed"] is False and not warnings(res)
    series, _unused = read_prom(missing / "mlinfra_stage_prep.prom")
    assert value(series, "runs_total", result="success", stage="prep") == 1
    assert value(series, "skipped_total", stage="prep") == 1


def test_unwritable_target_warns_not_fails(proj: Path, prom: Path) -> None:
    # A directory where the file should go cannot be replaced, even by root.
    (prom / "mlinfra_stage_prep.prom").mkdir()
    res = ok(margs(proj, prom))
    assert res["ran"] is True and res["metrics_textfile"] is None
    warned = [w for w in warnings(res) if "cannot write" in w]
    assert warned and str(prom) in warned[0] and "metrics_textfile_dir" in warned[0], warnings(res)
    assert [p.name for p in prom.iterdir()] == ["mlinfra_stage_prep.prom"]  # no temp file left
    # a failing run still fails for its own reason, not for the metrics
    res = ml(margs(proj, prom, params={"lr": 1}, secret_env={"FAIL": "yes-fail"}))
    assert res["failed"] and "cmd exited with rc 3" in res["msg"] and res["metrics_textfile"] is None


def test_corrupt_statistics_start_afresh_from_the_lock(proj: Path, prom: Path) -> None:
    first = ok(args(proj))  # ran before metrics were enabled
    assert first["metrics_textfile"] is None and not (proj / ".ml_stage" / "prep.runstats.json").exists()
    stats = proj / ".ml_stage" / "prep.runstats.json"
    stats.write_text("{not json")
    res = ok(margs(proj, prom))
    assert res["changed"] is False
    assert any("prep.runstats.json are unreadable" in w and "afresh" in w for w in warnings(res)), res
    series, _unused = read_prom(prom / "mlinfra_stage_prep.prom")
    assert value(series, "skipped_total", **BASE) == 1
    assert value(series, "runs_total", result="success", **BASE) == 0
    # the lock's record of the last success seeds the gauges (second resolution)
    assert abs(value(series, "last_success_timestamp_seconds", **BASE) - time.time()) < 60
    assert value(series, "last_run_success", **run_labels()) == 1
    stats.write_text(json.dumps({"format": 99}))
    res = ok(margs(proj, prom))
    assert any("unknown format" in w for w in warnings(res)), res
    assert json.loads(stats.read_text())["skipped_total"] == 1


# -- check mode, no option ------------------------------------------------------------------------
def test_check_mode_writes_nothing(proj: Path, prom: Path) -> None:
    before = snapshot(proj), snapshot(prom)
    res = ok(margs(proj, prom), check=True)
    assert res["changed"] is True and res["metrics_textfile"] is None
    assert (snapshot(proj), snapshot(prom)) == before
    ok(margs(proj, prom))
    for over in ({}, {"params": {"lr": 1}}, {"frozen": True, "params": {"lr": 1}}):
        before = snapshot(proj), snapshot(prom)
        res = ok(margs(proj, prom, **over), check=True)
        assert res["metrics_textfile"] is None
        assert (snapshot(proj), snapshot(prom)) == before


def test_without_the_option_nothing_is_kept(proj: Path) -> None:
    res = ok(args(proj))
    assert res["metrics_textfile"] is None
    assert not list((proj / ".ml_stage").glob("*runstats*"))


# -- mlflow_run_id through a fake tracking server --------------------------------------------
@pytest.fixture
def fake_mlflow() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if self.path.startswith("/api/2.0/mlflow/experiments/get-by-name"):
                payload: Any = {"experiment": {"experiment_id": "1"}}
            elif self.path == "/api/2.0/mlflow/runs/create":
                payload = {"run": {"info": {"run_id": "f00dcafe", "experiment_id": "1",
                                            "artifact_uri": "mlflow-artifacts:/1/f00dcafe/artifacts"}}}
            else:
                payload = {}
            body = json.dumps(payload).encode() if self.path.startswith("/api") else b"OK"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_run_series_carry_the_mlflow_run_id(proj: Path, prom: Path, fake_mlflow: str) -> None:
    res = ok(margs(proj, prom, mlflow={"tracking_uri": fake_mlflow, "timeout": 5}))
    assert res["mlflow_run_id"] == "f00dcafe", res
    path = prom / "mlinfra_stage_prep.prom"
    series, _unused = read_prom(path)
    for name in RUN_SERIES:
        assert [dict(k) for n, k in series if n == name] == [run_labels("f00dcafe")]
    res = ok(margs(proj, prom, mlflow={"tracking_uri": fake_mlflow, "timeout": 5}))
    assert res["changed"] is False
    series, _unused = read_prom(path)  # a skip keeps the run that made the outputs
    assert value(series, "last_run_success", **run_labels("f00dcafe")) == 1


# -- the formatting itself, in-process -------------------------------------------------------------
def test_formatting_helpers() -> None:
    assert SM.textfile_name("a.b-c+d") == "mlinfra_stage_a_b_c_d.prom"
    assert SM.escape_label('x\\y"z\n') == 'x\\\\y\\"z\\n'
    assert [SM.format_value(v) for v in (True, 0, 3, 1.5, float("nan"), float("inf"), -float("inf"), 1e20)] \
        == ["1", "0", "3", "1.5", "NaN", "+Inf", "-Inf", "1e+20"]
    assert SM.validate_labels({"ok_1": 2, "b": True}) == {"ok_1": "2", "b": "true"}
    text = SM.render("s", {"z": "1", "a": "2"}, {"skipped_total": 0, "runs_total": {}, "last_run": None,
                                                 "last_success_timestamp": None})
    series, meta = parse(text)
    assert set(meta) == {P + "skipped_total", P + "runs_total"}  # nothing about a run that never was
    assert text.splitlines()[2] == 'mlinfra_stage_skipped_total{stage="s",a="2",z="1"} 0'
