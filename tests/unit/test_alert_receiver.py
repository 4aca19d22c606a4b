"""The webhook receiver of the monitoring host, as a real process on loopback."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit
RECEIVER = Path(ROOT) / "roles" / "monitoring" / "files" / "mlinfra_alert_receiver.py"

# Alertmanager's webhook payload (version 4), as it posts a firing VMNotRunning.
NOTIFICATION = {
    "version": "4", "status": "firing", "receiver": "webhook", "groupKey": "{}:{alertname=\"VMNotRunning\"}",
    "groupLabels": {"alertname": "VMNotRunning"}, "commonLabels": {"alertname": "VMNotRunning"},
    "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093", "truncatedAlerts": 0,
    "alerts": [{"status": "firing", "labels": {"alertname": "VMNotRunning", "domain": "mlinfra-worker-1"},
                "annotations": {"summary": "VM mlinfra-worker-1 is shut off"},
                "startsAt": "2026-11-30T18:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus/graph", "fingerprint": "0123456789abcdef"}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def receiver(tmp_path):
    port, log = free_port(), tmp_path / "state" / "alerts.jsonl"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), "--listen", "127.0.0.1:%d" % port, "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = "http://127.0.0.1:%d" % port
    try:
        for _unused in range(100):
            try:
                urllib.request.urlopen(base + "/-/healthy", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.05)
        yield base, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_records_a_notification_and_serves_it_back(receiver):
    base, log = receiver
    assert post(base + "/", json.dumps(NOTIFICATION).encode()) == 200
    lines = log.read_text().splitlines()
    assert len(lines) == 1
    recorded = json.loads(lines[0])
    assert recorded["alerts"][0]["labels"]["domain"] == "mlinfra-worker-1" and recorded["received_at"] > 0
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o640
    served = json.loads(urllib.request.urlopen(base + "/notifications", timeout=5).read())
    assert [n["status"] for n in served] == ["firing"]


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"status": "firing"}'])
def test_refuses_what_is_not_a_notification(receiver, body):
    base, log = receiver
    assert post(base + "/", body) == 400
    assert not log.exists() or log.read_text() == ""


def test_a_bad_listen_address_is_one_line_not_a_traceback():
    proc = subprocess.run([sys.executable, str(RECEIVER), "--listen", "nowhere"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "expected HOST:PORT" in proc.stderr and "Traceback" not in proc.stderr
