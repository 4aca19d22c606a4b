"""playbooks/hypervisor_maintenance.yml against two real libvirt daemons and a real Alertmanager.

The inventory has two hypervisors, both reached with a local connection: ``this`` (the host's
libvirtd, as the second daemon reaches it: ``hv2.host_uri``) and ``hv2`` (the second libvirtd of
tests/second_hypervisor.py, in its own namespaces). The playbook maintains hv2 only (``--limit hv2``)
with updates and reboot off: it marks hv2 (a textfile metric, an Alertmanager silence), drains its
running domains onto ``this`` (the first other host of the group), and brings them back.

What is real: both daemons, libvirt's peer-to-peer live migration and the disk copy over the veth,
the domain module's shutdown and start, Alertmanager's API (a process of this test on a free
loopback port, with its own storage), and for the Slurm drain a Slurm cluster of tests/slurm_cluster.py
(slurmctld, slurmdbd, a slurmd per node), reached through a third inventory host with a local
connection. What is not: a guest with a PCI host device (this machine has
none to pass through), so the GPU path's cold move is proven by the module's own tests only; the
domain that stays behind is shut down by force (a SeaBIOS-only guest does not answer ACPI).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import pytest
import yaml

from conftest import ROOT
from slurm_cluster import Cluster
from test_inventory import inventory
from test_migration import disk_in, domain_xml, env, has_pattern, hv2, lookup  # noqa: F401  # pylint: disable=unused-import  # env, hv2: fixtures

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not ALERTMANAGER, reason="needs Alertmanager (Debian: prometheus-alertmanager)"),
]

PLAYBOOK = ROOT / "playbooks" / "hypervisor_maintenance.yml"
BIN = ROOT / ".venv" / "bin"
READY_TIMEOUT_S = 60.0
# One line per task result at -v: "changed: [hv2] => (item=NAME) => {...}" or "ok: [hv2] => {...}".
RESULT_LINE = re.compile(r"^(ok|changed|skipping|fatal|failed): \[([^]]+)\](?:: FAILED!)?(?: => \(item=(.*?)\))? => (\{.*\})$")


# ---------------------------------------------------------------------------------- Alertmanager
class Alertmanager:
    """A real Alertmanager on a free loopback port, with one receiver that sends nothing."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Alertmanager":
        config = self.tmp / "alertmanager.yml"
        config.write_text(yaml.safe_dump({"route": {"receiver": "nowhere"}, "receivers": [{"name": "nowhere"}]}))
        (self.tmp / "data").mkdir()
        with open(self.tmp / "alertmanager.log", "ab") as log:
            self.proc = subprocess.Popen(
                [ALERTMANAGER, "--config.file=%s" % config, "--storage.path=%s" % (self.tmp / "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port, "--cluster.listen-address="],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("Alertmanager exited (rc %s): %s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("Alertmanager not ready on %s within %.0f s: %s" % (self.url, READY_TIMEOUT_S, self.log_tail()))

    def log_tail(self) -> str:
        return "\n".join((self.tmp / "alertmanager.log").read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def api(self, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + "/api/v2" + path, data=data, method="POST" if data else "GET",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=15) as answer:
            return json.loads(answer.read().decode())

    def silences_of(self, host: str) -> List[Dict[str, Any]]:
        """The silences mlinfra.kvm made for ``host``, by id."""
        matchers = [{"name": "host", "value": host, "isRegex": False, "isEqual": True}]
        return [s for s in self.api("/silences") if s["createdBy"] == "mlinfra.kvm" and s["matchers"] == matchers]

    def guest_silences(self) -> List[Dict[str, Any]]:
        """The silences mlinfra.kvm made for guests a maintenance stops (one regex matcher on host)."""
        return [s for s in self.api("/silences") if s["createdBy"] == "mlinfra.kvm"
                and [(m["name"], m["isRegex"]) for m in s["matchers"]] == [("host", True)]]


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    server = Alertmanager(tmp_path_factory.mktemp("alertmanager")).start()
    yield server
    server.stop()


# ---------------------------------------------------------------------------------- the playbook
@pytest.fixture
def site(env: Dict[str, Any], alertmanager: Alertmanager, tmp_path: Path) -> Dict[str, Any]:  # noqa: F811
    """The two-hypervisor inventory and each one's textfile directory."""
    hv = env["hv2"]
    textfiles = {name: tmp_path / ("textfile-" + name) for name in ("this", "hv2")}
    for path in textfiles.values():
        path.mkdir()
    hosts = {
        "this": {"libvirt_uri": hv.host_uri, "migration_uri": hv.host_migration_uri},
        "hv2": {"libvirt_uri": hv.uri, "migration_uri": hv.migration_uri},
    }
    for name, host in hosts.items():
        host.update({"ansible_connection": "local", "monitoring_textfile_dir": str(textfiles[name])})
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_python_interpreter": str(BIN / "python")},
        "children": {"hypervisors": {"hosts": hosts}}}}))
    return dict(env, inventory=path, textfiles=textfiles, alertmanager=alertmanager, tmp=tmp_path,
                state_dir=tmp_path / "maintenance")


def command(site: Dict[str, Any], evars: Dict[str, Any], check: bool = False) -> Tuple[List[str], Dict[str, str]]:
    """ansible-playbook's argv over hv2 (updates and reboot off) and its environment."""
    evars = dict({"hypervisor_maintenance_updates": False, "hypervisor_maintenance_reboot": False,
                  "hypervisor_maintenance_alertmanager_url": site["alertmanager"].url,
                  "hypervisor_maintenance_migration_timeout": 300,
                  "hypervisor_maintenance_state_dir": str(site["state_dir"])}, **evars)
    varfile = site["tmp"] / "vars.json"
    varfile.write_text(json.dumps(evars))
    environ = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_CALLBACK_FORMAT_PRETTY="0")
    argv = [str(BIN / "ansible-playbook"), "-v", "-i", str(site["inventory"]), str(PLAYBOOK),
            "--limit", "hv2", "-e", "@%s" % varfile] + (["--check"] if check else [])
    return argv, environ


def play(site: Dict[str, Any], evars: Dict[str, Any], check: bool = False, rc: int = 0) -> Dict[str, Any]:
    """The playbook over hv2; the recap and every task result (-v prints each as JSON)."""
    argv, environ = command(site, evars, check)
    began = time.monotonic()
    proc = subprocess.run(argv, cwd=str(ROOT), env=environ, capture_output=True, text=True, timeout=900, check=False)
    print("playbook%s: %.1f s" % (" --check" if check else "", time.monotonic() - began))
    site["runs"] = site.get("runs", 0) + 1
    (site["tmp"] / ("play-%d.log" % site["runs"])).write_text(proc.stdout + proc.stderr)
    assert proc.returncode == rc, proc.stdout[-6000:] + proc.stderr[-3000:]
    return parse(proc.stdout, rc)


def parse(stdout: str, rc: Optional[int] = 0) -> Dict[str, Any]:
    """Every task's results (-v prints each as JSON) and the tasks that changed; the recap's failed
    count is checked against ``rc`` unless it is None (a killed run has no recap)."""
    tasks: Dict[str, List[Dict[str, Any]]] = {}
    task = None
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")]
            tasks.setdefault(task, [])
            continue
        match = RESULT_LINE.match(line)
        if match and task:
            tasks[task].append(dict(json.loads(match.group(4)), _status=match.group(1), _item=match.group(3)))
    if rc is not None:
        recap = re.search(r"^hv2\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", stdout, re.M)
        assert recap and recap.group(4) == ("0" if rc == 0 else "1"), stdout[-3000:]
    changed = sorted({t for t, results in tasks.items() if any(r["_status"] == "changed" for r in results)})
    return {"tasks": tasks, "changed": changed, "stdout": stdout}


def results_of(run: Dict[str, Any], task_start: str) -> List[Dict[str, Any]]:
    """The item results of the task whose name starts with ``task_start``."""
    found = [results for name, results in run["tasks"].items() if name.startswith(task_start)]
    assert len(found) == 1, (task_start, list(run["tasks"]))
    return [r for r in found[0] if r["_item"] is not None]


def task_results(run: Dict[str, Any], task_start: str) -> List[Dict[str, Any]]:
    """Every result of the task whose name starts with ``task_start`` (a loop's items or its one result)."""
    found = [results for name, results in run["tasks"].items() if name.startswith(task_start)]
    assert len(found) == 1, (task_start, list(run["tasks"]))
    return found[0]


def record_of(run: Dict[str, Any]) -> Dict[str, Any]:
    (report,) = [r for name, results in run["tasks"].items() if name.startswith("Report the maintenance")
                 for r in results]
    return report["hypervisor_maintenance_record"]


MIGRATIONS = ("Migrate the domains without", "Migrate the domains with PCI", "Shut down the domains",
              "Migrate the live-moved", "Migrate the cold-moved", "Start the domains")


def test_empty_hypervisor_moves_nothing_and_reuses_an_active_silence(site):
    """Nothing runs on hv2: no move, no shutdown; the active silence an interrupted run left for
    hv2 is reused (no second one) and expired; what changes is the mark and the unmark only."""
    am = site["alertmanager"]
    now = time.time()
    left = am.api("/silences", {
        "matchers": [{"name": "host", "value": "hv2", "isRegex": False, "isEqual": True}],
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600)),
        "createdBy": "mlinfra.kvm", "comment": "left by an interrupted maintenance"})["silenceID"]
    before = {s["id"] for s in am.silences_of("hv2")}

    run = play(site, {})
    assert run["changed"] == ["Expire the silence in Alertmanager %s" % left,
                              "Mark the maintenance in the textfile metric %s"
                              % (site["textfiles"]["hv2"] / "mlinfra_hypervisor_maintenance.prom"),
                              "Remove the maintenance textfile metric %s"
                              % (site["textfiles"]["hv2"] / "mlinfra_hypervisor_maintenance.prom")], run["changed"]
    for task in MIGRATIONS:
        assert results_of(run, task) == [], task
    assert record_of(run) == {"hypervisor": "hv2", "destination": "this", "started": record_of(run)["started"],
                              "silence_id": left, "guest_silence_id": "", "live": [], "cold": [], "stopped": [],
                              "slurm_drained": [], "slurm_resumed": [], "slurm_not_back": []}
    after = {s["id"]: s for s in am.silences_of("hv2")}
    assert set(after) == before, "no second silence"
    assert after[left]["status"]["state"] == "expired"
    assert not any(list(p.iterdir()) for p in site["textfiles"].values()), "no marker left"
    assert not site["state_dir"].exists(), "nothing left: no record written"


def test_preflight_refuses_hv2_as_its_own_destination_before_anything(site):
    run = play(site, {"hypervisor_maintenance_destination": "hv2"}, rc=2)
    assert run["changed"] == [] and list(run["tasks"]) == ["Assert the maintenance request is complete for hv2"]
    (refused,) = run["tasks"]["Assert the maintenance request is complete for hv2"]
    assert refused["_status"] == "fatal" and "set hypervisor_maintenance_destination" in refused["msg"], refused
    assert not [s for s in site["alertmanager"].silences_of("hv2") if s["status"]["state"] == "active"]
    assert not list(site["textfiles"]["hv2"].iterdir())


def test_drains_hv2_onto_this_host_and_brings_everything_back(site):
    host, second, hv = site["host"], site["second"], site["hv2"]
    prefix, am = site["prefix"], site["alertmanager"]
    live, stays, gpu = prefix + "live", prefix + "stays", prefix + "gpu"
    # The image is made (with the test pattern) in this host's pool and moved into hv2's at the same path.
    path = disk_in(host, site["pool"], "live.qcow2")
    shutil.move(str(path), str(hv.path_here(str(path))))
    for conn in (host, second):
        conn.storagePoolLookupByName(site["pool"]).refresh(0)
    second.defineXML(domain_xml(live, [path], site["network"])).create()
    second.defineXML(domain_xml(stays, [], site["network"])).create()
    second.defineXML(domain_xml(gpu, [], None, hostdev="0000:7f:1f.7"))  # shut off: it stays as it is
    uuid = lookup(second, live).UUIDString()
    evars = {"hypervisor_maintenance_stop_domains": [stays], "hypervisor_maintenance_shutdown_timeout": 1,
             "hypervisor_maintenance_shutdown_force": True}
    prom = site["textfiles"]["hv2"] / "mlinfra_hypervisor_maintenance.prom"
    silences = {s["id"] for s in am.silences_of("hv2")}
    guest_silences = {s["id"] for s in am.guest_silences()}

    def all_home() -> None:
        for name in (live, stays):
            dom = lookup(second, name)
            assert dom is not None and dom.isActive(), name
        assert lookup(second, live).UUIDString() == uuid
        assert not lookup(second, gpu).isActive()
        assert all(lookup(host, name) is None for name in (live, stays, gpu)), "nothing left on this host"
        assert not prom.exists()
        assert not (site["state_dir"] / "hv2.json").exists(), "no record left"

    # Check mode predicts the drain and moves nothing.
    predicted = play(site, evars, check=True)
    (move,) = results_of(predicted, "Migrate the domains without")
    assert move["_item"] == live and move["_status"] == "changed" and move["mode"] == "live"
    assert move["disks"] == [{"target": "vda", "path": str(path), "action": "copy"}]
    (stop,) = results_of(predicted, "Shut down the domains")
    assert stop["_item"] == stays and stop["_status"] == "changed"
    assert results_of(predicted, "Migrate the domains with PCI") == []
    all_home()
    assert {s["id"] for s in am.silences_of("hv2")} == silences, "check mode makes no silence"
    assert {s["id"] for s in am.guest_silences()} == guest_silences, "check mode makes no silence for the guests"

    applied = play(site, evars)
    record = record_of(applied)
    assert record["live"] == [live] and record["cold"] == [] and record["stopped"] == [stays], record
    (there,) = results_of(applied, "Migrate the domains without")
    assert there["mode"] == "live" and there["destination"] == hv.host_uri and there["progress"][-1] == "completed"
    (back,) = results_of(applied, "Migrate the live-moved")
    assert back["mode"] == "live" and back["destination"] == hv.uri
    (started,) = results_of(applied, "Start the domains")
    assert started["_status"] == "changed"
    all_home()
    assert has_pattern(hv.path_here(str(path))), "the disk went there and back intact"
    (silence,) = [s for s in am.silences_of("hv2") if s["id"] not in silences]
    assert silence["id"] == record["silence_id"] and silence["status"]["state"] == "expired", silence
    assert "hv2" in silence["comment"] and "this" in silence["comment"]
    # The guest that was shut down had its own alerts (GuestDown carries its name) silenced, live
    # moves not: one regex matcher on the stopped guests' names, expired when they are back.
    (guests,) = [g for g in am.guest_silences() if g["id"] not in guest_silences]
    assert guests["id"] == record["guest_silence_id"] and guests["status"]["state"] == "expired", guests
    assert guests["matchers"] == [{"name": "host", "value": re.escape(stays), "isRegex": True, "isEqual": True}]
    assert stays in guests["comment"] and live not in guests["comment"]
    (marked,) = [r for name, results in applied["tasks"].items() if name.startswith("Mark the maintenance")
                 for r in results]
    assert marked["dest"] == str(prom) and marked["checksum"] == hashlib.sha1(marker(record["started"])).hexdigest()

    # A second run drains and restores the same way, with a silence of its own.
    again = record_of(play(site, evars))
    assert again["live"] == [live] and again["stopped"] == [stays] and again["silence_id"] not in silences | {silence["id"]}
    all_home()
    assert has_pattern(hv.path_here(str(path)))
    assert all(s["status"]["state"] == "expired" for s in am.silences_of("hv2"))
    assert all(s["status"]["state"] == "expired" for s in am.guest_silences())


KILL_TIMEOUT_S = 120.0
POLL_S = 0.05


def descendants(pid: int) -> Set[int]:
    """Every process under ``pid``: ansible's workers call setsid() (they leave its process group)
    and start the modules, so a kill of the group alone would leave a module running on."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: Set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group and every process it started (a controller that dies)."""
    if proc.poll() is not None:
        return
    # Freeze first, so that nothing forks between the listing and the kill: the group (the main
    # process), then each process found under it, until a listing finds no new one.
    os.killpg(proc.pid, signal.SIGSTOP)
    below: Set[int] = set()
    while True:
        found = descendants(proc.pid) - below
        if not found:
            break
        for pid in found:
            signal_quietly(pid, signal.SIGSTOP)
        below |= found
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        signal_quietly(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path("/proc/%d" % pid).exists() and "Z" not in stat_state(pid) for pid in below):
        assert time.monotonic() < deadline, "processes of the killed run still alive: %s" % below
        time.sleep(POLL_S)


def signal_quietly(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended by itself meanwhile
        pass


def stat_state(pid: int) -> str:
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2:].split()[0]


def test_a_run_killed_after_the_drain_is_finished_by_the_next_run(site):
    """A run killed after the drain (SIGKILL of ansible-playbook's process group and of what it
    started) leaves the domain on ``this`` and the record naming it; a check run with the record
    predicts the way back and leaves the record; the next run brings the domain back to hv2 (same
    UUID), removes the record and the marker and expires the silence the killed run made; a check
    run after that finds no record and has nothing to bring back."""
    host, second, hv = site["host"], site["second"], site["hv2"]
    prefix, am = site["prefix"], site["alertmanager"]
    live = prefix + "live"
    second.defineXML(domain_xml(live, [], site["network"])).create()
    uuid = lookup(second, live).UUIDString()
    evars: Dict[str, Any] = {}
    before = {s["id"] for s in am.silences_of("hv2")}  # the Alertmanager is the module's: earlier tests' silences
    record_file = site["state_dir"] / "hv2.json"
    prom = site["textfiles"]["hv2"] / "mlinfra_hypervisor_maintenance.prom"

    def away() -> bool:
        there = lookup(host, live)
        return record_file.exists() and there is not None and there.isActive() and lookup(second, live) is None

    argv, environ = command(site, evars)
    log = site["tmp"] / "killed.log"
    began = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=str(ROOT), env=environ, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while not away():
            assert proc.poll() is None, "the run ended before it was killed: " + log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no drain within %.0f s: %s" % (KILL_TIMEOUT_S, log.read_text()[-4000:])
            time.sleep(POLL_S)
        kill_run(proc)
    finally:
        kill_run(proc)
    print("killed run: %.1f s" % (time.monotonic() - began))
    killed = parse(log.read_text(), rc=None)
    assert not any(r["_status"] in ("fatal", "failed") for results in killed["tasks"].values() for r in results)
    assert lookup(second, live) is None and lookup(host, live).isActive(), "the domain is away"
    record = json.loads(record_file.read_text())
    assert record_file.stat().st_mode & 0o777 == 0o600
    (entry,) = [d for d in record["domains"] if d["name"] == live]
    assert entry["how"] == "live" and entry["destination_uri"] == hv.host_uri, record
    (silence,) = [s for s in am.silences_of("hv2") if s["id"] not in before]
    assert silence["id"] == record["silence_id"] and silence["status"]["state"] == "active", silence
    assert prom.exists(), "the killed run's marker is still there"

    # Check mode with the record there: predicts the way back, writes and removes nothing.
    kept = record_file.read_bytes()
    predicted = play(site, evars, check=True)
    assert any("An earlier run's record %s was found" % record_file in r.get("msg", "")
               for name, results in predicted["tasks"].items() if name.startswith("Report the earlier run's record")
               for r in results), predicted["stdout"][-3000:]
    (back,) = results_of(predicted, "Migrate the live-moved")
    assert back["_item"] == live and back["_status"] == "changed" and back["mode"] == "live", back
    assert record_file.read_bytes() == kept and lookup(second, live) is None

    finished = play(site, evars)
    (back,) = results_of(finished, "Migrate the live-moved")
    assert back["_item"] == live and back["_status"] == "changed" and back["destination"] == hv.uri, back
    assert lookup(second, live).isActive() and lookup(second, live).UUIDString() == uuid
    assert lookup(host, live) is None
    assert not record_file.exists() and not prom.exists()
    assert [s["status"]["state"] for s in am.silences_of("hv2") if s["id"] not in before] == ["expired"]
    assert all(s["status"]["state"] == "expired" for s in am.silences_of("hv2"))

    # Nothing left to restore: no record read, nothing moved (check mode).
    again = play(site, evars, check=True)
    assert [r["_status"] for name, results in again["tasks"].items()
            if name.startswith("Report the earlier run's record") for r in results] == ["skipping"]
    (back,) = results_of(again, "Migrate the live-moved")
    assert back["_status"] == "ok" and back["mode"] == "none", back
    assert lookup(second, live).isActive() and lookup(host, live) is None and not record_file.exists()


def marker(started: int) -> bytes:
    """The textfile metric the playbook writes for hv2 while it is in maintenance."""
    return ("# HELP mlinfra_hypervisor_maintenance 1 while playbooks/hypervisor_maintenance.yml of mlinfra.kvm drains,"
            " updates or reboots this hypervisor.\n"
            "# TYPE mlinfra_hypervisor_maintenance gauge\n"
            'mlinfra_hypervisor_maintenance{hypervisor="hv2"} 1\n'
            "# HELP mlinfra_hypervisor_maintenance_start_timestamp_seconds When that maintenance began (Unix time).\n"
            "# TYPE mlinfra_hypervisor_maintenance_start_timestamp_seconds gauge\n"
            'mlinfra_hypervisor_maintenance_start_timestamp_seconds{hypervisor="hv2"} %d\n' % started).encode()


class SlurmdFollowsDomain:
    """The slurmd of a namespace node lives and dies with a domain, as a GPU VM's does: killed when
    the domain is seen off, started again `boot_s` after it is seen running (a VM's boot; longer than
    what the playbook does after the start, so a run that does not wait ends before it), unless
    `restart` is cleared. A thread polls libvirt while the block runs."""

    def __init__(self, cluster: Cluster, node: str, conn: Any, domain: str, boot_s: float = 12.0):
        self.cluster, self.node, self.conn, self.domain, self.boot_s = cluster, node, conn, domain, boot_s
        self.restart = True
        self.kills = self.starts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> "SlurmdFollowsDomain":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _follow(self) -> None:
        up, running_since = True, None
        while not self._stop.wait(0.2):
            active = bool(lookup(self.conn, self.domain).isActive())
            if not active and up:
                self.cluster.kill_node(self.node)
                up, running_since = False, None
                self.kills += 1
            elif active and not up and self.restart:
                running_since = running_since or time.monotonic()
                if time.monotonic() - running_since >= self.boot_s:
                    self.cluster.start_node(self.node)
                    up = True
                    self.starts += 1


def slurm_node(cluster: Cluster, node: str) -> Tuple[str, str]:
    """The node's state (sinfo's, without its flags) and Reason ('' when none)."""
    out = cluster.slurm("sinfo", "--noheader", "--Node", "--nodes", node, "--format", "%T|%E").splitlines()
    state, reason = out[0].split("|", 1)
    return state.rstrip("*~#!%$@^-"), "" if reason == "none" else reason


def submit(cluster: Cluster, node: str, seconds: int, tmp: Path) -> str:
    """A batch job of ``seconds`` on ``node`` (its output under ``tmp``); its id."""
    return cluster.slurm("sbatch", "--parsable", "--partition", "gpu", "--account", "team-a", "--nodelist", node,
                         "--output", str(tmp / "job-%j.out"), "--wrap", "sleep %d" % seconds).strip()


def debug_messages(run: Dict[str, Any], task_start: str) -> List[str]:
    return [r["msg"] for name, results in run["tasks"].items() if name.startswith(task_start)
            for r in results if "msg" in r]


SLURM_REASON = "mlinfra.kvm: maintenance of hypervisor hv2"


def test_the_slurm_node_of_a_domain_that_stops_is_drained_its_job_awaited_and_resumed(site, tmp_path):
    """A real Slurm cluster (tests/slurm_cluster.py) whose nodes stand for the domains that are shut
    down: check mode predicts the drain and drains nothing; the run drains the first node while its
    job runs, shuts its domain down only after the job ended (sacct's end time, and every poll during
    the run), starts it again, resumes the node and ends only once the node's slurmd (killed with its
    domain, started a few seconds after it) has registered again (idle, no Reason, as the run ends). The second node, drained by
    someone else, is neither drained nor resumed (its Reason stays); a domain whose node Slurm does
    not know is shut down with a note. A job that outlasts the timeout fails the run before anything
    is shut down; the rerun finds the node recorded and drained with this maintenance's Reason, does
    not drain it again, finishes and resumes it. A slurmd that does not come back fails the run at its
    end, naming the node, with every domain back and the record gone."""
    second, prefix = site["second"], site["prefix"]
    stays, theirs, unknown = prefix + "stays", prefix + "theirs", prefix + "nonode"
    second.defineXML(domain_xml(stays, [], site["network"])).create()
    for name in (theirs, unknown):
        second.defineXML(domain_xml(name, [], None)).create()
    inv = yaml.safe_load(site["inventory"].read_text())
    inv["all"]["hosts"] = {"slurmctl": {"ansible_connection": "local"}}
    site["inventory"].write_text(yaml.safe_dump(inv))
    with Cluster(tmp_path / "slurm", nodes=2) as cluster, \
            SlurmdFollowsDomain(cluster, cluster.node_names[0], second, stays) as follower:
        node, other = cluster.node_names
        cluster.slurm("scontrol", "update", "NodeName=" + other, "State=DRAIN", "Reason=memory test")
        evars = {"hypervisor_maintenance_stop_domains": [stays, theirs, unknown],
                 "hypervisor_maintenance_shutdown_timeout": 1, "hypervisor_maintenance_shutdown_force": True,
                 "hypervisor_maintenance_slurm_controller": "slurmctl", "hypervisor_maintenance_slurm_conf": cluster.conf,
                 "hypervisor_maintenance_slurm_nodes": {stays: node, theirs: other},
                 "hypervisor_maintenance_job_poll_interval": 1, "hypervisor_maintenance_job_timeout": 120}

        predicted = play(site, evars, check=True)
        (plan,) = debug_messages(predicted, "Report the Slurm nodes of the domains that stop")
        assert "would drain ['%s']" % node in plan, plan
        assert "another reason (waited for, left as they are): ['%s (drained: memory test)']" % other in plan, plan
        assert "not known to Slurm (skipped): ['%s (%s)']" % (unknown, unknown) in plan, plan
        assert not [t for t in predicted["changed"] if "Slurm" in t], predicted["changed"]
        assert "skipping: [hv2] => (item=%s)" % node in predicted["stdout"], "check mode runs no scontrol update"
        (resume,) = debug_messages(predicted, "Report the Slurm nodes resumed")
        assert "would resume ['%s']" % node in resume, resume
        assert record_of(predicted)["slurm_drained"] == [node]
        assert slurm_node(cluster, node) == ("idle", ""), "check mode drains nothing"
        assert lookup(second, stays).isActive() and not site["state_dir"].exists()

        job = submit(cluster, node, 15, tmp_path)
        deadline = time.monotonic() + 30
        while cluster.slurm("squeue", "--noheader", "-j", job, "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < deadline, "job %s did not start" % job
            time.sleep(0.2)

        argv, environ = command(site, evars)
        log = tmp_path / "drain.log"
        seen: List[Tuple[str, str, bool]] = []  # (job state, node state, domain active) per poll
        stopped_at = None
        recorded: Optional[Dict[str, Any]] = None  # the record, as first seen during the run
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=str(ROOT), env=environ, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the run took over 300 s: " + log.read_text()[-4000:]
                job_state = cluster.slurm("squeue", "--noheader", "-j", job, "-o", "%T").strip()
                active = bool(lookup(second, stays).isActive())
                seen.append((job_state, slurm_node(cluster, node)[0], active))
                if not active and stopped_at is None:
                    stopped_at = time.time()
                if (site["state_dir"] / "hv2.json").exists() and recorded is None:
                    recorded = json.loads((site["state_dir"] / "hv2.json").read_text())
                time.sleep(0.2)
        finally:
            kill_run(proc)
        applied = parse(log.read_text())
        assert recorded is not None and recorded["slurm_drained"] == [node], "a killed run's next run resumes it: %s" % recorded
        assert proc.returncode == 0, log.read_text()[-6000:]

        assert ("RUNNING", "draining", True) in seen, "the node was drained while the job ran: %s" % seen
        assert all(active for job_state, _node_state, active in seen if job_state), "shut down while the job ran: %s" % seen
        assert stopped_at is not None, "the domain was seen shut down during the run"
        end, state = cluster.slurm("sacct", "--noheader", "--parsable2", "--allocations", "-j", job,
                                   "-o", "End,State").splitlines()[0].split("|")
        assert state == "COMPLETED", state
        assert time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")) <= stopped_at, (end, stopped_at)
        (drained,) = results_of(applied, "Drain the Slurm nodes")
        assert drained["_item"] == node and drained["_status"] == "changed" and drained["cmd"] == [
            "scontrol", "update", "NodeName=" + node, "State=DRAIN", "Reason=" + SLURM_REASON], drained
        (resumed,) = results_of(applied, "Resume the Slurm nodes")
        assert resumed["_item"] == node and resumed["_status"] == "changed", resumed
        record = record_of(applied)
        assert sorted(record["stopped"]) == sorted([stays, theirs, unknown]), record
        assert record["slurm_drained"] == [node] and record["slurm_resumed"] == [node], record
        assert all(lookup(second, name).isActive() for name in (stays, theirs, unknown))
        assert not (site["state_dir"] / "hv2.json").exists()
        assert slurm_node(cluster, other) == ("drained", "memory test"), "someone else's drain is left as it is"
        # Not waited for here: the run itself waited until the node's new slurmd registered. ("idle"
        # alone would not show it: slurmctld lists a node whose slurmd just died as idle for a while.)
        assert (follower.kills, follower.starts) == (1, 1), "the run ended before the node's slurmd was back"
        assert slurm_node(cluster, node) == ("idle", "")
        assert record["slurm_not_back"] == [], record
        (waited,) = task_results(applied, "Wait until the slurmd of each resumed Slurm node registered again")
        assert waited["_status"] == "ok" and waited["attempts"] >= 1, waited

        # A job that outlasts hypervisor_maintenance_job_timeout: the run fails naming the node and the
        # job, shuts nothing down, and leaves the node drained and in the record.
        job = submit(cluster, node, 120, tmp_path)
        failed = play(site, dict(evars, hypervisor_maintenance_job_timeout=2), rc=2)
        (refused,) = failed["tasks"]["Assert no job runs on the Slurm nodes of the domains that stop"]
        assert refused["_status"] == "fatal", refused
        assert "Jobs still run on the Slurm nodes ['%s', '%s'] after 2 s" % (node, other) in refused["msg"], refused
        assert re.search(r"'%s RUNNING root wrap on %s'" % (job, node), refused["msg"]), refused["msg"]
        assert not [t for t in failed["tasks"] if t.startswith(MIGRATIONS)], "no move or shutdown was run"
        assert all(lookup(second, name).isActive() for name in (stays, theirs, unknown)), "nothing shut down"
        assert slurm_node(cluster, node) == ("draining", SLURM_REASON)
        assert json.loads((site["state_dir"] / "hv2.json").read_text())["slurm_drained"] == [node]
        cluster.slurm("scancel", job)

        # The rerun finds the node in the record, drained with this maintenance's Reason: not drained
        # again (no change); it drains the rest and resumes the node.
        record_file = site["state_dir"] / "hv2.json"
        rerun = play(site, evars)
        (plan,) = debug_messages(rerun, "Report the Slurm nodes of the domains that stop")
        assert "drains []" in plan and "already drained by this maintenance: ['%s']" % node in plan, plan
        assert results_of(rerun, "Drain the Slurm nodes") == []
        (resumed,) = results_of(rerun, "Resume the Slurm nodes")
        assert resumed["_item"] == node and resumed["_status"] == "changed", resumed
        assert record_of(rerun)["slurm_drained"] == [node] and record_of(rerun)["slurm_resumed"] == [node]
        assert not record_file.exists()
        assert slurm_node(cluster, other) == ("drained", "memory test")
        assert slurm_node(cluster, node) == ("idle", "")

        # A slurmd that does not come back with its domain: the maintenance finishes (domains back,
        # record gone), then fails naming the node; slurmctld lists it as not responding.
        follower.restart = False
        lost = play(site, dict(evars, hypervisor_maintenance_slurmd_timeout=3), rc=2)
        (refused,) = task_results(lost, "Assert the slurmd of every resumed Slurm node registered again")
        assert refused["_status"] == "fatal", refused
        assert re.search(r"the resumed Slurm nodes \['%s \([A-Z_+*]+, slurmd started [0-9T:-]+\)'\] did not register "
                         r"with slurmctld on slurmctl within 3 s" % node, refused["msg"]), refused["msg"]
        assert record_of(lost)["slurm_not_back"] and not record_file.exists(), record_of(lost)
        assert all(lookup(second, name).isActive() for name in (stays, theirs, unknown))
        assert not [t for t in lost["tasks"] if t.startswith("Fail naming what was moved")], "the restore itself succeeded"
        follower.restart = True


def wait_idle(cluster: Cluster, node: str) -> None:
    deadline = time.monotonic() + 30
    while slurm_node(cluster, node) != ("idle", ""):
        assert time.monotonic() < deadline, "node not idle without a Reason: %s" % (slurm_node(cluster, node),)
        time.sleep(0.2)


def test_a_running_ml_stage_in_a_guest_that_stops_is_awaited_before_it_stops(site, tmp_path):
    """A guest that stops (named in hypervisor_maintenance_stop_domains; a GPU VM's shutdown or cold
    move takes the same path) and is an inventory host (hypervisor_maintenance_guest_hosts, here with
    a local connection) runs an ml_stage started over SSH: its NAME.running.json and a process
    carrying the record's token. Check mode names the stage and would wait; the run waits up to
    hypervisor_maintenance_stage_timeout, then fails naming the stage with the domain still running;
    a record whose token no process carries (a run cut short) is not waited for. Once the stage has
    ended, the rerun shuts the domain down and starts it again."""
    second, train = site["second"], site["prefix"] + "train"
    second.defineXML(domain_xml(train, [], None)).create()
    stages = tmp_path / "stages"
    stages.mkdir()
    token = "hypervisor-maintenance-test-%d" % os.getpid()
    (stages / "train.running.json").write_text(json.dumps({"format": 1, "token": token, "cmd": ["sleep", "600"]}))
    (stages / "cut.running.json").write_text(json.dumps({"format": 1, "token": token + "-gone", "cmd": ["true"]}))
    inv = yaml.safe_load(site["inventory"].read_text())
    inv["all"]["hosts"] = {"trainguest": {"ansible_connection": "local"}}
    site["inventory"].write_text(yaml.safe_dump(inv))
    evars = {"hypervisor_maintenance_stop_domains": [train], "hypervisor_maintenance_shutdown_timeout": 1,
             "hypervisor_maintenance_shutdown_force": True, "hypervisor_maintenance_guest_hosts": {train: "trainguest"},
             "hypervisor_maintenance_stage_state_dir": str(stages), "hypervisor_maintenance_job_poll_interval": 1,
             "hypervisor_maintenance_stage_timeout": 3}
    stage = subprocess.Popen(["sleep", "600"], env=dict(os.environ, ML_STAGE_RUN_TOKEN=token), start_new_session=True)
    running = "%s: stage train (pids %d: sleep 600)" % (train, stage.pid)
    try:
        predicted = play(site, evars, check=True)
        (report,) = debug_messages(predicted, "Report the ML stages in the guests that stop")
        assert "would wait up to 3 s for ['%s'] in ['%s']" % (running, train) in report, report

        began = time.monotonic()
        failed = play(site, evars, rc=2)
        assert time.monotonic() - began >= 3, "the run waited for the stage"
        (refused,) = task_results(failed, "Assert no ML stage runs in the guests that stop")
        assert refused["_status"] == "fatal" and "hypervisor_maintenance_stage_timeout" in refused["msg"], refused
        assert running in refused["msg"] and "stage cut" not in refused["msg"], refused
        assert not [t for t in failed["tasks"] if t.startswith(MIGRATIONS)], "nothing shut down or moved"
        assert lookup(second, train).isActive()
    finally:
        stage.kill()
        stage.wait()

    run = play(site, evars)
    (report,) = debug_messages(run, "Report the ML stages in the guests that stop")
    assert "waited up to 3 s for [] in ['%s']" % train in report, report
    assert record_of(run)["stopped"] == [train]
    assert lookup(second, train).isActive(), "started again"


def test_inventory_lists_the_domains_of_both_hypervisors(site, tmp_path):
    host, second, hv = site["host"], site["second"], site["hv2"]
    prefix = site["prefix"]
    host.defineXML(domain_xml(prefix + "here", [], None))
    second.defineXML(domain_xml(prefix + "there", [], None))
    data = inventory(tmp_path, {"uri": ["qemu:///system", hv.uri], "name_filter": "^" + re.escape(prefix)})
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == [prefix + "here", prefix + "there"]
    assert hostvars[prefix + "here"]["libvirt_uri"] == "qemu:///system"
    assert hostvars[prefix + "there"]["libvirt_uri"] == hv.uri
