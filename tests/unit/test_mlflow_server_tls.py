"""mlflow_server's TLS material on the controller, made by real openssl through ansible-playbook.

The role's controller-side tasks (tasks_from tls_ca, then tls_cert) run against localhost into a
temporary directory; what the server and its clients rely on is then checked with Python's ssl
module and openssl itself: the chain verifies strictly, the names are covered, the keys are
0600 in a 0700 directory, a second run changes nothing, and a certificate is issued again when its
names change or its end nears. The CA is renewed when it can no longer cover a whole server
certificate or enters mlflow_server_tls_ca_renew_days, and replaced when its key or its
certificate is gone (a compromised CA's path); the certificates follow it, four ways, and check
mode predicts the guest's new files. The guest side (files, uvicorn's TLS listener) is proven on
the lab.
"""
from __future__ import annotations

import hashlib
import json
import ssl
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import yaml

from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit


def tls_play(tmp_path: Path, extra_vars: Dict, contents: bool = False) -> Path:
    role_vars = {"mlflow_server_tls_dir": str(tmp_path / "ca"), "mlflow_server_bind_address": "192.0.2.10",
                 "mlflow_server_credentials_file": str(tmp_path / "creds.json")}
    role_vars.update(extra_vars)
    tasks = [{"name": "tls %s" % part, "ansible.builtin.include_role": {
        "name": "mlinfra.kvm.mlflow_server", "tasks_from": part, "public": contents}} for part in ("tls_ca", "tls_cert")]
    if contents:
        # What tls.yml's copy would put on the guest (CA, certificate, key), as digests: no key printed.
        tasks.append({"name": "tls contents", "ansible.builtin.debug": {
            "msg": "{{ __mlflow_server_tls_files | map(attribute='content') | map('hash', 'sha256') | list }}"}})
    path = tmp_path / "tls.yml"
    path.write_text(yaml.safe_dump([{
        "name": "mlflow_server TLS on the controller",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": dict(role_vars, ansible_host="tracking.lab.test"),
        "tasks": tasks,
    }], sort_keys=False))
    return path


def run_tls(tmp_path: Path, extra_vars: Dict, *flags: str, contents: bool = False) -> subprocess.CompletedProcess:
    proc = run_playbook(tls_play(tmp_path, extra_vars, contents), *flags)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    return proc


def recap(proc: subprocess.CompletedProcess) -> Dict[str, int]:
    line = [line for line in proc.stdout.splitlines() if line.startswith("localhost") and "ok=" in line][-1]
    return {k: int(v) for k, v in (field.split("=") for field in line.split()[2:])}


def apply(tmp_path: Path, extra_vars: Dict, *flags: str) -> Dict[str, int]:
    return recap(run_tls(tmp_path, extra_vars, *flags))


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


def fingerprint(cert: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(cert)],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "").lower()


def verifies(cert: Path, ca: Path) -> bool:
    return subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(ca), str(cert)],
                          capture_output=True, check=False).returncode == 0


def valid_for(cert: Path, days: int) -> bool:
    return subprocess.run(["openssl", "x509", "-noout", "-in", str(cert), "-checkend", str(days * 86400)],
                          capture_output=True, check=False).returncode == 0


def snapshot(ca_dir: Path) -> Dict[str, Tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(ca_dir.iterdir())}


def assert_replaced_four_ways(tmp_path: Path, extra_vars: Dict, old_ca: Optional[bytes], old_fp: str,
                              old_key: Optional[bytes] = None) -> None:
    """Check predicts a change and touches no file; apply makes a new CA (new key) whose certificate
    is the one the server's now verifies against; the old CA is kept as retired (when its
    certificate was there to keep), its key is gone and it trusts nothing new; then check and apply
    again change nothing."""
    ca_dir = tmp_path / "ca"
    [cert] = certs(tmp_path)
    key = cert.with_suffix(".key")
    before = snapshot(ca_dir)
    assert apply(tmp_path, extra_vars, "--check")["changed"] >= 2   # the CA and the certificate
    assert snapshot(ca_dir) == before, "check mode changes no file (bytes and mtimes)"
    assert apply(tmp_path, extra_vars)["changed"] >= 2
    ca = ca_dir / "ca.crt"
    assert fingerprint(ca) != old_fp
    assert [oct(p.stat().st_mode & 0o777) for p in (ca_dir, ca_dir / "ca.key", key)] == ["0o700", "0o600", "0o600"]
    retired = sorted(p.name for p in ca_dir.glob("ca-retired-*.crt"))
    if old_ca is None:
        assert not retired, "nothing to keep without the old certificate"
    else:
        assert ca.read_bytes() != old_ca
        assert retired == ["ca-retired-%s.crt" % old_fp]
        assert (ca_dir / retired[0]).read_bytes() == old_ca
        assert not verifies(cert, ca_dir / retired[0]), "the new certificate is not the retired CA's"
    if old_key is not None:
        assert old_key not in [p.read_bytes() for p in ca_dir.iterdir()], "the retired CA's key is deleted"
    assert verifies(cert, ca)
    assert cert.read_bytes() != before[cert.name][0]
    assert key.read_bytes() != before[key.name][0], "a new server key"
    assert apply(tmp_path, extra_vars, "--check")["changed"] == 0
    assert apply(tmp_path, extra_vars)["changed"] == 0


def test_a_ca_that_cannot_cover_a_certificate_is_renewed_and_the_certificate_follows(tmp_path):
    # A CA with 30 days and a 20-day certificate: fresh, nothing to renew.
    short = {"mlflow_server_tls_ca_days": 30, "mlflow_server_tls_days": 20, "mlflow_server_tls_renew_days": 5}
    apply(tmp_path, short)
    assert apply(tmp_path, short)["changed"] == 0
    ca = tmp_path / "ca" / "ca.crt"
    old_ca, old_fp = ca.read_bytes(), fingerprint(ca)
    # Certificates now last 40 days: the CA's 30 cannot cover one. The certificate itself has 20
    # days left, outside its 5-day window: only the CA's renewal reissues it.
    assert_replaced_four_ways(tmp_path, {"mlflow_server_tls_days": 40, "mlflow_server_tls_renew_days": 5}, old_ca, old_fp)


def test_a_ca_within_its_renewal_window_is_renewed_and_the_certificate_follows(tmp_path):
    # A 30-day CA renewed in its last 10 days: fresh, nothing to renew.
    young = {"mlflow_server_tls_ca_days": 30, "mlflow_server_tls_ca_renew_days": 10,
             "mlflow_server_tls_days": 20, "mlflow_server_tls_renew_days": 5}
    apply(tmp_path, young)
    assert apply(tmp_path, young)["changed"] == 0
    ca_dir = tmp_path / "ca"
    old_ca, old_fp = (ca_dir / "ca.crt").read_bytes(), fingerprint(ca_dir / "ca.crt")
    old_key = (ca_dir / "ca.key").read_bytes()
    # Renewed in its last 60 days now: its 30 are inside. The certificate (20 days left, a 5-day
    # window, still covered by the old CA) is reissued only because its CA changed.
    window = dict(young, mlflow_server_tls_ca_days=400, mlflow_server_tls_ca_renew_days=60)
    assert_replaced_four_ways(tmp_path, window, old_ca, old_fp, old_key)
    # The new CA is made with the new mlflow_server_tls_ca_days.
    assert valid_for(ca_dir / "ca.crt", days=399) and not valid_for(ca_dir / "ca.crt", days=401)


def test_a_ca_whose_key_is_gone_is_replaced_and_the_certificate_follows(tmp_path):
    apply(tmp_path, {})
    ca_dir = tmp_path / "ca"
    old_ca, old_fp = (ca_dir / "ca.crt").read_bytes(), fingerprint(ca_dir / "ca.crt")
    (ca_dir / "ca.key").unlink()   # what an operator does with a compromised CA key
    assert_replaced_four_ways(tmp_path, {}, old_ca, old_fp)


def test_a_ca_key_without_its_certificate_is_replaced_not_reused(tmp_path):
    apply(tmp_path, {})
    ca_dir = tmp_path / "ca"
    old_fp, old_key = fingerprint(ca_dir / "ca.crt"), (ca_dir / "ca.key").read_bytes()
    (ca_dir / "ca.crt").unlink()   # half a CA the other way round: its key alone
    assert_replaced_four_ways(tmp_path, {}, None, old_fp, old_key)


def test_check_mode_predicts_the_guest_files_of_a_renewal(tmp_path):
    """tls.yml copies __mlflow_server_tls_files to the guest: in check mode, where the controller
    still holds the old CA and certificate, a due renewal gives them as empty (so the copy reports
    the change); otherwise, and in a real run, they are the controller's files."""
    def contents(*flags: str) -> List[str]:
        lines = run_tls(tmp_path, {}, *flags, contents=True).stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("TASK [tls contents]"))
        result = next(line for line in lines[start:] if line.startswith("ok: [localhost] => "))
        return json.loads(result.split("=> ", 1)[1])["msg"]

    def files() -> List[str]:
        [cert] = certs(tmp_path)
        return [hashlib.sha256(p.read_bytes().rstrip(b"\n") + b"\n").hexdigest()
                for p in (tmp_path / "ca" / "ca.crt", cert, cert.with_suffix(".key"))]

    empty = hashlib.sha256(b"\n").hexdigest()
    assert contents() == files()
    assert contents("--check") == files(), "nothing due: check mode shows the same files"
    (tmp_path / "ca" / "ca.key").unlink()
    assert contents("--check") == [empty] * 3, "the CA, the certificate and its key all change"
    assert contents() == files()
