"""A real `mlflow server` (sqlite backend, artifact proxy) on 127.0.0.1 for the integration tier.

Started from the project's venv on a free port in a temporary directory; ready once /health
answers; stopped with its whole process group. tests/conftest.py starts one per pytest session
(fixture ``mlflow_server``): each test uses experiments of its own names, so they share it.

``Server(tmp, tls=True)`` serves https instead (uvicorn's own TLS) with a certificate for
127.0.0.1 and localhost signed by a private CA made for it in ``tmp``: ``ca_path`` is that CA's
PEM file, and this module's own REST calls verify against it.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import datetime
import ipaddress
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mlflow_bin() -> str:
    for candidate in (Path(sys.executable).with_name("mlflow"), ROOT / ".venv" / "bin" / "mlflow"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("mlflow")
    if not found:
        pytest.fail("the mlflow CLI is not installed: run `make setup` (requirements.txt pins mlflow)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_key(path: Path, key: Any) -> None:
    """A private key in PEM, 0600 from the moment the file exists (never readable by others)."""
    from cryptography.hazmat.primitives import serialization
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _certificate(subject: str, public_key: Any, issuer: str, signing_key: Any, ca: bool) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False,
            decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            signing_key.public_key()), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_tls(directory: Path) -> Tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1/localhost signed by it, in
    ``directory``: (CA certificate, server certificate, server key), PEM, keys 0600. Python's
    ssl (OpenSSL 3, strict X.509) needs the CA's key usage and the key identifiers."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("mlkvmtest private CA", ca_key.public_key(), "mlkvmtest private CA", ca_key, True)
    server_cert = _certificate("127.0.0.1", server_key.public_key(), "mlkvmtest private CA", ca_key, False)
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    _write_key(directory / "ca.key", ca_key)
    _write_key(paths[2], server_key)
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return paths


class Server:
    """``admin_password`` set: MLflow's basic-auth app, its admin ``admin`` with that password,
    every user READ by default (as mlinfra.kvm.mlflow_server configures it).
    ``tls``: https with a certificate of a private CA made for this server (``ca_path``)."""

    ADMIN = "admin"

    def __init__(self, tmp: Path, admin_password: Optional[str] = None, tls: bool = False) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.admin_password = admin_password
        self.ca_path: Optional[Path] = None
        # urllib's default context (the system's CAs) for http; the private CA only, for https.
        self.context: Optional[ssl.SSLContext] = None
        cmd = [_mlflow_bin(), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", "sqlite:///%s" % (tmp / "mlflow.db"),
               "--artifacts-destination", str(tmp / "artifacts"), "--workers", "1"]
        if tls:
            self.ca_path, cert, key = make_tls(tmp / "tls")
            self.context = ssl.create_default_context(cafile=str(self.ca_path))
            # `mlflow server` runs uvicorn (MLflow 3's default) and passes these options through.
            cmd += ["--uvicorn-opts", shlex.join(["--ssl-keyfile", str(key), "--ssl-certfile", str(cert)])]
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
        if admin_password:
            ini = tmp / "basic_auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///%s\n"
                           "admin_username = %s\nauthorization_function = "
                           "mlflow.server.auth:authenticate_request_basic_auth\n"
                           % (tmp / "basic_auth.db", self.ADMIN))
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_AUTH_ADMIN_PASSWORD=admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY=os.urandom(16).hex())
            cmd += ["--app-name", "basic-auth"]
        self.log = open(tmp / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, cwd=str(tmp), stdout=self.log, env=env,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 240
        while True:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail("mlflow server exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2, context=self.context) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, ssl.SSLCertVerificationError):  # waiting cannot fix that
                    self.stop()
                    pytest.fail("the test server's certificate does not verify against its CA: %s"
                                % exc.reason)
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("mlflow server did not answer /health in 240 s:\n%s" % self.log_tail())
            time.sleep(0.5)

    def log_tail(self) -> str:
        return (self.tmp / "server.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()

    # -- REST, independent of the module's own client ------------------------------------
    def api(self, method: str, endpoint: str, body: Optional[Dict[str, Any]] = None,
            query: Optional[Dict[str, Any]] = None, version: int = 2,
            login: Optional[Tuple[str, str]] = None) -> Dict[str, Any]:
        """One REST call; on a basic-auth server as ``login`` (user, password), else as the admin."""
        url = "%s/api/%d.0/%s" % (self.url, version, endpoint)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Content-Type": "application/json"}
        if login is None and self.admin_password:
            login = (self.ADMIN, self.admin_password)
        if login:
            token = base64.b64encode(("%s:%s" % login).encode()).decode()
            headers["Authorization"] = "Basic " + token
        req = urllib.request.Request(url, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else {}

    def experiment(self, name: str) -> Optional[str]:
        try:
            return self.api("GET", "mlflow/experiments/get-by-name",
                            query={"experiment_name": name})["experiment"]["experiment_id"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def runs(self, experiment: str) -> list:
        exp = self.experiment(experiment)
        if exp is None:
            return []
        return self.api("POST", "mlflow/runs/search", {"experiment_ids": [exp]}).get("runs", [])

    def run(self, run_id: str) -> Dict[str, Any]:
        run = self.api("GET", "mlflow/runs/get", query={"run_id": run_id})["run"]
        data = run["data"]
        return {"info": run["info"],
                "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
                "params": {p["key"]: p["value"] for p in data.get("params", [])},
                "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])}}

    def artifacts(self, run_id: str, path: str) -> list:
        res = self.api("GET", "mlflow/artifacts/list", query={"run_id": run_id, "path": path})
        return sorted(f["path"] for f in res.get("files", []))

    def artifact(self, run_info: Dict[str, Any], path: str) -> bytes:
        root = run_info["artifact_uri"].split("mlflow-artifacts:", 1)[1].lstrip("/")
        with urllib.request.urlopen("%s/api/2.0/mlflow-artifacts/artifacts/%s/%s"
                                    % (self.url, root, path), timeout=30, context=self.context) as resp:
            return resp.read()
