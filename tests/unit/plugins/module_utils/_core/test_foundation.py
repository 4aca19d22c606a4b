"""Unit tests of the shared plumbing: XML building/normalising/comparing, validators, the
difference tracker, and the libvirt connection (on libvirt's test:///default driver)."""
from __future__ import annotations

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _xml as X
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, LibvirtCallError
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._connection import Connection, call, lookup, resolve_uri
from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _validate as V
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _network as N
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _pool as P
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _volume as VOL

pytestmark = pytest.mark.unit


# -- lxml helpers ------------------------------------------------------------------------------

def test_values_are_escaped_not_spliced():
    root = X.element("pool", {"type": "dir"})
    X.sub(root, "name", text="a<b&'c")
    xml = X.to_string(root)
    assert "a&lt;b&amp;'c" in xml
    assert X.text(X.parse(xml), "name") == "a<b&'c"


def test_none_attributes_are_omitted_and_bools_become_yes_no():
    el = X.element("bridge", {"name": None, "stp": True, "delay": 0})
    assert dict(el.attrib) == {"stp": "yes", "delay": "0"}


def test_normalise_ignores_attribute_order_and_whitespace():
    a = "<network><name>n</name>\n   <bridge stp='on' name='virbr9'/></network>"
    b = '<network><name>n</name><bridge name="virbr9" stp="on"></bridge></network>'
    assert X.normalise(a) == X.normalise(b)


def test_normalise_drops_elements_and_attributes():
    xml = ("<domain><name>d</name><uuid>u</uuid><devices><disk><address bus='0x01'/>"
           "<alias name='virtio-disk0'/></disk></devices></domain>")
    out = X.normalise(xml, drop=["/domain/uuid", "//address", "//alias/@name"])
    assert "uuid" not in out and "address" not in out
    assert "<alias></alias>" in out


def test_normalise_detects_real_differences():
    assert X.normalise("<a><b x='1'/></a>") != X.normalise("<a><b x='2'/></a>")


def test_parse_does_not_resolve_entities():
    evil = ("<?xml version='1.0'?><!DOCTYPE a [<!ENTITY x SYSTEM 'file:///etc/passwd'>]>"
            "<a>&x;</a>")
    root = X.parse(evil)
    assert "root:" not in (X.to_string(root))


# -- pool / network / volume XML round trips -----------------------------------------------------

def test_pool_dir_round_trip():
    spec = P.desired_spec({"type": "dir", "target": "/srv/pool/", "name": "p", "source_name": None,
                           "source_devices": [], "source_host": None, "source_dir": None, "source_format": "auto"})
    assert spec == {"type": "dir", "target": "/srv/pool"}
    assert P.spec_from_xml(P.build_xml("p", spec)) == spec


def test_pool_netfs_and_logical_round_trip():
    netfs = {"type": "netfs", "target": "/mnt/nfs", "source_host": "nas", "source_dir": "/export",
             "source_format": "nfs"}
    assert P.spec_from_xml(P.build_xml("p", netfs)) == netfs
    logical = {"type": "logical", "target": "/dev/vg0", "source_name": "vg0", "source_devices": ["/dev/sdb"]}
    assert P.spec_from_xml(P.build_xml("p", logical)) == logical


def test_network_xml_round_trip_nat_with_hosts():
    spec = {"mode": "nat", "bridge": "virbr42", "forward_dev": None, "domain": "lab", "mtu": 9000,
            "address": "10.1.2.1", "prefix": 24, "dhcp_range": {"start": "10.1.2.100", "end": "10.1.2.200"},
            "hosts": [{"mac": "52:54:00:00:00:01", "ip": "10.1.2.11", "name": "w1"}],
            "dns_hosts": [{"ip": "10.1.2.5", "hostnames": ["a.lab", "b.lab"]}]}
    assert N.spec_from_xml(N.build_xml("n", spec)) == spec


def test_network_isolated_has_no_forward():
    xml = N.build_xml("n", {"mode": "isolated", "address": "10.0.0.1", "prefix": 24})
    assert X.parse(xml).find("forward") is None
    assert N.spec_from_xml(xml)["mode"] == "isolated"


def test_network_netmask_in_libvirt_xml_reads_as_prefix():
    xml = "<network><name>n</name><ip address='10.0.0.1' netmask='255.255.0.0'/></network>"
    assert N.spec_from_xml(xml)["prefix"] == 16


def test_network_request_sorts_hosts_so_order_is_not_a_change():
    params = {"name": "n", "mode": "nat", "bridge": None, "forward_dev": None, "domain": None, "mtu": None,
              "address": "10.0.0.1", "netmask": None, "prefix": 24, "dhcp_range": None, "dns_hosts": None,
              "hosts": [{"mac": "52:54:00:00:00:02", "ip": "10.0.0.12", "name": None},
                        {"mac": "52:54:00:00:00:01", "ip": "10.0.0.11", "name": None}]}
    hosts = N.validated_request(params, local=False)["hosts"]
    assert [h["mac"] for h in hosts] == ["52:54:00:00:00:01", "52:54:00:00:00:02"]


def test_volume_overlay_xml():
    root = X.parse(VOL.build_xml("v.qcow2", "qcow2", 1024, "/base.qcow2", "qcow2"))
    assert X.text(root, "backingStore/path") == "/base.qcow2"
    assert X.attr(root, "backingStore/format", "type") == "qcow2"
    assert X.text(root, "capacity") == "1024"


# -- validators ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [("01:00.0", "0000:01:00.0"), ("0000:3B:00.1", "0000:3b:00.1")])
def test_pci_address_canonical(value, expected):
    assert V.pci_address("hostdevs[0].address", value) == expected


@pytest.mark.parametrize("value", ["01:00", "0000:01:20.0", "01:00.8", "garbage", None])
def test_pci_address_malformed(value):
    with pytest.raises(InvalidInputError) as err:
        V.pci_address("address", value)
    assert "domain:bus:slot.function" in err.value.msg


@pytest.mark.parametrize("value,expected", [("10G", 10 * 1024 ** 3), ("512MiB", 512 * 1024 ** 2),
                                            (4096, 4096), ("1.5K", 1536), ("100", 100)])
def test_sizes(value, expected):
    assert V.size_bytes("capacity", value) == expected


def test_invalid_input_message_names_option_value_and_fix():
    with pytest.raises(InvalidInputError) as err:
        V.object_name("name", "a/b")
    assert err.value.msg.startswith("option name: value 'a/b' is not a valid name; use ")
    assert err.value.details == {"option": "name", "value": "a/b"}


# -- difference tracker ----------------------------------------------------------------------------

def test_tracker_reports_only_differences_and_actions():
    t = DifferenceTracker()
    assert not t.add("a", 1, 1)
    assert t.add("b", 1, 2)
    assert t.changed and t.diff() == {"before": {"b": 1}, "after": {"b": 2}}
    t2 = DifferenceTracker()
    t2.action("start")
    assert t2.changed and t2.actions == ["start"] and t2.differences == []


def test_tracker_act_records_the_action_in_both_modes_and_performs_it_only_in_a_real_run():
    done = []
    real, check = DifferenceTracker(check_mode=False), DifferenceTracker(check_mode=True)
    assert real.act("stop net", lambda name, live: done.append((name, live)) or "stopped", "n1", live=True) == "stopped"
    assert check.act("stop net", lambda name, live: done.append((name, live)), "n1", live=True) is None
    assert done == [("n1", True)]
    assert real.actions == check.actions == ["stop net"] and real.changed and check.changed


def test_tracker_act_refuses_to_guess_the_mode():
    """A tracker made without check_mode must not perform a side effect a check run would skip."""
    with pytest.raises(TypeError):
        DifferenceTracker().act("stop", lambda: None)


# -- the libvirt connection on libvirt's test driver -----------------------------------------------

def test_connection_to_test_driver_and_lookups():
    import libvirt
    with Connection("test:///default") as c:
        assert c.conn.getURI() == "test:///default"
        assert lookup("x", c.conn.networkLookupByName, "default", (libvirt.VIR_ERR_NO_NETWORK,)) is not None
        assert lookup("x", c.conn.networkLookupByName, "nope", (libvirt.VIR_ERR_NO_NETWORK,)) is None
        with pytest.raises(LibvirtCallError) as err:
            call("defining a broken network", c.conn.networkDefineXML, "<network><name>a</name><ip address='x'/></network>")
        assert err.value.details["libvirt_code"] is not None and err.value.details["libvirt_message"]
        assert err.value.msg.startswith("libvirt error while defining a broken network: code ")


def test_network_xml_is_accepted_by_libvirt_test_driver():
    spec = {"mode": "nat", "address": "10.9.9.1", "prefix": 24, "dhcp_range": {"start": "10.9.9.10", "end": "10.9.9.20"},
            "hosts": [{"mac": "52:54:00:00:00:01", "ip": "10.9.9.11", "name": "w1"}],
            "dns_hosts": [{"ip": "10.9.9.5", "hostnames": ["m.lab"]}]}
    with Connection("test:///default") as c:
        net = c.conn.networkDefineXML(N.build_xml("unit-net", spec))
        read_back = N.spec_from_xml(net.XMLDesc(0))
        for key, value in spec.items():
            assert read_back[key] == value


def test_uri_resolution(monkeypatch):
    monkeypatch.delenv("LIBVIRT_DEFAULT_URI", raising=False)
    assert resolve_uri(None) == "qemu:///system"
    monkeypatch.setenv("LIBVIRT_DEFAULT_URI", "test:///default")
    assert resolve_uri(None) == "test:///default"
    assert resolve_uri("qemu:///session") == "qemu:///session"
