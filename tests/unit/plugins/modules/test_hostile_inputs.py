"""Hostile values for every module's options: each must end in a clear error naming the option or
in a result, never in an internal error, a traceback or a hang.

Every module's argument spec is read from the module itself (its main() builds the AnsibleModule;
here AnsibleModule is replaced by a catcher for that one call), and for each option a fixed list
of hostile values follows from its declared type: wrong types, out-of-range numbers, control
characters, a 4096-character string, paths to /etc/shadow, /dev/zero, a FIFO, a directory where a
file belongs. A fixed seed picks at most CASES_PER_MODULE of them per module, spread over the
options, so the same cases run every time and the tier stays fast.

Each case is a real module process in CHECK MODE (nothing on this machine changes): libvirt
modules on test:///default (an in-memory driver, fresh in every process), host modules on a
synthetic sysfs/proc/etc tree under tmp_path, nvidia modules on the recorded-table stand-in, and
every process starts in a scratch directory so that a relative path lands under tmp_path.
"""
from __future__ import annotations

import importlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import COLLECTIONS, ROOT, module_env
from sysfs_builder import GPU, GPU_AUDIO, gpu_host

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

pytestmark = pytest.mark.unit

MODULES_DIR = ROOT / "plugins" / "modules"
MIG_FAKE = ROOT / "tests" / "fixtures" / "mig" / "fake_nvidia_smi.py"
TEST_URI = "test:///default"
# A test-driver source hypervisor whose domains mlinfra.kvm.domain_migration moves to test:///default.
MIGRATION_SOURCE_URI = "test://%s" % (ROOT / "tests" / "fixtures" / "migration" / "source-node.xml")
CASES_PER_MODULE = 14
CASE_TIMEOUT_S = 30
SEED = 20240611
LONG = "x" * 4096


# -- placeholders resolved per case (tmp_path is known only when the case runs) -----------------

class Tmp:
    """A path under the case's tmp_path: ``Tmp("fifo")`` is a FIFO, ``Tmp("file/sub")`` a path
    through a regular file, ``Tmp("dir")`` an existing directory, anything else as named."""

    def __init__(self, rel: str) -> None:
        self.rel = rel

    def __repr__(self) -> str:
        return "<tmp>/%s" % self.rel


class Case:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.tree = gpu_host(tmp_path / "host")
        self.tree.meminfo(16 * 1024 * 1024)
        self.tree.hugepages()
        os.mkfifo(str(tmp_path / "fifo"))
        (tmp_path / "file").write_text("a regular file\n")
        # A cluster whose controller does not listen (port 9): Slurm's commands fail the same way each time.
        (tmp_path / "slurm-unanswered.conf").write_text("ClusterName=lab\nSlurmctldHost=head(127.0.0.1)\n"
                                                        "SlurmctldPort=9\nNodeName=w1 CPUs=1\n"
                                                        "PartitionName=gpu Nodes=w1 Default=YES\n")
        (tmp_path / "dir").mkdir()
        (tmp_path / "cwd").mkdir()
        (tmp_path / "stage").mkdir()
        (tmp_path / "stage" / "dep.txt").write_text("input\n")
        (self.tree.etc / "default" / "grub.d").mkdir(parents=True)
        (self.tree.etc / "default" / "grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
        self.state = tmp_path / "nvidia-smi-state.json"
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "python3").symlink_to(sys.executable)
        self.path_env = "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", ""))

    def resolve(self, value: Any) -> Any:
        if isinstance(value, Tmp):
            return str(self.tmp / value.rel)
        if isinstance(value, Roots):
            return self.tree.roots()[value.key]
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value


class Roots:
    """The synthetic host tree's sysfs_root / proc_root / etc_root."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return "<tree>/%s" % self.key


def roots(*keys: str) -> Dict[str, Roots]:
    return {k: Roots(k) for k in keys}


# -- a valid request per module: each case changes one option of it ---------------------------

BASE: Dict[str, Dict[str, Any]] = {
    "cloud_init": {"dest": Tmp("seed.iso"), "instance_id": "w1", "user_data": {"locale": "C.UTF-8"},
                   "meta_data": {"local-hostname": "w1"}, "network_config": {"version": 2}},
    "config_files": {"directories": [{"path": Tmp("etc/app"), "mode": "0755"}],
                     "files": [{"path": Tmp("etc/app/app.conf"), "mode": "0644", "content": "a = 1\n"}]},
    "domain": {"uri": TEST_URI, "name": "mlkvmtest-hostile", "memory": "512MiB", "vcpus": 1,
               "cpu": {"mode": "host-passthrough", "sockets": 1, "cores": 1, "threads": 1},
               "interfaces": [{"network": "default"}], "boot": ["hd"], "sysfs_root": Roots("sysfs_root")},
    "domain_info": {"uri": TEST_URI, "name": "test"},
    # test:///default cannot migrate: a request that passes the checks ends in check mode's plan.
    "domain_migration": {"uri": MIGRATION_SOURCE_URI, "dest_uri": TEST_URI, "name": "mlkvmtest-mover",
                         "migration_uri": "tcp://192.0.2.10:49152", "max_downtime_ms": 300, "timeout": 60},
    "domains": {"uri": TEST_URI, "config": [{"name": "mlkvmtest-hostile", "memory": "512MiB", "vcpus": 1}],
                "scope": {"name_prefix": "mlkvmtest-"}},
    "gpu_health": {"nvidia_smi": Tmp("absent-nvidia-smi"), "kernel_log": "none"},
    "hugepages": dict(roots("sysfs_root", "proc_root", "etc_root"), count=4),
    "kernel_cmdline": {"args": ["quiet"], "backend": "grub_dropin", "etc_root": Roots("etc_root"),
                       "proc_root": Roots("proc_root"), "update_grub_command": ["/bin/true"],
                       "grubby_command": ["/bin/true"]},
    "ml_stage": {"name": "train", "chdir": Tmp("stage"), "cmd": ["/bin/true"], "outs": ["out.txt"],
                 "env": {"A": "1"}, "deps": ["dep.txt"], "params": {"lr": 0.1}},
    # No server listens on port 9: the base request fails on the connection, so a hostile value may
    # also end there (that failure is the baseline, see accepted()).
    "mlflow_user": {"tracking_uri": "http://127.0.0.1:9", "admin_username": "admin", "admin_password": "pw",
                    "name": "alice", "password": "a-long-enough-secret", "timeout": 5,
                    "experiment_permissions": [{"experiment": "exp", "permission": "READ"}]},
    "network": {"uri": TEST_URI, "name": "mlkvmtest-hostile", "address": "192.168.250.1", "prefix": 24,
                "dhcp_range": {"start": "192.168.250.10", "end": "192.168.250.20"},
                "hosts": [{"mac": "52:54:00:00:00:01", "ip": "192.168.250.11", "name": "w1"}],
                "dns_hosts": [{"ip": "192.168.250.11", "hostnames": ["w1"]}]},
    "networks": {"uri": TEST_URI, "config": [{"name": "mlkvmtest-hostile", "address": "192.168.251.1", "prefix": 24}],
                 "scope": {"name_prefix": "mlkvmtest-"}},
    "nvidia_device_plugin_config": {"mig_strategy": "mixed", "dest": Tmp("dp/config.yaml"), "mig_profiles": ["1g.18gb"],
                                    "sharing": {"time_slicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
    "nvidia_mig": {"nvidia_smi": str(MIG_FAKE), "gpu": "0", "instances": [{"profile": "1g.18gb", "count": 1}]},
    "nvidia_smi_info": {"nvidia_smi": Tmp("absent-nvidia-smi")},
    "pci_info": roots("sysfs_root", "proc_root"),
    "pool": {"uri": TEST_URI, "name": "mlkvmtest-hostile", "target": Tmp("pool")},
    "pools": {"uri": TEST_URI, "config": [{"name": "mlkvmtest-hostile", "target": Tmp("pool")}],
              "scope": {"name_prefix": "mlkvmtest-"}},
    "snapshot": {"uri": TEST_URI, "domain": "test", "name": "s1", "description": "before"},
    # No slurmdbd here: every request that passes the input checks ends in the same "did not answer".
    "slurm_accounts": {"cluster": "lab", "conf": Tmp("slurm.conf"), "command_timeout": 2,
                       "qos": [{"name": "small", "max_gpus": 1, "max_wall": "60", "priority": 1}],
                       "accounts": [{"name": "team-a", "description": "A", "qos": ["small"]}],
                       "users": [{"name": "alice", "accounts": ["team-a"]}]},
    "slurm_config": {"config_dir": Tmp("slurm"), "cluster_name": "lab", "controller": {"host": "head", "address": "127.0.0.1"},
                     "accounting": {"host": "head"}, "munge_socket": Tmp("munge.socket"),
                     "nodes": [{"name": "w1", "address": "127.0.0.2", "cpus": 2, "memory_mb": 1024,
                                "gpus": [{"file": "/dev/nvidia0", "type": "h200"}]}],
                     "partitions": [{"name": "gpu", "default": True}],
                     "paths": {"state_save": Tmp("state"), "spool": Tmp("spool"), "run": Tmp("run"), "log": Tmp("log")}},
    # No slurmctld here: a request that passes the input checks ends in the same "did not answer".
    "slurm_job": {"name": "train-0123456789ab", "partition": "gpu", "account": "team-a", "nodes": 1,
                  "nodelist": ["w1"], "gpus_per_node": 1, "time_limit": "01:00:00", "comment": "stage train",
                  "wait_timeout": 5, "poll_interval": 1, "conf": Tmp("slurm-unanswered.conf"), "command_timeout": 2,
                  "mlflow": {"tracking_uri": "http://127.0.0.1:9", "run_id": "0123", "username": "svc-train", "password": "a-long-enough-secret"}},
    "snapshot_info": {"uri": TEST_URI, "domain": "test"},
    "vfio_pci": dict(roots("sysfs_root", "proc_root", "etc_root"), devices=[GPU, GPU_AUDIO], initramfs="none",
                     modprobe_command=["/bin/true"], bind_timeout=5),
    "volume": {"uri": TEST_URI, "name": "mlkvmtest-hostile.qcow2", "pool": "default-pool", "capacity": "1G",
               "format": "qcow2"},
    "volumes": {"uri": TEST_URI, "config": [{"name": "mlkvmtest-hostile.qcow2", "pool": "default-pool",
                                             "capacity": "1G", "format": "qcow2"}]},
}

# Options whose hostile values are never generated: the connection URIs (an empty or odd URI could
# reach a real hypervisor instead of test:///default; domain_migration's dest_uri is one) and the commands a module runs (a hostile
# command is the caller's choice to run; those options' checks live in the modules' own tests).
UNTOUCHED = {"uri", "dest_uri", "update_grub_command", "grubby_command", "modprobe_command", "initramfs_command",
             "nvidia_smi", "cmd"}

# Paths a module only reads may point at a secret; paths it may write get harmless hostile targets.
READ_ONLY_PATHS = {"import_from", "backing", "kernel", "initrd", "ovmf_code", "ovmf_vars", "xml_file",
                   "ca_path", "params_file", "metrics_file", "kernel_log_file"}


def module_names() -> List[str]:
    return sorted(p.stem for p in MODULES_DIR.glob("*.py") if not p.name.startswith("_"))


# -- the argument spec, from the module's own main() -------------------------------------------

class _Caught(Exception):
    pass


def argument_spec(name: str) -> Dict[str, Any]:
    module = importlib.import_module("ansible_collections.mlinfra.kvm.plugins.modules.%s" % name)
    caught: Dict[str, Any] = {}

    def catcher(*_args: Any, **kwargs: Any) -> None:
        caught.update(kwargs)
        raise _Caught()

    real = module.AnsibleModule
    module.AnsibleModule = catcher
    try:
        module.main()
    except _Caught:
        pass
    finally:
        module.AnsibleModule = real
    return caught["argument_spec"]


# -- hostile values per declared type ----------------------------------------------------------

CONTROL = ["a\x00b", "a\x07b", "\x1b[31mred", "line\nbreak"]


def hostile_values(option: str, entry: Dict[str, Any]) -> List[Any]:
    kind = entry.get("type", "str")
    if entry.get("choices"):
        choice = str(entry["choices"][0])
        return [choice + "\x00", choice.upper() + " ", "", [choice], LONG]
    if kind == "str":
        return CONTROL + [LONG, "", ["a", "b"], {"k": "v"}, "../../../etc/passwd", " "]
    if kind == "int":
        return [-1, 0, 2 ** 63, -(2 ** 63), "ten", [1], {"a": 1}, 1.5, "1e400"]
    if kind == "float":
        return [-1, 0, 2 ** 63, "inf", "nan", "-inf", "ten", [1]]
    if kind == "bool":
        return ["perhaps", 2, [True], {"a": 1}, ""]
    if kind == "path":
        paths: List[Any] = ["", "a\x00b", LONG, Tmp("fifo"), Tmp("file/sub"), Tmp("dir"), "/dev/zero",
                            "relative/../../../x", ["a"]]
        if option in READ_ONLY_PATHS:
            paths += ["/etc/shadow", "../../../../../../etc/passwd"]
        return paths
    if kind == "dict":
        return ["a=b", [1], {"bogus\x00": 1}, {"k": LONG}, {"k": {"deep": [None]}}, 7]
    if kind == "list":
        elements = entry.get("elements", "str")
        if elements == "dict":
            return ["text", [1], [None], [[]], [{}], {"a": 1}]
        if elements == "path":
            return [[""], ["a\x00b"], [Tmp("fifo")], ["/dev/zero"], [LONG], "a,b", [{"a": 1}]]
        return [[None], [["nested"]], [{"a": 1}], ["a\x00b"], [LONG], [""], "a,\x07b", {"a": 1}]
    # raw
    return ["a\x00b", LONG, 2 ** 63, [[[[]]]], {"k": {"k": {"k": [None]}}}, None, -1]


def sub_base(entry: Dict[str, Any], current: Any) -> Optional[Dict[str, Any]]:
    """The dict one suboption case edits: the base request's own, or one made of the required
    suboptions (a placeholder each) where the base request has none."""
    if isinstance(current, dict):
        return dict(current)
    if isinstance(current, list) and current and isinstance(current[0], dict):
        return dict(current[0])
    made = {}
    for sub, sub_entry in entry["options"].items():
        if sub_entry.get("required"):
            if sub_entry.get("type", "str") not in ("str", "path", "raw"):
                return None
            made[sub] = (sub_entry.get("choices") or ["x"])[0]
    return made


def option_cases(name: str) -> Iterator[Tuple[str, Callable[[Dict[str, Any]], Dict[str, Any]], Any]]:
    """(option path, a function of the base request giving the hostile request, the value)."""
    spec = argument_spec(name)
    for option, entry in spec.items():
        if option in UNTOUCHED:
            continue
        for value in hostile_values(option, entry):
            yield option, _setter(option, value), value
        if entry.get("options"):
            for sub, sub_entry in entry["options"].items():
                if sub in UNTOUCHED:
                    continue
                for value in hostile_values(sub, sub_entry):
                    yield "%s.%s" % (option, sub), _sub_setter(option, entry, sub, value), value


def _setter(option: str, value: Any) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    def build(base: Dict[str, Any]) -> Dict[str, Any]:
        return dict(base, **{option: value})
    return build


def _sub_setter(option: str, entry: Dict[str, Any], sub: str, value: Any) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    def build(base: Dict[str, Any]) -> Dict[str, Any]:
        element = sub_base(entry, base.get(option))
        if element is None:
            return dict(base)
        element[sub] = value
        wrapped = [element] if entry.get("type") == "list" else element
        return dict(base, **{option: wrapped})
    return build


def sampled_cases(name: str) -> List[Tuple[str, str, Callable, Any]]:
    """At most CASES_PER_MODULE cases, spread over the options: a seeded shuffle of each option's
    values, then one value per option in turn (options themselves in a seeded order)."""
    rng = random.Random("%s-%s" % (SEED, name))
    per_option: Dict[str, List[Tuple[Callable, Any]]] = {}
    for option, build, value in option_cases(name):
        per_option.setdefault(option, []).append((build, value))
    options = sorted(per_option)
    rng.shuffle(options)
    for values in per_option.values():
        rng.shuffle(values)
    picked: List[Tuple[str, str, Callable, Any]] = []
    depth = 0
    while len(picked) < CASES_PER_MODULE and any(len(v) > depth for v in per_option.values()):
        for option in options:
            if depth < len(per_option[option]) and len(picked) < CASES_PER_MODULE:
                build, value = per_option[option][depth]
                picked.append((name, option, build, value))
        depth += 1
    return picked


def value_id(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 24 else "%s..%d" % (text[:16], len(text))
    return re.sub(r"[^A-Za-z0-9_.:/<>=\-]", "_", text)


ALL_CASES = [case for name in module_names() for case in sampled_cases(name)]

# Known failures, each with what is wrong: marked where they stand so the test passes and tells
# when one is fixed (strict xfail). Keyed by (module, option, repr(value)).
KNOWN: Dict[Tuple[str, str, str], str] = {
}


def params() -> List[Any]:
    out = []
    for name, option, build, value in ALL_CASES:
        marks = []
        reason = KNOWN.get((name, option, repr(value)))
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        out.append(pytest.param(name, option, build, value, marks=marks,
                                id="%s-%s-%s" % (name, option, value_id(value))))
    return out


# -- running one case --------------------------------------------------------------------------

def run_case(case: Case, name: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """The module's result, or a synthetic failure describing a hang or a crash without JSON."""
    payload = dict(case.resolve(args), _ansible_check_mode=True, _ansible_diff=True)
    env = module_env()
    env.update(PATH=case.path_env, FAKE_NVIDIA_SMI_STATE=str(case.state))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.%s" % name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, cwd=str(case.tmp / "cwd"), start_new_session=True)
    try:
        out, err = proc.communicate(json.dumps({"ANSIBLE_MODULE_ARGS": payload}), timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"failed": True, "_hang": True, "msg": "no answer within %ds (a hang)" % CASE_TIMEOUT_S}
    try:
        result = json.loads(out[out.index("{"):])
    except ValueError:
        return {"failed": True, "_crash": True, "msg": "no JSON (rc=%s): %s" % (proc.returncode, err.strip()[-300:])}
    result.setdefault("failed", False)
    if isinstance(result.get("msg"), str):
        result["msg"] = result["msg"].replace(str(case.tmp), "<tmp>")
    return result


def names_option(msg: str, option: str) -> bool:
    """The message names the option: its leaf name, its parent, or its dotted path."""
    words = set(option.split(".")) | {option}
    return any(re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(w), msg) for w in words)


def problem(result: Dict[str, Any], option: str, baseline: Dict[str, Any]) -> Optional[str]:
    """What is wrong with the result, or None."""
    msg = str(result.get("msg", ""))
    if result.get("_hang") or result.get("_crash"):
        return msg
    if "internal error" in msg or "MODULE FAILURE" in msg or "module_stderr" in result:
        return msg
    if "Traceback" in msg:
        return "traceback in msg: " + msg
    if not result["failed"]:
        return None
    if names_option(msg, option):
        return None
    if baseline["failed"] and msg == baseline.get("msg"):
        return None  # the value was accepted; the request fails where the base request fails
    return "failed without naming %s: %s" % (option, msg)


_BASELINES: Dict[str, Dict[str, Any]] = {}


def baseline(case: Case, name: str) -> Dict[str, Any]:
    """The base request's own result (once per module and worker): it must not crash either."""
    if name not in _BASELINES:
        _BASELINES[name] = run_case(case, name, BASE[name])
    return _BASELINES[name]


def row(name: str, option: str, value: Any, why: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:30] + "...(%d chars)" % len(shown)
    return "%-28s | %-26s | %-40s | %s" % (name, option, shown, why[:400])


# -- the tests ---------------------------------------------------------------------------------

def test_every_module_has_a_base_request():
    assert sorted(BASE) == module_names()


@pytest.mark.parametrize("name", module_names())
def test_base_request_is_clean(tmp_path, name):
    """The request each case starts from does not itself crash (else every case would be noise)."""
    result = run_case(Case(tmp_path), name, BASE[name])
    assert not (result.get("_hang") or result.get("_crash") or "internal error" in str(result.get("msg"))), \
        row(name, "(base)", BASE[name], str(result.get("msg")))


@pytest.mark.parametrize("name,option,build,value", params())
def test_hostile_value(tmp_path, name, option, build, value):
    case = Case(tmp_path)
    result = run_case(case, name, build(BASE[name]))
    why = problem(result, option, baseline(case, name))
    assert why is None, row(name, option, value, why)
