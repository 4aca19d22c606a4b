# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm_job's runner: one named allocation per stage run, found again by its name.

A stage that runs under Slurm first holds its nodes as one job (gang allocation: every node at
once or none), then starts its processes as steps of that job (``srun --jobid``), then releases
it. The job's name is the stage's identity (its key), so a re-run after an interrupted play
finds the job still queued or running and waits for it instead of submitting a second one that
would write the same outputs; it never submits twice under one name.

The job itself runs a holder script on its first node that waits for a signal: USR1 ends it
with exit code 0 (``COMPLETED`` in the accounting), USR2 with 1 (``FAILED``), so slurmdbd's
record says how the stage ended. Elapsed time and GPU-hours come from ``sacct`` (slurmdbd's
accounting), never from this module's clock.

Before anything is submitted the request is checked against the cluster: the controller answers
(else its host and port are named), the partition, account and QOS exist, and the partition has
enough nodes and GPUs in total (a job that can never start is refused, not left pending).
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Dict, List, Optional

from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from ._cli import DEFAULT_CONF, SlurmCli

ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
RELEASE_SIGNAL = {"completed": "USR1", "failed": "USR2"}


class JobFailedError(KvmError):
    """The allocation ended before it ran (cancelled, node failure, time limit)."""


def tres_count(tres: str, key: str) -> int:
    """``gres/gpu`` of ``billing=2,cpu=2,gres/gpu=2,node=2`` -> 2 (0 when absent)."""
    for part in (tres or "").split(","):
        name, _sep, value = part.partition("=")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def gres_gpus(gres: str) -> int:
    """GPUs in a node's or partition's Gres= (``gpu:h200:2,shard:4`` -> 2)."""
    total = 0
    for part in (gres or "").split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


class SlurmJobRunner(ObjectRunner):
    def __init__(self, module: Any, cli: SlurmCli, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(module, cli)
        self.p = module.params
        self.sleep = sleep
        self.progress: List[str] = []

    # -- input -----------------------------------------------------------------------------
    def validate(self) -> None:
        if not NAME_RE.match(self.p["name"]):
            raise InvalidInputError("name", self.p["name"], "is not a job name this module can find again",
                                    "use 1 to 128 letters, digits, '.', '_', ':' or '-'")
        for option in ("nodes", "gpus_per_node"):
            if self.p[option] is not None and self.p[option] < (1 if option == "nodes" else 0):
                raise InvalidInputError(option, self.p[option], "is out of range",
                                        "give at least %d" % (1 if option == "nodes" else 0))
        if self.p["nodelist"] and len(self.p["nodelist"]) != self.p["nodes"]:
            raise InvalidInputError("nodelist", self.p["nodelist"], "names %d nodes for a job of nodes=%d"
                                    % (len(self.p["nodelist"]), self.p["nodes"]),
                                    "list exactly the nodes the job runs on, or leave nodelist out")
        if self.p["conf"] and not os.path.isfile(self.p["conf"]):
            raise InvalidInputError("conf", self.p["conf"], "is not a file",
                                    "give the path of the cluster's slurm.conf (the one the slurm_controller and "
                                    "slurm_node roles write), or leave conf out for %s" % DEFAULT_CONF)

    def _preflight(self) -> None:
        """Refuse a job the cluster can never run, before it is submitted."""
        cli: SlurmCli = self.service
        partitions = cli.partitions()
        name = self.p["partition"]
        if name not in partitions:
            raise InvalidInputError("partition", name, "is not a partition of this cluster (partitions: %s)"
                                    % ", ".join(sorted(partitions)), "name one of them")
        members = cli.expand_hostlist(partitions[name].get("Nodes", ""))
        nodes = cli.nodes()
        if self.p["nodes"] > len(members):
            raise InvalidInputError("nodes", self.p["nodes"], "is more than partition %s has in total (%d)"
                                    % (name, len(members)), "ask for at most %d nodes" % len(members))
        for node in self.p["nodelist"] or []:
            if node not in members:
                raise InvalidInputError("nodelist", node, "is not a Slurm node of partition %s (its nodes: %s)"
                                        % (name, ", ".join(members)),
                                        "run the slurm_node role on that host, or list only the partition's nodes")
        wanted = self.p["gpus_per_node"] or 0
        if wanted:
            candidates = self.p["nodelist"] or members
            able = [n for n in candidates if gres_gpus(nodes.get(n, {}).get("Gres", "")) >= wanted]
            if len(able) < self.p["nodes"]:
                total = sum(gres_gpus(nodes.get(n, {}).get("Gres", "")) for n in members)
                raise InvalidInputError(
                    "gpus_per_node", wanted, "is more than %d of partition %s's nodes have (%d of them have that many; "
                    "the partition has %d GPUs in total)" % (self.p["nodes"], name, len(able), total),
                    "ask for fewer GPUs per node or fewer nodes")
        self._check_account_and_qos()

    def _check_account_and_qos(self) -> None:
        cli: SlurmCli = self.service
        if self.p["account"]:
            found = cli.sacctmgr_show("account", ["Account"], "where", "name=%s" % self.p["account"])
            if not found:
                raise InvalidInputError("account", self.p["account"], "is not a Slurm account",
                                        "create it (the slurm_controller role's accounts) or name an existing one")
        if self.p["qos"]:
            found = cli.sacctmgr_show("qos", ["Name"], "where", "name=%s" % self.p["qos"])
            if not found:
                raise InvalidInputError("qos", self.p["qos"], "is not a Slurm QOS",
                                        "create it (the slurm_controller role's qos) or name an existing one")

    # -- the sequence ----------------------------------------------------------------------
    def converge(self) -> Dict[str, Any]:
        cli: SlurmCli = self.service
        cli.ping()  # an unreachable controller is named with its port, whatever the state asked
        jobs = cli.jobs_named(self.p["name"])
        if len(jobs) > 1:
            raise KvmError("%d jobs are named %s (%s); one stage run has one job: cancel the extra ones with scancel"
                           % (len(jobs), self.p["name"], ", ".join(j["id"] for j in jobs)), job_ids=[j["id"] for j in jobs])
        job = jobs[0] if jobs else None
        state = self.p["state"]
        if state == "running":
            return self._running(job)
        if state == "absent":
            return self._absent(job)
        return self._released(job, state)

    def _running(self, job: Optional[Dict[str, str]]) -> Dict[str, Any]:
        result: Dict[str, Any] = {"changed": False}
        if job is None:
            self._preflight()
            predecessor = self._predecessor()
            if predecessor:
                result["predecessor"] = predecessor
                self.note("job %s of the same name ended %s" % (predecessor["job_id"], predecessor["state"]))
            job_id = self.tracker.act("submit job %s" % self.p["name"], self.service.submit, self._submit_options())
            result["changed"] = True
            if self.check:
                result.update(job_id=None, state="PENDING", nodes=[], actions=self.tracker.actions)
                return result
            self.note("job %s submitted" % job_id)
        else:
            job_id = job["id"]
            self.note("job %s (%s) was already %s: waiting for it, not submitting another" % (job_id, self.p["name"], job["state"]))
            result["attached"] = True
        info = self._wait_running(job_id) if self.p["wait_timeout"] else (self.service.job(job_id) or {})
        result.update(job_id=job_id, state=info.get("state", "PENDING"), reason=info.get("reason", ""),
                      nodes=self.service.expand_hostlist(info.get("nodes", "")), account=info.get("account", ""),
                      partition=info.get("partition", ""), actions=self.tracker.actions)
        return result

    def _submit_options(self) -> List[str]:
        p = self.p
        argv = ["--job-name", p["name"], "--partition", p["partition"], "--nodes", str(p["nodes"]),
                "--ntasks-per-node", "1", "--output", "/dev/null", "--chdir", "/"]
        for option, flag in (("account", "--account"), ("qos", "--qos"), ("time_limit", "--time")):
            if p[option]:
                argv += [flag, str(p[option])]
        if p["gpus_per_node"]:
            argv += ["--gres", "gpu:%d" % p["gpus_per_node"]]
        if p["cpus_per_node"]:
            argv += ["--cpus-per-task", str(p["cpus_per_node"])]
        if p["nodelist"]:
            argv += ["--nodelist", ",".join(p["nodelist"])]
        if p["comment"]:
            argv += ["--comment", p["comment"]]
        return argv

    def _wait_running(self, job_id: str) -> Dict[str, str]:
        deadline = time.monotonic() + self.p["wait_timeout"]
        last = None
        while True:
            info = self.service.job(job_id)
            if info is None:
                record = self.service.accounting(job_id) or {}
                raise JobFailedError("job %s ended (%s) before it ran; nothing of the stage was started"
                                     % (job_id, record.get("state", "gone from the queue")), job_id=job_id,
                                     progress=self.progress)
            seen = (info["state"], info["reason"])
            if seen != last:
                position = self.service.queue_position(job_id, info["partition"]) if info["state"] == "PENDING" else 0
                reason = " (%s)" % info["reason"] if info["reason"] not in ("", "None") else ""
                where = ", position %d in %s" % (position, info["partition"]) if position else ""
                self.note("job %s %s%s%s" % (job_id, info["state"], reason, where))
                last = seen
            if info["state"] == "RUNNING":
                return info
            if time.monotonic() > deadline:
                raise KvmError("job %s is still %s (%s) after %ss; it stays queued and a re-run waits for it: cancel "
                               "it with scancel %s to give up"
                               % (job_id, info["state"], info["reason"], self.p["wait_timeout"], job_id),
                               job_id=job_id, state=info["state"], reason=info["reason"], progress=self.progress)
            self.sleep(self.p["poll_interval"])

    def _predecessor(self) -> Optional[Dict[str, str]]:
        record = self.service.last_accounting_named(self.p["name"])
        if record and not record["state"].startswith("COMPLETED"):
            return {"job_id": record["jobid"], "state": record["state"]}
        return None

    def _absent(self, job: Optional[Dict[str, str]]) -> Dict[str, Any]:
        if job is None:
            return {"changed": False, "job_id": None, "actions": []}
        self.tracker.act("cancel job %s" % job["id"], self.service.cancel, job["id"])
        return {"changed": True, "job_id": job["id"], "actions": self.tracker.actions}

    def _released(self, job: Optional[Dict[str, str]], state: str) -> Dict[str, Any]:
        result: Dict[str, Any] = {"changed": False}
        if job is not None:
            signal = RELEASE_SIGNAL[state] if job["state"] == "RUNNING" else None
            if signal:
                self.tracker.act("release job %s as %s" % (job["id"], state), self.service.signal_batch, job["id"], signal)
            else:  # still pending: it never ran, and never will now
                self.tracker.act("cancel pending job %s" % job["id"], self.service.cancel, job["id"])
            result["changed"] = True
            if self.check:
                result.update(job_id=job["id"], actions=self.tracker.actions)
                return result
            record = self._wait_accounted(job["id"])
            # The queue read of a running job names every node it holds; the accounting's
            # NodeList has been seen naming the first node alone under load, so what the job
            # held when it was released is taken from the queue.
            held = job["nodes"] if job["state"] == "RUNNING" else ""
        else:
            record = self.service.last_accounting_named(self.p["name"])
            if record is None:
                raise KvmError("no job named %s is queued, running or in the accounting: nothing to release"
                               % self.p["name"])
            held = ""
        result.update(self._accounted(record, held), actions=self.tracker.actions)
        self._log_to_mlflow(result)
        return result

    def _wait_accounted(self, job_id: str) -> Dict[str, str]:
        """The job's final record: it leaves the queue, then slurmdbd writes its end."""
        deadline = time.monotonic() + max(60, self.p["poll_interval"] * 10)
        while True:
            record = self.service.accounting(job_id)
            if record and record["state"] not in ACTIVE_STATES and record.get("end") not in ("", "Unknown"):
                return record
            if time.monotonic() > deadline:
                raise KvmError("job %s was released but its accounting still says %s; read it later with sacct -j %s"
                               % (job_id, (record or {}).get("state", "nothing"), job_id), job_id=job_id)
            self.sleep(min(self.p["poll_interval"], 2))

    def _accounted(self, record: Dict[str, str], held: str = "") -> Dict[str, Any]:
        """The result of a released job from its accounting record; ``held``, the nodes the queue
        listed while it ran, wins over the record's NodeList."""
        elapsed = int(record.get("elapsedraw") or 0)
        gpus = tres_count(record.get("alloctres", ""), "gres/gpu")
        cpus = tres_count(record.get("alloctres", ""), "cpu")
        nodes = self.service.expand_hostlist(held or record.get("nodelist", ""))
        if held and held != record.get("nodelist", ""):
            self.note("job %s held %s; its accounting lists %s" % (record["jobid"], held, record.get("nodelist") or "none"))
        return {"job_id": record["jobid"], "state": record["state"].split()[0], "account": record.get("account", ""),
                "nodes": nodes, "elapsed_s": elapsed,
                "gpus": gpus, "gpu_hours": gpus * elapsed / 3600.0,
                "cpu_hours": cpus * elapsed / 3600.0, "exit_code": record.get("exitcode", "")}

    def _log_to_mlflow(self, result: Dict[str, Any]) -> None:
        m = self.p.get("mlflow")
        if not m or not m.get("run_id") or self.check:
            return
        from .._ml._stage_mlflow import MlflowClient  # only when asked: the job itself needs no MLflow
        client = MlflowClient(m["tracking_uri"], m.get("username"), m.get("password"), m.get("token"),
                              ca_path=m.get("ca_path"), option_prefix="mlflow.", credentials_option="mlflow.username")
        tags = {"slurm.job_id": result["job_id"], "slurm.account": result["account"], "slurm.state": result["state"],
                "slurm.nodes": ",".join(result["nodes"])}
        self.tracker.act("log job %s's accounting to MLflow run %s" % (result["job_id"], m["run_id"]),
                         self._mlflow_write, client, m["run_id"], tags, result)

    @staticmethod
    def _mlflow_write(client: Any, run_id: str, tags: Dict[str, str], result: Dict[str, Any]) -> None:
        client.set_tags(run_id, tags)
        client.log_metrics(run_id, {"slurm_gpu_hours": result["gpu_hours"], "slurm_cpu_hours": result["cpu_hours"],
                                    "slurm_elapsed_s": float(result["elapsed_s"])})

    def note(self, line: str) -> None:
        stamped = "%s %s" % (time.strftime("%H:%M:%S"), line)
        self.progress.append(stamped)
        self.module.log(line)

    def run(self) -> Dict[str, Any]:
        result = super().run()
        result["progress"] = self.progress
        return result


def run_slurm_job(module: Any) -> Dict[str, Any]:
    cli = SlurmCli(module.params["conf"], module.params["command_timeout"])
    return SlurmJobRunner(module, cli).run()
