"""slurm_controller and slurm_node against this machine (connection local): it is both the
controller and the one node, with the real /etc/slurm, /etc/munge, MariaDB on its default socket
and the Debian daemons (this is a throwaway CI host). Four ways - check, apply, check, apply - the
second pair reporting changed=0; then sinfo and srun through the real daemons, under the account
the role declared. The daemons the test started are stopped in every path."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
PIDFILES = {"slurmd": "/run/slurm/slurmd.%s.pid" % socket.gethostname().split(".")[0], "slurmctld": "/run/slurm/slurmctld.pid",
            "slurmdbd": "/run/slurm/slurmdbd.pid"}
CONFIG_FILES = ["/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/etc/slurm/cgroup.conf",
                "/etc/slurm/slurmdbd.conf", "/etc/slurm/.slurmdbd-db-password"]
CLUSTER = "mlinfraci"


def munged_running() -> bool:
    """The host's munged, by its PID file (a test cluster's munged on this machine is not it)."""
    return subprocess.run(["pgrep", "-F", "/run/munge/munged.pid", "-x", "munged"], capture_output=True,
                          check=False).returncode == 0


def mariadb_running() -> bool:
    """The host's MariaDB, on its default socket (a test cluster's runs on a socket of its own)."""
    return subprocess.run(["mariadb-admin", "--socket=/run/mysqld/mysqld.sock", "ping"], capture_output=True,
                          timeout=30, check=False).returncode == 0


def by_pidfile(name: str) -> bool:
    return subprocess.run(["pgrep", "-F", PIDFILES[name], "-x", name], capture_output=True,
                          check=False).returncode == 0


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def host_daemons() -> Iterator[None]:
    """Stops what the roles started (Slurm's daemons by their own PID files, munged and MariaDB
    when they were not running before) and removes the configs the roles wrote."""
    if any(port_busy(p) for p in (6817, 6818, 6819)) or any(os.path.exists(f) for f in CONFIG_FILES[:4]):
        pytest.skip("a Slurm cluster already uses this machine's /etc/slurm or ports 6817-6819; "
                    "these role tests need them free")
    before = {"munged": munged_running(), "mariadb": mariadb_running()}
    try:
        yield
    finally:
        for name in ("slurmd", "slurmctld", "slurmdbd"):
            subprocess.run(["pkill", "-TERM", "-F", PIDFILES[name], "-x", name], capture_output=True, check=False)
        deadline = time.monotonic() + 30
        while any(os.path.exists(PIDFILES[n]) and by_pidfile(n) for n in PIDFILES) and time.monotonic() < deadline:
            time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "slurmdbd"):
            subprocess.run(["pkill", "-KILL", "-F", PIDFILES[name], "-x", name], capture_output=True, check=False)
        if not before["munged"]:
            subprocess.run(["pkill", "-TERM", "-F", "/run/munge/munged.pid", "-x", "munged"], capture_output=True,
                           check=False)
        if not before["mariadb"]:
            subprocess.run(["/etc/init.d/mariadb", "stop"], capture_output=True, timeout=120, check=False)
        for path in CONFIG_FILES:
            if os.path.exists(path):
                os.unlink(path)


def inventory(tmp: Path, **extra_vars: object) -> Path:
    short = socket.gethostname().split(".")[0]
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "slurm_node_name": short, "slurm_node_address": "127.0.0.1",
            "slurm_node_cpus": len(os.sched_getaffinity(0))}
    host.update(extra_vars)
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "slurm_controller": {"hosts": {"localhost": host}},
        "slurm_nodes": {"hosts": {"localhost": None}}}}}))
    return path


def playbook(tmp: Path, partition: Optional[Dict[str, object]] = None) -> Path:
    path = tmp / "slurm.yml"
    path.write_text(yaml.safe_dump([
        {"name": "Slurm controller", "hosts": "slurm_controller", "gather_facts": False,
         "roles": [{"role": "mlinfra.kvm.slurm_controller", "vars": {
             "slurm_controller_cluster_name": CLUSTER, "slurm_controller_address": "127.0.0.1",
             "slurm_controller_host": socket.gethostname().split(".")[0],
             "slurm_controller_partitions": [partition or {"name": "ci", "default": True}],
             "slurm_controller_qos": [{"name": "ci-short", "max_wall": "02:00:00", "priority": 5}],
             "slurm_controller_accounts": [{"name": "ci", "description": "CI jobs", "qos": ["normal", "ci-short"]}],
             "slurm_controller_users": [{"name": "root", "accounts": ["ci"]}]}}]},
        {"name": "Slurm nodes", "hosts": "slurm_nodes", "gather_facts": False,
         "roles": ["mlinfra.kvm.slurm_node"]},
    ], sort_keys=False))
    return path


def ansible_playbook(inv: Path, play: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_LOCALHOST_WARNING="0")
    env.pop("SLURM_CONF", None)
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play), *extra], capture_output=True,
                          text=True, env=env, cwd=str(ROOT), timeout=timeout, check=False)


def recap(proc: subprocess.CompletedProcess) -> Dict[str, int]:
    lines = [l for l in proc.stdout.splitlines() if l.startswith("localhost") and "changed=" in l]
    assert lines, ("no PLAY RECAP", proc.stdout[-6000:], proc.stderr[-3000:])
    line = lines[-1]
    return {k: int(v) for k, v in (w.split("=") for w in line.split() if "=" in w)}


def changed_tasks(proc: subprocess.CompletedProcess) -> List[str]:
    found, task = [], None
    for line in proc.stdout.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line[line.index("[") + 1:line.rindex("]")]
        elif line.startswith("changed:"):
            found.append(task)
    return found


def failed_tasks(proc: subprocess.CompletedProcess) -> str:
    """The output from the first failed task on (or its tail)."""
    at = proc.stdout.find("fatal: ")
    return proc.stdout[max(0, proc.stdout.rfind("TASK [", 0, at)):][:6000] if at >= 0 else proc.stdout[-6000:]


def slurm(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)


def test_roles_four_ways_then_jobs_run(host_daemons: None, tmp_path: Path) -> None:
    inv, play = inventory(tmp_path), playbook(tmp_path)
    runs = {}
    for label, extra in (("check", ["--check", "--diff"]), ("apply", []), ("check_again", ["--check", "--diff"]),
                         ("apply_again", [])):
        proc = ansible_playbook(inv, play, *extra)
        runs[label] = proc
        counts = recap(proc)
        assert proc.returncode == 0 and counts["failed"] == 0, (label, failed_tasks(proc), proc.stderr[-3000:])
        if label in ("check", "apply"):
            assert counts["changed"] > 0, (label, proc.stdout[-3000:])
        else:
            assert counts["changed"] == 0, (label, changed_tasks(proc), proc.stdout[-6000:])
    # The key and the database password never reach the output.
    key = Path("/etc/munge/munge.key").read_bytes()
    password = Path("/etc/slurm/.slurmdbd-db-password").read_text().strip()
    for proc in runs.values():
        assert password not in proc.stdout and password not in proc.stderr
    assert oct(os.stat("/etc/munge/munge.key").st_mode & 0o777) == "0o400" and len(key) >= 32
    assert oct(os.stat("/etc/slurm/slurmdbd.conf").st_mode & 0o777) == "0o600"
    assert oct(os.stat("/etc/slurm/.slurmdbd-db-password").st_mode & 0o777) == "0o600"

    short = socket.gethostname().split(".")[0]
    info = slurm("sinfo", "--noheader", "-N", "-o", "%N %T %P")
    assert info.returncode == 0 and info.stdout.split() == [short, "idle", "ci*"], info
    job = slurm("srun", "--account=ci", "--qos=ci-short", "-N1", "hostname", timeout=120)
    assert job.returncode == 0 and job.stdout.strip() == socket.gethostname(), job
    assoc = slurm("sacctmgr", "--noheader", "--parsable2", "show", "assoc", "cluster=%s" % CLUSTER, "user=root",
                  "format=Account,User,QOS")
    assert "ci|root|ci-short,normal" in assoc.stdout, assoc


def test_node_offering_less_than_declared_is_drained_and_said(host_daemons: None, tmp_path: Path) -> None:
    """Runs after the first test (same module): the cluster is up. The inventory declares twice this
    host's CPUs: the node is drained with that reason, the play says so, and it is resumed once the
    inventory says the truth again."""
    if not by_pidfile("slurmctld"):
        pytest.skip("needs the cluster the four-ways test set up")
    cpus = len(os.sched_getaffinity(0))
    play = playbook(tmp_path)
    proc = ansible_playbook(inventory(tmp_path, slurm_node_cpus=cpus * 2), play)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "WARNING: Slurm node" in proc.stdout and "declared %d CPUs, host has %d" % (cpus * 2, cpus) in proc.stdout
    node = slurm("scontrol", "show", "node", "-o").stdout
    assert "DRAIN" in node and "Reason=mlinfra: declared %d CPUs" % (cpus * 2) in node, node
    back = ansible_playbook(inventory(tmp_path), play)
    assert back.returncode == 0, back.stdout[-6000:]
    assert "Drain" not in " ".join(changed_tasks(back))
    deadline = time.monotonic() + 60
    while "DRAIN" in slurm("scontrol", "show", "node", "-o").stdout and time.monotonic() < deadline:
        time.sleep(1)
    assert "DRAIN" not in slurm("scontrol", "show", "node", "-o").stdout


def test_a_node_whose_gpu_is_unhealthy_is_drained_naming_the_gpu(host_daemons: None, tmp_path: Path) -> None:
    """The node's GPU reading is the H200 capture with two double-bit ECC errors (gpu_health's
    xml_file): gpu_health calls it unhealthy, the node is drained naming the GPU and what to do,
    check mode predicts the drain first, a second run changes nothing, and a healthy capture of the
same GPU lifts the drain."""
    if not by_pidfile("slurmctld"):
        pytest.skip("needs the cluster the four-ways test set up")
    fixtures = ROOT / "tests" / "fixtures" / "gpu-health"
    play = playbook(tmp_path)
    sick = inventory(tmp_path, slurm_node_gpu_health_options={"xml_file": str(fixtures / "dbe.xml"), "kernel_log": "none"})
    check = ansible_playbook(sick, play, "--check")
    assert check.returncode == 0, check.stdout[-6000:]
    assert "would be drained: mlinfra: GPU 0 NVIDIA H200" in check.stdout, check.stdout[-4000:]
    assert "DRAIN" not in slurm("scontrol", "show", "node", "-o").stdout  # check mode changed nothing
    proc = ansible_playbook(sick, play)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "WARNING: Slurm node" in proc.stdout and "uncorrectable (double-bit) ECC errors" in proc.stdout
    node = slurm("scontrol", "show", "node", "-o").stdout
    assert "DRAIN" in node and "Reason=mlinfra: GPU 0 NVIDIA H200" in node, node
    again = ansible_playbook(sick, play)
    assert again.returncode == 0 and recap(again)["changed"] == 0, changed_tasks(again)
    healthy = ROOT / "tests" / "fixtures" / "h200-exporter" / "idle-nvidia-smi-q.xml"  # a real, healthy capture
    back = ansible_playbook(inventory(tmp_path, slurm_node_gpu_health_options={"xml_file": str(healthy),
                                                                               "kernel_log": "none"}), play)
    assert back.returncode == 0, back.stdout[-6000:]
    deadline = time.monotonic() + 60
    while "DRAIN" in slurm("scontrol", "show", "node", "-o").stdout and time.monotonic() < deadline:
        time.sleep(1)
    assert "DRAIN" not in slurm("scontrol", "show", "node", "-o").stdout


def test_a_partition_change_reconfigures_without_a_restart(host_daemons: None, tmp_path: Path) -> None:
    """A new time limit is a change slurmctld takes with `scontrol reconfigure`: the handler that
    runs is the reconfigure, slurmctld keeps its process, and the partition has the limit."""
    if not by_pidfile("slurmctld"):
        pytest.skip("needs the cluster the four-ways test set up")
    pid = Path(PIDFILES["slurmctld"]).read_text().strip()
    inv = inventory(tmp_path)
    proc = ansible_playbook(inv, playbook(tmp_path, {"name": "ci", "default": True, "max_time": "01:00:00"}))
    assert proc.returncode == 0, failed_tasks(proc)
    done = changed_tasks(proc)
    assert "mlinfra.kvm.slurm_controller : Reconfigure slurmctld (scontrol reconfigure)" in done, done
    assert not [t for t in done if "Restart" in t or "Start" in t], done
    assert Path(PIDFILES["slurmctld"]).read_text().strip() == pid
    assert "MaxTime=01:00:00" in slurm("scontrol", "show", "partition", "ci", "-o").stdout
    back = ansible_playbook(inv, playbook(tmp_path))
    assert back.returncode == 0 and "MaxTime=UNLIMITED" in slurm("scontrol", "show", "partition", "ci", "-o").stdout
