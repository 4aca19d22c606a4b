"""plugins/module_utils/_libvirt/_network_leftovers: which processes and bridges count as what an
unfinished network start left, read from a /proc and /sys/class/net laid out as Linux lays them out
(the real thing is exercised in tests/integration/test_fault_libvirtd.py, with libvirtd killed)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _network_leftovers as L

pytestmark = pytest.mark.unit

CONF = L.LIBVIRT_DNSMASQ_DIR + "/%s.conf"


@pytest.fixture
def host(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    net = tmp_path / "net"
    proc.mkdir()
    net.mkdir()
    monkeypatch.setattr(L, "PROC", str(proc))
    monkeypatch.setattr(L, "SYS_CLASS_NET", str(net))
    return tmp_path


def process(host: Path, pid: int, argv: List[str], ppid: int = 1, state: str = "S") -> None:
    entry = host / "proc" / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    # comm may hold spaces and parentheses: the state comes after the last ")".
    (entry / "stat").write_text("%d (dns (masq)) %s %d 1 1 0\n" % (pid, state, ppid))


def dnsmasq(host: Path, pid: int, network: str, ppid: int = 1, state: str = "S") -> None:
    process(host, pid, ["/usr/sbin/dnsmasq", "--conf-file=" + CONF % network, "--leasefile-ro"], ppid, state)


def bridge(host: Path, name: str, ports: List[str] = ()) -> None:
    (host / "net" / name / "brif").mkdir(parents=True)
    for port in ports:
        (host / "net" / name / "brif" / port).mkdir()


def leftovers(name="n1", own_bridge="virbr7", others=()):
    return L.Leftovers(name, own_bridge, list(others), run_command=lambda argv: (0, "", ""))


def described(pairs):
    return [description for description, _clear in pairs]


def test_only_main_live_libvirt_dnsmasq_processes_are_listed(host):
    dnsmasq(host, 100, "n1")
    dnsmasq(host, 101, "n1", ppid=100)          # the --dhcp-script helper it forks
    dnsmasq(host, 200, "gone", state="Z")       # exited, not reaped: holds nothing
    process(host, 300, ["/usr/sbin/dnsmasq", "--conf-file=/etc/dnsmasq.conf"])   # not libvirt's
    process(host, 400, ["/usr/bin/python3", "--conf-file=" + CONF % "n2"])       # not dnsmasq
    assert L.libvirt_dnsmasqs() == {"n1": [100]}


def test_own_leftovers_are_the_networks_dnsmasq_then_its_idle_bridge(host):
    dnsmasq(host, 100, "n1")
    dnsmasq(host, 150, "n2")
    bridge(host, "virbr7")
    assert described(leftovers().own()) == ["stop dnsmasq 100 (left by an unfinished start)",
                                            "delete bridge virbr7 (left by an unfinished start)"]


@pytest.mark.parametrize("others,ports", [
    ([{"name": "n2", "active": True, "bridge": "virbr7"}], []),   # another network runs on it
    ([], ["vnet0"]),                                               # something is plugged in
])
def test_a_bridge_in_use_is_never_a_leftover(host, others, ports):
    bridge(host, "virbr7", ports)
    assert described(leftovers(others=others).own()) == []
    message = "error creating bridge interface virbr7: File exists"
    assert leftovers(others=others).blocking(message) == []


def test_a_failure_naming_another_interface_clears_nothing(host):
    dnsmasq(host, 100, "n1")
    bridge(host, "virbr7")
    bridge(host, "br-lan")
    assert leftovers().blocking("internal error: Network is already in use by interface br-lan") == []
    assert described(leftovers().blocking("internal error: Network is already in use by interface virbr7")) == [
        "stop dnsmasq 100 (left by an unfinished start)", "delete bridge virbr7 (left by an unfinished start)"]


def test_an_address_taken_clears_own_leftovers_and_orphans_of_networks_libvirt_lacks(host):
    dnsmasq(host, 100, "n1")
    dnsmasq(host, 200, "deleted-net")
    dnsmasq(host, 300, "n3")                     # libvirt has n3 (inactive): n3's own start clears it
    message = ("internal error: Child process (VIR_BRIDGE_NAME=virbr7 /usr/sbin/dnsmasq ...) unexpected exit "
               "status 2: \ndnsmasq: failed to create listening socket for 10.1.2.1: Address already in use")
    assert described(leftovers(others=[{"name": "n3", "active": False, "bridge": "virbr9"}]).blocking(message)) == [
        "stop dnsmasq 100 (left by an unfinished start)",
        "stop dnsmasq 200 (of network deleted-net, which libvirt no longer has)"]


def test_an_unrelated_start_failure_clears_nothing(host):
    dnsmasq(host, 100, "n1")
    bridge(host, "virbr7")
    assert leftovers().blocking("internal error: Failed to apply firewall rules") == []


def test_a_bridge_that_cannot_be_deleted_is_an_error_naming_the_fix(host):
    bridge(host, "virbr7")
    failing = L.Leftovers("n1", "virbr7", [], run_command=lambda argv: (2, "", "RTNETLINK answers: Operation not permitted"))
    (_description, clear), = failing.own()
    with pytest.raises(L.KvmError) as caught:
        clear()
    assert "ip link delete virbr7" in caught.value.msg and "Operation not permitted" in caught.value.msg
