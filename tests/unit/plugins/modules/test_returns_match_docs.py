"""Returned values agree with each module's RETURN: every key a module returns is documented, and
every key RETURN promises as always returned is there, in check mode too. Every module that can
run here is held to that (test_returned_keys_match_return_docs); the others are listed, with why."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import yaml

from conftest import ROOT, module_env, run_module_process  # noqa: E402
from nvidia_fixtures import fake_smi_in_mig_mode  # noqa: E402
from sysfs_builder import gpu_host  # noqa: E402

pytestmark = pytest.mark.unit
MODULES = Path(ROOT) / "plugins" / "modules"


def documented(module: str) -> Dict[str, Any]:
    tree = ast.parse((MODULES / ("%s.py" % module)).read_text())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "RETURN")
    return yaml.safe_load(text)


def test_pci_info_devices_return_only_documented_keys(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    result = run_module_process("pci_info", {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc)}, check=True)
    assert not result["failed"], result
    keys = set(documented("pci_info")["devices"]["contains"])
    for device in result["devices"]:
        assert set(device) <= keys, "undocumented in RETURN devices: %s" % sorted(set(device) - keys)
    assert {"slot", "revision"} <= keys


def test_nvidia_smi_info_gpus_and_mig_devices_return_only_documented_keys(tmp_path: Path, monkeypatch) -> None:
    # The recorded H200 stand-in (tests/fixtures/mig) in MIG mode with one 3g.71gb device: the keys
    # of each GPU and of each MIG device against RETURN's contains, both ways.
    fixtures = Path(ROOT) / "tests" / "fixtures" / "mig"
    smi = fake_smi_in_mig_mode(tmp_path, monkeypatch, "9")
    result = run_module_process("nvidia_smi_info", {"nvidia_smi": str(smi),
                                                    "mig_minors_file": str(fixtures / "mig-minors")}, check=True)
    assert not result["failed"], result
    gpus = documented("nvidia_smi_info")["gpus"]["contains"]
    assert [set(gpu) for gpu in result["gpus"]] == [set(gpus)]
    assert [set(device) for device in result["gpus"][0]["mig_devices"]] == [set(gpus["mig_devices"]["contains"])]


def test_pool_in_check_mode_returns_the_name_of_the_pool_it_would_make(tmp_path: Path) -> None:
    # test:///default is a fresh in-memory libvirt per process: the pool is always new here.
    # (A real run is in tests/integration/test_pool.py, against libvirtd.)
    args = {"name": "mlkvm-returns", "type": "dir", "target": str(tmp_path / "pool"), "uri": "test:///default"}
    result = run_module_process("pool", args, check=True)
    assert not result["failed"], result
    assert result["changed"] is True
    assert "name" in documented("pool")["pool"]["contains"]
    assert result["pool"]["name"] == "mlkvm-returns"


# -- every module that can run here, against its RETURN, both ways ------------------------------
#
# Each module runs as a real process on test_hostile_inputs' valid request (test:///default, the
# synthetic host tree, the recorded nvidia-smi stand-in), in check mode and for real (everything
# it touches lies under tmp_path or in the in-memory test driver). On success every top-level key
# it returns must be in RETURN (or one of Ansible's common keys), and every key RETURN marks
# `returned: always` must be there. Failure results carry error details and are not held to RETURN.

from test_hostile_inputs import BASE, Case, Tmp  # noqa: E402  (the same directory)

# Keys Ansible documents for every module (common return values), not in each RETURN.
COMMON_KEYS = {"changed", "failed", "invocation", "diff", "warnings", "deprecations", "msg"}

# Changes to the base request for a real run, where check mode's request cannot succeed for real.
REAL_RUN_ARGS: Dict[str, Dict[str, Any]] = {
    # a real run creates the directory, so its parent must exist (Tmp("dir") does)
    "config_files": {"directories": [{"path": Tmp("dir/app"), "mode": "0755"}],
                     "files": [{"path": Tmp("dir/app/app.conf"), "mode": "0644", "content": "a = 1\n"}]},
    # a real run checks that the command wrote its declared out
    "ml_stage": {"cmd": ["/usr/bin/touch", "out.txt"]},
}

# (module, mode) pairs that cannot succeed here, each with the reason and the text of the error it
# ends in: test_cannot_run_here_still_fails keeps the table true (an entry that starts to succeed
# must move into the checked runs). Their RETURN is held by the integration tier's runs.
CANNOT_RUN_HERE: Dict[Tuple[str, str], Tuple[str, str]] = {
    ("domain_migration", "real"): ("test:///default cannot migrate (tests/integration/test_migration.py moves domains "
                                   "between two libvirtd)", "not supported"),
    ("mlflow_user", "check"): ("needs an MLflow server (the integration tier starts one)", "is unreachable"),
    ("mlflow_user", "real"): ("needs an MLflow server (the integration tier starts one)", "is unreachable"),
    ("network", "real"): ("test:///default refuses the inactive-XML flag the read-back after define uses",
                          "unsupported flags"),
    ("networks", "check"): ("test:///default refuses the inactive-XML flag networks reads with",
                            "unsupported flags"),
    ("networks", "real"): ("test:///default refuses the inactive-XML flag networks reads with",
                           "unsupported flags"),
    ("pool", "real"): ("test:///default refuses the inactive-XML flag the read-back after define uses",
                       "unsupported flags"),
    ("pools", "check"): ("test:///default refuses the inactive-XML flag pools reads with", "unsupported flags"),
    ("pools", "real"): ("test:///default refuses the inactive-XML flag pools reads with", "unsupported flags"),
    ("slurm_accounts", "check"): ("needs slurmdbd (tests/integration/test_slurm_accounts.py starts one)", "did not answer"),
    ("slurm_accounts", "real"): ("needs slurmdbd (tests/integration/test_slurm_accounts.py starts one)", "did not answer"),
    ("slurm_job", "check"): ("needs slurmctld (tests/integration/test_slurm_job.py starts a cluster)",
                             "no Slurm controller answers"),
    ("slurm_job", "real"): ("needs slurmctld (tests/integration/test_slurm_job.py starts a cluster)",
                            "no Slurm controller answers"),
    ("snapshot", "check"): ("test:///default's domain has a disk of unknown format, which cannot hold "
                            "an internal snapshot", "cannot hold an internal snapshot"),
    ("snapshot", "real"): ("test:///default's domain has a disk of unknown format, which cannot hold "
                           "an internal snapshot", "cannot hold an internal snapshot"),
    ("vfio_pci", "real"): ("no kernel binds the synthetic tree's device to vfio-pci", "did not bind to vfio-pci"),
}


def run_here(tmp_path: Path, name: str, mode: str) -> Dict[str, Any]:
    """The module's result for its base request, in check mode or for real, in diff mode."""
    case = Case(tmp_path)
    args = dict(BASE[name], **(REAL_RUN_ARGS.get(name, {}) if mode == "real" else {}))
    payload = dict(case.resolve(args), _ansible_check_mode=mode == "check", _ansible_diff=True)
    env = module_env()
    env.update(PATH=case.path_env, FAKE_NVIDIA_SMI_STATE=str(case.state))
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.%s" % name],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": payload}), capture_output=True, text=True,
                          env=env, cwd=str(case.tmp / "cwd"), timeout=120, check=False)
    out = proc.stdout
    assert "{" in out, "%s printed no JSON (rc=%s): %s" % (name, proc.returncode, proc.stderr[-2000:])
    result = json.loads(out[out.index("{"):])
    result.setdefault("failed", False)
    return result


def runs(listed: bool) -> List[Tuple[str, str]]:
    """(module, mode) pairs of the base requests: those in CANNOT_RUN_HERE, or those not in it."""
    return [(name, mode) for name in sorted(BASE) for mode in ("check", "real")
            if ((name, mode) in CANNOT_RUN_HERE) == listed]


@pytest.mark.parametrize("name,mode", runs(False))
def test_returned_keys_match_return_docs(tmp_path: Path, name: str, mode: str) -> None:
    result = run_here(tmp_path, name, mode)
    assert not result["failed"], "%s (%s) failed here: %s" % (name, mode, result.get("msg"))
    docs = documented(name) or {}
    undocumented = sorted(set(result) - set(docs) - COMMON_KEYS)
    always = {key for key, entry in docs.items() if entry.get("returned") == "always"}
    absent = sorted(always - set(result))
    assert not undocumented, "%s (%s) returns keys its RETURN does not document: %s" % (name, mode, undocumented)
    assert not absent, "%s (%s) leaves out keys its RETURN says are returned always: %s" % (name, mode, absent)


@pytest.mark.parametrize("name,mode", runs(True))
def test_cannot_run_here_still_fails(tmp_path: Path, name: str, mode: str) -> None:
    why, error = CANNOT_RUN_HERE[(name, mode)]
    result = run_here(tmp_path, name, mode)
    assert result["failed"] and error in str(result.get("msg")), (
        "%s (%s) was listed as unable to run here (%s), but it ended: %s; move it into the checked runs"
        % (name, mode, why, result.get("msg")))
