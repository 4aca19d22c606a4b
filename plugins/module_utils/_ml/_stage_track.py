# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The MLflow side of one ml_stage run: reachability, the reuse search and fetch, the
run, its params, metrics, artifacts and final status.

Imported only when the stage has an ``mlflow`` option and is about to run (a skipped
stage never loads it, and makes no MLflow call).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from .._core._errors import KvmError
from ._stage_hash import Hasher, StatCache
from ._stage_lock import StageFiles, remove_path
from ._stage_mlflow import MlflowClient, MlflowError, param_value
from ._stage_sign import (KEY_ID_TAG, LOCK_ARTIFACT, SIGNATURE_ARTIFACT, UntrustedLock, check_pins,
                          key_id, signature, verify_signature)
from ._stage_spec import MLFLOW_CERT_ENV, MLFLOW_INSECURE_ENV, MLFLOW_TLS_ENV, MlflowSpec, StageSpec, flatten

LOG_ARTIFACT_LIMIT = 10 * 1024 * 1024
# Given to a tracked command unless its environment already sets them. MLflow 3's client starts
# a thread that fetches a telemetry config from the internet; where that fails (an on-premise
# network without a route out) the thread removes _MLFLOW_TELEMETRY_SESSION_ID from os.environ
# while the command's HTTP client may be iterating os.environ: the lab's train stage died once
# with "API request to .../runs/get failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'".
TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true"}
TAG_KEY = "mlinfra.stage.key"


def apply_tls_env(m: MlflowSpec, env: Dict[str, str]) -> None:
    """Let the command's mlflow client verify the server as the module does.

    mlflow.ca_path: MLFLOW_TRACKING_SERVER_CERT_PATH (requests' ``verify``); an inherited
    MLFLOW_TRACKING_INSECURE_TLS is dropped, since MLflow refuses the two together (the task's
    own env cannot hold either: StageSpec refuses that). validate_certs false:
    MLFLOW_TRACKING_INSECURE_TLS=true, unless the environment already says how to verify (a
    task that set MLFLOW_TRACKING_SERVER_CERT_PATH itself before ca_path existed keeps working)."""
    if not m.validate_certs:
        if not any(name in env for name in MLFLOW_TLS_ENV):
            env[MLFLOW_INSECURE_ENV] = "true"
    elif m.ca_path:
        env.pop(MLFLOW_INSECURE_ENV, None)
        env[MLFLOW_CERT_ENV] = m.ca_path


def artifact_name(out: str) -> str:
    """Where an out is uploaded in the run's artifacts (no '..' or leading '/')."""
    parts = out.replace(os.sep, "/").split("/")
    if out.startswith("/"):
        parts = ["_abs"] + [p for p in parts if p]
    return "outs/" + "/".join("_up_" if p == ".." else p for p in parts)


class Reuse(NamedTuple):
    """A run whose outs may replace running the command: its id, where its artifacts are
    served, and its lock, already checked against the signing key and the pins."""
    run_id: str
    root: str
    lock: Dict[str, Any]


def _tail_bytes(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read()


class StageTracker:
    def __init__(self, spec: StageSpec, files: StageFiles, check_mode: bool,
                 warn: Callable[[str], None]) -> None:
        m = spec.mlflow
        if m is None:
            raise AssertionError("StageTracker needs a stage with mlflow set")
        self.spec = spec
        self.m = m
        self.files = files
        self.check = check_mode
        self.warn = warn
        self.client: Optional[MlflowClient] = MlflowClient.for_stage(m)
        self.experiment_id: Optional[str] = None
        self.run_info: Optional[Dict[str, Any]] = None

    @property
    def run_id(self) -> Optional[str]:
        return self.run_info["run_id"] if self.run_info else None

    def _untracked(self, exc: MlflowError, what: str) -> None:
        """Optional tracking: warn and carry on without it. Required: fail, not run."""
        if not self.m.optional and exc.certificate:
            raise KvmError("option mlflow.ca_path: %s; the command was not run" % exc.msg, **exc.details)
        if not self.m.optional:
            raise KvmError("option %s: %s; the command was not run. Start or fix the server, "
                           "or set mlflow.optional: true to run without tracking" % (what, exc.msg),
                           **exc.details)
        self.warn("%s; running without MLflow tracking (mlflow.optional is true)" % exc.msg)
        self.client = None

    def connect(self) -> bool:
        """Reachability and the experiment, before anything runs (check mode creates none)."""
        try:
            self.client.health()
            self.experiment_id = self.client.experiment_id(self.m.experiment, create=not self.check)
            return True
        except MlflowError as exc:
            self._untracked(exc, "mlflow.tracking_uri")
            return False

    def find_reuse(self, key: str, algo: str) -> Optional[Reuse]:
        """The newest FINISHED run of the same key whose outs were uploaded and whose lock
        this task trusts (docs: _stage_sign). Reads only, so check mode predicts the same."""
        if not self.client or not self.m.reuse or self.experiment_id is None:
            return None
        flt = ("tags.`%s` = '%s' and tags.`mlinfra.stage.outs_uploaded` = 'true' "
               "and attributes.status = 'FINISHED'" % (TAG_KEY, key))
        if self.m.signing_key:  # runs signed with another key (or none) are no candidates
            flt += " and tags.`%s` = '%s'" % (KEY_ID_TAG, key_id(self.m.signing_key))
        try:
            runs = self.client.search_runs([self.experiment_id], flt, max_results=5)
        except MlflowError as exc:
            self.warn("MLflow search for a run with key %s failed: %s" % (key, exc.msg))
            return None
        for run in runs:
            try:
                return self._trusted(run, key, algo)
            except (UntrustedLock, KvmError, OSError, ValueError) as exc:
                self.warn("not reusing MLflow run %s: %s" % (run["info"]["run_id"], getattr(exc, "msg", exc)))
        return None

    def _trusted(self, run: Dict[str, Any], key: str, algo: str) -> Reuse:
        """The run with its lock, once the lock's signature (mlflow.signing_key) and pins hold."""
        root = self.client.artifact_root(run["info"].get("artifact_uri", ""))
        if root is None:
            raise KvmError("its artifacts are not served by the tracking server")
        body = self.client.read(root, LOCK_ARTIFACT)
        if self.m.signing_key:
            try:
                sig = self.client.read(root, SIGNATURE_ARTIFACT)
            except MlflowError as exc:  # missing, or unreadable: either way not trusted
                raise UntrustedLock("its lock's signature %s could not be read (%s)"
                                    % (SIGNATURE_ARTIFACT, exc.msg))
            verify_signature(self.m.signing_key, body, sig)
        lock = json.loads(body.decode("utf-8"))
        if not isinstance(lock, dict) or lock.get("key") != key \
                or (lock.get("inputs") or {}).get("algorithm") != algo:
            raise KvmError("its lock does not carry key %s (algorithm %s)" % (key, algo))
        check_pins(lock, self.m.reuse_pins)
        return Reuse(run["info"]["run_id"], root, lock)

    def trust(self) -> str:
        """Why the reused lock is trusted, for the task's reasons."""
        why = []
        if self.m.signing_key:
            why.append("its lock signed with key id %s" % key_id(self.m.signing_key))
        if self.m.reuse_pins:
            why.append("its outs match mlflow.reuse_pins")
        return " and ".join(why)

    def fetch(self, reuse: Reuse) -> bool:
        """Download the outs of the run find_reuse chose into a staging dir, verify every
        hash against its trusted lock, then move them into place. False (and a warning)
        on any doubt."""
        spec, client, root, remote = self.spec, self.client, reuse.root, reuse.lock
        staging = os.path.join(spec.state_dir, "%s.fetch.%d" % (spec.name, os.getpid()))
        # find_reuse checked the lock's algorithm against the stage's; staging paths stay out
        # of the stage's stat cache.
        verifier = Hasher(StatCache(None, remote["inputs"]["algorithm"]))
        try:
            staged = {}
            for out in spec.outs:
                entry = (remote.get("outs") or {}).get(out)
                if not entry:
                    raise KvmError("its lock records no out %s" % out)
                dest = os.path.join(staging, "o%d" % len(staged))
                if entry["kind"] == "dir":
                    os.makedirs(dest, exist_ok=True)
                    client.download_tree(root, artifact_name(out), dest)
                else:
                    client.download(root, artifact_name(out), dest)
                got = verifier.path(dest, staging)
                if got.get("hash") != entry.get("hash"):
                    raise KvmError("out %s downloaded with hash %s, its lock says %s"
                                   % (out, got.get("hash"), entry.get("hash")))
                staged[out] = dest
            for out, src in staged.items():
                dest = spec.abspath(out)
                remove_path(dest)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                os.replace(src, dest)
            return True
        except (KvmError, OSError, ValueError) as exc:  # MlflowError is a KvmError
            self.warn("not reusing MLflow run %s: %s; running the command instead"
                      % (reuse.run_id, getattr(exc, "msg", exc)))
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def start(self, key: str, previous_key: Optional[str], reasons: List[str], algo: str,
              git_commit: Optional[str]) -> Dict[str, str]:
        """Create the run and log the params; the variables the command needs to attach."""
        if not self.client:
            return {}
        spec, m, client = self.spec, self.m, self.client
        tags = {"mlinfra.stage": spec.name, TAG_KEY: key,
                "mlinfra.stage.previous_key": previous_key or "",
                "mlinfra.stage.host": socket.gethostname(),
                "mlinfra.stage.algorithm": algo,
                "mlinfra.stage.cmd": shlex.join(spec.cmd),
                "mlinfra.stage.reasons": "; ".join(reasons),
                "mlflow.source.name": "ml_stage:%s" % spec.name,
                "mlflow.source.type": "JOB"}
        if git_commit:
            tags["mlflow.source.git.commit"] = git_commit
        if spec.mps:
            tags.update(spec.mps.tags())
        tags.update(m.tags)
        try:
            self.run_info = client.create_run(self.experiment_id, m.run_name, tags)
            params = {k: param_value(v) for k, v in flatten(spec.params)}
            if params:
                client.log_params(self.run_info["run_id"], params)
        except MlflowError as exc:
            if self.run_info:
                self._attempt([], "ending the run", lambda: client.end_run(self.run_id, "FAILED"))
                self.run_info = None
            self._untracked(exc, "mlflow")
            return {}
        env = {"MLFLOW_TRACKING_URI": m.tracking_uri, "MLFLOW_RUN_ID": self.run_id,
               "MLFLOW_EXPERIMENT_ID": str(self.experiment_id)}
        if m.token:
            env["MLFLOW_TRACKING_TOKEN"] = m.token
        elif m.username is not None:
            env["MLFLOW_TRACKING_USERNAME"] = m.username
            env["MLFLOW_TRACKING_PASSWORD"] = m.password or ""
        return env

    def summary(self) -> Dict[str, Any]:
        """For the result (and the lock): the run made, if any."""
        if not self.run_info:
            return {"enabled": True, "run_id": None}
        return {"enabled": True, "run_id": self.run_id, "experiment_id": self.experiment_id,
                "tracking_uri": self.m.tracking_uri,
                "run_url": "%s/#/experiments/%s/runs/%s" % (self.m.tracking_uri,
                                                            self.experiment_id, self.run_id)}

    @staticmethod
    def _attempt(errors: List[str], what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except (MlflowError, OSError) as exc:
            errors.append("%s: %s" % (what, getattr(exc, "msg", exc)))

    def finish(self, status: str, lock_doc: Optional[Dict[str, Any]], failure: Optional[str],
               metrics: Optional[Dict[str, float]] = None) -> None:
        """Metrics in one call, the lock and logs (and outs) as artifacts, then the status.

        After a successful command the lock is already written: a failure here fails the
        task (saying so) unless MLflow is optional, and never undoes the lock."""
        if not self.run_info:
            return
        spec, client, run_id = self.spec, self.client, self.run_id
        root = client.artifact_root(self.run_info.get("artifact_uri", ""))
        errors: List[str] = []
        attempt = self._attempt
        if metrics:
            attempt(errors, "logging metrics", lambda: client.log_metrics(run_id, metrics))
        if root is None:
            errors.append("artifacts: the run's artifact root %s is not served by the tracking "
                          "server (start it with --serve-artifacts)" % self.run_info.get("artifact_uri"))
        else:
            if lock_doc is not None:
                body = (json.dumps(lock_doc, indent=1, sort_keys=True) + "\n").encode("utf-8")
                attempt(errors, "uploading the lock", lambda: client.upload(root, LOCK_ARTIFACT, body))
                if self.m.signing_key:
                    sig = signature(self.m.signing_key, body)
                    attempt(errors, "uploading the lock's signature",
                            lambda: client.upload(root, SIGNATURE_ARTIFACT, sig))
            for name, path in (("stdout.log", self.files.stdout), ("stderr.log", self.files.stderr)):
                if os.path.exists(path) and os.path.getsize(path):
                    source: Any = path if os.path.getsize(path) <= LOG_ARTIFACT_LIMIT \
                        else _tail_bytes(path, LOG_ARTIFACT_LIMIT)
                    attempt(errors, "uploading " + name,
                            lambda s=source, n=name: client.upload(root, "ml_stage/" + n, s))
            if lock_doc is not None and self.m.upload_outs:
                before = len(errors)
                for out in spec.outs:
                    full = spec.abspath(out)
                    if os.path.isdir(full):
                        attempt(errors, "uploading out " + out,
                                lambda f=full, o=out: client.upload_tree(root, artifact_name(o), f))
                    else:
                        attempt(errors, "uploading out " + out,
                                lambda f=full, o=out: client.upload(root, artifact_name(o), f))
                if len(errors) == before:
                    tags = {"mlinfra.stage.outs_uploaded": "true"}
                    if self.m.signing_key:
                        tags[KEY_ID_TAG] = key_id(self.m.signing_key)
                    attempt(errors, "tagging", lambda: client.set_tags(run_id, tags))
        if failure:
            attempt(errors, "tagging", lambda: client.set_tags(run_id, {"mlinfra.stage.failure": failure}))
        attempt(errors, "ending the run", lambda: client.end_run(run_id, status))
        if errors:
            msg = "MLflow run %s: %s" % (run_id, "; ".join(errors))
            if status == "FINISHED" and not self.m.optional:
                raise KvmError("stage %s ran and its lock was written, but %s" % (spec.name, msg),
                               changed=True, ran=True, mlflow_run_id=run_id)
            self.warn(msg)
