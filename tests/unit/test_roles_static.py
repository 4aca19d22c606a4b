"""The guest roles without a guest: syntax, argument_specs and preflight refusals.

Every play runs against localhost (connection local) in check mode with the preflight tag,
so nothing on this machine changes; the roles are resolved as mlinfra.kvm.<role> through
the repository's ansible.cfg (collections/ansible_collections/mlinfra/kvm -> the checkout).
"""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

ROLES = ["nvidia_driver", "cuda", "ml_runtime", "mlflow_server", "nvidia_mps"]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def play(tmp_path: Path, role: str, role_vars: dict, gather: bool = False) -> Path:
    path = tmp_path / ("play-%s.yml" % role)
    path.write_text(yaml.safe_dump([{
        "name": "static check of %s" % role,
        "hosts": "localhost",
        "gather_facts": gather,
        "roles": [{"role": "mlinfra.kvm.%s" % role, "vars": role_vars}],
    }], sort_keys=False))
    return path


def run_playbook(path: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_CALLBACK_FORMAT_PRETTY="0", ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    argv = [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % sys.executable, str(path)] + list(extra)
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=timeout, check=False)


def failures(proc: subprocess.CompletedProcess) -> list:
    """(task name, msg) of every failed task, read from the default callback's output."""
    found, task = [], None
    for line in proc.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")]
        elif line.startswith("fatal: ") and "=> " in line:
            result = json.loads(line[line.index("=> ") + 3:])
            found.append((task, str(result.get("msg"))))
    return found


@pytest.mark.unit
@pytest.mark.parametrize("role", ROLES)
def test_role_layout(role):
    base = ROOT / "roles" / role
    for rel in ("defaults/main.yml", "meta/main.yml", "meta/argument_specs.yml", "tasks/main.yml",
                "tasks/preflight.yml", "handlers/main.yml", "vars/main.yml"):
        assert (base / rel).is_file(), "%s: %s missing" % (role, rel)
    defaults = yaml.safe_load((base / "defaults/main.yml").read_text())
    spec = yaml.safe_load((base / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    # Every default is documented, every documented option has a default, all carry the prefix.
    assert set(defaults) == set(spec), (set(defaults) ^ set(spec))
    assert all(name.startswith(role + "_") for name in defaults), [n for n in defaults if not n.startswith(role + "_")]
    internal = yaml.safe_load((base / "vars/main.yml").read_text())
    assert all(name.startswith("__%s_" % role) for name in internal), internal.keys()
    # preflight only asserts
    for task in yaml.safe_load((base / "tasks/preflight.yml").read_text()):
        modules = [k for k in task if k not in ("name", "when", "tags", "vars")]
        assert modules == ["ansible.builtin.assert"], (role, task["name"], modules)
        assert "fail_msg" in task["ansible.builtin.assert"], (role, task["name"])
    # handlers listen on a topic
    for handler in yaml.safe_load((base / "handlers/main.yml").read_text()):
        assert handler.get("listen"), (role, handler["name"])


@pytest.mark.unit
@pytest.mark.parametrize("role", ROLES)
def test_syntax_check(tmp_path, role):
    proc = run_playbook(play(tmp_path, role, {}), "--syntax-check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
@pytest.mark.parametrize("role,role_vars,needle", [
    ("ml_runtime", {"ml_runtime_source": "ftp"}, "ml_runtime_source"),
    ("ml_runtime", {"ml_runtime_packages": {"numpy": "2.4.6"}}, "ml_runtime_packages"),
    ("mlflow_server", {"mlflow_server_backend": "mysql"}, "mlflow_server_backend"),
    ("mlflow_server", {"mlflow_server_port": "http"}, "mlflow_server_port"),
    ("nvidia_driver", {"nvidia_driver_allow_reboot": "perhaps"}, "nvidia_driver_allow_reboot"),
    ("cuda", {"cuda_source": "conda"}, "cuda_source"),
    ("nvidia_mps", {"nvidia_mps_verify": "perhaps"}, "nvidia_mps_verify"),
])
def test_argument_specs_refuse_bad_types(tmp_path, role, role_vars, needle):
    proc = run_playbook(play(tmp_path, role, role_vars), "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed, proc.stdout
    name, msg = failed[0]
    assert "argument" in name.lower() or "validat" in name.lower(), failed
    assert needle in msg, failed


@pytest.mark.unit
@pytest.mark.parametrize("role,role_vars,needle", [
    # This controller is Debian 12 (gathered facts): only branch 535 exists there.
    ("nvidia_driver", {"nvidia_driver_branch": "999"}, "nvidia_driver_branch=999 does not exist for Debian 12"),
    ("nvidia_driver", {"nvidia_driver_branch": "550"}, "available: 535"),
    ("nvidia_driver", {"nvidia_driver_kernel_versions": ["latest"]}, "nvidia_driver_kernel_versions"),
    ("cuda", {"cuda_version": "12.4", "cuda_driver_branch": "535"}, "CUDA 12.4 needs driver branch 550"),
    ("cuda", {"cuda_version": "12.2", "cuda_driver_branch": "535"}, "cuda_source=distro on Debian 12 gives CUDA 11.8"),
    ("cuda", {"cuda_source": "nvidia", "cuda_version": "12.2", "cuda_driver_branch": "535"},
     "cuda_source=nvidia needs cuda_nvidia_repo_url"),
    ("ml_runtime", {"ml_runtime_packages": ["numpy", "torch==2.13.0"]}, "not pinned: ['numpy']"),
    ("ml_runtime", {"ml_runtime_packages": "numpy==2.4.6"}, "must be a non-empty list of name==version pins"),
    ("ml_runtime", {"ml_runtime_venv": "venv"}, "ml_runtime_venv=venv is not an absolute path"),
    ("mlflow_server", {"mlflow_server_version": "latest"}, "mlflow_server_version=latest"),
    ("mlflow_server", {"mlflow_server_bind_address": "tracking.lab"}, "mlflow_server_bind_address=tracking.lab"),
    ("mlflow_server", {"mlflow_server_port": 70000}, "mlflow_server_port=70000"),
    # Basic auth in clear text over the network, and a SAN list an openssl argument could split.
    ("mlflow_server", {"mlflow_server_tls": False, "mlflow_server_bind_address": "192.0.2.10"},
     "would send every client's password in clear text"),
    ("mlflow_server", {"mlflow_server_tls_names": ["mlflow.lab,IP:10.0.0.1"]}, "no commas or spaces"),
    ("mlflow_server", {"mlflow_server_tls_renew_days": 900}, "mlflow_server_tls_renew_days (900)"),
    # A CA that lasts no longer than a server certificate would be renewed on every run.
    ("mlflow_server", {"mlflow_server_tls_ca_days": 825}, "below mlflow_server_tls_ca_days (825: the CA is renewed"),
    # A CA renewed with as many days left as it lasts would be renewed on every run.
    ("mlflow_server", {"mlflow_server_tls_ca_renew_days": 3650},
     "mlflow_server_tls_ca_renew_days (3650) must be a whole number of days below mlflow_server_tls_ca_days (3650)"),
    ("mlflow_server", {"mlflow_server_tls_ca_days": 1000, "mlflow_server_tls_ca_renew_days": 1200},
     "mlflow_server_tls_ca_renew_days (1200) must be a whole number of days below mlflow_server_tls_ca_days (1000)"),
    ("mlflow_server", {"mlflow_server_extra_args": ["--uvicorn-opts", "--ssl-keyfile /x"]}, "--uvicorn-opts"),
])
def test_preflight_refuses_bad_input(tmp_path, role, role_vars, needle):
    proc = run_playbook(play(tmp_path, role, role_vars, gather=role in ("nvidia_driver", "cuda")),
                        "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed and needle in failed[0][1], failed


@pytest.mark.unit
@pytest.mark.parametrize("role_vars", [
    {"mlflow_server_tls": False, "mlflow_server_bind_address": "127.0.0.1"},   # loopback: a local proxy
    {"mlflow_server_tls": False, "mlflow_server_auth": False, "mlflow_server_bind_address": "192.0.2.10"},
    {"mlflow_server_tls_names": ["mlflow.lab", "10.0.0.1", "*.tracking.lab"]},
])
def test_preflight_accepts_plain_http_only_without_a_password_on_the_wire(tmp_path, role_vars):
    role_vars = dict(role_vars, mlflow_server_credentials_file=str(tmp_path / "creds.json"))
    proc = run_playbook(play(tmp_path, "mlflow_server", role_vars), "--check", "--tags", "preflight")
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:])


@pytest.mark.unit
@pytest.mark.parametrize("role", ROLES)
def test_preflight_accepts_the_defaults(tmp_path, role):
    role_vars = {"mlflow_server_credentials_file": str(tmp_path / "creds.json")} if role == "mlflow_server" else {}
    proc = run_playbook(play(tmp_path, role, role_vars, gather=role in ("nvidia_driver", "cuda")),
                        "--check", "--tags", "preflight")
    assert proc.returncode == 0, (failures(proc), proc.stdout[-3000:], proc.stderr[-2000:])


# -- secrets never in a process's arguments ------------------------------------------------------
# /proc/PID/cmdline is readable by every user of the machine while the command runs: a secret
# goes in on stdin, in the environment, or in a 0600 file.

SECRET_WORD = re.compile(r"password|passwd|secret_key|token", re.I)
JINJA = re.compile(r"{{(.*?)}}", re.S)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def role_variables() -> dict:
    """Every role default and var of the collection, as written (templates unrendered)."""
    found = {}
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")) + sorted(ROOT.glob("roles/*/vars/main.yml")):
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


def secret_variables(variables: dict) -> set:
    """Variables whose value names a secret, directly or through another such variable."""
    secret = {name for name in variables if SECRET_WORD.search(name)}
    while True:
        more = {name for name, value in variables.items() if name not in secret and any(
            word in secret or SECRET_WORD.search(word)
            for expr in JINJA.findall(str(value)) for word in IDENTIFIER.findall(expr))}
        if not more:
            return secret
        secret |= more


def command_arguments(tasks, where: str):
    """(where, task name, argument) of every templated command/shell argument."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for nested in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks"):
            yield from command_arguments(task.get(nested), where)
        for module in ("ansible.builtin.command", "ansible.builtin.shell", "command", "shell"):
            args = task.get(module)
            if isinstance(args, str):
                args = {"cmd": args}
            for key in ("argv", "cmd"):
                value = (args or {}).get(key)
                for item in value if isinstance(value, list) else [value] if value else []:
                    if "{{" in str(item):
                        yield where, task.get("name"), str(item)


def leaks(arguments, secret: set) -> list:
    """(where, task name, secret names) of each argument that templates a secret."""
    found = []
    for where, name, item in arguments:
        words = {w for expr in JINJA.findall(item) for w in IDENTIFIER.findall(expr)}
        named = sorted(w for w in words if w in secret or SECRET_WORD.search(w))
        if named:
            found.append((where, name, named))
    return found


def collection_command_arguments():
    files = sorted(ROOT.glob("roles/*/tasks/*.yml")) + sorted(ROOT.glob("roles/*/handlers/*.yml")) + \
        sorted(ROOT.glob("playbooks/*.yml"))
    for path in files:
        yield from command_arguments(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))


@pytest.mark.unit
def test_no_secret_in_a_command_line():
    secret = secret_variables(role_variables())
    # The scan knows the store URI carries the database password (it is built from it).
    assert "__mlflow_server_backend_uri" in secret and "__mlflow_server_backend_uri_argv" not in secret
    assert leaks(collection_command_arguments(), secret) == []


@pytest.mark.unit
def test_the_secret_scan_finds_a_leak():
    # The check above must be able to fail: the shapes the role had before (psql -v pw=..., and
    # mlflow db upgrade with the store URI), one of them nested in a block.
    tasks = [{"name": "leaky", "ansible.builtin.command": {
        "argv": ["psql", "-v", "pw={{ __mlflow_server_credentials.db_password }}"]}},
        {"block": [{"name": "nested", "ansible.builtin.command": {
            "argv": ["mlflow", "db", "upgrade", "{{ __mlflow_server_backend_uri }}"]}}]}]
    assert leaks(command_arguments(tasks, "x"), secret_variables(role_variables())) == [
        ("x", "leaky", ["db_password"]), ("x", "nested", ["__mlflow_server_backend_uri"])]


# -- every external command the roles run is bounded --------------------------------------------

RUNNERS = {"ansible.builtin.command", "ansible.builtin.shell", "ansible.builtin.raw", "ansible.builtin.script",
           "command", "shell", "raw", "script"}
SHELLS = {"ansible.builtin.shell", "shell"}
# Roles whose command tasks are not bounded yet; strict, so the mark fails once they are.
UNBOUNDED_ROLES: dict = {}  # role -> why its command tasks may not be bounded yet (none today)


def command_tasks(tasks, where: str):
    """(where, task) of every command/shell/raw/script task, in blocks and plays too."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for nested in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from command_tasks(task.get(nested), where)
        if RUNNERS & set(task):
            yield where, task


def unbounded_task(task: dict) -> bool:
    """No task keyword ``timeout`` (a positive number or a template): such a task can hang the
    play forever (psql waiting on a lock, update-initramfs, nvidia-smi on a wedged GPU)."""
    bound = task.get("timeout")
    return not (isinstance(bound, int) and not isinstance(bound, bool) and bound > 0
                or isinstance(bound, str) and "{{" in bound)


def unbounded(files) -> list:
    """(file, task name) of each command task without a timeout."""
    return [(where, task.get("name")) for path in files
            for where, task in command_tasks(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))
            if unbounded_task(task)]


def task_files(role: str = None) -> list:
    if role is None:
        return sorted(ROOT.glob("playbooks/*.yml"))
    base = ROOT / "roles" / role
    return sorted(base.glob("tasks/*.yml")) + sorted(base.glob("handlers/*.yml"))


def bounded_params():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    out = [pytest.param(None, id="playbooks")]
    for role in roles:
        marks = [pytest.mark.xfail(strict=True, reason=UNBOUNDED_ROLES[role])] if role in UNBOUNDED_ROLES else []
        out.append(pytest.param(role, id=role, marks=marks))
    return out


@pytest.mark.unit
@pytest.mark.parametrize("role", bounded_params())
def test_every_command_task_has_a_timeout(role):
    assert unbounded(task_files(role)) == []


@pytest.mark.unit
def test_the_timeout_gate_finds_an_unbounded_task(tmp_path):
    # The gate must be able to fail: a command in a block, a zero timeout, a handler in a play.
    probe = tmp_path / "probe.yml"
    probe.write_text(yaml.safe_dump([
        {"block": [{"name": "nested", "ansible.builtin.command": {"argv": ["psql"]}}]},
        {"name": "zero", "timeout": 0, "ansible.builtin.command": {"argv": ["update-grub"]}},
        {"name": "bounded", "timeout": 60, "ansible.builtin.command": {"argv": ["nvidia-smi"]}},
        {"name": "templated", "timeout": "{{ t }}", "ansible.builtin.command": {"argv": ["apt-get"]}},
        {"hosts": "all", "handlers": [{"name": "handler", "ansible.builtin.raw": "reboot"}]}]))
    assert [task.get("name") for _where, task in command_tasks(yaml.safe_load(probe.read_text()), "x")
            if unbounded_task(task)] == ["nested", "zero", "handler"]


@pytest.mark.unit
def test_no_shell_task():
    # Commands are argv lists, never shell strings (quoting, injection).
    files = task_files() + [p for role in sorted((ROOT / "roles").iterdir()) for p in task_files(role.name)]
    shells = [(where, task.get("name")) for path in files
              for where, task in command_tasks(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))
              if SHELLS & set(task)]
    assert shells == []
