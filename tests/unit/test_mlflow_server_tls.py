"""mlflow_server's TLS material on the controller, made by real openssl through ansible-playbook.

The role's controller-side tasks (tasks_from tls_ca, then tls_cert) run against localhost into a
temporary directory; what the server and its clients rely on is then checked with Python's ssl
module and openssl itself: the chain verifies strictly, the names are covered, the keys are
0600 in a 0700 directory, a second run changes nothing, and a certificate is issued again when its
names change or its end nears. The guest side (files, uvicorn's TLS listener) is proven on the lab.
"""
from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit


def tls_play(tmp_path: Path, extra_vars: Dict) -> Path:
    role_vars = {"mlflow_server_tls_dir": str(tmp_path / "ca"), "mlflow_server_bind_address": "192.0.2.10",
                 "mlflow_server_credentials_file": str(tmp_path / "creds.json")}
    role_vars.update(extra_vars)
    path = tmp_path / "tls.yml"
    path.write_text(yaml.safe_dump([{
        "name": "mlflow_server TLS on the controller",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": dict(role_vars, ansible_host="tracking.lab.test"),
        "tasks": [{"name": "tls %s" % part, "ansible.builtin.include_role": {
            "name": "mlinfra.kvm.mlflow_server", "tasks_from": part}} for part in ("tls_ca", "tls_cert")],
    }], sort_keys=False))
    return path


def apply(tmp_path: Path, extra_vars: Dict, *flags: str) -> Dict[str, int]:
    proc = run_playbook(tls_play(tmp_path, extra_vars), *flags)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    recap = [line for line in proc.stdout.splitlines() if line.startswith("localhost") and "ok=" in line][-1]
    return {k: int(v) for k, v in (field.split("=") for field in recap.split()[2:])}


def certs(tmp_path: Path) -> List[Path]:
    return sorted((tmp_path / "ca").glob("localhost-*.crt"))


def san(cert: Path) -> List[str]:
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(name.strip() for name in out.splitlines()[1].split(","))


def test_four_ways_then_the_chain_verifies_strictly(tmp_path):
    assert apply(tmp_path, {}, "--check")["changed"] >= 2          # the CA and the certificate
    assert not (tmp_path / "ca" / "ca.crt").exists(), "check mode makes nothing"
    assert apply(tmp_path, {})["changed"] >= 2
    assert apply(tmp_path, {}, "--check")["changed"] == 0
    assert apply(tmp_path, {})["changed"] == 0

    ca_dir = tmp_path / "ca"
    [cert] = certs(tmp_path)
    key = cert.with_suffix(".key")
    assert oct(ca_dir.stat().st_mode & 0o777) == "0o700"
    assert [oct(p.stat().st_mode & 0o777) for p in (ca_dir / "ca.key", key)] == ["0o600", "0o600"]
    assert san(cert) == ["DNS:localhost", "DNS:tracking.lab.test", "IP Address:127.0.0.1", "IP Address:192.0.2.10"]
    strict = subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslserver",
                             "-CAfile", str(ca_dir / "ca.crt"), str(cert)], capture_output=True, text=True, check=False)
    assert strict.returncode == 0, strict.stdout + strict.stderr
    # What clients do: Python's ssl loads the CA, the server side loads the key pair.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(cert), str(key))
    client = ssl.create_default_context(cafile=str(ca_dir / "ca.crt"))
    assert client.cert_store_stats()["x509_ca"] == 1


def test_new_names_issue_a_new_certificate_under_the_same_ca(tmp_path):
    apply(tmp_path, {})
    ca_before = (tmp_path / "ca" / "ca.crt").read_bytes()
    assert apply(tmp_path, {"mlflow_server_tls_names": ["mlflow.example.test"]})["changed"] == 1
    assert (tmp_path / "ca" / "ca.crt").read_bytes() == ca_before, "the CA is made once"
    newest = max(certs(tmp_path), key=lambda p: p.stat().st_mtime)
    assert "DNS:mlflow.example.test" in san(newest)


def test_a_certificate_near_its_end_is_issued_again(tmp_path):
    apply(tmp_path, {"mlflow_server_tls_days": 20, "mlflow_server_tls_renew_days": 10})
    [cert] = certs(tmp_path)
    serial = cert.read_bytes()
    # 20 days left is now inside a 30-day renewal window: the check predicts it, the run does it.
    window = {"mlflow_server_tls_days": 825, "mlflow_server_tls_renew_days": 30}
    assert apply(tmp_path, window, "--check")["changed"] >= 1
    assert cert.read_bytes() == serial
    assert apply(tmp_path, window)["changed"] >= 1
    assert cert.read_bytes() != serial
    assert apply(tmp_path, window)["changed"] == 0
