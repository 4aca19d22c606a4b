"""mlinfra.kvm.monitoring without a monitoring host: layout, argument specs, preflight refusals,
and the rendered Prometheus and Alertmanager files checked by promtool and amtool.

Plays run against localhost in check mode with the preflight tag (nothing here changes), the
way tests/unit/test_roles_static.py runs the other roles.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from test_roles_static import run_playbook

pytestmark = pytest.mark.unit
ROLE = Path(ROOT) / "roles" / "monitoring"
VENDOR = ROLE / "files" / "dashboard" / "vendor" / "uPlot.iife.min.js"


def failures(proc: subprocess.CompletedProcess) -> list:
    """(task, msg) of every failed task or loop item ("fatal:" and "failed:" lines)."""
    found, task = [], None
    for line in proc.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")]
        elif line.startswith(("fatal: ", "failed: ")) and "=> {" in line:
            found.append((task, str(json.loads(line[line.index("=> {") + 3:]).get("msg"))))
    return found


def role_vars_play(path: Path, tasks: list, **play: object) -> Path:
    """A one-play playbook at path that loads the role's defaults and vars (vars_files), as the
    role's own tasks see them, then runs tasks; play sets or adds the play's keys (name, hosts,
    vars, connection). Returns path."""
    path.write_text(yaml.safe_dump([dict({"hosts": "localhost", "gather_facts": False, "vars_files": [
        str(ROLE / "defaults/main.yml"), str(ROLE / "vars/main.yml")]}, tasks=tasks, **play)], sort_keys=False))
    return path


def server_play(tmp_path: Path, role_vars: dict, tasks_from: str = "server") -> Path:
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{
        "name": "monitoring preflight", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "the role", "ansible.builtin.include_role": {
            "name": "mlinfra.kvm.monitoring", "tasks_from": tasks_from}, "vars": role_vars,
            "tags": ["preflight"]}],
    }], sort_keys=False))
    return path


def test_layout_and_argument_specs():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    assert set(specs) == {"main", "exporters", "server"}
    assert set(defaults) == set(specs["main"]["options"]), set(defaults) ^ set(specs["main"]["options"])
    assert set(specs["exporters"]["options"]) | set(specs["server"]["options"]) == set(defaults)
    for name, option in specs["main"]["options"].items():
        assert str(option["default"]) == str(defaults[name]), name
    assert all(n.startswith("monitoring_") for n in defaults)
    internal = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    assert all(n.startswith("__monitoring_") for n in internal), list(internal)
    for handler in yaml.safe_load((ROLE / "handlers/main.yml").read_text()):
        assert handler.get("listen", "").startswith("monitoring "), handler["name"]
    for preflight in ("exporters_preflight.yml", "server_preflight.yml"):
        for task in yaml.safe_load((ROLE / "tasks" / preflight).read_text()):
            modules = [k for k in task if k not in ("name", "when", "tags", "vars", "loop", "loop_control",
                                                    "register", "check_mode")]
            assert modules[0] in ("ansible.builtin.assert", "ansible.builtin.slurp"), (preflight, task["name"])


@pytest.mark.parametrize("role_vars,needle", [
    ({"monitoring_alerts_silenced": ["GPUTooHot"]}, 'names ["GPUTooHot"], which are not alerts of this role'),
    ({"monitoring_alert_gpu_temp_celsius": "hot"}, 'monitoring_alert_gpu_temp_celsius="hot" is not a number'),
    ({"monitoring_alert_disk_free_ratio": 1.5}, "monitoring_alert_disk_free_ratio=1.5 is not a number between 0 and 1"),
    ({"monitoring_alert_vm_down_for": "one minute"}, 'monitoring_alert_vm_down_for="one minute" is not a Prometheus duration'),
    ({"monitoring_alert_webhook_url": "chat.example.internal/hook"},
     'monitoring_alert_webhook_url="chat.example.internal/hook" is not an http(s)'),
    ({"monitoring_mlflow_urls": ["tracking:5000"]}, 'monitoring_mlflow_urls has "tracking:5000"'),
    ({"monitoring_alert_email": {"to": "ops@example.internal"}}, "monitoring_alert_email needs to, from and smarthost"),
    ({"monitoring_receiver_log": "/tmp/alerts.jsonl"}, 'monitoring_receiver_log="/tmp/alerts.jsonl"'),
])
def test_server_preflight_refuses_bad_input(tmp_path, role_vars, needle):
    proc = run_playbook(server_play(tmp_path, role_vars), "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed and needle in failed[0][1], failed


def test_a_target_that_does_not_resolve_fails_before_any_change(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"hypervisors": {"hosts": {
        "hv-gone": {"monitoring_address": "hv-gone.invalid"}}}}}}))
    play = server_play(tmp_path, {})
    proc = run_playbook(play, "-i", str(inventory), "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed and 'hv-gone\'s scrape address "hv-gone.invalid" does not resolve' in failed[0][1], failed
    assert "Set monitoring_address for hv-gone" in failed[0][1]


def test_exporter_preflight_refuses_a_bad_port(tmp_path):
    proc = run_playbook(server_play(tmp_path, {"monitoring_node_exporter_port": 99999}, "exporters"),
                        "--check", "--tags", "preflight")
    failed = failures(proc)
    assert failed and "monitoring_node_exporter_port=99999 is not a TCP port" in failed[0][1], failed


def test_server_preflight_accepts_the_defaults(tmp_path):
    if not VENDOR.is_file():
        pytest.skip("the dashboard's uPlot is not vendored: run scripts/build-dashboard-vendor.sh (make setup does)")
    proc = run_playbook(server_play(tmp_path, {}), "--check", "--tags", "preflight")
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])


def render(tmp_path: Path, template: str, extra_vars: dict) -> Path:
    """Render one of the role's templates with Ansible itself (role defaults + vars)."""
    out = tmp_path / Path(template).name.replace(".j2", "")
    play = role_vars_play(tmp_path / "render.yml", [{"name": "render", "ansible.builtin.template": {
        "src": str(ROLE / "templates" / template), "dest": str(out), "mode": "0644"}}],
        name="render", vars={"__monitoring_targets": "{{ __monitoring_targets_list | from_json }}"})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "hypervisors": {"hosts": {"hv1": {"monitoring_address": "192.0.2.1"}}},
        "mlinfra_guests": {"hosts": {
            "gpu-worker": {"ansible_host": "192.0.2.20", "mlinfra_vm": {"role": "worker", "gpus": ["0000:41:00.0"]},
                           "mlinfra_hypervisor": "hv1"},
            "tracking": {"ansible_host": "192.0.2.10", "mlinfra_vm": {"role": "tracking", "gpus": []},
                         "mlinfra_hypervisor": "hv1"}}},
        "monitoring": {"hosts": {"localhost": {"ansible_connection": "local"}}}}}}))
    overrides = tmp_path / "overrides.json"  # extra vars: above the role defaults of vars_files
    overrides.write_text(json.dumps(extra_vars))
    proc = run_playbook(play, "-i", str(inventory), "--limit", "localhost", "-e", "@%s" % overrides)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    return out


def test_prometheus_config_scrapes_the_inventory(tmp_path):
    if not shutil.which("promtool"):
        pytest.skip("promtool (Debian package prometheus) is not installed; `make setup` installs it")
    out = render(tmp_path, "prometheus.yml.j2", {"monitoring_mlflow_urls": ["http://192.0.2.10:5000"]})
    check = subprocess.run(["promtool", "check", "config", "--syntax-only", str(out)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    jobs = {j["job_name"]: j for j in yaml.safe_load(out.read_text())["scrape_configs"]}
    node = {tuple(sc["targets"]): sc["labels"] for sc in jobs["node"]["static_configs"]}
    assert node == {("192.0.2.1:9100",): {"host": "hv1", "role": "hypervisor"},
                    ("192.0.2.20:9100",): {"host": "gpu-worker", "role": "worker"},
                    ("192.0.2.10:9100",): {"host": "tracking", "role": "tracking"}}
    assert [sc["targets"] for sc in jobs["libvirt"]["static_configs"]] == [["192.0.2.1:9177"]]
    # Only the guest with a GPU passed through gets the GPU job.
    assert [sc["targets"] for sc in jobs["gpu"]["static_configs"]] == [["192.0.2.20:9400"]]
    assert jobs["mlflow"]["static_configs"][0]["targets"] == ["http://192.0.2.10:5000/health"]


def test_expected_vms_textfile_lists_the_guests_placed_here(tmp_path):
    out = tmp_path / "expected.prom"
    play = role_vars_play(tmp_path / "render.yml", [{"name": "render", "ansible.builtin.template": {
        "src": str(ROLE / "templates/expected_vms.prom.j2"), "dest": str(out), "mode": "0644"}}],
        name="render", hosts="hv1", connection="local",
        vars={"ansible_python_interpreter": "{{ ansible_playbook_python }}"})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "hypervisors": {"hosts": {"hv1": {}, "hv2": {}}},
        "mlinfra_guests": {"hosts": {"vm-a": {"mlinfra_hypervisor": "hv1"}, "vm-b": {"mlinfra_hypervisor": "hv2"}}}}}}))
    proc = run_playbook(play, "-i", str(inventory), "-e", '{"monitoring_expected_vms_extra": ["hand-made"]}')
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    samples = [line for line in out.read_text().splitlines() if line and not line.startswith("#")]
    assert samples == ['mlinfra_vm_expected_running{domain="hand-made"} 1',
                       'mlinfra_vm_expected_running{domain="vm-a"} 1']


@pytest.mark.parametrize("email", [{}, {"to": "ops@example.internal", "from": "am@example.internal",
                                        "smarthost": "smtp.example.internal:587", "auth_username": "am",
                                        "auth_password": "s3cret"}])
def test_alertmanager_config_passes_amtool(tmp_path, email):
    if not shutil.which("amtool"):
        pytest.skip("amtool (Debian package prometheus-alertmanager) is not installed; `make setup` installs it")
    out = render(tmp_path, "alertmanager.yml.j2", {"monitoring_alert_email": email})
    check = subprocess.run(["amtool", "check-config", str(out)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(out.read_text())
    assert config["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:9095/"
    assert len(config["receivers"]) == (2 if email else 1)


def test_config_files_writes_what_the_template_module_wrote(tmp_path):
    """config.yml writes the server's files with mlinfra.kvm.config_files from template lookups.
    Where the template module wrote the same files first, it finds nothing to change: the
    lookups render byte for byte what the template module renders (trailing newlines,
    ansible_managed), and the receiver script comes unstripped."""
    import grp
    import os
    import pwd
    import re
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    entries = [dict(e) for key in ("__monitoring_prometheus_config_files", "__monitoring_alertmanager_config_files",
                                   "__monitoring_blackbox_config_files", "__monitoring_receiver_config_files")
               for e in role_vars[key]]
    out = tmp_path / "out"
    out.mkdir()
    me, mine = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    first = []
    for e in entries:
        e.update(path=str(out / Path(e["path"]).name), owner=me, group=mine)
        e.pop("validate", None)  # promtool and amtool checks: tests above
        source = re.search(r"lookup\('ansible\.builtin\.(template|file)', '([^']+)'", e["content"])
        if source.group(1) == "template":
            first.append({"name": "template module: %s" % source.group(2), "ansible.builtin.template": {
                "src": source.group(2), "dest": e["path"], "mode": e["mode"]}})
        else:
            first.append({"name": "copy module: %s" % source.group(2), "ansible.builtin.copy": {
                "src": source.group(2), "dest": e["path"], "mode": e["mode"]}})
    assert len(first) == 9, [t["name"] for t in first]
    # The play's own templates/ and files/ are the role's: lookups search them as they search a role's.
    (tmp_path / "templates").symlink_to(ROLE / "templates")
    (tmp_path / "files").symlink_to(ROLE / "files")
    play = role_vars_play(tmp_path / "play.yml", first + [
        {"name": "config_files", "mlinfra.kvm.config_files": {"files": entries}, "register": "again"},
        {"name": "nothing to change", "ansible.builtin.assert": {
            "that": ["not again.changed", "again.changed_paths == []"], "fail_msg": "{{ again.files | to_json }}"}}],
        name="template module, then config_files",
        vars={"__monitoring_targets": "{{ __monitoring_targets_list | from_json }}"})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "hypervisors": {"hosts": {"hv1": {"monitoring_address": "192.0.2.1"}}},
        "mlinfra_guests": {"hosts": {"tracking": {"ansible_host": "192.0.2.10", "mlinfra_vm": {"role": "tracking", "gpus": []},
                                                  "mlinfra_hypervisor": "hv1"}}},
        "monitoring": {"hosts": {"localhost": {"ansible_connection": "local"}}}}}}))
    proc = run_playbook(play, "-i", str(inventory), "--limit", "localhost")
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    assert (out / "mlinfra-alert-receiver").read_bytes() == (ROLE / "files/mlinfra_alert_receiver.py").read_bytes()


@pytest.mark.parametrize("exporters_read, server_read, up", [
    # The exporters' read on the server host includes the server's units; the server's own is skipped.
    ({"stdout": "Id=prometheus-node-exporter.service\nActiveState=active\nUnitFileState=enabled\n\n"
                "Id=prometheus.service\nActiveState=inactive\nUnitFileState=disabled"}, {"skipped": True},
     ["prometheus-node-exporter.service"]),
    # server.yml on its own: only its read.
    (None, {"stdout": "Id=prometheus.service\nActiveState=active\nUnitFileState=enabled"}, ["prometheus.service"]),
    # No systemd (this hypervisor): both reads skipped, every "Run ..." task runs.
    ({"skipped": True}, {"skipped": True}, []),
])
def test_units_up_from_the_role_s_own_expression(tmp_path, exporters_read, server_read, up):
    """__monitoring_units_up as the role computes it (vars/main.yml), from registered reads."""
    given = {"__monitoring_server_units_read": server_read}
    if exporters_read is not None:
        given["__monitoring_units_read"] = exporters_read
    overrides = tmp_path / "reads.json"
    overrides.write_text(json.dumps(given))
    play = role_vars_play(tmp_path / "play.yml", [{"name": "units up", "ansible.builtin.assert": {
        "that": ["__monitoring_units_up == %s" % json.dumps(up)],
        "fail_msg": "{{ __monitoring_units_up | to_json }}"}}], name="units")
    proc = run_playbook(play, "-e", "@%s" % overrides)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-2000:])


def _handler_decisions(tmp_path: Path, runs: dict, changed_tags: list) -> dict:
    """Each server handler's `when`, as handlers/main.yml writes it, evaluated by Ansible with
    the role's vars and the given results of the "Run ..." tasks and of config.yml."""
    handlers = {h["name"]: h["when"] if isinstance(h["when"], list) else [h["when"]]
                for h in yaml.safe_load((ROLE / "handlers/main.yml").read_text()) if "when" in h}
    facts = dict(runs, __monitoring_server_config={"changed": bool(changed_tags), "changed_tags": changed_tags})
    expression = "{{ {%s} | to_json }}" % ", ".join(
        "%s: (%s)" % (json.dumps(name), " and ".join("(%s)" % c.strip() for c in conditions))
        for name, conditions in handlers.items())
    play = role_vars_play(tmp_path / "handlers.yml", [{"ansible.builtin.set_fact": facts},
                                                      {"ansible.builtin.debug": {"msg": expression}}])
    proc = run_playbook(play)
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok: [localhost] => ") and '"msg"' in ln][-1]
    return json.loads(json.loads(line.split("=> ", 1)[1])["msg"])


ALL_SERVER_TAGS = ["monitoring prometheus reload", "monitoring prometheus restart", "monitoring alertmanager reload",
                   "monitoring alertmanager restart", "monitoring blackbox restart", "monitoring receiver restart",
                   "monitoring receiver unit"]
SERVER_RUNS = {"__monitoring_prometheus_run": "prometheus", "__monitoring_alertmanager_run": "prometheus-alertmanager",
               "__monitoring_blackbox_run": "prometheus-blackbox-exporter",
               "__monitoring_receiver_run": "mlinfra-alert-receiver"}


@pytest.mark.unit
@pytest.mark.parametrize("before", ["inactive", "failed"])
def test_units_this_run_started_get_no_restart_or_reload(tmp_path, before):
    """A first run: every unit was stopped, its Run task started it after config.yml wrote its
    files; restarting or reloading it again is work with nothing to apply."""
    runs = {var: {"changed": True, "name": unit, "status": {"ActiveState": before}} for var, unit in SERVER_RUNS.items()}
    decisions = _handler_decisions(tmp_path, runs, ALL_SERVER_TAGS)
    assert decisions and not any(decisions.values()), decisions


@pytest.mark.unit
def test_units_that_ran_before_get_their_handlers_once(tmp_path):
    """Running before this run (Run tasks skipped) or started by the package's postinst (Run
    task ok, unit active): changed files need their restart; a restart makes the reload moot."""
    skipped = {var: {"changed": False, "skipped": True} for var in SERVER_RUNS}
    decisions = _handler_decisions(tmp_path, skipped, ALL_SERVER_TAGS)
    assert decisions["Restart Prometheus (its command line changed)"] and decisions["Restart Alertmanager"]
    assert decisions["Restart the blackbox exporter"] and decisions["Restart the alert receiver"]
    assert decisions["Reload systemd units"]  # the receiver's unit changed while it runs
    assert not decisions["Reload Prometheus"] and not decisions["Reload Alertmanager"]

    postinst = {var: {"changed": True, "name": unit, "status": {"ActiveState": "active"}}  # enabled only
                for var, unit in SERVER_RUNS.items()}
    decisions = _handler_decisions(tmp_path, postinst, ["monitoring prometheus reload", "monitoring alertmanager reload"])
    assert decisions["Reload Prometheus"] and decisions["Reload Alertmanager"]
    assert not decisions["Restart Prometheus (its command line changed)"] and not decisions["Reload systemd units"]


def _tls_server(tmp_path: Path):
    """An HTTPS /health on loopback whose certificate a fresh private CA signed (openssl, the
    role's own arguments): what the blackbox probe meets on a tracking server with TLS."""
    import http.server
    import ssl
    import threading
    ca_key, ca, key, cert = (tmp_path / n for n in ("ca.key", "ca.crt", "srv.key", "srv.crt"))
    base = ["openssl", "req", "-x509", "-config", "/dev/null", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(base + ["-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=test CA",
                           "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
                           "-addext", "subjectKeyIdentifier=hash"], check=True, capture_output=True)
    subprocess.run(base + ["-keyout", str(key), "-out", str(cert), "-CA", str(ca), "-CAkey", str(ca_key),
                           "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                           "-addext", "basicConstraints=critical,CA:FALSE"], check=True, capture_output=True)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, ca


def role_ca_copy(tmp_path: Path, ca: Path) -> Path:
    """The role's copy of monitoring_mlflow_ca_file (__monitoring_mlflow_ca_files, the entry
    config.yml hands to mlinfra.kvm.config_files), evaluated by Ansible and written with the
    copy module at a temporary path: the bytes the probe reads on the monitoring host."""
    out = tmp_path / "role-copy-of-ca.crt"
    play = role_vars_play(tmp_path / "ca-copy.yml", [{"name": "write it", "ansible.builtin.copy": {
        "content": "{{ (__monitoring_mlflow_ca_files | first).content }}", "dest": str(out), "mode": "0644"}}],
        name="the role's CA copy", connection="local",
        vars={"ansible_python_interpreter": "{{ ansible_playbook_python }}"})
    # An extra var, above the role defaults that vars_files loads.
    proc = run_playbook(play, "-e", json.dumps({"monitoring_mlflow_ca_file": str(ca)}))
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])
    return out


def test_the_role_s_copy_of_the_mlflow_ca_is_the_certificate(tmp_path):
    """The copy is the CA file's PEM with exactly one final newline: no literal backslash-n
    (which the probe's TLS client cannot parse, MLflowUnreachable firing on a healthy lab)."""
    _server, ca = _tls_server(tmp_path)
    _server.shutdown()
    copy = role_ca_copy(tmp_path, ca).read_bytes()
    assert copy == ca.read_bytes().rstrip(b"\n") + b"\n", copy[-80:]
    parsed = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=copy, capture_output=True, check=False)
    assert parsed.returncode == 0 and b"test CA" in parsed.stdout, parsed.stderr


@pytest.mark.parametrize("with_ca", [True, False])
def test_blackbox_probe_trusts_the_mlflow_ca(tmp_path, with_ca):
    """The rendered blackbox.yml against a real blackbox exporter and an HTTPS server: with
    monitoring_mlflow_ca_file the probe succeeds; without it the same probe fails on the
    certificate (so the first case proves the CA is what made it pass)."""
    import socket
    import time
    import urllib.request
    exporter = shutil.which("prometheus-blackbox-exporter")
    if not exporter:
        pytest.skip("prometheus-blackbox-exporter (Debian package) is not installed; `make setup` installs it")
    server, ca = _tls_server(tmp_path)
    out = render(tmp_path, "blackbox.yml.j2", {"monitoring_mlflow_ca_file": str(ca) if with_ca else ""})
    config = yaml.safe_load(out.read_text())
    if with_ca:   # the exporter reads the role's copy of the CA, written here as the role writes it
        assert config["modules"]["mlflow_health"]["http"]["tls_config"] == {"ca_file": "/etc/prometheus/mlflow-ca.crt"}
        config["modules"]["mlflow_health"]["http"]["tls_config"]["ca_file"] = str(role_ca_copy(tmp_path, ca))
    else:
        assert "tls_config" not in config["modules"]["mlflow_health"]["http"]
    out.write_text(yaml.safe_dump(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exporter, "--config.file", str(out), "--web.listen-address", "127.0.0.1:%d" % port],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = "http://127.0.0.1:%d/probe?module=mlflow_health&target=https://127.0.0.1:%d/health" % (
            port, server.server_address[1])
        deadline, body = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                time.sleep(0.3)
        assert "probe_success" in body, body
        assert ("probe_success 1" in body) is with_ca, body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()


NODE_XML = """<node>
  <domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
    <name>vm-running</name><memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os>
  </domain>
  <domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
    <name>vm-off</name><memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os>
    <test:runstate>5</test:runstate>
  </domain>
</node>
"""


def test_vm_state_collector_publishes_defined_but_shut_off_domains(tmp_path):
    """roles/monitoring/files/mlinfra_vm_state.py against libvirt's test driver (a node file
    with a running and a defined-but-shut-off domain): both appear with their real state, from
    libvirt's list of all domains; a URI libvirt cannot open leaves no state lines."""
    import sys
    pytest.importorskip("libvirt", reason="python3-libvirt (libvirt-python) is not installed; `make setup` installs it")
    script = ROLE / "files" / "mlinfra_vm_state.py"
    node = tmp_path / "node.xml"
    node.write_text(NODE_XML)
    out = tmp_path / "mlinfra_vm_state.prom"
    proc = subprocess.run([sys.executable, str(script), "--uri", "test://%s" % node, "--textfile", str(out), "--once"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    samples = [line for line in out.read_text().splitlines() if line and not line.startswith("#")]
    assert samples[:2] == ['mlinfra_vm_state{domain="vm-off"} 5', 'mlinfra_vm_state{domain="vm-running"} 1'], samples
    assert samples[2].startswith("mlinfra_vm_state_read_timestamp_seconds ") and len(samples) == 3, samples
    proc = subprocess.run([sys.executable, str(script), "--uri", "test://%s" % (tmp_path / "missing.xml"),
                           "--textfile", str(out), "--once"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "cannot read libvirt" in proc.stderr, proc.stderr
    assert [line for line in out.read_text().splitlines() if line and not line.startswith("#")] == []


def _vm_state_files(tmp_path: Path, pid1: str) -> dict:
    """__monitoring_vm_state_files as the role computes it (vars/main.yml) on a hypervisor whose
    PID 1 is `pid1`: {path: entry}."""
    import base64
    overrides = tmp_path / "pid1.json"
    overrides.write_text(json.dumps({"__monitoring_pid1": {"content": base64.b64encode(pid1.encode()).decode()},
                                     "monitoring_vm_state_interval": 7}))
    out = tmp_path / "files.json"
    for where in ("templates", "files"):  # the lookups look beside the playbook outside a role
        (tmp_path / where).symlink_to(ROLE / where)
    play = role_vars_play(tmp_path / "play.yml", [{"name": "files", "ansible.builtin.copy": {
        "content": "{{ __monitoring_vm_state_files | to_json }}", "dest": str(out), "mode": "0644"}}],
        name="vm state files")
    proc = run_playbook(play, "-e", "@%s" % overrides)
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])
    return {entry["path"]: entry for entry in json.loads(out.read_text())}


@pytest.mark.parametrize("pid1", ["systemd", "init"])
def test_hypervisors_install_and_start_the_vm_state_collector(tmp_path, pid1):
    """The exporters entry point installs the collector on hypervisors and starts it: a systemd
    unit under systemd, else an init script that runs it through `daemon --respawn` (as Debian's
    libvirt exporter runs there); both run the loop writing mlinfra_vm_state.prom in the textfile
    directory, and a changed file restarts it."""
    exporters = yaml.safe_load((ROLE / "tasks/exporters.yml").read_text())
    [step] = [t for t in exporters if t.get("ansible.builtin.import_tasks") == "vm_state.yml"]
    assert step["when"] == "__monitoring_is_hypervisor"
    assert exporters.index(step) > [t.get("ansible.builtin.import_tasks") for t in exporters].index("libvirt_exporter.yml")
    libvirt = yaml.safe_load((ROLE / "tasks/libvirt_exporter.yml").read_text())
    assert "python3-libvirt" in libvirt[0]["vars"]["__monitoring_packages"]

    files = _vm_state_files(tmp_path, pid1)
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    script = files.pop(defaults["monitoring_vm_state_path"])
    assert script["content"] == (ROLE / "files/mlinfra_vm_state.py").read_text() and script["mode"] == "0755"
    argv = "%s --uri %s --textfile %s/mlinfra_vm_state.prom --interval 7" % (
        defaults["monitoring_vm_state_path"], defaults["monitoring_libvirt_uri"], defaults["monitoring_textfile_dir"])
    tasks = {t["name"]: t for t in yaml.safe_load((ROLE / "tasks/vm_state.yml").read_text())}
    handlers = [h for h in yaml.safe_load((ROLE / "handlers/main.yml").read_text())
                if h.get("listen") == "monitoring vm_state restart"]
    if pid1 == "systemd":
        [(path, unit)] = files.items()
        assert path == "/etc/systemd/system/mlinfra-vm-state.service" and unit["tag"] == "monitoring vm_state unit"
        assert "ExecStart=%s\n" % argv in unit["content"] and "Restart=always" in unit["content"]
        run = tasks["Run the VM state collector (systemd unit)"]
        assert run["ansible.builtin.systemd_service"]["state"] == "started" and "__monitoring_systemd | bool" in run["when"]
        assert any("ansible.builtin.systemd_service" in h for h in handlers)
    else:
        [(path, init)] = files.items()
        assert path == "/etc/init.d/mlinfra-vm-state" and init["mode"] == "0755"
        assert init["tag"] == "monitoring vm_state restart"
        content = init["content"]
        assert 'HELPER=/usr/bin/daemon\n' in content and "--respawn" in content
        assert 'DAEMON=%s\n' % defaults["monitoring_vm_state_path"] in content
        assert 'ARGS="%s"\n' % argv.split(" ", 1)[1] in content
        proc = subprocess.run(["sh", "-n", "/dev/stdin"], input=content, capture_output=True, text=True, timeout=30,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        run = tasks["Run the VM state collector (init script, respawned by daemon)"]
        assert run["ansible.builtin.service"]["state"] == "started" and "not (__monitoring_systemd | bool)" in run["when"]
        assert any("ansible.builtin.service" in h for h in handlers)


def test_vm_state_collector_loop_replaces_the_file_atomically(tmp_path):
    """--interval mode, as the role runs it: the file appears with the domains' states and each
    read replaces it by a rename (a new inode; no temporary file left behind), so
    node_exporter never reads half a file."""
    import sys
    import time
    pytest.importorskip("libvirt", reason="python3-libvirt (libvirt-python) is not installed; `make setup` installs it")
    node = tmp_path / "node.xml"
    node.write_text(NODE_XML)
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    out = textfiles / "mlinfra_vm_state.prom"
    proc = subprocess.Popen([sys.executable, str(ROLE / "files" / "mlinfra_vm_state.py"), "--uri", "test://%s" % node,
                             "--textfile", str(out), "--interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    inodes, texts = [], []
    try:
        deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
        while len(set(inodes)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            if out.exists():
                stat = out.stat()
                if not inodes or stat.st_ino != inodes[-1]:
                    inodes.append(stat.st_ino)
                    texts.append(out.read_text())
            time.sleep(0.1)
    finally:
        proc.kill()
        stderr = proc.communicate(timeout=30)[1]
    assert len(set(inodes)) >= 3, ("the loop did not rewrite the file", proc.returncode, stderr)
    for text in texts:
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert samples[:2] == ['mlinfra_vm_state{domain="vm-off"} 5', 'mlinfra_vm_state{domain="vm-running"} 1'], text
    assert sorted(p.name for p in textfiles.iterdir()) == ["mlinfra_vm_state.prom"]
