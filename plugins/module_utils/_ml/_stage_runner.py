# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's decision and run: fingerprint the inputs, compare with the lock, say why,
run the command (linked to an MLflow run), and record the success atomically.

The runner every module shares (ObjectRunner): each side effect goes through
``self.tracker.act``, so check mode takes the same decision from the same reads and skips
the writes in one place; MLflow is only read then (reachability, the reuse search). Where
check mode must decide otherwise (it does not wait for processes, it stops before the
command), the branch says why. The judgement itself (key, reasons) is _stage_reasons'.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .._core._atomic_file import write_bytes_atomic
from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from ._stage_fingerprint import StageFingerprint, base_env
from ._stage_hash import Hasher, StatCache, choose_algorithm, special_kind
from ._stage_lock import FileLock, StageBusyError, StageFiles, open_private, remove_path
from ._stage_proc import (TOKEN_VAR, RunRecord, describe, still_running, stop_group, supervised_argv,
                          wait_for_exit)
from ._stage_reasons import inputs_digest, lock_summary, run_reasons, stage_key, summary_line
from ._stage_tree import (describe_listing, left_behind, listing, new_run_token, processes_of_stage,
                          stage_id, stop_run, wait_gone)
from ._stage_spec import StageSpec

# Seconds the command gets between SIGTERM and SIGKILL when it is stopped (timeout, a
# signal to ml_stage, ml_stage's death).
STOP_GRACE = 10.0
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class StageFailed(KvmError):
    """The command ran and failed (or did not produce its outputs); the lock is untouched."""

    # The status the stage's MLflow run ends with.
    mlflow_status = "FAILED"


class StageInterrupted(StageFailed):
    """ml_stage got SIGHUP/SIGTERM/SIGINT while the command ran; the command was stopped."""

    mlflow_status = "KILLED"


class _Signalled(BaseException):
    """Raised by the signal handler to leave the wait for the command."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:]) if lines else ""


class StageRunner(ObjectRunner):
    def __init__(self, module: Any) -> None:
        spec = StageSpec(module.params)  # the options checked and completed, once
        files = StageFiles(spec.state_dir, spec.name)
        super().__init__(module, files)
        self.spec = spec
        self.files = files
        self.diff_mode = bool(module._diff)
        self.warn = module.warn
        self.record = RunRecord(self.files.running)
        # What every process of this stage's runs carries in its token (see _stage_tree).
        self.stage_id = stage_id(spec.state_dir, spec.name)
        # Why the run fails because of processes its command left behind (None: it does not).
        self._leftover_problem: Optional[str] = None
        # The MLflow run of the command being run (for the run record).
        self._run_mlflow: Optional[Dict[str, Any]] = None
        # When the command started and ended (time.time()), for the metrics textfile.
        self._cmd_started: Optional[float] = None
        self._cmd_ended: Optional[float] = None

    # -- the sequence (ObjectRunner.run: validate, converge) ------------------------------
    def converge(self) -> Dict[str, Any]:
        """Under the stage's flock, which check mode does not take (it writes nothing)."""
        flock = FileLock(self.files.flock, self.spec.name, self.spec.lock_timeout)
        self.tracker.act("take the stage's lock %s" % self.files.flock, flock.acquire)
        try:
            return self._converge_locked()
        finally:
            flock.release()  # nothing to release when it was not taken

    def _converge_locked(self) -> Dict[str, Any]:
        """What a cut-short run left, the stage, then the run statistics (still under the
        flock, so two runs never interleave their counters; check mode updates none)."""
        recorded_token = (self.record.read() or {}).get("token")
        recovered = self._recover()
        self._refuse_earlier_processes(recorded_token)
        try:
            result = self._stage()
        except StageFailed as exc:
            if recovered:
                exc.details["interrupted_run"] = recovered
            exc.details["metrics_textfile"] = self._update_metrics(
                "failure", duration=exc.details.get("duration"),
                mlflow_run_id=exc.details.get("mlflow_run_id"))
            raise
        if result.get("ran") or result.get("reused_from"):
            outcome = "success"
        else:
            outcome = "skipped"  # up to date, or frozen although due: never a success
        result["metrics_textfile"] = self._update_metrics(
            outcome, duration=result.get("duration"),
            mlflow_run_id=result.get("mlflow_run_id") or result.get("reused_from"))
        return self._with_recovery(result, recovered)

    def report_partial(self, err: KvmError) -> None:
        """ml_stage's failures say themselves what the run did (``changed``, ``ran``, the lock
        kept, the MLflow run ended) in the keys its RETURN documents, so the base adds no
        ``actions`` and no "already done" to them."""

    # -- a run that was cut short -------------------------------------------------------
    def _recover(self) -> Optional[Dict[str, Any]]:
        """Deal with what an earlier run that was cut short left behind, before deciding.

        Its processes (found by the run's token): wait for them up to lock_timeout, then
        fail naming them, so no second copy starts. Its MLflow run, left RUNNING: ended
        KILLED. Check mode only reads (and fails the same way when it would not wait).
        """
        prev = self.record.read()
        if prev is None:
            return None
        spec = self.spec
        token = prev.get("token")
        info: Dict[str, Any] = {k: prev.get(k) for k in ("started", "host", "module_pid", "pid", "cmd")}
        info["mlflow_run_id"] = (prev.get("mlflow") or {}).get("run_id")
        # Check mode does not wait: it answers now. It fails the same way where a real run
        # would not wait either (lock_timeout 0), and warns where a real run would.
        wait = 0 if self.check else spec.lock_timeout
        left = wait_for_exit(token, wait) if token else []
        if left and (not self.check or spec.lock_timeout <= 0):
            raise StageBusyError(
                "stage %s: the command of an earlier run that was cut short is still running: "
                "%s (started %s by ml_stage pid %s, which is gone). ml_stage does not start a "
                "second copy: wait for it to end (option lock_timeout, waited %s s), or stop it "
                "(kill -TERM %s) and run again"
                % (spec.name, describe(left), prev.get("started"), prev.get("module_pid"),
                   wait, " ".join(str(p) for p in left)),
                changed=False, lock_file=self.files.running, pids=left)
        if left:  # check mode, where the real run would wait up to lock_timeout
            info["still_running"] = left
            self.warn("stage %s: %s of an earlier, cut-short run still run(s); a real run waits "
                      "up to %s s (lock_timeout) for them" % (spec.name, describe(left), spec.lock_timeout))
        info["mlflow"] = self._end_open_mlflow_run(prev, info)
        self._drop_run_record()
        self.warn("stage %s: the run started %s by ml_stage pid %s was cut short (no result was "
                  "recorded; its outputs do not count); MLflow: %s"
                  % (spec.name, prev.get("started"), prev.get("module_pid"), info["mlflow"]))
        return info

    def _refuse_earlier_processes(self, recorded_token: Optional[str]) -> None:
        """Processes of any earlier run of this stage that still run, whatever became of that
        run's records (a state directory wiped, processes that could not be stopped): wait for
        them up to lock_timeout, then refuse naming them, so a run, forced or not, never starts
        a second copy beside them. Those of the recorded cut-short run are _recover's.
        Check mode refuses the same way, or warns where a real run would wait."""
        spec = self.spec
        # Check mode does not wait (as in _recover).
        wait = 0 if self.check else spec.lock_timeout
        pids = processes_of_stage(self.stage_id, exclude_token=recorded_token)
        if pids and wait > 0:
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = processes_of_stage(self.stage_id, exclude_token=recorded_token)
        if not pids:
            return
        procs = listing(pids)
        if self.check and spec.lock_timeout > 0:  # a real run would have waited for them
            self.warn("stage %s: %s of an earlier run still run(s); a real run waits up to %s s "
                      "(lock_timeout) for them" % (spec.name, describe_listing(procs), spec.lock_timeout))
            return
        raise StageBusyError(
            "stage %s: processes of an earlier run of this stage still run: %s. ml_stage does not "
            "start a run beside them: wait for them to end (option lock_timeout, waited %s s), or "
            "stop them (kill -TERM %s) and run again"
            % (spec.name, describe_listing(procs), wait, " ".join(str(p) for p in pids)),
            changed=False, pids=pids, leftover_processes=procs)

    def _end_open_mlflow_run(self, prev: Dict[str, Any], info: Dict[str, Any]) -> str:
        """End the MLflow run a cut-short run left RUNNING; says what was (or would be) done."""
        rec = prev.get("mlflow") or {}
        run_id, uri = rec.get("run_id"), (rec.get("tracking_uri") or "").rstrip("/")
        if not run_id:
            return "no run was open"
        m = self.spec.mlflow
        if m is None or m.tracking_uri.rstrip("/") != uri:
            return ("run %s on %s was left as it is (not this stage's tracking server now); end "
                    "it there by hand" % (run_id, uri))
        from ._stage_mlflow import MlflowClient, MlflowError
        client = MlflowClient.for_stage(m)
        try:
            status = client.get_run(run_id)["info"]["status"]
            if status not in ("RUNNING", "SCHEDULED"):
                return "run %s was already %s" % (run_id, status)
            info["mlflow_ended"] = True
            self.tracker.act("end MLflow run %s KILLED" % run_id, client.fail_run, run_id, "KILLED",
                             "cut short: ml_stage pid %s stopped before the run ended" % prev.get("module_pid"))
            if self.check:  # the words only: what a real run would do
                return "run %s is %s and would be ended KILLED" % (run_id, status)
            return "run %s was %s; ended KILLED" % (run_id, status)
        except (MlflowError, KeyError, TypeError) as exc:
            return "run %s could not be ended (%s); end it by hand" % (run_id, getattr(exc, "msg", exc))

    @staticmethod
    def _with_recovery(result: Dict[str, Any], recovered: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        result["interrupted_run"] = recovered
        if recovered and recovered.get("mlflow_ended"):
            result["changed"] = True  # an MLflow run was (or would be) ended
        return result

    # -- side effects of more than one step ---------------------------------------------
    def _update_metrics(self, outcome: str, duration: Optional[float],
                        mlflow_run_id: Optional[str]) -> Optional[str]:
        """The run statistics and textfile updated; their path (None in check mode)."""
        return self.tracker.act("update the run statistics (%s)" % outcome, self._record_metrics,
                                outcome, duration, mlflow_run_id)

    def _drop_run_record(self) -> None:
        self.tracker.act("remove the run record %s" % self.files.running, self.record.remove)

    def _end_mlflow_run(self, tracker: Any, status: str, lock_doc: Optional[Dict[str, Any]],
                        failure: Optional[str], metrics: Optional[Dict[str, float]] = None) -> None:
        if tracker:
            self.tracker.act("end the MLflow run %s" % status, tracker.finish, status, lock_doc,
                             failure, metrics)

    def _write_lock(self, lock_doc: Dict[str, Any], manifest: Dict[str, Any], cache: StatCache) -> None:
        """The lock and manifest of a success written, the hash cache saved."""
        self.tracker.act("write the lock %s" % self.files.lock, self.files.write, lock_doc, manifest)
        self._save_cache(cache)

    def _save_cache(self, cache: StatCache) -> None:
        self.tracker.act("save the stat cache %s" % self.files.statcache, cache.save)

    def _record_metrics(self, outcome: str, duration: Optional[float],
                        mlflow_run_id: Optional[str]) -> Optional[str]:
        """Update the run statistics and the textfile; a problem is a warning, never a failure."""
        spec = self.spec
        if not spec.metrics_textfile_dir:
            return None
        from ._stage_metrics import StageMetrics
        metrics = StageMetrics(spec.metrics_textfile_dir, spec.name, spec.metrics_labels,
                               self.files.runstats, self.warn)
        if duration is None and self._cmd_ended is not None and self._cmd_started is not None:
            duration = self._cmd_ended - self._cmd_started
        try:
            return metrics.record(outcome, lock=self.files.read_lock()[0], ended=self._cmd_ended,
                                  duration=duration, mlflow_run_id=mlflow_run_id)
        except Exception as exc:  # observability must not turn a run into a failure
            self.warn("ml_stage metrics: could not update %s (%s: %s); the stage's result is "
                      "unaffected" % (metrics.path, type(exc).__name__, exc))
            return None

    # -- the stage ------------------------------------------------------------------------
    def _stage(self) -> Dict[str, Any]:
        spec = self.spec
        started = time.monotonic()
        lock, problem = self.files.read_lock()
        previous_algo = (lock or {}).get("inputs", {}).get("algorithm")
        try:
            algo = choose_algorithm(spec.hash_algorithm, previous_algo,
                                    collision_resistant=bool(spec.mlflow and spec.mlflow.reuse))
        except ValueError as exc:
            raise InvalidInputError("hash_algorithm", spec.hash_algorithm, str(exc),
                                    "install the package on the target host, or use auto")
        cache = StatCache(self.files.statcache, algo)
        fingerprint = StageFingerprint(spec, Hasher(cache))
        inputs, git_info, outs_now = fingerprint.read()
        key = stage_key(inputs)
        reasons = run_reasons(self.files, spec, lock, problem, inputs, git_info, outs_now, fingerprint.hasher)
        previous_key = (lock or {}).get("key")
        result: Dict[str, Any] = {
            "changed": False, "ran": False, "would_run": bool(reasons), "reasons": reasons,
            "key": key, "previous_key": previous_key, "algorithm": algo,
            "lock_file": self.files.lock, "frozen": spec.frozen,
            "deps": inputs["deps"], "outs": outs_now, "params_file": spec.params_file,
            "mlflow": {"enabled": bool(spec.mlflow), "run_id": None}, "mlflow_run_id": None,
            "hashing": dict(cache.stats, seconds=round(time.monotonic() - started, 3)),
            "mps": dict(spec.mps.summary(), daemon=None) if spec.mps else None,
            "runtime_env": spec.runtime_env,
            "inputs_digest": inputs_digest(inputs),
            "code_python": inputs["code"].get("python"),
        }
        result["summary"] = summary_line(reasons, spec.frozen, key, inputs, outs_now)
        if self.diff_mode and reasons:
            result["diff"] = {"before": lock_summary(lock) if lock else {},
                              "after": lock_summary({"key": key, "inputs": inputs, "outs": None})}
        if not reasons or spec.frozen:
            # What the last successful run recorded, so a summary of a skipped stage still
            # shows its figures and the MLflow run that made its outputs.
            last_run = (lock or {}).get("run") or {}
            result["metrics"] = (lock or {}).get("metrics") or {}
            result["last_run"] = last_run
            result["last_mlflow_run_id"] = (last_run.get("mlflow") or {}).get("run_id")
            if spec.frozen and reasons:
                self.warn("stage %s is frozen: not running although %s" % (spec.name, "; ".join(reasons)))
            self._save_cache(cache)
            return result
        result["changed"] = True
        if spec.mps:  # before MLflow is contacted: a stage that cannot run makes no run there
            self._check_mps(result)
        tracker = None
        if spec.mlflow:
            from ._stage_track import StageTracker  # only for a stage that is about to run
            tracker = StageTracker(spec, self.files, self.check, self.warn)
            tracker.connect()
        reuse = tracker.find_reuse(key, algo) if tracker else None
        # Check mode stops before the run: what the command (or a fetch of the reused outputs)
        # would produce cannot be predicted, and every step from here on needs it.
        if self.check:
            if reuse:
                result["reuse_from"] = reuse.run_id
            return result
        manifest = fingerprint.input_manifests(inputs)  # as the inputs are now, before the run
        if reuse and self.tracker.act("fetch the outs of MLflow run %s" % reuse.run_id, tracker.fetch, reuse):
            lock_doc, manifest = fingerprint.lock_doc(key, inputs, git_info, manifest, None, {},
                                                      reused_from=reuse.run_id)
            self._write_lock(lock_doc, manifest, cache)
            result.update(outs=lock_doc["outs"], reused_from=reuse.run_id)
            result["reasons"] = reasons + ["reused the outputs of MLflow run %s (same key, %s)"
                                           % (reuse.run_id, tracker.trust())]
            return result
        return self._execute(result, tracker, key, previous_key, inputs, git_info,
                             fingerprint, manifest, reasons)

    def _check_mps(self, result: Dict[str, Any]) -> None:
        """A due stage under MPS needs its daemon. A real run fails without it; check mode
        reports and warns instead, because in a check run the play's nvidia_mps role only
        predicted the start of the daemon that a real run of the same play would have."""
        mps = self.spec.mps
        if mps is None:  # only called for a stage with mps
            raise KvmError("ml_stage: the MPS check ran for a stage without mps")
        problem = mps.daemon_problem()
        result["mps"]["daemon"] = "ok: %s is a socket" % mps.control_socket if problem is None else problem
        if problem is None:
            return
        if not self.check:  # a real run fails here (see above); check mode only warns
            mps.check_daemon()
        self.warn("stage %s: mps.pipe_directory %s %s; a real run fails here unless the daemon "
                  "runs by then" % (self.spec.name, mps.pipe_directory, problem))

    # -- running ------------------------------------------------------------------------
    def _execute(self, result: Dict[str, Any], tracker: Any, key: str,
                 previous_key: Optional[str], inputs: Dict[str, Any], git_info: Dict[str, Any],
                 fingerprint: StageFingerprint, manifest: Dict[str, Any], reasons: List[str]) -> Dict[str, Any]:
        """Run the command and, when it succeeded, write the lock: environment, workspace, the
        command, its verdict, then the record of the run."""
        env = self._command_env(result, tracker, key, previous_key, git_info, fingerprint.hasher.algo, reasons)
        self._prepare_workspace()
        rc, timed_out, cmd_started, duration = self._run_command(env, tracker, result)
        failure = self._failure(rc, timed_out)
        metrics: Dict[str, float] = {}
        if failure is None and self.spec.metrics_file:
            try:
                metrics = _read_metrics(self.spec.abspath(self.spec.metrics_file))
            except (OSError, ValueError) as exc:
                failure = "metrics_file %s is not a JSON (or YAML) document: %s" % (self.spec.metrics_file, exc)
        if failure is not None:
            self._fail(result, tracker, failure)
        return self._record_success(result, tracker, key, inputs, git_info, fingerprint, manifest, metrics,
                                    cmd_started, duration)

    def _command_env(self, result: Dict[str, Any], tracker: Any, key: str, previous_key: Optional[str],
                     git_info: Dict[str, Any], algo: str, reasons: List[str]) -> Dict[str, str]:
        """The command's environment: the module's, the stage's, MPS, the stage's identity and,
        when tracked, the MLflow run it logs to (started here)."""
        spec = self.spec
        env = base_env(spec)
        env.update(spec.runtime_env)
        if spec.mps:
            spec.mps.apply(env)
        env.update(ML_STAGE_NAME=spec.name, ML_STAGE_KEY=key)
        if spec.params_file:
            env["ML_STAGE_PARAMS"] = spec.abspath(spec.params_file)
        if tracker:
            from ._stage_track import TELEMETRY_OFF, apply_tls_env
            env.update(self.tracker.act("start an MLflow run", tracker.start, key, previous_key, reasons,
                                        algo, git_info.get("commit")))
            for name, value in TELEMETRY_OFF.items():  # the stage's env (or the module's) may say otherwise
                env.setdefault(name, value)
            if tracker.run_id:  # an untracked command gets no MLflow URI, so no TLS settings either
                apply_tls_env(tracker.m, env)
            result["mlflow"] = tracker.summary()
            result["mlflow_run_id"] = tracker.run_id
        env[TOKEN_VAR] = new_run_token(self.stage_id)
        return env

    def _prepare_workspace(self) -> None:
        """The params file written, declared outs removed when clean_outs says so, the state
        directory made."""
        spec = self.spec
        if spec.params_file:
            self.tracker.act("write params_file %s" % spec.params_file, write_bytes_atomic,
                             spec.abspath(spec.params_file),
                             (json.dumps(spec.params, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        if spec.clean_outs:
            for out in spec.outs:
                self.tracker.act("remove out %s (clean_outs)" % out, remove_path, spec.abspath(out))
        self.tracker.act("create state_dir %s" % spec.state_dir, os.makedirs, spec.state_dir, exist_ok=True)

    def _run_command(self, env: Dict[str, str], tracker: Any,
                     result: Dict[str, Any]) -> Tuple[int, bool, float, float]:
        """Spawn and wait: (rc, timed out, start time, duration). A spawn that fails outright
        ends the MLflow run and the run record (unless the command still runs) and re-raises."""
        cmd_started = self._cmd_started = time.time()
        t0 = time.monotonic()
        if tracker and tracker.run_id:
            self._run_mlflow = {k: result["mlflow"][k] for k in ("run_id", "experiment_id", "tracking_uri")}
        try:
            rc, timed_out = self.tracker.act("run the command", self._spawn, env)
        except StageFailed as exc:
            self._cmd_ended = time.time()
            self._end_mlflow_run(tracker, exc.mlflow_status, None, exc.msg)
            if not exc.details.get("still_running"):
                self._drop_run_record()
            raise
        self._leftover_problem = self._deal_with_leftovers(env[TOKEN_VAR], t0, timed_out, result)
        self._cmd_ended = time.time()
        duration = round(time.monotonic() - t0, 3)
        result.update(ran=True, rc=rc, duration=duration,
                      stdout_tail=_tail(self.files.stdout, self.spec.tail_lines),
                      stderr_tail=_tail(self.files.stderr, self.spec.tail_lines),
                      stdout_log=self.files.stdout, stderr_log=self.files.stderr)
        return rc, timed_out, cmd_started, duration

    def _deal_with_leftovers(self, token: str, t0: float, timed_out: bool,
                             result: Dict[str, Any]) -> Optional[str]:
        """The processes the command left when it exited (a daemon, a background job), found by
        the run's token, handled as leftover_processes says; why the run fails because of them
        (None: it does not). Whatever the policy, none is left running when this returns, unless
        it could not be stopped (then the next run refuses while it lives)."""
        spec = self.spec
        pids = left_behind(token)
        if not pids:
            return None
        procs = listing(pids)
        result["leftover_processes"] = procs
        policy = spec.leftover_processes
        if policy == "wait" and not timed_out:
            remaining = None if not spec.timeout else spec.timeout - (time.monotonic() - t0)
            if not wait_gone(token, remaining):
                return None
        not_stopped = stop_run(token, STOP_GRACE)
        what = ("cmd left %s running after it exited" % describe_listing(procs))
        if not_stopped:
            done = ("they were sent SIGTERM and SIGKILL but %s still run(s); the next run refuses "
                    "to start while they do" % describe(not_stopped))
        else:
            done = "they were stopped (SIGTERM, SIGKILL after %g s)" % STOP_GRACE
        if policy == "wait" and not timed_out:
            return ("%s and they still ran when the timeout of %s s passed; %s"
                    % (what, spec.timeout, done))
        if policy == "kill" and not not_stopped:
            self.warn("stage %s: %s; %s (leftover_processes: kill)" % (spec.name, what, done))
            return None
        return ("%s; %s. A daemon of the stage would go on writing its outputs beside the next run: "
                "keep the work in the foreground until it is done, or set leftover_processes "
                "(wait, kill)" % (what, done))

    def _failure(self, rc: int, timed_out: bool) -> Optional[str]:
        """Why the finished command's run counts as failed; None when it succeeded. Processes
        it left behind are named after the command's own failure, if any."""
        own = self._command_failure(rc, timed_out)
        if own and self._leftover_problem:
            return "%s; %s" % (own, self._leftover_problem)
        return own or self._leftover_problem

    def _command_failure(self, rc: int, timed_out: bool) -> Optional[str]:
        """Why the command's own run counts as failed (its status, its outputs); None when not."""
        spec = self.spec
        if timed_out:
            return "cmd timed out after %s s (option timeout) and was killed" % spec.timeout
        if rc != 0:
            return "cmd exited with rc %s" % rc
        missing = [o for o in spec.outs if not os.path.exists(spec.abspath(o))]
        if missing:
            return ("cmd exited 0 but did not produce the declared out(s) %s; the run counts "
                    "as failed (fix the command or the outs option)" % ", ".join(missing))
        special = [o for o in spec.outs if special_kind(os.stat(spec.abspath(o)).st_mode)]
        if special:
            return ("cmd made the out(s) %s a FIFO, device or socket, which ml_stage does not "
                    "read (it could hang); the run counts as failed (write regular files)" % ", ".join(special))
        return None

    def _fail(self, result: Dict[str, Any], tracker: Any, failure: str) -> None:
        """End the MLflow run FAILED, drop the run record, keep the previous lock, and raise."""
        self._end_mlflow_run(tracker, "FAILED", None, failure)
        self._drop_run_record()
        details = {k: result.get(k) for k in ("rc", "duration", "stdout_tail", "stderr_tail",
                                              "stdout_log", "stderr_log", "reasons", "key",
                                              "previous_key", "mlflow", "mlflow_run_id",
                                              "leftover_processes")}
        raise StageFailed("stage %s failed: %s; the previous lock is kept" % (self.spec.name, failure),
                          changed=True, ran=True, lock_file=self.files.lock, **details)

    def _record_success(self, result: Dict[str, Any], tracker: Any, key: str, inputs: Dict[str, Any],
                        git_info: Dict[str, Any], fingerprint: StageFingerprint, manifest: Dict[str, Any],
                        metrics: Dict[str, float], cmd_started: float, duration: float) -> Dict[str, Any]:
        """The lock and manifest written, the hash cache saved, the MLflow run ended FINISHED."""
        # The run the command logged to, as _run_command recorded it (None when untracked).
        lock_doc, manifest = fingerprint.lock_doc(key, inputs, git_info, manifest, self._run_mlflow,
                                                  metrics, cmd_started=cmd_started, duration=duration)
        self._write_lock(lock_doc, manifest, fingerprint.hasher.cache)
        result.update(outs=lock_doc["outs"], metrics=metrics)
        try:
            self._end_mlflow_run(tracker, "FINISHED", lock_doc, None, metrics)
        finally:
            self._drop_run_record()
        return result

    def _check_executable(self, env: Dict[str, str]) -> None:
        """Refuse a command that cannot start, before anything is spawned (the supervisor
        would start fine and only then fail to start it)."""
        spec = self.spec
        prog = (spec.launcher or spec.cmd)[0]
        if os.sep in prog:
            found = os.path.join(spec.chdir, prog)
            ok = os.path.isfile(found) and os.access(found, os.X_OK)
        else:
            ok = shutil.which(prog, path=env.get("PATH", os.defpath)) is not None
        if not ok:
            raise StageFailed("option cmd: %s could not be started (not found or not executable "
                              "from %s with the command's PATH); install it or fix the path"
                              % (prog, spec.chdir), changed=False)

    def _spawn(self, env: Dict[str, str]) -> Tuple[int, bool]:
        """Run the command under the supervisor; (rc, timed_out). A signal to ml_stage stops
        the command and raises StageInterrupted."""
        spec = self.spec
        self._check_executable(env)
        argv = supervised_argv(sys.executable, spec.launcher + spec.cmd, STOP_GRACE)
        # The handlers go in before the command starts: a signal that came between its start and
        # the handlers (the running record's fsync can take seconds on a loaded host) ended the
        # module with no result. Until the record is written a signal is held, then acted on.
        held: List[int] = []
        armed = False

        def on_signal(signum: int, frame: Any) -> None:
            if not armed:
                held.append(signum)
                return
            raise _Signalled(signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
        try:
            with open_private(self.files.stdout) as out, open_private(self.files.stderr) as err:
                try:
                    proc = subprocess.Popen(argv, cwd=spec.chdir, env=env, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=err, start_new_session=True)
                except OSError as exc:
                    raise StageFailed("option cmd: %s could not be started (%s); install it or fix "
                                      "the path" % (spec.cmd[0], exc), changed=False)
            try:
                self.tracker.act("record the run in %s" % self.files.running, self.record.write,
                                 env[TOKEN_VAR], proc.pid, spec.launcher + spec.cmd, self._run_mlflow)
                armed = True
                if held:
                    raise _Signalled(held[0])
                return proc.wait(timeout=spec.timeout or None), False
            except subprocess.TimeoutExpired:
                return stop_group(proc, STOP_GRACE), True
            except _Signalled as exc:
                for sig in STOP_SIGNALS:  # a second signal must not cut the clean-up short
                    signal.signal(sig, signal.SIG_IGN)
                stop_group(proc, STOP_GRACE)
                raise self._interrupted(exc.signum, env[TOKEN_VAR])
            except BaseException:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _interrupted(self, signum: int, token: str) -> StageInterrupted:
        name = signal.Signals(signum).name
        left = still_running(token)
        why = {"SIGHUP": "the connection to the controller dropped, or ansible-playbook was killed",
               "SIGINT": "interrupted from the keyboard", "SIGTERM": "asked to stop"}.get(name, "")
        msg = ("stage %s was interrupted by %s (%s) while its command ran; the command was stopped "
               "and the previous lock is kept" % (self.spec.name, name, why))
        if left:
            msg += ("; these processes of the run left its process group and still run: %s (the "
                    "next run waits for them or refuses)" % describe(left))
        return StageInterrupted(msg, changed=True, ran=True, interrupted_by=name,
                                still_running=left, lock_file=self.files.lock)


def _read_metrics(path: str) -> Dict[str, float]:
    from ._stage_mlflow import numeric_metrics
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8")
    try:
        data = json.loads(raw)
    except ValueError as json_error:
        try:
            import yaml  # type: ignore
        except ImportError:
            raise json_error
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(str(exc))
    if not isinstance(data, dict):
        raise ValueError("the document is not a mapping of metric names to numbers")
    return numeric_metrics(data)
