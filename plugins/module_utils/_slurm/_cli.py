# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The only code that runs Slurm's commands (squeue, sinfo, sacct, scontrol, salloc, scancel,
sacctmgr): argv lists through the bounded runner, ``SLURM_CONF`` set when a config path is
given, and parsed output. Each failure names the command and Slurm's own words."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .._core._command import CommandTimeoutError, run_bounded
from .._core._errors import KvmError


# What a stage's job runs on its first node: it holds the allocation until signalled, USR1 ending
# it COMPLETED (exit 0) and USR2 FAILED (exit 1) in the accounting.
DEFAULT_CONF = "/etc/slurm/slurm.conf"
HOLDER = 'trap "exit 0" USR1; trap "exit 1" USR2; while :; do sleep 5 & wait $!; done'


class SlurmCommandError(KvmError):
    """A Slurm command failed; ``msg`` carries its stderr."""


class ControllerUnreachableError(KvmError):
    """slurmctld did not answer (``scontrol ping``)."""


def parse_pipe_table(text: str, fields: Sequence[str]) -> List[Dict[str, str]]:
    """Rows of ``-P``/``--parsable2``-style output without a header, as dicts over ``fields``."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append(dict(zip(fields, values + [""] * (len(fields) - len(values)))))
    return rows


def parse_key_values(text: str) -> Dict[str, str]:
    """``scontrol show -o`` output (one record): ``Key=Value`` words; a value may hold spaces
    only in the known free-text keys (Reason, Comment), which scontrol puts last or quotes."""
    found: Dict[str, str] = {}
    key = None
    for word in text.strip().split(" "):
        if "=" in word and not (key in ("Reason", "Comment") and not word.split("=", 1)[0].isalpha()):
            name, value = word.split("=", 1)
            if name and name[0].isupper():
                key = name
                found[key] = value
                continue
        if key is not None:
            found[key] += " " + word
    return found


class SlurmCli:
    def __init__(self, conf: Optional[str] = None, timeout_s: float = 30.0) -> None:
        self.conf = conf
        self.timeout_s = timeout_s

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: Optional[float] = None) -> Any:
        env = {"SLURM_CONF": self.conf} if self.conf else None
        rc, out, err = run_bounded(list(argv), timeout_s=timeout_s or self.timeout_s, env_update=env)
        if check and rc != 0:
            raise SlurmCommandError("%s failed (rc=%d): %s" % (" ".join(argv[:2]), rc, (err or out).strip()),
                                    command=list(argv), rc=rc, stderr=err.strip())
        return rc, out, err

    # -- the controller ---------------------------------------------------------------------
    def ping(self) -> None:
        """Raise ControllerUnreachableError naming the controller and port when it is down."""
        try:
            rc, out, err = self.run(["scontrol", "ping"], check=False)
        except CommandTimeoutError:
            # scontrol retries an address that drops its packets until the bound kills it.
            rc, out, err = 1, "", "no answer within %g s" % self.timeout_s
        if rc != 0 or " is UP" not in out:
            where = self.controller_address()
            said = ((out or err).strip() or "no answer").splitlines()[0]
            raise ControllerUnreachableError(
                "no Slurm controller answers at %s (%s). Start slurmctld there (the slurm_controller role), or fix "
                "the controller's host and port in slurm.conf" % (where, said),
                controller=where)

    def controller_address(self) -> str:
        """``host (address) port N`` from slurm.conf itself: the controller that does not answer
        cannot be asked (``scontrol show config`` needs it)."""
        conf: Dict[str, str] = {}
        try:
            with open(self.conf or DEFAULT_CONF, encoding="utf-8") as handle:
                for line in handle:
                    key, _sep, value = line.split("#", 1)[0].strip().partition("=")
                    if key in ("SlurmctldHost", "ControlMachine", "SlurmctldPort"):
                        conf.setdefault(key, value.strip())  # the primary: the first SlurmctldHost
        except OSError as exc:
            return "(slurm.conf %s unreadable: %s)" % (self.conf or DEFAULT_CONF, exc.strerror)
        host = conf.get("SlurmctldHost") or conf.get("ControlMachine") or "?"
        return "%s port %s" % (host, conf.get("SlurmctldPort", "6817"))

    # -- nodes and partitions ---------------------------------------------------------------
    def nodes(self) -> Dict[str, Dict[str, str]]:
        _rc, out, _err = self.run(["scontrol", "show", "node", "-o"])
        found = {}
        for line in out.splitlines():
            if line.strip() and not line.startswith("No nodes"):
                record = parse_key_values(line)
                found[record.get("NodeName", "")] = record
        return found

    def partitions(self) -> Dict[str, Dict[str, str]]:
        _rc, out, _err = self.run(["scontrol", "show", "partition", "-o"])
        return {r.get("PartitionName", ""): r for r in (parse_key_values(l) for l in out.splitlines() if l.strip())}

    def expand_hostlist(self, hostlist: str) -> List[str]:
        if not hostlist or hostlist in ("(null)", "None"):
            return []
        _rc, out, _err = self.run(["scontrol", "show", "hostnames", hostlist])
        return out.split()

    def update_node(self, name: str, state: str, reason: Optional[str] = None) -> None:
        argv = ["scontrol", "update", "NodeName=%s" % name, "State=%s" % state]
        if reason:
            argv.append("Reason=%s" % reason)
        self.run(argv)

    def reconfigure(self) -> None:
        self.run(["scontrol", "reconfigure"], timeout_s=max(self.timeout_s, 60))

    # -- accounting -------------------------------------------------------------------------
    def sacctmgr_show(self, entity: str, fields: Sequence[str], *where: str) -> List[Dict[str, str]]:
        _rc, out, _err = self.run(["sacctmgr", "--noheader", "--parsable2", "show", entity, *where,
                                   "format=%s" % ",".join(fields)])
        return parse_pipe_table(out, [f.lower() for f in fields])

    def sacctmgr(self, *args: str) -> None:
        self.run(["sacctmgr", "--immediate", *args])

    def accounting_address(self) -> str:
        """``host port N`` of slurmdbd from slurm.conf (AccountingStorageHost/Port), for the
        error that says which slurmdbd did not answer."""
        conf: Dict[str, str] = {}
        try:
            with open(self.conf or DEFAULT_CONF, encoding="utf-8") as handle:
                for line in handle:
                    key, _sep, value = line.split("#", 1)[0].strip().partition("=")
                    if key in ("AccountingStorageHost", "AccountingStoragePort"):
                        conf[key] = value.strip()
        except OSError as exc:
            return "(slurm.conf %s unreadable: %s)" % (self.conf or DEFAULT_CONF, exc.strerror)
        return "%s port %s" % (conf.get("AccountingStorageHost", "?"), conf.get("AccountingStoragePort", "6819"))

    def accounting_clusters(self) -> List[str]:
        """The clusters slurmdbd knows (``sacctmgr add cluster``)."""
        return [row["cluster"] for row in self.sacctmgr_show("cluster", ["Cluster"])]

    def accounting_qos(self) -> List[Dict[str, str]]:
        return self.sacctmgr_show("qos", ["Name", "GrpTRES", "MaxWall", "Priority"])

    def accounting_accounts(self) -> List[Dict[str, str]]:
        return self.sacctmgr_show("account", ["Account", "Descr", "Org"])

    def accounting_associations(self, cluster: str) -> List[Dict[str, str]]:
        """One cluster's associations: an account's own row has an empty ``user``."""
        return self.sacctmgr_show("association", ["Account", "User", "ParentName", "QOS"], "cluster=%s" % cluster)

    def accounting_users(self) -> List[Dict[str, str]]:
        return self.sacctmgr_show("user", ["User", "DefaultAccount"])

    # -- jobs -------------------------------------------------------------------------------
    SQUEUE_FIELDS = ("id", "name", "state", "reason", "nodes", "account", "partition", "user")

    def jobs_named(self, name: str) -> List[Dict[str, str]]:
        """Queued or running jobs (every user's) called ``name``."""
        _rc, out, _err = self.run(["squeue", "--noheader", "--name", name, "--states", "PENDING,RUNNING,CONFIGURING,"
                                   "COMPLETING,SUSPENDED,REQUEUED,RESIZING", "--format", "%i|%j|%T|%r|%N|%a|%P|%u"])
        return parse_pipe_table(out, self.SQUEUE_FIELDS)

    def job(self, job_id: str) -> Optional[Dict[str, str]]:
        rc, out, _err = self.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%i|%j|%T|%r|%N|%a|%P|%u"],
                                 check=False)
        rows = parse_pipe_table(out, self.SQUEUE_FIELDS) if rc == 0 else []
        return rows[0] if rows else None

    def queue_position(self, job_id: str, partition: str) -> int:
        """1 + the pending jobs ahead of ``job_id`` in its partition (by priority, squeue's order)."""
        _rc, out, _err = self.run(["squeue", "--noheader", "--states", "PENDING", "--partition", partition,
                                   "--sort", "-p,i", "--format", "%i"])
        ids = out.split()
        return ids.index(job_id) + 1 if job_id in ids else 0

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    SACCT_FIELDS = ("JobID", "JobName", "Account", "State", "ElapsedRaw", "AllocTRES", "NodeList", "ExitCode",
                    "Start", "End")

    def accounting(self, job_id: str) -> Optional[Dict[str, str]]:
        """The job's own record: the row whose JobID is ``job_id``, never one of its steps
        (``ID.batch`` runs on the first node only, and would name that node alone)."""
        _rc, out, _err = self.run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id,
                                   "--format", ",".join(self.SACCT_FIELDS)])
        rows = [r for r in parse_pipe_table(out, [f.lower() for f in self.SACCT_FIELDS]) if r["jobid"] == job_id]
        return rows[0] if rows else None

    def steps(self, job_id: str) -> List[Dict[str, str]]:
        _rc, out, _err = self.run(["sacct", "--noheader", "--parsable2", "--jobs", job_id,
                                   "--format", ",".join(self.SACCT_FIELDS)])
        return [r for r in parse_pipe_table(out, [f.lower() for f in self.SACCT_FIELDS]) if "." in r["jobid"]]

    # -- allocations held by a job (slurm_job) ------------------------------------------------
    def submit(self, options: Sequence[str]) -> str:
        """Submit a job that holds its allocation until signalled (_job_runner.HOLDER); its id."""
        _rc, out, _err = self.run(["sbatch", "--parsable", *options, "--wrap", HOLDER])
        return out.strip().split(";")[0]

    def signal_batch(self, job_id: str, signal: str) -> None:
        self.run(["scancel", "--batch", "--signal", signal, job_id])

    def last_accounting_named(self, name: str) -> Optional[Dict[str, str]]:
        """The accounting record of the newest job called ``name`` (any user, the last 30 days)."""
        _rc, out, _err = self.run(["sacct", "--noheader", "--parsable2", "--allocations", "--allusers",
                                   "--name", name, "--starttime", "now-30days",
                                   "--format", ",".join(self.SACCT_FIELDS)])
        rows = parse_pipe_table(out, [f.lower() for f in self.SACCT_FIELDS])
        return max(rows, key=lambda r: int(r["jobid"].split("_")[0]) if r["jobid"].split("_")[0].isdigit() else 0) \
            if rows else None
