# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small MLflow tracking client over the REST API, with ansible.module_utils.urls (imported on first
use, so a stage without MLflow does not pay for it).

The target host needs no ``mlflow`` package. Covered: /health, experiments get-by-name and
create, runs create/update/search/log-batch, and artifacts through the tracking server's
artifact proxy (``/api/2.0/mlflow-artifacts/artifacts/...``, served when the server runs
with ``--serve-artifacts``, the default since MLflow 2.0). Limits follow MLflow's own:
100 params and 1000 metrics per log-batch call, param values up to 6000 characters and
tag values up to 8000.
"""
from __future__ import annotations

import base64
import json
import math
import os
import shutil
import time
from typing import Any, Dict, List, Optional

from .._core._errors import KvmError
from ._stage_spec import flatten

MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
ARTIFACTS_ROUTE = "/api/2.0/mlflow-artifacts/artifacts"


class MlflowError(KvmError):
    """The tracking server refused or could not be reached."""

    def __init__(self, msg: str, status: Optional[int] = None, error_code: Optional[str] = None,
                 certificate: bool = False) -> None:
        super().__init__(msg, mlflow_status=status, mlflow_error_code=error_code)
        self.status = status
        self.error_code = error_code
        # The server's TLS certificate was refused: fixed by ca_path, not by starting the server.
        self.certificate = certificate


def _now_ms() -> int:
    return int(time.time() * 1000)


def clip(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit - 3] + "..."


class MlflowClient:
    def __init__(self, tracking_uri: str, username: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None,
                 timeout: float = 30, validate_certs: bool = True,
                 credentials_option: str = "mlflow.credentials", ca_path: Optional[str] = None,
                 option_prefix: str = "mlflow.") -> None:
        self.base = tracking_uri.rstrip("/")
        # Named in the hint of a 401/403: the option whose credentials the server refused.
        self.credentials_option = credentials_option
        # Prefix of the ca_path and validate_certs options named when a certificate is refused.
        self.option_prefix = option_prefix
        self.ca_path = ca_path
        self.timeout = timeout
        self.headers: Dict[str, str] = {}
        if token:
            self.headers["Authorization"] = "Bearer " + token
        elif username is not None:
            raw = ("%s:%s" % (username, password or "")).encode("utf-8")
            self.headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
        self.validate_certs = validate_certs

    @classmethod
    def for_stage(cls, m: Any) -> "MlflowClient":
        """The client for a stage's ``mlflow`` option (a _stage_spec.MlflowSpec)."""
        return cls(m.tracking_uri, m.username, m.password, m.token, m.timeout, m.validate_certs,
                   ca_path=m.ca_path)

    # -- transport --------------------------------------------------------------------

    def _open(self, method: str, url: str, data: Any = None,
              headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Any:
        import urllib.error
        from ansible.module_utils.urls import ConnectionError as UrlsConnectionError, open_url
        try:
            # No ~/.netrc lookup: the only credentials sent are the ones of the mlflow option.
            return open_url(url, data=data, headers=dict(self.headers, **(headers or {})), method=method,
                            timeout=timeout or self.timeout, validate_certs=self.validate_certs,
                            ca_path=self.ca_path, use_netrc=False)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            code = None
            message = body.strip()[:500]
            try:
                parsed = json.loads(body)
                code = parsed.get("error_code")
                message = parsed.get("message") or message
            except ValueError:
                pass
            hint = ""
            if exc.code in (401, 403):
                hint = " (check %s)" % self.credentials_option
            raise MlflowError("MLflow %s %s: HTTP %s%s%s" % (method, url.split("?")[0], exc.code,
                                                             " " + message if message else "", hint),
                              status=exc.code, error_code=code)
        except (urllib.error.URLError, OSError, UrlsConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            if _certificate_refused(exc, reason):
                raise MlflowError(self._certificate_message(reason), certificate=True)
            raise MlflowError("MLflow tracking server %s is unreachable (%s)" % (self.base, reason))

    def _certificate_message(self, reason: Any) -> str:
        """A refused server certificate is no unreachable server: say which option fixes it."""
        why = getattr(reason, "verify_message", None) or getattr(reason, "reason", None) or reason
        ca_option, certs_option = self.option_prefix + "ca_path", self.option_prefix + "validate_certs"
        if self.ca_path:
            fix = ("%s (%s) is not the CA that signed it, or the certificate does not name this "
                   "host: set %s to the PEM file of the CA that signed it" % (ca_option, self.ca_path, ca_option))
        else:
            fix = ("set %s to the PEM file of the CA that signed it (a private CA is not among the "
                   "system's CAs)" % ca_option)
        return ("the TLS certificate of MLflow tracking server %s could not be verified (%s); %s, or "
                "%s: false for a test server" % (self.base, why, fix, certs_option))

    def call(self, method: str, endpoint: str, body: Optional[Dict[str, Any]] = None,
             query: Optional[Dict[str, Any]] = None, version: int = 2) -> Dict[str, Any]:
        """One REST call; ``version`` 3 for the API that MLflow 3 added (user permissions)."""
        import urllib.parse
        url = "%s/api/%d.0/mlflow/%s" % (self.base, version, endpoint)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode("utf-8") if body is not None else None
        with self._open(method, url, data, {"Content-Type": "application/json"}) as resp:
            raw = resp.read()
        return json.loads(raw.decode("utf-8")) if raw.strip() else {}

    # -- server -----------------------------------------------------------------------
    def health(self, timeout: Optional[float] = None) -> None:
        """Raises MlflowError unless the server answers /health (within mlflow.timeout, like
        every other call: a busy server's first answer can take longer than a few seconds)."""
        with self._open("GET", self.base + "/health", timeout=timeout) as resp:
            resp.read()

    def experiment_id(self, name: str, create: bool = True) -> Optional[str]:
        try:
            return self.call("GET", "experiments/get-by-name",
                             query={"experiment_name": name})["experiment"]["experiment_id"]
        except MlflowError as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST" and exc.status != 404:
                raise
        if not create:
            return None
        try:
            return self.call("POST", "experiments/create", {"name": name})["experiment_id"]
        except MlflowError as exc:  # created meanwhile by a concurrent stage
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.call("GET", "experiments/get-by-name",
                             query={"experiment_name": name})["experiment"]["experiment_id"]

    # -- runs -------------------------------------------------------------------------
    def create_run(self, experiment_id: str, run_name: str, tags: Dict[str, str]) -> Dict[str, Any]:
        body = {"experiment_id": experiment_id, "start_time": _now_ms(), "run_name": run_name,
                "tags": [{"key": clip(k, MAX_KEY), "value": clip(str(v), MAX_TAG_VALUE)}
                         for k, v in sorted(tags.items())]}
        return self.call("POST", "runs/create", body)["run"]["info"]

    def log_params(self, run_id: str, params: Dict[str, str]) -> int:
        """In batches of 100; returns the number of calls made."""
        items = [{"key": clip(k, MAX_KEY), "value": clip(str(v), MAX_PARAM_VALUE)}
                 for k, v in sorted(params.items())]
        return self._log_batches(run_id, "params", items, MAX_PARAMS_PER_BATCH)

    def log_metrics(self, run_id: str, metrics: Dict[str, float], step: int = 0) -> int:
        """One call (more only past MLflow's 1000 metrics per batch)."""
        ts = _now_ms()
        items = [{"key": clip(k, MAX_KEY), "value": float(v), "timestamp": ts, "step": step}
                 for k, v in sorted(metrics.items())]
        return self._log_batches(run_id, "metrics", items, MAX_METRICS_PER_BATCH)

    def _log_batches(self, run_id: str, field: str, items: List[Dict[str, Any]], per_batch: int) -> int:
        """``items`` as ``field`` of log-batch calls of at most ``per_batch`` each; returns the number
        of calls made (none for no items)."""
        calls = 0
        for i in range(0, len(items), per_batch):
            self.call("POST", "runs/log-batch", {"run_id": run_id, field: items[i:i + per_batch]})
            calls += 1
        return calls

    def set_tags(self, run_id: str, tags: Dict[str, str]) -> None:
        items = [{"key": clip(k, MAX_KEY), "value": clip(str(v), MAX_TAG_VALUE)}
                 for k, v in sorted(tags.items())]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.call("POST", "runs/log-batch", {"run_id": run_id, "tags": items[i:i + 100]})

    def end_run(self, run_id: str, status: str) -> None:
        self.call("POST", "runs/update", {"run_id": run_id, "status": status, "end_time": _now_ms()})

    def fail_run(self, run_id: str, status: str, failure: str) -> None:
        """Tag the run with why it failed (``mlinfra.stage.failure``), then end it."""
        self.set_tags(run_id, {"mlinfra.stage.failure": failure})
        self.end_run(run_id, status)

    def get_run(self, run_id: str) -> Dict[str, Any]:
        return self.call("GET", "runs/get", query={"run_id": run_id})["run"]

    def search_runs(self, experiment_ids: List[str], filter_string: str,
                    max_results: int = 10) -> List[Dict[str, Any]]:
        body = {"experiment_ids": experiment_ids, "filter": filter_string,
                "max_results": max_results, "order_by": ["attributes.start_time DESC"]}
        return self.call("POST", "runs/search", body).get("runs", [])

    # -- artifacts through the server's proxy -----------------------------------------
    @staticmethod
    def artifact_root(artifact_uri: str) -> Optional[str]:
        """The proxy path of a run's artifact root, or None when the server does not
        proxy it (an s3:// or file:// root: the server runs without --serve-artifacts)."""
        import urllib.parse
        parsed = urllib.parse.urlparse(artifact_uri)
        if parsed.scheme == "mlflow-artifacts":
            return parsed.path.lstrip("/")
        if parsed.scheme in ("http", "https") and ARTIFACTS_ROUTE + "/" in parsed.path:
            return parsed.path.split(ARTIFACTS_ROUTE + "/", 1)[1]
        return None

    def _artifact_url(self, root: str, rel: str) -> str:
        import urllib.parse
        path = "/".join(p for p in (root.strip("/"), rel.strip("/")) if p)
        return "%s%s/%s" % (self.base, ARTIFACTS_ROUTE, urllib.parse.quote(path))

    def upload(self, root: str, rel: str, source: Any) -> None:
        """PUT one artifact; ``source`` is bytes or the path of a file (streamed)."""
        url = self._artifact_url(root, rel)
        if isinstance(source, (bytes, bytearray)):
            with self._open("PUT", url, bytes(source),
                            {"Content-Type": "application/octet-stream"}) as resp:
                resp.read()
            return
        size = os.path.getsize(source)
        with open(source, "rb") as f:
            with self._open("PUT", url, f, {"Content-Type": "application/octet-stream",
                                            "Content-Length": str(size)},
                            timeout=max(self.timeout, 600)) as resp:
                resp.read()

    def upload_tree(self, root: str, rel: str, directory: str) -> int:
        count = 0
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                sub = os.path.relpath(path, directory).replace(os.sep, "/")
                self.upload(root, rel + "/" + sub, path)
                count += 1
        return count

    def list_artifacts(self, root: str, rel: str) -> List[Dict[str, Any]]:
        import urllib.parse
        path = "/".join(p for p in (root.strip("/"), rel.strip("/")) if p)
        url = "%s%s?%s" % (self.base, ARTIFACTS_ROUTE, urllib.parse.urlencode({"path": path}))
        with self._open("GET", url) as resp:
            raw = resp.read()
        return (json.loads(raw.decode("utf-8")) if raw.strip() else {}).get("files", [])

    def download(self, root: str, rel: str, dest: str) -> None:
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        with self._open("GET", self._artifact_url(root, rel), timeout=max(self.timeout, 600)) as resp:
            with open(dest, "wb") as f:
                shutil.copyfileobj(resp, f, 1 << 20)

    def read(self, root: str, rel: str) -> bytes:
        with self._open("GET", self._artifact_url(root, rel)) as resp:
            return resp.read()

    def download_tree(self, root: str, rel: str, dest: str) -> int:
        """Download a directory of artifacts recursively; returns the number of files."""
        count = 0
        for info in self.list_artifacts(root, rel):
            name = os.path.basename(info["path"])
            if name in ("", ".", ".."):
                continue
            if info.get("is_dir"):
                count += self.download_tree(root, rel + "/" + name, os.path.join(dest, name))
            else:
                self.download(root, rel + "/" + name, os.path.join(dest, name))
                count += 1
        return count


def _certificate_refused(exc: BaseException, reason: Any) -> bool:
    """Whether a failed call is the server's certificate refused (urllib wraps the ssl error
    in URLError.reason; ansible's urls raises SSLValidationError on some Pythons)."""
    import ssl
    from ansible.module_utils.urls import SSLValidationError
    return isinstance(reason, ssl.SSLCertVerificationError) or isinstance(exc, (ssl.SSLCertVerificationError,
                                                                                SSLValidationError))


def param_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def numeric_metrics(data: Any) -> Dict[str, float]:
    """Numeric leaves of a metrics document (bools and strings are not metrics)."""
    out: Dict[str, float] = {}
    for key, value in flatten(data):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):  # NaN and +/-inf are no metric values
            continue
        out[key] = float(value)
    return out
