"""The pipeline role's training parameters: pipeline_train_params_overrides merges over
pipeline_train_params, so changing one parameter keeps the others (dist_timeout_s, precision).

The role's own preflight runs against localhost in check mode (a worker group of one), then
the play reads the parameters the train stage would run with (its key before world_size).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from test_roles_static import failures, run_playbook

pytestmark = pytest.mark.unit
ROLE = Path(ROOT) / "roles" / "pipeline"
MARK = "TRAIN_PARAMS="


def preflight(tmp_path: Path, extra_vars: dict):
    """(ansible-playbook's result, the merged parameters the play printed or None)."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "pipeline preflight", "hosts": "localhost", "gather_facts": False,
        "tasks": [
            {"name": "the role's preflight", "ansible.builtin.include_role": {
                "name": "mlinfra.kvm.pipeline", "tasks_from": "preflight", "public": True}},
            {"name": "the parameters train runs with", "ansible.builtin.debug": {
                "msg": MARK + "{{ __pipeline_train_params_given | to_json }}"}},
        ],
    }], sort_keys=False))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": {
        "localhost": {"ansible_connection": "local"}}}}}}))
    overrides = tmp_path / "extra.json"
    overrides.write_text(json.dumps(extra_vars))
    proc = run_playbook(play, "-i", str(inventory), "--check", "-e", "@%s" % overrides)
    found = [line for line in proc.stdout.splitlines() if MARK in line]
    # The default callback's line: ok: [localhost] => {"msg": "TRAIN_PARAMS={...}"}
    params = json.loads(json.loads(found[0][found[0].index("=> ") + 3:])["msg"][len(MARK):]) if found else None
    return proc, params


def role_default_train_params() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["pipeline_train_params"]


def test_an_override_changes_one_parameter_and_keeps_the_others(tmp_path):
    proc, params = preflight(tmp_path, {"pipeline_train_params_overrides": {"lr": 0.002, "epochs": 6}})
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    assert params == dict(role_default_train_params(), lr=0.002, epochs=6), params
    assert params["dist_timeout_s"] == 120 and params["precision"] == "auto"


def test_overrides_merge_over_an_inventory_s_whole_mapping(tmp_path):
    base = {"epochs": 4, "lr": 0.003, "hidden": [64, 32], "dropout": 0.1, "batch_size": 0, "seed": 7,
            "precision": "auto", "dist_timeout_s": 60}
    proc, params = preflight(tmp_path, {"pipeline_train_params": base,
                                        "pipeline_train_params_overrides": {"hidden": [16]}})
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    assert params == dict(base, hidden=[16]), params


def test_the_preflight_checks_the_merged_parameters(tmp_path):
    proc, params = preflight(tmp_path, {"pipeline_train_params_overrides": {"dist_timeout_s": 0}})
    assert proc.returncode != 0 and params is None, proc.stdout[-3000:]
    [(task, msg)] = failures(proc)
    assert task.endswith("Assert the training parameters are sound"), task
    assert "pipeline_train_params_overrides" in msg and '"dist_timeout_s": 0' in msg, msg


def test_the_readme_changes_one_parameter_with_the_overrides():
    """README's example of a changed training parameter keeps the other parameters."""
    readme = (Path(ROOT) / "README.md").read_text()
    assert '"pipeline_train_params_overrides"' in readme
    assert '-e \'{"pipeline_train_params": ' not in readme, "an example replacing the whole mapping drops keys"


# --------------------------------------------------------------------------- GPU health before the train

HEALTH_FIXTURES = Path(ROOT) / "tests" / "fixtures" / "gpu-health"
SHARED_CAPTURE = Path(ROOT).parent / "shared" / "fixtures" / "h200-passthrough-guest" / "nvidia-smi-q.xml"


def gpu_check(tmp_path: Path, extra_vars: dict, check: bool = False):
    """The role's tasks/gpu_health.yml on localhost as the one planned worker; (result, failures)."""
    play = tmp_path / "gpu_health.yml"
    play.write_text(yaml.safe_dump([{
        "name": "train's GPU check", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "the role's GPU check", "ansible.builtin.include_role": {
            "name": "mlinfra.kvm.pipeline", "tasks_from": "gpu_health"}}],
    }], sort_keys=False))
    inventory = tmp_path / "hosts.yml"  # the role plans its workers from this group
    inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": {
        "localhost": {"ansible_connection": "local"}}}}}}))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(extra_vars))
    proc = run_playbook(play, "-i", str(inventory), "-e", "@%s" % extra, *(["--check"] if check else []))
    return proc, failures(proc)


def smi_options(xml: Path, log: str = "") -> dict:
    if not xml.is_file():
        pytest.skip("fixture %s is missing" % xml)
    options = {"source": "nvidia-smi", "xml_file": str(xml)}
    options.update({"kernel_log_file": str(HEALTH_FIXTURES / log)} if log else {"kernel_log": "none"})
    return {"pipeline_gpu_health_options": options}


@pytest.mark.parametrize("check", [False, True])
def test_the_train_refuses_an_unhealthy_gpu_naming_it_and_the_reason(tmp_path, check):
    proc, failed = gpu_check(tmp_path, smi_options(HEALTH_FIXTURES / "dbe.xml"), check=check)
    assert proc.returncode != 0
    ((task, msg),) = failed
    assert task.endswith("Refuse to train on an unhealthy GPU (pipeline_gpu_health_override to train anyway)")
    assert ("localhost: GPU 0 NVIDIA H200 (GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2, 00000000:00:06.0): "
            "2 uncorrectable (double-bit) ECC errors since the last reset") in msg
    assert "pipeline_gpu_health_override=true" in msg


def test_a_gpu_fallen_off_the_bus_is_refused(tmp_path):
    proc, failed = gpu_check(tmp_path, smi_options(SHARED_CAPTURE, "xid79.log"))
    assert proc.returncode != 0 and "XID 79 (GPU has fallen off the bus" in failed[0][1]


def test_the_override_trains_anyway_and_says_so(tmp_path):
    proc, failed = gpu_check(tmp_path, dict(smi_options(HEALTH_FIXTURES / "dbe.xml"), pipeline_gpu_health_override=True))
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "pipeline_gpu_health_override=true: training despite localhost: GPU 0 NVIDIA H200" in proc.stdout


def test_a_healthy_gpu_with_an_application_xid_passes(tmp_path):
    proc, failed = gpu_check(tmp_path, smi_options(SHARED_CAPTURE, "xid13.log"))
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "GPU health: 1 GPU: 1 healthy" in proc.stdout


def test_a_worker_without_gpu_passes_and_says_so(tmp_path):
    options = {"pipeline_gpu_health_options": {"source": "nvidia-smi", "nvidia_smi": str(tmp_path / "no-nvidia-smi")}}
    proc, failed = gpu_check(tmp_path, options)
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "no NVIDIA GPU here: nothing to refuse" in proc.stdout


@pytest.mark.parametrize("variable, value", [("pipeline_cost_utilisation", 1.5), ("pipeline_cost_electricity_price", 0),
                                             ("pipeline_cost_lifetime_years", 0)])
def test_a_bad_cost_input_fails_before_the_train_naming_the_variable(tmp_path, variable, value):
    proc, failed = gpu_check(tmp_path, dict(smi_options(SHARED_CAPTURE), **{variable: value}))
    assert proc.returncode != 0
    ((task, msg),) = failed
    assert task.endswith("Check the declared cost inputs before the train starts")
    assert "option %s: value" % variable in msg, msg


def test_an_unknown_gpu_model_without_power_fails_naming_the_power_variable(tmp_path):
    proc, failed = gpu_check(tmp_path, dict(smi_options(SHARED_CAPTURE), pipeline_cost_gpu_model="RTX 4090"))
    assert proc.returncode != 0 and "option pipeline_cost_gpu_power_w" in failed[0][1], failed


# --------------------------------------------------------------------------- the cost of a run

def cost_play(tmp_path: Path, extra_vars: dict, changed: bool = True, run_id: str = ""):
    """gpu_health.yml, then a train result standing in for the stage's (30 minutes), then cost.yml."""
    play = tmp_path / "cost.yml"
    play.write_text(yaml.safe_dump([{
        "name": "train's cost", "hosts": "localhost", "gather_facts": False,
        "tasks": [
            {"name": "the role's GPU check", "ansible.builtin.include_role": {
                "name": "mlinfra.kvm.pipeline", "tasks_from": "gpu_health"}},
            {"name": "a train result", "ansible.builtin.set_fact": {
                "pipeline_train_result": {"changed": changed, "duration": 1800.0, "mlflow_run_id": run_id}}},
            {"name": "the role's cost", "ansible.builtin.include_role": {
                "name": "mlinfra.kvm.pipeline", "tasks_from": "cost"}},
        ],
    }], sort_keys=False))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"mlinfra_worker": {"hosts": {
        "localhost": {"ansible_connection": "local"}}}}}}))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(extra_vars))
    proc = run_playbook(play, "-i", str(inventory), "-e", "@%s" % extra)
    return proc, failures(proc)


def test_the_train_report_has_its_cost_line(tmp_path):
    """One H200 for 30 minutes, no energy counter in nvidia-smi's XML: 0.5 GPU-hours at the board's
    700 W = 0.35 kWh; x PUE 1.58 x 0.15 = 0.083; hardware 10000 / (3 * 8760 * 0.5) * 0.5 = 0.381;
    no cloud rate for H200 among the defaults (only the seed's A100)."""
    proc, failed = cost_play(tmp_path, smi_options(SHARED_CAPTURE))
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert ("cost: 0.500 GPU-hours (1 x H200), 0.350 kWh (board power 700 W of H200 (NVIDIA datasheet maximum) x time), "
            "PUE 1.58: on premise 0.46 USD (hardware 0.38 at 50% utilisation + energy 0.08); no cloud rate declared for H200"
            ) in proc.stdout, proc.stdout[-3000:]


def test_the_cost_line_with_a_declared_cloud_rate_and_power(tmp_path):
    """500 W for 0.5 GPU-hours = 0.25 kWh; energy per GPU-hour 0.5 * 1.58 * 0.15 = 0.1185; cloud
    0.5 * 4 = 2.00; break-even 10000 / (26280 * (4 - 0.1185)) = 9.8 %."""
    extra = dict(smi_options(SHARED_CAPTURE), pipeline_cost_cloud_rates={"H200": 4.0}, pipeline_cost_gpu_power_w=500)
    proc, failed = cost_play(tmp_path, extra)
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "0.250 kWh (declared power 500 W x time)" in proc.stdout
    assert "cloud 2.00 USD at 4 USD/GPU-hour; on premise is cheaper above 9.8% utilisation" in proc.stdout


def test_a_skipped_train_has_nothing_to_price(tmp_path):
    proc, failed = cost_play(tmp_path, smi_options(SHARED_CAPTURE), changed=False)
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "cost: the train did not run, nothing to price" in proc.stdout


def test_the_cost_lands_on_the_train_s_mlflow_run(tmp_path):
    """A stand-in tracking server records the log-batch call (the REST API ml_stage uses too)."""
    import http.server
    import threading

    calls = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append((self.path, json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        extra = dict(smi_options(SHARED_CAPTURE), pipeline_mlflow_tracking_uri="http://127.0.0.1:%d/" % server.server_port)
        proc, failed = cost_play(tmp_path, extra, run_id="0123abcd")
    finally:
        server.shutdown()
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    ((path, body),) = calls
    assert path == "/api/2.0/mlflow/runs/log-batch" and body["run_id"] == "0123abcd"
    metrics = {m["key"]: m["value"] for m in body["metrics"]}
    # the worked example of test_the_train_report_has_its_cost_line; no cloud rate: no cloud metrics
    assert metrics == pytest.approx({"mlinfra.cost.gpu_hours": 0.5, "mlinfra.cost.energy_kwh": 0.35,
                                     "mlinfra.cost.on_premise": 10000 / 26280 + 0.35 * 1.58 * 0.15})
    assert all(isinstance(m["timestamp"], int) and m["step"] == 0 for m in body["metrics"])
    tags = {t["key"]: t["value"] for t in body["tags"]}
    assert tags["mlinfra.cost.energy_source"].startswith("board power 700 W") and tags["mlinfra.cost.currency"] == "USD"


def test_a_worker_without_gpu_gets_a_cost_line_that_says_so(tmp_path):
    """The lab's TCG workers: no nvidia-smi, so no GPU; the GPU check passes and the cost says why it is empty."""
    options = {"pipeline_gpu_health_options": {"source": "nvidia-smi", "nvidia_smi": str(tmp_path / "no-nvidia-smi")}}
    proc, failed = cost_play(tmp_path, options)
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    assert "cost: no GPU on the workers (a CPU-only run of 1800 s): no GPU time to price" in proc.stdout
