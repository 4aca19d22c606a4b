"""mlinfra.kvm.domain_info against the real libvirtd (qemu:///system).

Addresses: no guest boots here, so the test writes a lease into the network's dnsmasq status
file (/var/lib/libvirt/dnsmasq/<bridge>.status), which is exactly what libvirt reads to
answer its DHCP leases call; the module's path from libvirt to the result is the real one.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

libvirt = pytest.importorskip("libvirt")


@pytest.fixture
def env(libvirt_cleanup, run_module):
    prefix = libvirt_cleanup
    uri = "qemu:///system"
    # Not under pytest's tmp_path: its parents are 0700 and QEMU runs as libvirt-qemu.
    pool_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chmod(pool_dir, 0o755)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(pool_dir / "a.qcow2"), "16M"], check=True)
    conn = libvirt.open(uri)
    pool = conn.storagePoolDefineXML(
        "<pool type='dir'><name>%spool</name><target><path>%s</path></target></pool>" % (prefix, pool_dir), 0)
    pool.create(0)
    net = conn.networkDefineXML(
        "<network><name>%snet</name><ip address='192.168.252.1' netmask='255.255.255.0'/></network>" % prefix)
    net.create()
    try:
        yield {"prefix": prefix, "uri": uri, "conn": conn, "pool": prefix + "pool", "network": prefix + "net",
               "bridge": net.bridgeName()}
    finally:
        conn.close()


def write_lease(bridge: str, mac: str, address: str) -> None:
    status = "/var/lib/libvirt/dnsmasq/%s.status" % bridge
    leases = [{"ip-address": address, "mac-address": mac, "hostname": "guest",
               "client-id": "01:" + mac, "expiry-time": int(time.time()) + 3600}]
    with open(status, "w") as handle:
        json.dump(leases, handle)


def define(run_module, env, name, **extra):
    args = {"name": env["prefix"] + name, "uri": env["uri"], "virt_type": "qemu", "memory": "128M",
            "vcpus": 1, "interfaces": [{"network": env["network"]}], "metadata": {"role": "worker"}}
    args.update(extra)
    result = run_module("domain", args)
    assert not result["failed"], result
    return result["domain"]


def test_shut_off_domain_with_lease(env, run_module):
    dom = define(run_module, env, "vm1", disks=[{"pool": env["pool"], "volume": "a.qcow2"}])
    mac = dom["interfaces"][0]["mac"]
    write_lease(env["bridge"], mac, "192.168.252.50")
    result = run_module("domain_info", {"name": env["prefix"] + "vm1", "uri": env["uri"]}, check=True)
    assert not result["failed"] and result["changed"] is False and result["exists"] is True
    (info,) = result["domains"]
    assert info["state"] == "shutoff" and info["persistent"] is True
    assert (info["vcpus"], info["memory_mib"]) == (1, 128)
    assert info["interfaces"][0]["mac"] == mac
    assert info["interfaces"][0]["ip_addresses"] == [
        {"address": "192.168.252.50", "prefix": 24, "type": "ipv4", "source": "lease"}]
    assert info["disks"][0]["volume"] == "a.qcow2" and info["disks"][0]["device"] == "disk"
    assert info["metadata"] == {"role": "worker"}
    assert info["stats"] == {}


def test_running_domain_has_stats(env, run_module):
    define(run_module, env, "vm2", state="running", disks=[{"pool": env["pool"], "volume": "a.qcow2"}])
    time.sleep(1)  # SeaBIOS reads the disk's boot sector during the first second
    result = run_module("domain_info", {"name": env["prefix"] + "vm2", "uri": env["uri"]})
    (info,) = result["domains"]
    assert info["state"] == "running"
    stats = info["stats"]
    assert stats["cpu_time_ns"] > 0
    assert stats["memory_actual_kib"] == 131072
    assert [b["target"] for b in stats["block"]] == ["vda"]
    assert isinstance(stats["block"][0]["rd_bytes"], int) and isinstance(stats["block"][0]["wr_bytes"], int)


def test_all_domains_and_missing_one(env, run_module):
    define(run_module, env, "vm3")
    define(run_module, env, "vm4")
    result = run_module("domain_info", {"uri": env["uri"], "stats": False})
    names = [d["name"] for d in result["domains"]]
    assert env["prefix"] + "vm3" in names and env["prefix"] + "vm4" in names
    assert names == sorted(names)
    result = run_module("domain_info", {"name": env["prefix"] + "nope", "uri": env["uri"]})
    assert not result["failed"] and result["exists"] is False and result["domains"] == []


def test_bad_name_is_refused(run_module):
    result = run_module("domain_info", {"name": "bad/name"})
    assert result["failed"] and "option name" in result["msg"]
