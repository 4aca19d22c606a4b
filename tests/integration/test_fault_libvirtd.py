"""Fault injection: libvirtd killed (SIGKILL) in the middle of a resource list, and in the middle
of a play that declares pools, volumes, networks and domains, against the real libvirtd. The call
fails with libvirt's message (never a traceback), reports changed=true and the objects made before
the fault; after a restart (scripts/ensure-libvirtd.sh, the same set-up), the re-run makes the
rest, and the run after that changes nothing. Nothing is lost or made twice.

These tests stop the machine's libvirtd: nothing else may use it meanwhile (the integration tier
runs alone against libvirtd; only the podman container tier runs beside it).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List

import libvirt
import pytest
import yaml

from conftest import ROOT, module_env
from test_resource_lists import free_subnets

pytestmark = pytest.mark.integration
URI = "qemu:///system"
SCRIPT = ROOT / "scripts" / "ensure-libvirtd.sh"
COUNT = 24


def network_names(prefix: str) -> List[str]:
    try:
        conn = libvirt.open(URI)
    except libvirt.libvirtError:
        return []
    try:
        return sorted(n.name() for n in conn.listAllNetworks() if n.name().startswith(prefix))
    finally:
        conn.close()


def kill_libvirtd_once_networks_exist(prefix: str, within_s: float, count: int = 3):
    """A started thread that SIGKILLs libvirtd as soon as ``count`` networks named ``prefix...``
    exist (polled every 50 ms, for ``within_s`` at most), and the event it sets when it did."""
    killed = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if len(network_names(prefix)) >= count:
                subprocess.run(["pkill", "-KILL", "-x", "libvirtd"], check=False)
                killed.set()
                return
            time.sleep(0.05)

    killer = threading.Thread(target=watch)
    killer.start()
    return killer, killed


def run_networks(config: List[Dict], check: bool = False) -> Dict:
    payload = {"ANSIBLE_MODULE_ARGS": {"uri": URI, "config": config, "_ansible_check_mode": check}}
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.networks"],
                          input=json.dumps(payload), capture_output=True, text=True, env=module_env(),
                          cwd=str(ROOT), timeout=600, check=False)
    out = proc.stdout.strip()
    assert "Traceback" not in proc.stderr, proc.stderr  # Ansible would show it as MODULE FAILURE
    result = json.loads(out[out.index("{"):])
    result.setdefault("failed", False)
    return result


@pytest.fixture
def bridges_left():
    """Bridges of this test's networks: a libvirtd killed while networks run can lose track of
    them, and the networks' removal then leaves the bridges behind. Torn down after
    libvirt_cleanup (request it first): those that still exist with nothing plugged in go."""
    names: List[str] = []
    yield names
    for bridge in names:
        ports = "/sys/class/net/%s/brif" % bridge
        if os.path.isdir(ports) and not os.listdir(ports):
            subprocess.run(["ip", "link", "delete", bridge, "type", "bridge"], capture_output=True, check=False)


def bridges_of(prefix: str) -> List[str]:
    conn = libvirt.open(URI)
    try:
        return [n.bridgeName() for n in conn.listAllNetworks() if n.name().startswith(prefix) and n.isActive()]
    finally:
        conn.close()


@pytest.fixture
def restart_libvirtd():
    """Whatever happens in the test, libvirtd runs again afterwards with the same set-up."""
    yield
    subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)


def test_libvirtd_killed_mid_list_fails_clearly_and_the_rerun_converges(
        bridges_left, libvirt_cleanup, restart_libvirtd):
    subnets = free_subnets(COUNT)
    # state: active said outright: with merged an unset state keeps the object's, and the network
    # that libvirtd died under may be defined and not started; the re-run must start it.
    config = [{"name": "%snet%02d" % (libvirt_cleanup, i), "mode": "isolated", "address": s + ".1", "prefix": 24,
               "state": "active"} for i, s in enumerate(subnets)]
    killer, killed = kill_libvirtd_once_networks_exist(libvirt_cleanup, within_s=120)
    first = run_networks(config)
    killer.join()
    assert killed.is_set(), "libvirtd was never killed: the list did not make 3 networks in 120 s"
    if not first["failed"]:
        pytest.fail("the list finished before libvirtd died (raise COUNT so the fault lands mid-list): %s"
                    % first.get("actions"))
    assert first["changed"] is True, first
    assert "libvirt" in first["msg"] and "Traceback" not in first["msg"], first["msg"]
    made_before = [name for name, item in first.get("objects", {}).items() if item.get("changed")]
    assert made_before, first  # the partial report names what was done

    subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)
    second = run_networks(config)
    assert second["failed"] is False and second["changed"] is True, "%s %s" % (second.get("msg"), second.get("objects"))
    third = run_networks(config)
    bridges_left.extend(bridges_of(libvirt_cleanup))
    assert third["failed"] is False and third["changed"] is False, "%s %s" % (third.get("msg"), third.get("actions"))
    assert network_names(libvirt_cleanup) == sorted(item["name"] for item in config)
    conn = libvirt.open(URI)
    try:
        inactive = [item["name"] for item in config if not conn.networkLookupByName(item["name"]).isActive()]
        assert inactive == [], {name: (second["objects"].get(name), third["objects"].get(name)) for name in inactive}
        for name in made_before:  # what the faulted call made is kept, not redefined
            assert "redefine" not in " ".join(second["objects"][name]["actions"]), second["objects"][name]
    finally:
        conn.close()


def play(tmp_path, evars: Dict) -> subprocess.CompletedProcess:
    playbook = tmp_path / "site.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "A hypervisor's objects", "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/mlinfra.kvm.libvirt": {"uri": URI}},
        "tasks": [
            {"name": "Pools", "mlinfra.kvm.pools": {"config": "{{ pools }}"}},
            {"name": "Volumes", "mlinfra.kvm.volumes": {"config": "{{ volumes }}"}},
            # As the hypervisor role declares them: replaced, so an unset state is the default (active).
            {"name": "Networks", "mlinfra.kvm.networks": {"state": "replaced", "config": "{{ networks }}"}},
            {"name": "Domains", "mlinfra.kvm.domains": {"config": "{{ domains }}"}},
        ]}]))
    (tmp_path / "vars.json").write_text(json.dumps(evars))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook), "-e", "@%s" % (tmp_path / "vars.json")],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900, check=False)


def recap(proc: subprocess.CompletedProcess) -> Dict[str, int]:
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("localhost")][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_libvirtd_killed_mid_play_the_rerun_converges_nothing_lost_or_doubled(bridges_left, libvirt_cleanup,
                                                                              restart_libvirtd, tmp_path):
    subnets = free_subnets(COUNT + 1)
    pool = libvirt_cleanup + "pool"
    evars = {
        "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python"),
        "pools": [{"name": pool, "target": str(tmp_path / "pool")}],
        "volumes": [{"pool": pool, "name": "d%d.qcow2" % i, "capacity": "16M"} for i in range(4)],
        "networks": [{"name": "%snet%02d" % (libvirt_cleanup, i), "mode": "isolated", "address": s + ".1", "prefix": 24}
                     for i, s in enumerate(subnets[:COUNT])],
        "domains": [{"name": "%svm%d" % (libvirt_cleanup, i), "virt_type": "qemu", "memory": "64M", "vcpus": 1,
                     "disks": [{"pool": pool, "volume": "d%d.qcow2" % i}],
                     "interfaces": [{"network": "%snet00" % libvirt_cleanup}]} for i in range(4)],
    }
    killer, killed = kill_libvirtd_once_networks_exist(libvirt_cleanup, within_s=300)
    first = play(tmp_path, evars)
    killer.join()
    assert killed.is_set(), first.stdout[-3000:]
    assert first.returncode != 0, "the play finished before libvirtd died: " + first.stdout[-2000:]
    assert "Traceback" not in first.stdout + first.stderr, first.stdout[-4000:]
    assert "TASK [Networks]" in first.stdout and "TASK [Domains]" not in first.stdout, first.stdout[-3000:]
    assert "libvirt" in first.stdout.split("TASK [Networks]")[1], first.stdout[-3000:]

    subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)
    second = play(tmp_path, evars)
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap(second)["changed"] == 2, second.stdout[-3000:]  # the rest of the networks, the domains
    third = play(tmp_path, evars)
    bridges_left.extend(bridges_of(libvirt_cleanup))
    assert third.returncode == 0 and recap(third)["changed"] == 0, third.stdout[-3000:]
    conn = libvirt.open(URI)
    try:
        assert sorted(conn.storagePoolLookupByName(pool).listVolumes()) == ["d%d.qcow2" % i for i in range(4)]
        assert sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(libvirt_cleanup)) == \
            sorted(d["name"] for d in evars["domains"])
    finally:
        conn.close()
    assert network_names(libvirt_cleanup) == sorted(n["name"] for n in evars["networks"])


@pytest.mark.parametrize("plugged", [False, True])
def test_a_bridge_left_by_an_unfinished_start_is_removed_only_when_nothing_uses_it(libvirt_cleanup, plugged):
    """What libvirtd killed mid-start leaves (the network defined, its bridge created, the network
    not active), made on purpose: the start removes that bridge and goes on; a bridge with a port
    plugged in is someone's: it is never removed, and the start is refused before libvirt is asked."""
    (subnet,) = free_subnets(1)
    name = libvirt_cleanup + "br"
    bridge = "mlkvbr%d" % (os.getpid() % 100000)
    item = {"name": name, "mode": "isolated", "address": subnet + ".1", "prefix": 24, "bridge": bridge,
            "state": "present"}
    assert run_networks([item])["changed"]
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    port = bridge + "p"
    try:
        if plugged:
            subprocess.run(["ip", "tuntap", "add", "dev", port, "mode", "tap"], check=True)
            subprocess.run(["ip", "link", "set", port, "master", bridge], check=True)
        result = run_networks([dict(item, state="active")])
        if plugged:
            assert result["failed"] and result["changed"] is False, result
            # Refused before the start: the bridge is a host interface in use, not a leftover.
            assert "option bridge: value %r is already an interface of this host" % bridge in result["msg"], result["msg"]
            assert os.path.isdir("/sys/class/net/%s/brif/%s" % (bridge, port))  # left as it was
        else:
            assert not result["failed"] and result["changed"], result
            assert result["objects"][name]["actions"] == [
                "start", "delete bridge %s (left by an unfinished start)" % bridge, "start again"], result
            assert run_networks([dict(item, state="active")])["changed"] is False
    finally:
        subprocess.run(["ip", "link", "delete", port], capture_output=True, check=False)
        if plugged:
            subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)


def dnsmasq_pids(name: str) -> List[int]:
    """The dnsmasq processes (not zombies) that run network ``name``'s configuration."""
    conf = "--conf-file=/var/lib/libvirt/dnsmasq/%s.conf" % name
    pids = []
    for entry in os.listdir("/proc"):
        try:
            argv = open("/proc/%s/cmdline" % entry, "rb").read().decode().split("\0")
            state = open("/proc/%s/stat" % entry).read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if conf in argv and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("wanted", ["active", "absent"])
def test_a_start_libvirtd_never_recorded_is_cleared(bridges_left, libvirt_cleanup, restart_libvirtd, wanted):
    """libvirtd killed after it made the bridge, gave it its address and started dnsmasq, but
    before it recorded the network as started (its status file under /run/libvirt/network): made
    on purpose by removing that file while libvirtd is down. libvirtd comes back with the network
    inactive, and a plain start fails ("Network is already in use by interface", then dnsmasq's
    "Address already in use"). The module stops that dnsmasq, deletes that bridge, starts the
    network (or, asked to remove it, undefines it), says so; the run after changes nothing."""
    (subnet,) = free_subnets(1)
    name = libvirt_cleanup + "unrec"
    bridge = "mlkvur%d" % (os.getpid() % 100000)
    bridges_left.append(bridge)
    item = {"name": name, "mode": "isolated", "address": subnet + ".1", "prefix": 24, "bridge": bridge,
            "dhcp_range": {"start": subnet + ".10", "end": subnet + ".20"}, "state": "active"}
    assert run_networks([item])["changed"]
    (stale_dnsmasq,) = [pid for pid in dnsmasq_pids(name) if open("/run/libvirt/network/%s.pid" % name).read().strip()
                        == str(pid)]
    subprocess.run(["pkill", "-KILL", "-x", "libvirtd"], check=False)
    os.remove("/run/libvirt/network/%s.xml" % name)
    subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)
    conn = libvirt.open(URI)
    try:
        assert not conn.networkLookupByName(name).isActive()  # libvirtd lost the start, as after the fault
    finally:
        conn.close()
    assert os.path.isdir("/sys/class/net/%s" % bridge) and stale_dnsmasq in dnsmasq_pids(name)

    leftovers = ["stop dnsmasq %d (left by an unfinished start)" % stale_dnsmasq,
                 "delete bridge %s (left by an unfinished start)" % bridge]
    wanted_item = dict(item, state=wanted)
    if wanted == "absent":
        wanted_item = {"name": name, "state": "absent"}
    predicted = run_networks([wanted_item], check=True)
    result = run_networks([wanted_item])
    assert not result["failed"] and result["changed"], result.get("msg")
    actions = result["objects"][name]["actions"]
    if wanted == "active":
        assert actions == ["start"] + leftovers + ["start again"], result
        assert predicted["objects"][name]["actions"] == ["start"], predicted  # a failure check mode cannot foresee
    else:
        assert actions == ["undefine"] + leftovers, result
        assert predicted["objects"][name]["actions"] == actions, predicted
        assert not os.path.isdir("/sys/class/net/%s" % bridge)
    assert stale_dnsmasq not in dnsmasq_pids(name)
    again = run_networks([wanted_item])
    assert not again["failed"] and again["changed"] is False, again
    conn = libvirt.open(URI)
    try:
        assert network_names(name) == ([name] if wanted == "active" else [])
        if wanted == "active":
            assert conn.networkLookupByName(name).isActive()
    finally:
        conn.close()
