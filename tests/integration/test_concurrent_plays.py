"""Two runs against one hypervisor at once (issue 13): the host-local object locks.

First, deterministically: while this test holds an object's lock (as another run would), a
module run for that object opens the lock and waits, and acts on nothing; the test makes the
object meanwhile, as the other run would, and once the lock is released the waiting run reads it
and reports it unchanged. Without the locks the run would have made the object itself and
then collided, so the test fails. A pool purge waits the same way on a volume's lock. Then the
user's scenario:

The play declares a pool, volumes, networks and domains through the list modules, as the
hypervisor role does. Both runs must succeed, every object must be made exactly once (one run
reports it changed, the other finds it done) and a third run must change nothing. Without the
host-local object locks (_host_lock) the second run's define of an object the first made
between its read and its act fails with libvirt's "already exists", half way through a list.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

import libvirt
import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _host_lock
from conftest import ROOT, module_env, run_module_process
from test_resource_lists import free_subnets

pytestmark = pytest.mark.integration
URI = "qemu:///system"
TASKS = ("pools", "volumes", "networks", "domains")


def write_play(directory: Path, evars: Dict) -> Path:
    """The play, and a last task that saves each list's per-object results for the test."""
    playbook = directory / "site.yml"
    tasks = [
        {"name": "Pools", "mlinfra.kvm.pools": {"config": "{{ pools }}"}, "register": "pools_result"},
        {"name": "Volumes", "mlinfra.kvm.volumes": {"config": "{{ volumes }}"}, "register": "volumes_result"},
        {"name": "Networks", "mlinfra.kvm.networks": {"state": "replaced", "config": "{{ networks }}"},
         "register": "networks_result"},
        {"name": "Domains", "mlinfra.kvm.domains": {"config": "{{ domains }}"}, "register": "domains_result"},
        {"name": "Save what each list did", "ansible.builtin.copy": {
            "dest": "{{ results_file }}", "mode": "0600",
            "content": "{{ {'pools': pools_result.objects, 'volumes': volumes_result.objects, "
                       "'networks': networks_result.objects, 'domains': domains_result.objects} | to_json }}"}},
    ]
    playbook.write_text(yaml.safe_dump([{
        "name": "A hypervisor's objects", "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/mlinfra.kvm.libvirt": {"uri": URI}}, "tasks": tasks}]))
    (directory / "vars.json").write_text(json.dumps(evars))
    return playbook


def start_play(directory: Path, playbook: Path, run: str) -> subprocess.Popen:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    with open(directory / ("%s.log" % run), "w") as log:  # the play writes to its own copy of the fd
        return subprocess.Popen([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                                 str(playbook), "-e", "@%s" % (directory / "vars.json"),
                                 "-e", "results_file=%s" % (directory / ("%s.json" % run))],
                                cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def finish(directory: Path, proc: subprocess.Popen, run: str) -> Dict:
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (directory / ("%s.log" % run)).read_text()
    assert proc.returncode == 0, "%s failed:\n%s" % (run, log[-4000:])
    assert "Traceback" not in log, log[-4000:]
    return json.loads((directory / ("%s.json" % run)).read_text())


def made_by(results: List[Dict], task: str) -> Dict[str, List[bool]]:
    """For each object of a task: whether each run reported it changed."""
    names = sorted(set().union(*(r[task] for r in results)))
    return {name: [bool(r[task].get(name, {}).get("changed")) for r in results] for name in names}


def test_two_plays_at_once_make_each_object_once(libvirt_cleanup, tmp_path):
    subnets = free_subnets(4)
    pool = libvirt_cleanup + "pool"
    evars = {
        "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python"),
        "pools": [{"name": pool, "target": str(tmp_path / "pool")}],
        "volumes": [{"pool": pool, "name": "d%d.qcow2" % i, "capacity": "16M"} for i in range(3)],
        "networks": [{"name": "%snet%d" % (libvirt_cleanup, i), "mode": "isolated", "address": s + ".1",
                      "prefix": 24} for i, s in enumerate(subnets)],
        "domains": [{"name": "%svm%d" % (libvirt_cleanup, i), "virt_type": "qemu", "memory": "64M", "vcpus": 1,
                     "disks": [{"pool": pool, "volume": "d%d.qcow2" % i}],
                     "interfaces": [{"network": "%snet0" % libvirt_cleanup}]} for i in range(3)],
    }
    playbook = write_play(tmp_path, evars)
    procs = {run: start_play(tmp_path, playbook, run) for run in ("a", "b")}
    try:
        results = [finish(tmp_path, proc, run) for run, proc in procs.items()]
    finally:  # one run failed: the other must not go on beside the clean-up
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    for task in TASKS:
        outcome = made_by(results, task)
        keys = ["%s/%s" % (i["pool"], i["name"]) if task == "volumes" else i["name"] for i in evars[task]]
        assert sorted(outcome) == sorted(keys), (task, outcome)
        # Exactly one run made each object; the other found it made (and said so: unchanged).
        twice_or_never = {name: runs for name, runs in outcome.items() if runs.count(True) != 1}
        assert twice_or_never == {}, (task, results)

    third = start_play(tmp_path, playbook, "c")
    again = finish(tmp_path, third, "c")
    assert {task: [n for n, item in again[task].items() if item.get("changed")] for task in TASKS} == \
        {task: [] for task in TASKS}, again

    conn = libvirt.open(URI)
    try:
        assert sorted(conn.storagePoolLookupByName(pool).listVolumes()) == ["d0.qcow2", "d1.qcow2", "d2.qcow2"]
        assert sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(libvirt_cleanup)) == \
            sorted(d["name"] for d in evars["domains"])
        assert sorted(n.name() for n in conn.listAllNetworks() if n.name().startswith(libvirt_cleanup)) == \
            sorted(n["name"] for n in evars["networks"])
        assert [p.name() for p in conn.listAllStoragePools() if p.name().startswith(libvirt_cleanup)] == [pool]
    finally:
        conn.close()


# -- one run waits on a held lock ------------------------------------------------------------

def start_module(name: str, args: Dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.%s" % name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=module_env(), cwd=str(ROOT))
    proc.stdin.write(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc.stdin.close()
    proc.stdin = None  # communicate() would flush it again
    return proc


def wait_until_it_opens(proc: subprocess.Popen, path: str, within_s: float = 120) -> None:
    """Until the module process has ``path`` open (it then waits in flock)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended without waiting for the lock: %s" % (proc.communicate(),)
        try:
            opened = [os.readlink("/proc/%d/fd/%s" % (proc.pid, fd)) for fd in os.listdir("/proc/%d/fd" % proc.pid)]
        except OSError:  # an fd closed between the listing and the readlink
            opened = []
        if path in opened:
            return
        time.sleep(0.1)
    pytest.fail("the run never opened %s in %d s" % (path, within_s))


@contextmanager
def module_waiting_on(path: str, name: str, args: Dict) -> Iterator[subprocess.Popen]:
    """Start module ``name``, wait until it waits on the lock ``path`` (which the caller holds);
    the body then acts as the lock's holder. A failing body kills the module run."""
    proc = start_module(name, args)
    try:
        wait_until_it_opens(proc, path)
        yield proc
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def finished_result(proc: subprocess.Popen) -> Dict:
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err
    return json.loads(out[out.index("{"):])


def make_network(conn, xml: str) -> None:
    conn.networkDefineXML(xml).create()


def make_domain(conn, xml: str) -> None:
    conn.defineXML(xml)


@pytest.mark.parametrize("kind", ["network", "domain"])
def test_a_run_waits_for_a_held_lock_then_finds_the_object_made(kind, libvirt_cleanup):
    name = libvirt_cleanup + kind
    if kind == "network":
        (subnet,) = free_subnets(1)
        module, item = "networks", {"name": name, "mode": "isolated", "address": subnet + ".1", "prefix": 24,
                                    "state": "active"}
        make = make_network
    else:
        module, item = "domains", {"name": name, "virt_type": "qemu", "memory": "64M", "vcpus": 1, "state": "present"}
        make = make_domain
    rendered = run_module_process(module, {"state": "rendered", "config": [item]})
    assert not rendered["failed"], rendered
    args = {"uri": URI, "config": [item]}
    with _host_lock.object_lock(kind, name) as path, module_waiting_on(path, module, args) as proc:
        conn = libvirt.open(URI)
        try:  # what the other run does while it holds the lock
            make(conn, rendered["rendered"][name])
        finally:
            conn.close()
    result = finished_result(proc)
    assert not result.get("failed") and result["changed"] is False, result
    assert result["objects"][name]["changed"] is False, result
    # The waiter opened the file the holder removed, then locked a new one: it removed that too.
    assert not os.path.exists(path), "a lock file stayed behind in %s" % os.path.dirname(path)


def test_a_purge_waits_for_a_volume_run_then_deletes_what_it_left(libvirt_cleanup, tmp_path):
    """pool state=absent purge=true deletes each volume under that volume's lock: while another
    run holds it (allocating or uploading), the purge waits instead of deleting a volume half made,
    and afterwards it also deletes what that run made meanwhile."""
    pool = libvirt_cleanup + "purgepool"
    made = run_module_process("pool", {"uri": URI, "name": pool, "target": str(tmp_path / "pool")})
    assert not made.get("failed"), made
    for name in ("d0.qcow2", "d1.qcow2"):
        vol = run_module_process("volume", {"uri": URI, "pool": pool, "name": name, "capacity": "16M"})
        assert not vol.get("failed"), vol
    purge = {"uri": URI, "name": pool, "state": "absent", "purge": True}
    with _host_lock.object_lock("volume", "d1.qcow2", scope=pool) as path, \
            module_waiting_on(path, "pool", purge) as proc:
        conn = libvirt.open(URI)
        try:  # the purge waits on d1 (d0 is gone already); d1 is still there
            assert conn.storagePoolLookupByName(pool).listVolumes() == ["d1.qcow2"]
        finally:
            conn.close()
        # what the run holding d1's lock finishes meanwhile: another volume of the pool
        late = run_module_process("volume", {"uri": URI, "pool": pool, "name": "late.qcow2", "capacity": "16M"})
        assert not late.get("failed") and late["changed"], late
    result = finished_result(proc)
    assert not result.get("failed") and result["changed"], result
    assert result["purged"] == ["d0.qcow2", "d1.qcow2", "late.qcow2"], result
    conn = libvirt.open(URI)
    try:
        assert pool not in [p.name() for p in conn.listAllStoragePools()]
    finally:
        conn.close()
    assert not (tmp_path / "pool").exists()
