#!/usr/bin/python3
"""Slurm's queue, nodes, GPUs and accounting for node_exporter's textfile collector
(mlinfra.kvm.monitoring). Debian packages no Slurm exporter; this reads the Slurm commands on
the host that runs slurmctld and writes, atomically, one .prom file:

    mlinfra_slurm_up{daemon="slurmctld"|"slurmdbd"}          1 answers, 0 does not
    mlinfra_slurm_jobs{partition,state,reason}               jobs not yet finished (squeue)
    mlinfra_slurm_pending_oldest_seconds{partition,reason}   age of the oldest pending job
    mlinfra_slurm_pending_oldest_gpus{partition,reason}      the GPUs that job asks for
    mlinfra_slurm_node_state{node,state,reason}              1 per node (sinfo): idle, mixed,
                                                             allocated, down, drained, draining...
    mlinfra_slurm_partition_gpus{partition}            GPUs (gres/gpu) of its nodes
    mlinfra_slurm_partition_gpus_allocated{partition}        of which allocated to jobs
    mlinfra_slurm_account_gpu_hours{account}                 GPU-hours of the last --gpu-hours-days
                                                             days (sacct, slurmdbd): the part of each
                                                             allocation inside that sliding window
    mlinfra_slurm_gpu_usage_window_seconds                   that window
    mlinfra_slurm_command_success{command}                   whether each command's last run worked
    mlinfra_slurm_command_error{command,error}               1 with the error of a command that failed
    mlinfra_slurm_read_timestamp_seconds                     when the commands last ran

Every command runs with a timeout. A command that fails, hangs or is missing never stops the
loop: its metrics are left out (never stale ones), the error is published, and the daemon it
needs is published as down. squeue and sinfo are read as JSON (Slurm 22.05's --json), sacct as
parsable text with epoch times (SLURM_TIME_FORMAT=%s).

It runs as a loop (--interval, under systemd or `daemon --respawn`) or once (--once).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# Jobs that squeue still lists for MinJobAge after they ended: not part of the queue.
FINISHED_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
BUSY_NODE_STATES = {"allocated", "mixed", "completing"}
ERROR_MAX_CHARS = 300


class CommandFailed(Exception):
    """A Slurm command that could not give an answer: the command and why."""

    def __init__(self, command: str, error: str) -> None:
        super().__init__("%s: %s" % (command, error))
        self.command = command
        self.error = error


class SlurmCommands:
    """Runs Slurm's commands, each bounded by timeout_s; records which failed and why."""

    def __init__(self, timeout_s: float, env: Optional[Dict[str, str]] = None) -> None:
        self.timeout_s = timeout_s
        self.env = env
        self.results: Dict[str, Optional[str]] = {}   # command name -> None (worked) or its error

    def run(self, name: str, argv: List[str], env: Optional[Dict[str, str]] = None) -> str:
        merged = dict(self.env if self.env is not None else os.environ, **(env or {}))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, env=merged,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return self._failed(name, "no answer within %g s" % self.timeout_s)
        except OSError as exc:  # not installed, not executable
            return self._failed(name, "cannot run %s: %s" % (argv[0], exc.strerror or exc))
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            return self._failed(name, "exit %d: %s" % (proc.returncode, detail[-1] if detail else "no output"))
        self.results[name] = None
        return proc.stdout

    def json(self, name: str, argv: List[str]) -> Dict[str, Any]:
        text = self.run(name, argv)
        try:
            data = json.loads(text)
        except ValueError as exc:
            self._failed(name, "not JSON: %s" % exc)
        errors = data.get("errors") or []
        if errors:
            first = errors[0]
            self._failed(name, str(first.get("error") or first.get("description") or first)
                         if isinstance(first, dict) else str(first))
        return data

    def _failed(self, name: str, error: str) -> str:
        self.results[name] = error[:ERROR_MAX_CHARS]
        raise CommandFailed(name, error)


# --------------------------------------------------------------------------- parsing


def tres_gpus(tres: Optional[str]) -> int:
    """GPUs in a TRES string such as "cpu=2,mem=1M,gres/gpu=2,gres/gpu:a100=2" (the untyped
    total; typed entries repeat part of it)."""
    for item in (tres or "").split(","):
        key, _sep, value = item.partition("=")
        if key.strip() == "gres/gpu":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def job_summary(squeue: Dict[str, Any], now: float) -> Tuple[Dict[Tuple[str, str, str], int], Dict[Tuple[str, str], Tuple[float, int]]]:
    """({(partition, state, reason): jobs}, {(partition, reason): (oldest pending age, its GPUs)})
    from `squeue --json`. Jobs that already ended are left out; a reason is kept for pending
    jobs only (a running job's reason is "None")."""
    counts: Dict[Tuple[str, str, str], int] = defaultdict(int)
    oldest: Dict[Tuple[str, str], Tuple[float, int]] = {}
    for job in squeue.get("jobs") or []:
        state = str(job.get("job_state") or "UNKNOWN")
        if state in FINISHED_STATES:
            continue
        partition = str(job.get("partition") or "")
        reason = str(job.get("state_reason") or "") if state == "PENDING" else ""
        counts[(partition, state, reason)] += 1
        if state == "PENDING":
            age = max(0.0, now - float(job.get("submit_time") or now))
            gpus = tres_gpus(job.get("tres_req_str"))
            if (partition, reason) not in oldest or age > oldest[(partition, reason)][0]:
                oldest[(partition, reason)] = (age, gpus)
    return dict(counts), oldest


def node_state(node: Dict[str, Any]) -> str:
    """One word per node: the base state, or drained / draining when drain is set (sinfo's own
    words)."""
    base = str(node.get("state") or "unknown").lower()
    flags = {str(f).upper() for f in node.get("state_flags") or []}
    if "DRAIN" in flags:
        return "draining" if base in BUSY_NODE_STATES else "drained"
    return base


def node_summary(sinfo: Dict[str, Any]) -> Tuple[List[Tuple[str, str, str]], Dict[str, Tuple[int, int]]]:
    """([(node, state, reason)], {partition: (GPUs total, GPUs allocated)}) from `sinfo --json`."""
    nodes: Dict[str, Tuple[str, str, str]] = {}
    gpus: Dict[str, List[int]] = defaultdict(lambda: [0, 0])
    for node in sinfo.get("nodes") or []:
        name = str(node.get("name") or node.get("hostname") or "")
        if not name or name in nodes:  # sinfo lists a node once per partition in some versions
            continue
        nodes[name] = (name, node_state(node), str(node.get("reason") or ""))
        total, used = tres_gpus(node.get("tres")), tres_gpus(node.get("tres_used"))
        for partition in node.get("partitions") or []:
            gpus[str(partition)][0] += total
            gpus[str(partition)][1] += used
    return sorted(nodes.values()), {p: (t, u) for p, (t, u) in gpus.items()}


def account_gpu_hours(sacct_text: str, window_start: float, now: float) -> Dict[str, float]:
    """{account: GPU-hours inside [window_start, now]} from `sacct --allocations --parsable2
    --noheader -o JobID,Account,Start,End,AllocTRES` with SLURM_TIME_FORMAT=%s. A running job
    counts up to now; a job that started before the window counts from its start."""
    hours: Dict[str, float] = defaultdict(float)
    for line in sacct_text.splitlines():
        fields = line.split("|")
        if len(fields) < 5:
            continue
        _job, account, start, end, tres = fields[:5]
        gpus = tres_gpus(tres)
        if not gpus or not start.isdigit():
            continue  # pending (Start Unknown) or no GPU
        begin = max(float(start), window_start)
        finish = min(float(end), now) if end.isdigit() else now
        if finish > begin:
            hours[account or "(none)"] += gpus * (finish - begin) / 3600.0
    return dict(hours)


# --------------------------------------------------------------------------- reading


def read_all(cmds: SlurmCommands, now: float, gpu_hours_days: float) -> Dict[str, Any]:
    """Every Slurm read of one round; a part whose command failed is None."""
    model: Dict[str, Any] = {"slurmctld": False, "slurmdbd": False, "jobs": None, "nodes": None,
                             "gpu_hours": None, "window_s": gpu_hours_days * 86400}
    try:
        model["slurmctld"] = "UP" in cmds.run("scontrol_ping", ["scontrol", "ping"])
    except CommandFailed:
        pass
    try:
        model["jobs"] = job_summary(cmds.json("squeue", ["squeue", "--all", "--json"]), now)
    except CommandFailed:
        pass
    try:
        model["nodes"] = node_summary(cmds.json("sinfo", ["sinfo", "--json"]))
    except CommandFailed:
        pass
    try:
        cmds.run("sacctmgr_show_cluster", ["sacctmgr", "--noheader", "--parsable2", "show", "cluster", "format=Cluster"])
        model["slurmdbd"] = True
    except CommandFailed:
        pass
    if model["slurmdbd"]:
        window_start = now - model["window_s"]
        try:
            text = cmds.run("sacct", ["sacct", "--allocations", "--allusers", "--parsable2", "--noheader",
                                      "--starttime", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(window_start)),
                                      "--endtime", "now", "--format", "JobID,Account,Start,End,AllocTRES"],
                            env={"SLURM_TIME_FORMAT": "%s"})
            model["gpu_hours"] = account_gpu_hours(text, window_start, now)
        except CommandFailed:
            pass
    return model


# --------------------------------------------------------------------------- exposition


def escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**pairs: str) -> str:
    return "{%s}" % ",".join('%s="%s"' % (k, escape(v)) for k, v in pairs.items())


def metric(lines: List[str], name: str, kind: str, help_text: str, samples: Iterable[Tuple[str, float]]) -> None:
    lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
    for label_text, value in samples:
        lines.append("%s%s %s" % (name, label_text, ("%d" % value) if float(value).is_integer() else ("%.6g" % value)))


def exposition(model: Dict[str, Any], results: Dict[str, Optional[str]], read_at: float) -> str:
    lines: List[str] = []
    metric(lines, "mlinfra_slurm_up", "gauge", "Whether the Slurm daemon answers (scontrol ping; sacctmgr show cluster).",
           [(labels(daemon="slurmctld"), int(model["slurmctld"])), (labels(daemon="slurmdbd"), int(model["slurmdbd"]))])
    counts, oldest = model["jobs"] or ({}, {})
    metric(lines, "mlinfra_slurm_jobs", "gauge", "Jobs in the queue by partition, state and (pending) reason.",
           [(labels(partition=p, state=s, reason=r), n) for (p, s, r), n in sorted(counts.items())])
    metric(lines, "mlinfra_slurm_pending_oldest_seconds", "gauge",
           "Seconds since the oldest pending job of the partition and reason was submitted.",
           [(labels(partition=p, reason=r), age) for (p, r), (age, _g) in sorted(oldest.items())])
    metric(lines, "mlinfra_slurm_pending_oldest_gpus", "gauge", "GPUs the oldest pending job of the partition and reason asks for.",
           [(labels(partition=p, reason=r), gpus) for (p, r), (_a, gpus) in sorted(oldest.items())])
    nodes, partitions = model["nodes"] or ([], {})
    metric(lines, "mlinfra_slurm_node_state", "gauge", "1 per Slurm node with its state and reason (drained, down: why).",
           [(labels(node=n, state=s, reason=r), 1) for n, s, r in nodes])
    metric(lines, "mlinfra_slurm_partition_gpus", "gauge", "GPUs (gres/gpu) of the partition's nodes, any state.",
           [(labels(partition=p), t) for p, (t, _u) in sorted(partitions.items())])
    metric(lines, "mlinfra_slurm_partition_gpus_allocated", "gauge", "GPUs of the partition's nodes allocated to jobs.",
           [(labels(partition=p), u) for p, (_t, u) in sorted(partitions.items())])
    metric(lines, "mlinfra_slurm_account_gpu_hours", "gauge",
           "GPU-hours allocated to the account's jobs inside the sliding window (sacct, slurmdbd's accounting).",
           [(labels(account=a), round(h, 6)) for a, h in sorted((model["gpu_hours"] or {}).items())])
    metric(lines, "mlinfra_slurm_gpu_usage_window_seconds", "gauge", "Length of the GPU-hours window.",
           [("", model["window_s"])])
    metric(lines, "mlinfra_slurm_command_success", "gauge", "Whether the Slurm command's last run gave an answer.",
           [(labels(command=c), int(e is None)) for c, e in sorted(results.items())])
    metric(lines, "mlinfra_slurm_command_error", "gauge", "1 with the error of each Slurm command whose last run failed.",
           [(labels(command=c, error=e), 1) for c, e in sorted(results.items()) if e is not None])
    metric(lines, "mlinfra_slurm_read_timestamp_seconds", "gauge", "When the Slurm commands last ran.", [("", read_at)])
    return "\n".join(lines) + "\n"


def write_textfile(path: str, text: str) -> None:
    """A temporary file in the same directory renamed over the target: node_exporter never reads
    half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".mlinfra_slurm_state.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def collect_once(path: str, timeout_s: float, gpu_hours_days: float, env: Optional[Dict[str, str]] = None) -> bool:
    """One round: read Slurm, write the file, say on stderr what failed. True when every command worked."""
    cmds = SlurmCommands(timeout_s, env)
    now = time.time()
    model = read_all(cmds, now, gpu_hours_days)
    write_textfile(path, exposition(model, cmds.results, now))
    failed = {c: e for c, e in cmds.results.items() if e is not None}
    for command, error in sorted(failed.items()):
        print("mlinfra-slurm-state: %s failed: %s" % (command, error), file=sys.stderr, flush=True)
    return not failed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--textfile", required=True, metavar="PATH.prom",
                        help="file in node_exporter's textfile collector directory")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS", help="seconds between reads")
    parser.add_argument("--command-timeout", type=float, default=20.0, metavar="SECONDS",
                        help="most seconds one Slurm command may take")
    parser.add_argument("--gpu-hours-days", type=float, default=30.0, metavar="DAYS",
                        help="the sliding window of mlinfra_slurm_account_gpu_hours")
    parser.add_argument("--slurm-conf", default="", metavar="PATH",
                        help="slurm.conf to use (SLURM_CONF); empty: the commands' default")
    parser.add_argument("--once", action="store_true", help="read and write once, then exit (1 if a command failed)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.textfile.endswith(".prom") or not os.path.isdir(os.path.dirname(args.textfile) or "."):
        parser.error("--textfile must be a .prom file in an existing directory, got %r" % args.textfile)
    for option, value in (("--interval", args.interval), ("--command-timeout", args.command_timeout),
                          ("--gpu-hours-days", args.gpu_hours_days)):
        if value <= 0:
            parser.error("%s must be more than 0, got %r" % (option, value))
    env = dict(os.environ, SLURM_CONF=args.slurm_conf) if args.slurm_conf else None
    while True:
        try:
            ok = collect_once(args.textfile, args.command_timeout, args.gpu_hours_days, env)
        except OSError as exc:  # the textfile directory went away or filled up: try again next round
            print("mlinfra-slurm-state: cannot write %s: %s" % (args.textfile, exc), file=sys.stderr, flush=True)
            ok = False
        if args.once:
            return 0 if ok else 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
