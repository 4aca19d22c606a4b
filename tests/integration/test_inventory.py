"""The mlinfra.kvm.libvirt inventory plugin against the real libvirtd, through ansible-inventory.

Domains are defined with the domain module (so their metadata is what the module writes);
a lease is written into the network's dnsmasq status file, which libvirt reads for its DHCP
leases call (no guest needs to boot).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, module_env

pytestmark = pytest.mark.integration

libvirt = pytest.importorskip("libvirt")
ANSIBLE_INVENTORY = str(Path(sys.executable).parent / "ansible-inventory")


@pytest.fixture
def env(libvirt_cleanup, run_module):
    prefix = libvirt_cleanup
    conn = libvirt.open("qemu:///system")
    net = conn.networkDefineXML(
        "<network><name>%snet</name><ip address='192.168.253.1' netmask='255.255.255.0'/></network>" % prefix)
    net.create()

    def define(name, metadata=None, state="present"):
        args = {"name": prefix + name, "uri": "qemu:///system", "virt_type": "qemu", "memory": "128M",
                "vcpus": 1, "interfaces": [{"network": prefix + "net"}], "state": state}
        if metadata is not None:
            args["metadata"] = metadata
        result = run_module("domain", args)
        assert not result["failed"], result
        return result["domain"]

    try:
        yield {"prefix": prefix, "conn": conn, "bridge": net.bridgeName(), "define": define}
    finally:
        conn.close()


def write_lease(bridge, mac, address):
    with open("/var/lib/libvirt/dnsmasq/%s.status" % bridge, "w") as handle:
        json.dump([{"ip-address": address, "mac-address": mac, "hostname": "guest",
                    "expiry-time": int(time.time()) + 3600}], handle)


def inventory(tmp_path, config, *extra_args):
    path = tmp_path / "test.libvirt.yml"
    path.write_text(yaml.safe_dump(dict({"plugin": "mlinfra.kvm.libvirt"}, **config)))
    proc = subprocess.run([ANSIBLE_INVENTORY, "-i", str(path), "--list", *extra_args],
                          capture_output=True, text=True, env=module_env(), cwd=str(ROOT), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Failed to parse" not in proc.stderr, proc.stderr
    return plain(json.loads(proc.stdout))


def plain(value):
    """ansible-inventory marks strings from the plugin as not trusted for templating
    ({'__ansible_unsafe': ...}): data from libvirt (metadata a guest owner may set) must not
    be rendered as Jinja. Unwrap for the assertions."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def hosts_of(data, group):
    return sorted(data.get(group, {}).get("hosts", []))


def test_hosts_groups_and_addresses(env, tmp_path):
    p = env["prefix"]
    worker = env["define"]("w1", {"role": "worker", "gpu": "a100"})
    env["define"]("t1", {"role": "trainer", "groups": "nlp,gpu-nodes"})
    env["define"]("plain")
    write_lease(env["bridge"], worker["interfaces"][0]["mac"], "192.168.253.20")
    data = inventory(tmp_path, {
        "name_filter": "^" + p,
        "keyed_groups": [{"key": "mlinfra_metadata.gpu | default('none')", "prefix": "gpu"}],
        "compose": {"ansible_user": "'debian'"},
    })
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted([p + "w1", p + "t1", p + "plain"])  # the filter kept only ours
    assert hosts_of(data, "worker") == [p + "w1"]
    assert hosts_of(data, "trainer") == [p + "t1"]
    assert hosts_of(data, "nlp") == [p + "t1"] and hosts_of(data, "gpu_nodes") == [p + "t1"]
    assert hosts_of(data, "gpu_a100") == [p + "w1"]
    assert p + "plain" in hosts_of(data, "libvirt_shutoff")
    w1 = hostvars[p + "w1"]
    assert w1["ansible_host"] == "192.168.253.20"
    assert w1["ansible_user"] == "debian"
    assert w1["mlinfra_metadata"] == {"role": "worker", "gpu": "a100"}
    assert w1["libvirt_state"] == "shutoff" and w1["libvirt_uri"] == "qemu:///system"
    assert "ansible_host" not in hostvars[p + "t1"]


def test_include_inactive_false_lists_running_only(env, tmp_path):
    p = env["prefix"]
    env["define"]("up", {"role": "worker"}, state="running")
    env["define"]("down", {"role": "worker"})
    data = inventory(tmp_path, {"name_filter": "^" + p, "include_inactive": False})
    assert sorted(data["_meta"]["hostvars"]) == [p + "up"]
    assert hosts_of(data, "libvirt_running") == [p + "up"]


def test_cache(env, tmp_path):
    p = env["prefix"]
    env["define"]("first", {"role": "worker"})
    config = {"name_filter": "^" + p, "cache": True, "cache_plugin": "ansible.builtin.jsonfile",
              "cache_connection": str(tmp_path / "cache"), "cache_timeout": 3600}
    assert sorted(inventory(tmp_path, config)["_meta"]["hostvars"]) == [p + "first"]
    env["define"]("second", {"role": "worker"})
    # Served from the cache: the new domain is not seen...
    assert sorted(inventory(tmp_path, config)["_meta"]["hostvars"]) == [p + "first"]
    # ...until the cache is flushed.
    assert sorted(inventory(tmp_path, config, "--flush-cache")["_meta"]["hostvars"]) == [p + "first", p + "second"]


def test_domain_domain_info_and_the_inventory_report_one_read_model(env, tmp_path, run_module):
    """_domain_read is the one read model: the sizes and the leased address that domain's result,
    domain_info and the inventory's host variables report for one domain are the same values."""
    p = env["prefix"]
    made = env["define"]("same", {"role": "worker"})
    mac = made["interfaces"][0]["mac"]
    write_lease(env["bridge"], mac, "192.168.253.31")
    info = run_module("domain_info", {"name": p + "same", "uri": "qemu:///system"})
    assert not info["failed"], info
    described = info["domains"][0]
    again = run_module("domain", {"name": p + "same", "uri": "qemu:///system", "state": "present"}, check=True)
    assert not again["failed"] and not again["changed"], again
    hostvars = inventory(tmp_path, {"name_filter": "^" + p})["_meta"]["hostvars"][p + "same"]

    sizes = ("vcpus", "max_vcpus", "memory_mib", "max_memory_mib")
    assert {k: made[k] for k in sizes} == {k: described[k] for k in sizes} == {k: again["domain"][k] for k in sizes}
    assert (described["vcpus"], described["memory_mib"]) == (1, 128)
    assert (hostvars["libvirt_vcpus"], hostvars["libvirt_memory_mib"]) == (described["vcpus"], described["memory_mib"])
    leased = described["interfaces"][0]["ip_addresses"]
    assert leased == [{"address": "192.168.253.31", "prefix": 24, "type": "ipv4", "source": "lease"}], leased
    assert hostvars["libvirt_interfaces"][0]["ip_addresses"] == ["192.168.253.31"]
    assert hostvars["ansible_host"] == "192.168.253.31"
    assert hostvars["libvirt_interfaces"][0]["mac"] == described["interfaces"][0]["mac"] == mac
