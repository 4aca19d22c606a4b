"""mlinfra.kvm.network against a real libvirtd (qemu:///system)."""
from __future__ import annotations

import random

import libvirt
import pytest

from conftest import four_ways, run_module_process
from host_network import addresses_in_use

pytestmark = pytest.mark.integration


def free_subnet(*taken):
    """A /24 in 10.213.x.0 that no libvirt network, host interface or route of this host uses."""
    used = addresses_in_use("qemu:///system")
    for _unused in range(100):
        third = random.randint(1, 254)
        candidate = "10.213.%d" % third
        if candidate + "." not in used and candidate not in taken:
            return candidate
    pytest.fail("no free 10.213.x.0/24 for a test network")


@pytest.fixture
def subnet():
    return free_subnet()


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


# -- restart: refused before the stop when the new definition cannot start; restored when it fails ----

def net_xml_fields(name, inactive):
    """(address, bridge, mtu) of the live or persistent definition."""
    from lxml import etree
    root = etree.fromstring(live_xml(name, inactive).encode())
    ip = root.find("ip")
    mtu = root.find("mtu")
    return (ip.get("address") if ip is not None else None, root.find("bridge").get("name"),
            mtu.get("size") if mtu is not None else None)


def is_active(name):
    conn = libvirt.open("qemu:///system")
    try:
        return bool(conn.networkLookupByName(name).isActive())
    finally:
        conn.close()


def assert_refused_and_untouched(run_module, args, before, starts):
    for check in (True, False):  # check mode reports the same refusal
        result = run_module("network", args, check=check, diff=True)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith(starts), result["msg"]
        assert "could not start again after the restart" in result["msg"] and "Nothing was changed" in result["msg"]
    assert is_active(args["name"]), "the running network must not have been stopped"
    assert net_xml_fields(args["name"], False) == before, "live definition unchanged"
    assert net_xml_fields(args["name"], True) == before, "persistent definition unchanged"
    return result


def test_restart_into_subnet_of_another_active_network_refused(net_args, subnet, libvirt_cleanup, run_module):
    run_module("network", net_args)
    other = free_subnet(subnet)
    other_args = {"name": libvirt_cleanup + "other", "mode": "isolated", "address": other + ".1", "prefix": 24}
    assert not run_module("network", other_args)["failed"]
    before = net_xml_fields(net_args["name"], False)
    request = dict(net_args, restart=True, address=other + ".2",
                   dhcp_range={"start": other + ".100", "end": other + ".200"})
    result = assert_refused_and_untouched(run_module, request, before,
                                          "option address: value '%s.0/24' overlaps %s.0/24 of active libvirt network %s"
                                          % (other, other, other_args["name"]))
    assert result["option"] == "address"


def test_restart_into_subnet_of_a_host_interface_refused(net_args, subnet, host_dummy, run_module):
    run_module("network", net_args)
    before = net_xml_fields(net_args["name"], False)
    taken = host_dummy["subnet"]
    request = dict(net_args, restart=True, address=taken + ".2",
                   dhcp_range={"start": taken + ".100", "end": taken + ".200"})
    assert_refused_and_untouched(run_module, request, before,
                                 "option address: value '%s.0/24' overlaps %s.1/24 on host interface %s"
                                 % (taken, taken, host_dummy["name"]))


def test_restart_onto_an_existing_host_interface_name_refused(net_args, host_dummy, run_module):
    run_module("network", net_args)
    before = net_xml_fields(net_args["name"], False)
    assert_refused_and_untouched(run_module, dict(net_args, restart=True, bridge=host_dummy["name"]), before,
                                 "option bridge: value %r is already an interface of this host" % host_dummy["name"])


def test_restart_with_old_dhcp_range_outside_new_subnet_refused(net_args, subnet, run_module):
    # Only the address moves: the kept DHCP range would lie outside the new subnet.
    run_module("network", net_args)
    before = net_xml_fields(net_args["name"], False)
    moved = free_subnet(subnet)
    request = {k: v for k, v in net_args.items() if k != "dhcp_range"}
    request.update(restart=True, address=moved + ".1")
    assert_refused_and_untouched(run_module, request, before,
                                 "option dhcp_range: value {'start': '%s.100', 'end': '%s.200'} is not inside the "
                                 "network %s.0/24" % (subnet, subnet, moved))


def test_restart_to_a_new_bridge_name_four_ways(net_args, prefix, run_module):
    run_module("network", net_args)
    bridge = "mlkb" + prefix.split("-")[2][:6]
    results = four_ways("network", dict(net_args, restart=True, bridge=bridge))
    assert results["apply"]["actions"] == ["redefine", "restart"]
    assert net_xml_fields(net_args["name"], False)[1] == bridge


@pytest.fixture
def host_dummy(prefix, subnet):
    """A host interface (a bare bridge: the dummy driver may be missing) holding an address in a
    /24 of its own, removed afterwards."""
    import subprocess
    name = "mlkd" + prefix.split("-")[2][:6]
    taken = free_subnet(subnet)
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", taken + ".1/24", "dev", name], check=True)
        yield {"name": name, "subnet": taken}
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


# -- issue 13: bounded values and no control characters, refused before anything changes -----------

@pytest.mark.parametrize("extra,starts", [
    ({"mtu": 67}, "option mtu: value 67 is out of range; give a number from 68 to 65535"),
    ({"mtu": 65536}, "option mtu: value 65536 is out of range; give a number from 68 to 65535"),
    ({"prefix": 31}, "option prefix: value 31 is out of range; give a number from 8 to 30"),
    ({"domain": "lab\ninternal"}, "option domain: value 'lab\\ninternal' contains the control character U+000A"),
    ({"dns_hosts": [{"ip": "192.0.2.5", "hostnames": ["ok", "bad\x01"]}]},
     "option dns_hosts[0].hostnames[1]: value 'bad\\x01' contains the control character U+0001"),
    ({"forward_dev": "eth0\t"}, "option forward_dev: value 'eth0\\t' contains the control character U+0009"),
    ({"bridge": "mlkvm0123456789x"}, "option bridge: value 'mlkvm0123456789x' is longer than 15 characters"),
])
def test_out_of_range_and_control_characters_refused(net_args, subnet, run_module, extra, starts):
    args = dict(net_args, **extra)
    if "dns_hosts" in extra:
        args["dns_hosts"] = [dict(h, ip=subnet + ".5") for h in extra["dns_hosts"]]
    result = _assert_refused(run_module, args, starts)
    assert result["changed"] is False and result["option"] == starts.split(":")[0][len("option "):]


def test_out_of_range_change_leaves_an_existing_network_untouched(net_args, run_module):
    assert not run_module("network", net_args)["failed"]
    before = live_xml(net_args["name"], inactive=True)
    for check in (True, False):
        result = run_module("network", dict(net_args, mtu=70000), check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option mtu: value 70000 is out of range"), result["msg"]
    assert live_xml(net_args["name"], inactive=True) == before


def test_failed_start_restores_the_previous_definition_kernel_refuses_the_bridge_name(net_args, run_module):
    """The restore safety net with a trigger that input validation does not see: MTU 70000, the
    former trigger, is now refused before anything changes (issue 13). The kernel refuses an
    interface named 'all' (it would clash with /proc/sys/net/*/conf/all), which no pre-check
    predicts: a real start failure after the stop."""
    run_module("network", net_args)
    before = net_xml_fields(net_args["name"], False)
    bad = dict(net_args, restart=True, bridge="all")
    predicted = run_module("network", bad, check=True)
    assert not predicted["failed"] and predicted["actions"] == ["redefine", "restart"], predicted
    result = run_module("network", bad)
    assert result["failed"] and result["changed"] is True and result["restored"] is True, result
    assert "did not start with the new definition" in result["msg"] and "previous definition was restored" in result["msg"]
    assert result["libvirt_message"], result
    assert result["actions"] == ["redefine", "stop", "start (failed)", "restore previous definition", "start"]
    assert is_active(net_args["name"]), "guests must get their network back"
    assert net_xml_fields(net_args["name"], False) == before
    assert net_xml_fields(net_args["name"], True) == before
    again = run_module("network", net_args)
    assert not again["failed"] and again["changed"] is False and again["restart_required"] is False, again


def test_a_new_network_whose_start_fails_is_undefined_again(net_args, prefix, run_module):
    """A new network defined, then refused its start (the kernel refuses a bridge named 'all',
    which no pre-check predicts): the run undefines what it defined, and its failure says so
    (before, the definition stayed behind). Nothing remains, so changed is false."""
    bad = dict(net_args, bridge="all")
    predicted = run_module("network", bad, check=True)
    assert not predicted["failed"] and predicted["actions"] == ["define", "start"], predicted
    result = run_module("network", bad)
    assert result["failed"] and result["changed"] is False and result["undefined"] is True, result
    assert result["actions"] == ["define", "start (failed)", "undefine"] and result["failed_action"] == "start", result
    assert "undefined it again: the network does not exist, nothing was changed" in result["msg"], result
    assert result["libvirt_message"], result
    assert net_args["name"] not in network_names()
    good = dict(net_args, bridge="mlkf" + prefix.split("-")[2][:6])
    fixed = run_module("network", good)
    assert not fixed["failed"] and fixed["actions"] == ["define", "start"] and is_active(net_args["name"]), fixed
    assert run_module("network", good)["changed"] is False


def network_names():
    conn = libvirt.open("qemu:///system")
    try:
        return [n.name() for n in conn.listAllNetworks()]
    finally:
        conn.close()


# -- a new network that could not start is refused before it is defined (check mode alike) ----------

def assert_start_refused(run_module, args, starts, defined_before=False):
    for check in (True, False):
        result = run_module("network", args, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith(starts), result["msg"]
        assert "could not start" in result["msg"] and "Nothing was changed" in result["msg"], result["msg"]
    assert (args["name"] in network_names()) is defined_before, "nothing may be defined"
    return result


def test_a_new_network_inside_an_active_networks_subnet_is_refused(net_args, subnet, libvirt_cleanup, run_module):
    wide = {"name": libvirt_cleanup + "wide", "mode": "isolated", "address": "10.215.0.1", "prefix": 16}
    assert not run_module("network", wide)["failed"]
    inner = {"name": libvirt_cleanup + "inner", "mode": "isolated", "address": "10.215.7.1", "prefix": 24}
    result = assert_start_refused(run_module, inner, "option address: value '10.215.7.0/24' overlaps 10.215.0.0/16 "
                                  "of active libvirt network %s, so network %s could not start"
                                  % (wide["name"], inner["name"]))
    assert result["option"] == "address" and result["blockers"], result
    # Only defining it (state present) is no start: libvirt takes the definition.
    assert not run_module("network", dict(inner, state="present"))["failed"]
    assert_start_refused(run_module, inner, "option address: value '10.215.7.0/24' overlaps", defined_before=True)
    assert not is_active(inner["name"]), "the refused start left the defined network as it was"


def test_a_new_network_on_an_existing_host_interface_name_is_refused(net_args, host_dummy, run_module):
    assert_start_refused(run_module, dict(net_args, bridge=host_dummy["name"]),
                         "option bridge: value %r is already an interface of this host" % host_dummy["name"])


def test_a_new_network_in_a_subnet_the_host_routes_is_refused(net_args, prefix, run_module):
    """A route of the host (here through a dummy interface of the test, with no address in the
    subnet) takes the subnet: libvirt would refuse the start after the define."""
    import subprocess
    taken = free_subnet(net_args["address"].rsplit(".", 1)[0])
    dev = "mlkr" + prefix.split("-")[2][:6]
    made = subprocess.run(["ip", "link", "add", dev, "type", "dummy"], capture_output=True, text=True, check=False)
    if made.returncode != 0:  # the dummy driver may be missing: a bare bridge routes as well
        subprocess.run(["ip", "link", "add", dev, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        subprocess.run(["ip", "route", "add", taken + ".0/24", "dev", dev], check=True)
        request = dict(net_args, address=taken + ".1", dhcp_range={"start": taken + ".100", "end": taken + ".200"})
        assert_start_refused(run_module, request, "option address: value '%s.0/24' overlaps %s.0/24, which the host "
                             "routes through %s, so network %s could not start" % (taken, taken, dev, net_args["name"]))
    finally:
        subprocess.run(["ip", "link", "del", dev], check=False)


# -- names: refused before any lock, file or libvirt call, by every libvirt object module -------------

LONG = "n" * 300


@pytest.mark.parametrize("module,args,option", [
    ("network", {"name": LONG}, "name"),
    ("network", {"name": "bad\x01name"}, "name"),
    ("pool", {"name": LONG, "target": "/var/tmp/mlk-never"}, "name"),
    ("volume", {"pool": "default", "name": LONG, "capacity": "1M"}, "name"),
    ("volume", {"pool": LONG, "name": "v.qcow2", "capacity": "1M"}, "pool"),
    ("domain", {"name": LONG, "memory": "64M", "vcpus": 1}, "name"),
    ("snapshot", {"domain": LONG, "name": "s1"}, "domain"),
    ("snapshot", {"domain": "mlk-never", "name": LONG}, "name"),
    ("networks", {"config": [{"name": LONG}]}, "name"),
    ("networks", {"state": "deleted", "config": [{"name": LONG}]}, "name"),
    ("pools", {"config": [{"name": LONG, "target": "/var/tmp/mlk-never"}]}, "name"),
    ("volumes", {"state": "deleted", "config": [{"pool": "default", "name": LONG}]}, "name"),
    ("domains", {"state": "deleted", "config": [{"name": LONG}]}, "name"),
])
@pytest.mark.parametrize("check", [True, False])
def test_names_too_long_or_with_control_characters_are_refused_naming_the_option(
        libvirtd, module, args, option, check):
    import os
    locks_before = set(os.listdir("/run/mlinfra")) if os.path.isdir("/run/mlinfra") else set()
    result = run_module_process(module, args, check=check)
    assert result["failed"] and result["changed"] is False, result
    assert "option %s: value " % option in result["msg"] and "is not a valid name" in result["msg"], result["msg"]
    assert "internal error" not in result["msg"] and "File name too long" not in result["msg"], result["msg"]
    locks_after = set(os.listdir("/run/mlinfra")) if os.path.isdir("/run/mlinfra") else set()
    assert not [f for f in locks_after - locks_before if LONG[:20] in f], "no lock file for a refused name"
