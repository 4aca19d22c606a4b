"""ml_stage against a real `mlflow server` (sqlite backend, artifact proxy) on 127.0.0.1.

The test starts the server from the project's venv on a free port in a temporary
directory, waits for /health, and stops its whole process group afterwards. The stage's
command is a Python script that calls mlflow.start_run() itself: its metric landing in
the run ml_stage created proves the attachment through MLFLOW_RUN_ID.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import ROOT, run_module_process
from mlflow_server import Server

pytestmark = pytest.mark.integration

TRAIN = r'''
import json, os, sys
run_id = os.environ["MLFLOW_RUN_ID"]          # exported by ml_stage; start_run() consumes it
assert os.environ["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:")
import mlflow
with mlflow.start_run() as run:
    assert run.info.run_id == run_id, (run.info.run_id, run_id)
    mlflow.log_metric("from_script", 42.0)
params = json.load(open(os.environ["ML_STAGE_PARAMS"]))
with open("runs.log", "a") as f:
    f.write(run_id + "\n")
with open("telemetry.txt", "w") as f:
    f.write(os.environ.get("MLFLOW_DISABLE_TELEMETRY", "<unset>"))
if os.environ.get("FAIL"):
    sys.exit("training diverged")
os.makedirs("model", exist_ok=True)
with open("model/weights.bin", "wb") as f:
    f.write(open("data/train.csv", "rb").read() * 1000 + json.dumps(params).encode())
with open("model/config.json", "w") as f:
    json.dump({"lr": params["lr"]}, f)
json.dump({"acc": 0.93, "loss": {"val": 0.12}, "comment": "text is not a metric"},
          open("metrics.json", "w"))
print("trained run", run_id)
'''


@pytest.fixture
def server(mlflow_server: Server) -> Server:
    return mlflow_server   # one server for the integration tier (tests/conftest.py)


def project(base: Path) -> Path:
    (base / "data").mkdir(parents=True)
    (base / "data" / "train.csv").write_text("x,y\n1,2\n3,4\n")
    (base / "train.py").write_text(TRAIN)
    return base


def stage(proj: Path, mlflow: Dict[str, Any], **over: Any) -> Dict[str, Any]:
    params: Dict[str, Any] = {"lr": 0.01, "grid": {"g%03d" % i: i for i in range(150)}}
    args = {"name": "train", "chdir": str(proj), "cmd": [sys.executable, "train.py"],
            "deps": ["data/"], "outs": ["model/"], "metrics_file": "metrics.json",
            "params": params, "code": {"paths": ["train.py"]}, "mlflow": mlflow}
    args.update(over)
    return args


def ml(args: Dict[str, Any], check: bool = False) -> Dict[str, Any]:
    return run_module_process("ml_stage", args, check=check, timeout=300)


def ran(proj: Path) -> int:
    log = proj / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_real_run_is_recorded_and_the_command_attaches(server: Server, tmp_path: Path) -> None:
    proj = project(tmp_path / "p")
    mlflow = {"tracking_uri": server.url, "experiment": "stage-linkage",
              "tags": {"team": "vision"}}
    predicted = ml(stage(proj, mlflow), check=True)
    assert predicted["changed"] is True and not predicted["failed"], predicted
    assert server.experiment("stage-linkage") is None   # check mode made no MLflow write

    res = ml(stage(proj, mlflow))
    assert not res["failed"] and res["changed"] and res["ran"], res
    run_id = res["mlflow"]["run_id"]
    assert res["mlflow"]["run_url"].endswith(run_id)
    run = server.run(run_id)
    assert run["info"]["status"] == "FINISHED"
    tags = run["tags"]
    assert tags["mlinfra.stage"] == "train" and tags["mlinfra.stage.key"] == res["key"]
    assert tags["team"] == "vision" and "no lock" in tags["mlinfra.stage.reasons"]
    assert len(run["params"]) == 151 and run["params"]["lr"] == "0.01"   # two log-batch calls
    assert run["params"]["grid.g149"] == "149"
    assert run["metrics"]["from_script"] == 42.0      # logged by the command's own start_run()
    assert run["metrics"]["acc"] == 0.93 and run["metrics"]["loss.val"] == 0.12
    assert "comment" not in run["metrics"]
    assert res["metrics"] == {"acc": 0.93, "loss.val": 0.12}
    assert {"ml_stage/lock.json", "ml_stage/stdout.log"} <= set(server.artifacts(run_id, "ml_stage"))
    lock = json.loads(server.artifact(run["info"], "ml_stage/lock.json"))
    local = json.loads((proj / ".ml_stage" / "train.lock.json").read_text())
    assert lock["key"] == local["key"] == res["key"]
    assert local["run"]["mlflow"]["run_id"] == run_id
    assert (proj / "runs.log").read_text().strip() == run_id
    # MLflow's telemetry thread is off in the tracked command (it raced the command's REST calls)
    assert (proj / "telemetry.txt").read_text() == "true"

    # a skipped stage makes no MLflow write at all
    again = ml(stage(proj, mlflow))
    assert not again["failed"] and again["changed"] is False and again["reasons"] == []
    assert len(server.runs("stage-linkage")) == 1
    # a change makes a new run that says why
    changed = ml(stage(proj, mlflow, params={"lr": 0.02, "grid": {}},
                       env={"MLFLOW_DISABLE_TELEMETRY": "1"}))
    assert changed["ran"] and changed["mlflow"]["run_id"] != run_id
    assert (proj / "telemetry.txt").read_text() == "1"   # the stage's own env wins
    second = server.run(changed["mlflow"]["run_id"])
    assert "param lr 0.01 -> 0.02" in second["tags"]["mlinfra.stage.reasons"]
    assert second["tags"]["mlinfra.stage.previous_key"] == res["key"]
    assert len(server.runs("stage-linkage")) == 2


def test_failed_run_ends_failed_and_keeps_no_lock(server: Server, tmp_path: Path) -> None:
    proj = project(tmp_path / "p")
    res = ml(stage(proj, {"tracking_uri": server.url, "experiment": "stage-failure"},
                   secret_env={"FAIL": "please"}))
    assert res["failed"] and res["rc"] == 1 and "training diverged" in res["stderr_tail"]
    run = server.run(res["mlflow"]["run_id"])
    assert run["info"]["status"] == "FAILED"
    assert "cmd exited with rc 1" in run["tags"]["mlinfra.stage.failure"]
    assert "ml_stage/stderr.log" in server.artifacts(res["mlflow"]["run_id"], "ml_stage")
    assert not (proj / ".ml_stage" / "train.lock.json").exists()


SITE_KEY = "this site's signing key, 32 chars"
OTHER_KEY = "another site's key, also long enough"


def test_reuse_fetches_verified_outputs_instead_of_running(server: Server, tmp_path: Path) -> None:
    mlflow = {"tracking_uri": server.url, "experiment": "stage-reuse", "reuse": True,
              "signing_key": SITE_KEY}
    first_proj = project(tmp_path / "machine-a")
    first = ml(stage(first_proj, mlflow))
    assert not first["failed"] and first["ran"], first
    run_id = first["mlflow"]["run_id"]
    assert server.run(run_id)["tags"]["mlinfra.stage.outs_uploaded"] == "true"
    assert server.artifacts(run_id, "outs") == ["outs/metrics.json", "outs/model"]

    other = project(tmp_path / "machine-b")
    res = ml(stage(other, mlflow))
    assert not res["failed"] and res["changed"] and res["ran"] is False, res
    assert res["reused_from"] == run_id and res["key"] == first["key"]
    assert "signed with key id" in res["reasons"][-1]
    assert res["algorithm"] in ("blake3", "sha256")   # reuse trusts hashes: no xxh3 here
    assert ran(other) == 0
    for rel in ("model/weights.bin", "model/config.json", "metrics.json"):
        assert (other / rel).read_bytes() == (first_proj / rel).read_bytes()
    assert len(server.runs("stage-reuse")) == 1
    assert ml(stage(other, mlflow))["changed"] is False

    # a corrupted artifact is refused (hash check against the run's lock): it runs instead
    weights = next((server.tmp / "artifacts").rglob(run_id + "/artifacts/outs/model/weights.bin"))
    weights.write_bytes(b"corrupted")
    third = project(tmp_path / "machine-c")
    res = ml(stage(third, mlflow))
    assert not res["failed"] and res["ran"] is True and "reused_from" not in res
    msgs = [w["event"]["msg"] if isinstance(w, dict) else w for w in res.get("warnings", [])]
    assert any("not reusing MLflow run %s" % run_id in m for m in msgs), msgs


def test_reuse_trusts_only_locks_signed_by_this_site_or_pinned(server: Server, tmp_path: Path) -> None:
    """A run anyone could have uploaded is not reused: signed with another key, changed after
    it was signed, or not matching the pins, the command runs instead (with a warning)."""
    def mlflow(**over: Any) -> Dict[str, Any]:
        return dict({"tracking_uri": server.url, "experiment": "stage-trust", "reuse": True}, **over)

    first = ml(stage(project(tmp_path / "a"), mlflow(signing_key=SITE_KEY)))
    assert not first["failed"] and first["ran"], first
    run_a = first["mlflow"]["run_id"]
    tags = server.run(run_a)["tags"]
    assert len(tags["mlinfra.stage.signed_by"]) == 16 and SITE_KEY not in json.dumps(tags)
    assert "ml_stage/lock.json.sig" in server.artifacts(run_a, "ml_stage")

    # another site's key: run A is no candidate, so it runs (and signs its own run B)
    foreign = project(tmp_path / "b")
    res = ml(stage(foreign, mlflow(signing_key=OTHER_KEY)))
    assert not res["failed"] and res["ran"] is True and "reused_from" not in res, res
    run_b = res["mlflow"]["run_id"]

    # pins instead of a key: every out's hash as the first lock recorded it
    pins = {out: entry["hash"] for out, entry in first["outs"].items()}
    pinned = project(tmp_path / "c")
    res = ml(stage(pinned, mlflow(reuse_pins=pins)))
    assert not res["failed"] and res["ran"] is False and res["reused_from"] in (run_a, run_b), res
    assert "outs match mlflow.reuse_pins" in res["reasons"][-1] and ran(pinned) == 0
    wrong = dict(pins, **{"metrics.json": "0" * len(pins["metrics.json"])})
    res = ml(stage(project(tmp_path / "d"), mlflow(reuse_pins=wrong)))
    assert not res["failed"] and res["ran"] is True, res
    assert any("mlflow.reuse_pins pins" in w for w in warning_texts(res)), res

    # run A's lock edited on the server after it was signed (to point at other weights)
    lock_file = next((server.tmp / "artifacts").rglob(run_a + "/artifacts/ml_stage/lock.json"))
    lock_file.write_text(lock_file.read_text().replace(first["outs"]["model"]["hash"], "f" * 32))
    tampered = project(tmp_path / "e")
    predicted = ml(stage(tampered, mlflow(signing_key=SITE_KEY)), check=True)
    assert predicted["changed"] and "reuse_from" not in predicted   # check mode reads the lock too
    res = ml(stage(tampered, mlflow(signing_key=SITE_KEY)))
    assert not res["failed"] and res["ran"] is True and "reused_from" not in res, res
    assert any("not reusing MLflow run %s: its lock does not match its signature" % run_a in w
               for w in warning_texts(res)), res


def warning_texts(res: Dict[str, Any]) -> list:
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in res.get("warnings", [])]


class AuthProxy:
    """Basic auth in front of the real server, as an nginx would put it (the MLflow
    basic-auth app itself needs the mlflow[auth] extra, which the project does not pin)."""

    def __init__(self, upstream: str, user: str, password: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading
        expected = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
        self.denied = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.headers.get("Authorization") != expected:
                    proxy.denied += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command)
                for key in ("Content-Type",):
                    if self.headers.get(key):
                        req.add_header(key, self.headers[key])
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type")
                except urllib.error.HTTPError as exc:
                    status, payload, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_basic_auth_credentials(server: Server, tmp_path: Path) -> None:
    proxy = AuthProxy(server.url, "ml-user", "s3cret-admin-pw")
    try:
        proj = project(tmp_path / "p")
        bad = {"tracking_uri": proxy.url, "experiment": "auth",
               "credentials": {"username": "ml-user", "password": "wrong-password"}}
        res = ml(stage(proj, bad))
        assert res["failed"] and "401" in res["msg"] and "mlflow.credentials" in res["msg"], res
        assert "wrong-password" not in json.dumps(res)
        assert ran(proj) == 0 and proxy.denied >= 1
        good = dict(bad, credentials={"username": "ml-user", "password": "s3cret-admin-pw"})
        denied = proxy.denied
        res = ml(stage(proj, good))
        assert not res["failed"] and res["ran"], res
        assert proxy.denied == denied   # neither the module nor the command was refused
        run = server.run(res["mlflow"]["run_id"])
        assert run["info"]["status"] == "FINISHED"
        assert run["metrics"]["from_script"] == 42.0   # the credentials reached the command too
        assert "s3cret-admin-pw" not in json.dumps(res)
    finally:
        proxy.stop()


def test_through_ansible_playbook(server: Server, tmp_path: Path) -> None:
    """The module as Ansible ships it (AnsiballZ): every module_util it imports lazily
    (MLflow tracking, code fingerprints, metrics) must travel with it."""
    proj = project(tmp_path / "p")
    (proj / ".gitignore").write_text("runs.log\ntelemetry.txt\n")  # written by the command, not outs
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run(["git", "-C", str(proj), "add", "train.py", ".gitignore"], check=True)
    subprocess.run(["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                    "commit", "-q", "-m", "init"], check=True)
    task = {"name": "train", "chdir": str(proj), "cmd": [sys.executable, "train.py"],
            "deps": ["data/"], "outs": ["model/"], "metrics_file": "metrics.json",
            "params": {"lr": 0.01}, "code": {"paths": ["train.py"], "git": True, "python": True},
            "mlflow": {"tracking_uri": server.url, "experiment": "stage-playbook"}}
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "run", "mlinfra.kvm.ml_stage": task, "register": "first"},
        {"name": "again", "mlinfra.kvm.ml_stage": task, "register": "second"},
        {"ansible.builtin.assert": {"that": [
            "first is changed", "first.mlflow_run_id | length == 32", "first.metrics.acc == 0.93",
            "second is not changed", "second.reasons == []"], "fail_msg": "{{ second.reasons }}"}},
    ]}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env.pop("PYTHONPATH", None)
    venv_bin = Path(sys.executable).parent
    proc = subprocess.run([str(venv_bin / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook), "-e", "ansible_python_interpreter=" + sys.executable],
                          env=env, capture_output=True, text=True, cwd=str(tmp_path), timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "changed=1" in proc.stdout and "failed=0" in proc.stdout
    assert len(server.runs("stage-playbook")) == 1
