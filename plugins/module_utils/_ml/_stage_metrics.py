# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's outcome for Prometheus: a node_exporter textfile-collector file per stage.

After every run decision (success, failure, timeout, skip) the stage's run statistics are
updated in ``STATE_DIR/NAME.runstats.json`` and the whole ``mlinfra_stage_<name>.prom`` file
is rebuilt from them and replaced atomically (temp file in the same directory, rename), so
node_exporter, which reads ``*.prom`` only, never sees a torn file.

Metrics are observability, not managed state: nothing here changes ``changed``, and no
problem here fails a run; it becomes a warning.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._core._errors import InvalidInputError
from .._core._atomic_file import write_bytes_atomic
from ._stage_lock import write_json_atomic

STATS_FORMAT = 1
PREFIX = "mlinfra_stage_"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Labels the module sets itself (``result`` is on runs_total).
RESERVED_LABELS = ("stage", "mlflow_run_id", "result")
_SCALARS = (str, int, float, bool)

HELP = {
    "last_run_timestamp_seconds": ("gauge", "End time of the stage's last real run (Unix seconds)."),
    "last_run_duration_seconds": ("gauge", "Seconds the stage's last real run took."),
    "last_run_success": ("gauge", "1 when the stage's last real run succeeded, 0 when it failed."),
    "last_success_timestamp_seconds": ("gauge", "End time of the stage's last successful run (Unix seconds)."),
    "skipped_total": ("counter", "Runs of the stage skipped because it was up to date (or frozen)."),
    "runs_total": ("counter", "Real runs of the stage by result (success or failure)."),
}


def textfile_name(stage: str) -> str:
    """``mlinfra_stage_<name>.prom`` with the name reduced to [a-zA-Z0-9_]."""
    return "%s%s.prom" % (PREFIX, re.sub(r"[^a-zA-Z0-9_]", "_", stage))


def validate_labels(value: Any) -> Dict[str, str]:
    """metrics_labels checked against Prometheus' label-name rules; values as strings."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError("metrics_labels", value, "is not a mapping",
                                "give label: value pairs, e.g. {pipeline: nightly}")
    out: Dict[str, str] = {}
    for name, val in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            raise InvalidInputError("metrics_labels", name, "is not a valid Prometheus label name",
                                    "use letters, digits and '_', not starting with a digit "
                                    "([a-zA-Z_][a-zA-Z0-9_]*), e.g. pipeline_name")
        if name.startswith("__"):
            raise InvalidInputError("metrics_labels", name, "starts with '__', which Prometheus "
                                    "reserves for internal use", "choose a name without the "
                                    "leading underscores")
        if name in RESERVED_LABELS:
            raise InvalidInputError("metrics_labels", name, "is a label ml_stage sets itself "
                                    "(reserved: %s)" % ", ".join(RESERVED_LABELS),
                                    "rename it, e.g. to pipeline_%s" % name)
        if isinstance(val, bool):
            val = "true" if val else "false"
        if val is None or not isinstance(val, _SCALARS):
            raise InvalidInputError("metrics_labels", "%s=%r" % (name, val), "is not a string",
                                    "give each label a string value (numbers are turned into strings)")
        out[name] = str(val)
    return out


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def format_value(value: Any) -> str:
    """A sample value as the text exposition format writes it (Go ParseFloat syntax)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(pairs: List[Tuple[str, str]]) -> str:
    return "{%s}" % ",".join('%s="%s"' % (k, escape_label(v)) for k, v in pairs)


def render(stage: str, labels: Dict[str, str], stats: Dict[str, Any]) -> str:
    """The whole textfile for one stage from its run statistics."""
    base = [("stage", stage)] + sorted(labels.items())
    lines: List[str] = []

    def family(short: str, samples: List[Tuple[List[Tuple[str, str]], Any]]) -> None:
        if not samples:
            return
        name = PREFIX + short
        typ, text = HELP[short]
        lines.append("# HELP %s %s" % (name, text))
        lines.append("# TYPE %s %s" % (name, typ))
        for pairs, value in samples:
            lines.append("%s%s %s" % (name, _labels(pairs), format_value(value)))

    last = stats.get("last_run")
    if last:
        run_labels = base + [("mlflow_run_id", last.get("mlflow_run_id") or "")]
        family("last_run_timestamp_seconds", [(run_labels, last["timestamp"])])
        family("last_run_duration_seconds", [(run_labels, last["duration"])])
        family("last_run_success", [(run_labels, 1 if last["success"] else 0)])
    if stats.get("last_success_timestamp") is not None:
        family("last_success_timestamp_seconds", [(base, stats["last_success_timestamp"])])
    family("skipped_total", [(base, stats.get("skipped_total", 0))])
    runs = stats.get("runs_total") or {}
    family("runs_total", [(base + [("result", result)], runs.get(result, 0))
                          for result in ("success", "failure")])
    return "\n".join(lines) + "\n"


def _fresh() -> Dict[str, Any]:
    return {"format": STATS_FORMAT, "skipped_total": 0, "runs_total": {"success": 0, "failure": 0},
            "last_run": None, "last_success_timestamp": None}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _valid(data: Any) -> bool:
    if not isinstance(data, dict) or data.get("format") != STATS_FORMAT:
        return False
    runs = data.get("runs_total")
    if not _number(data.get("skipped_total")) or not isinstance(runs, dict) \
            or not all(_number(runs.get(k)) for k in ("success", "failure")):
        return False
    last = data.get("last_run")
    if last is not None and not (isinstance(last, dict) and _number(last.get("timestamp"))
                                 and _number(last.get("duration"))
                                 and isinstance(last.get("success"), bool)):
        return False
    ts = data.get("last_success_timestamp")
    return ts is None or _number(ts)


def _lock_time(lock: Optional[Dict[str, Any]]) -> Optional[float]:
    """When the lock's run finished (its record has second resolution), or None."""
    finished = ((lock or {}).get("run") or {}).get("finished")
    if not isinstance(finished, str):
        return None
    try:
        return datetime.strptime(finished, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


class StageMetrics:
    """Keeps one stage's run statistics and rebuilds its textfile after every decision."""

    def __init__(self, directory: str, stage: str, labels: Dict[str, str], stats_path: str,
                 warn: Callable[[str], None]) -> None:
        self.directory = directory
        self.stage = stage
        self.labels = labels
        self.stats_path = stats_path
        self.path = os.path.join(directory, textfile_name(stage))
        self.warn = warn

    # -- the statistics ---------------------------------------------------------------
    def _load(self, lock: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        try:
            with open(self.stats_path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            data = None
        except (OSError, ValueError) as exc:
            self.warn("ml_stage metrics: run statistics %s are unreadable (%s); starting them "
                      "afresh (the counters restart at 0)" % (self.stats_path, exc))
            data = None
        else:
            if not _valid(data):
                self.warn("ml_stage metrics: run statistics %s have an unknown format; starting "
                          "them afresh (the counters restart at 0)" % self.stats_path)
                data = None
        if data is not None:
            return data
        # A stage that succeeded before its metrics were enabled: its lock knows when.
        stats = _fresh()
        finished = _lock_time(lock)
        if finished is not None:
            run = lock.get("run") or {}
            duration = run.get("duration")
            stats["last_success_timestamp"] = finished
            stats["last_run"] = {"timestamp": finished,
                                 "duration": duration if _number(duration) else 0.0,
                                 "success": True,
                                 "mlflow_run_id": (run.get("mlflow") or {}).get("run_id") or ""}
        return stats

    # -- one decision -----------------------------------------------------------------
    def record(self, outcome: str, lock: Optional[Dict[str, Any]] = None,
               ended: Optional[float] = None, duration: Optional[float] = None,
               mlflow_run_id: Optional[str] = None) -> Optional[str]:
        """Count ``outcome`` (success, failure or skipped), save the statistics and write
        the textfile; returns its path, or None (with a warning) when it could not be written."""
        stats = self._load(lock)
        if outcome == "skipped":
            stats["skipped_total"] += 1
        else:
            success = outcome == "success"
            ended = time.time() if ended is None else ended
            stats["runs_total"]["success" if success else "failure"] += 1
            stats["last_run"] = {"timestamp": round(ended, 3),
                                 "duration": round(float(duration or 0.0), 3),
                                 "success": success, "mlflow_run_id": mlflow_run_id or ""}
            if success:
                stats["last_success_timestamp"] = round(ended, 3)
        stats["stage"] = self.stage
        try:
            write_json_atomic(self.stats_path, stats)
        except OSError as exc:
            self.warn("ml_stage metrics: cannot save the run statistics %s (%s); the counters "
                      "of the next run will not include this one" % (self.stats_path, exc))
        return self._write(render(self.stage, self.labels, stats))

    def _write(self, text: str) -> Optional[str]:
        if not os.path.isdir(self.directory):
            self.warn("ml_stage metrics: metrics_textfile_dir %s does not exist (or is not a "
                      "directory), so %s was not written; create it (prometheus-node-exporter's "
                      "textfile collector reads /var/lib/prometheus/node-exporter) or unset "
                      "metrics_textfile_dir" % (self.directory, os.path.basename(self.path)))
            return None
        try:
            write_bytes_atomic(self.path, text.encode("utf-8"), mode=0o644)
        except OSError as exc:
            self.warn("ml_stage metrics: cannot write %s in metrics_textfile_dir %s (%s); make the "
                      "directory writable by the user the task runs as (become), or unset "
                      "metrics_textfile_dir" % (os.path.basename(self.path), self.directory, exc))
            return None
        return self.path
