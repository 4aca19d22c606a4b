"""mlinfra.kvm.network against a real libvirtd (qemu:///system)."""
from __future__ import annotations

import random

import libvirt
import pytest

from conftest import four_ways

pytestmark = pytest.mark.integration


@pytest.fixture
def subnet():
    """A /24 in 10.213.x.0 that no other libvirt network of this host uses."""
    conn = libvirt.open("qemu:///system")
    try:
        used = "".join(n.XMLDesc(0) for n in conn.listAllNetworks())
    finally:
        conn.close()
    for _ in range(100):
        third = random.randint(1, 254)
        if "10.213.%d." % third not in used:
            return "10.213.%d" % third
    pytest.fail("no free 10.213.x.0/24 for a test network")


@pytest.fixture
def net_args(libvirt_cleanup, subnet):
    return {"name": libvirt_cleanup + "net", "mode": "nat", "address": subnet + ".1", "prefix": 24,
            "dhcp_range": {"start": subnet + ".100", "end": subnet + ".200"}}


def live_xml(name, inactive=False):
    conn = libvirt.open("qemu:///system")
    try:
        net = conn.networkLookupByName(name)
        return net.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE if inactive else 0)
    finally:
        conn.close()


def test_nat_network_four_ways(net_args, subnet):
    results = four_ways("network", dict(net_args, autostart=True))
    assert results["check"]["actions"] == ["define", "start", "autostart on"]
    net = results["apply"]["network"]
    assert net["state"] == "active" and net["mode"] == "nat" and net["autostart"] is True
    assert net["dhcp_range"] == {"start": subnet + ".100", "end": subnet + ".200"}
    assert results["check"]["diff"]["before"]["state"] == "absent"
    assert results["check"]["diff"]["after"]["address"] == subnet + ".1"
    assert "<forward mode=\"nat\"" in results["apply"]["xml"] or "<forward mode='nat'" in results["apply"]["xml"]


@pytest.mark.parametrize("mode", ["isolated", "route"])
def test_other_modes_four_ways(net_args, mode):
    results = four_ways("network", dict(net_args, mode=mode))
    assert results["apply"]["network"]["mode"] == mode


def test_netmask_form_is_equivalent_to_prefix(net_args, run_module):
    run_module("network", net_args)
    args = dict(net_args)
    del args["prefix"]
    args["netmask"] = "255.255.255.0"
    assert run_module("network", args, check=True)["changed"] is False


def test_host_entries_change_live_without_restart(net_args, subnet, run_module):
    run_module("network", net_args)
    bridge_before = run_module("network", net_args)["network"]["bridge"]
    hosts = [{"mac": "52:54:00:aa:bb:01", "ip": subnet + ".11", "name": "worker-1"},
             {"mac": "52:54:00:aa:bb:02", "ip": subnet + ".12", "name": "worker-2"}]
    dns = [{"ip": subnet + ".5", "hostnames": ["mlflow.lab"]}]
    results = four_ways("network", dict(net_args, hosts=hosts, dns_hosts=dns))
    assert "restart" not in results["apply"]["actions"] and "redefine" not in results["apply"]["actions"]
    assert sorted(results["apply"]["actions"]) == sorted([
        "live add DHCP host 52:54:00:aa:bb:01", "live add DHCP host 52:54:00:aa:bb:02", "live add DNS host %s.5" % subnet])
    assert results["apply"]["restart_required"] is False
    for inactive in (False, True):  # live AND persistent
        xml = live_xml(net_args["name"], inactive)
        assert "52:54:00:aa:bb:02" in xml and "worker-2" in xml and "mlflow.lab" in xml
    # Modify one entry, drop another: still live.
    hosts2 = [{"mac": "52:54:00:aa:bb:01", "ip": subnet + ".21", "name": "worker-1"}]
    results = four_ways("network", dict(net_args, hosts=hosts2, dns_hosts=[]))
    assert results["apply"]["restart_required"] is False
    for inactive in (False, True):
        xml = live_xml(net_args["name"], inactive)
        assert subnet + ".21" in xml and "52:54:00:aa:bb:02" not in xml and "mlflow.lab" not in xml
    assert run_module("network", net_args)["network"]["bridge"] == bridge_before


def test_restart_needing_change_is_reported_not_applied(net_args, subnet, run_module):
    run_module("network", net_args)
    changed = dict(net_args, dhcp_range={"start": subnet + ".50", "end": subnet + ".60"})
    check = run_module("network", changed, check=True, diff=True)
    assert check["changed"] and check["restart_required"] is True and check["pending"] == ["dhcp_range"]
    applied = run_module("network", changed, diff=True)
    assert applied["changed"] and applied["actions"] == ["redefine"]
    assert applied["restart_required"] is True and applied["pending"] == ["dhcp_range"]
    assert subnet + ".50" in live_xml(net_args["name"], inactive=True)
    assert subnet + ".50" not in live_xml(net_args["name"]), "the running network must not be restarted"
    again = run_module("network", changed)
    assert again["changed"] is False and again["restart_required"] is True, "still pending until restarted"
    restarted = run_module("network", dict(changed, restart=True))
    assert restarted["changed"] is True and restarted["actions"] == ["restart"]
    assert restarted["restart_required"] is False
    assert subnet + ".50" in live_xml(net_args["name"])
    assert run_module("network", dict(changed, restart=True))["changed"] is False


def test_restart_opt_in_four_ways(net_args, subnet, run_module):
    run_module("network", net_args)
    results = four_ways("network", dict(net_args, restart=True,
                                        dhcp_range={"start": subnet + ".50", "end": subnet + ".60"}))
    assert results["apply"]["actions"] == ["redefine", "restart"]
    assert results["apply"]["restart_required"] is False
    assert subnet + ".50" in live_xml(net_args["name"])


def test_inactive_network_is_redefined_without_restart_flag(net_args, subnet, run_module):
    run_module("network", dict(net_args, state="present"))
    results = four_ways("network", dict(net_args, state="present", address=subnet + ".2"))
    assert results["apply"]["restart_required"] is False
    assert results["apply"]["network"]["state"] == "inactive"


def test_absent_four_ways(net_args, run_module):
    run_module("network", net_args)
    four_ways("network", {"name": net_args["name"], "state": "absent"})


# -- bad input: clear error, nothing changed ----------------------------------------------------------

def _assert_refused(run_module, args, starts):
    result = run_module("network", args)
    assert result["failed"], result
    assert result["msg"].startswith(starts), result["msg"]
    conn = libvirt.open("qemu:///system")
    try:
        assert args["name"] not in [n.name() for n in conn.listAllNetworks()]
    finally:
        conn.close()
    return result


@pytest.mark.parametrize("bad", ["a/b", "x<y", "o'neil", "a&b", "two words"])
def test_bad_names(run_module, bad):
    _assert_refused(run_module, {"name": bad}, "option name: value %r is not a valid name" % bad)


def test_dhcp_range_outside_netmask(net_args, subnet, run_module):
    result = _assert_refused(run_module, dict(net_args, dhcp_range={"start": subnet + ".100", "end": "10.99.0.5"}),
                             "option dhcp_range.end: value '10.99.0.5' is outside the network %s.0/24" % subnet)
    assert "use an address between" in result["msg"]


def test_host_ip_outside_network(net_args, run_module):
    _assert_refused(run_module, dict(net_args, hosts=[{"mac": "52:54:00:00:00:01", "ip": "192.0.2.4"}]),
                    "option hosts[0].ip: value '192.0.2.4' is outside the network")


def test_address_is_network_address(net_args, subnet, run_module):
    _assert_refused(run_module, dict(net_args, address=subnet + ".0", dhcp_range=None),
                    "option address: value '%s.0' is the network or broadcast address" % subnet)


def test_duplicate_mac(net_args, subnet, run_module):
    _assert_refused(run_module, dict(net_args, hosts=[{"mac": "52:54:00:00:00:01", "ip": subnet + ".11"},
                                                      {"mac": "52:54:00:00:00:01", "ip": subnet + ".12"}]),
                    "option hosts[1].mac: value '52:54:00:00:00:01' is already used by hosts[0]")


def test_duplicate_ip(net_args, subnet, run_module):
    _assert_refused(run_module, dict(net_args, hosts=[{"mac": "52:54:00:00:00:01", "ip": subnet + ".11"},
                                                      {"mac": "52:54:00:00:00:02", "ip": subnet + ".11"}]),
                    "option hosts[1].ip: value '%s.11' is already used by hosts[0]" % subnet)


@pytest.mark.parametrize("mac", ["52:54:00:00:00", "zz:54:00:00:00:01", "01:00:5e:00:00:01"])
def test_malformed_mac(net_args, subnet, run_module, mac):
    _assert_refused(run_module, dict(net_args, hosts=[{"mac": mac, "ip": subnet + ".11"}]),
                    "option hosts[0].mac: value %r" % mac)


def test_bridge_mode_needs_existing_bridge(libvirt_cleanup, run_module):
    _assert_refused(run_module, {"name": libvirt_cleanup + "br", "mode": "bridge", "bridge": "nosuchbr0"},
                    "option bridge: value 'nosuchbr0' is not a bridge on this host")


def test_unreachable_uri(run_module):
    result = run_module("network", {"name": "mlkvmtest-x", "uri": "qemu+unix:///system?socket=/nonexistent"})
    assert result["failed"] and result["libvirt_code"] is not None and "option uri" in result["msg"]


@pytest.fixture
def host_bridge(prefix):
    import subprocess
    name = "mlkbr" + prefix.split("-")[1][:6]
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], check=False)


def test_bridged_to_existing_host_bridge_four_ways(libvirt_cleanup, host_bridge):
    results = four_ways("network", {"name": libvirt_cleanup + "br", "mode": "bridge", "bridge": host_bridge})
    assert results["apply"]["network"]["mode"] == "bridge"
    assert results["apply"]["network"]["bridge"] == host_bridge
