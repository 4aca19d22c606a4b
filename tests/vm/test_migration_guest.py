"""mlinfra.kvm.domain_migration with a real guest: a Debian guest (the vm tier's image, TCG) that
keeps counting moves live to a second hypervisor on this machine (tests/second_hypervisor.py) and
back, and never reboots: the same boot id, an uptime that went on, a counter process that kept its
PID and kept counting, and a file written before the first move intact after each.

The guest's overlay lies in a directory that both hypervisors hold as a storage pool at the same
path (each its own copy: the second one's /var/lib/libvirt is private), so it is copied; its
backing image (lab/build/base.qcow2) is outside the private mounts, seen by both, and the second
hypervisor holds it as a pool too: copy_storage auto becomes incremental, only the overlay
travels. The seed ISO is read-only, never copied; it is put on the second hypervisor beforehand.
After the first move the guest answers SSH from inside the second hypervisor's network namespace,
on a network of the same name and subnet there. Objects are named with the vm tier's prefix."""
from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from typing import Any, Dict, List

import pytest

import harness
from conftest import four_ways
from second_hypervisor import SecondHypervisor

pytestmark = pytest.mark.vm

COUNTER = "/tmp/mlkvm-counter"
MARKER = "/home/%s/marker" % harness.GUEST_USER


def pool_xml(name: str, path: str) -> str:
    from lxml import etree
    root = etree.Element("pool", {"type": "dir"})
    etree.SubElement(root, "name").text = name
    etree.SubElement(etree.SubElement(root, "target"), "path").text = path
    return etree.tostring(root, encoding="unicode")


def start_pool(conn: Any, name: str, path: str, build: bool) -> Any:
    pool = conn.storagePoolDefineXML(pool_xml(name, path), 0)
    if build:
        pool.build(0)
    pool.create(0)
    return pool


def pool_at(conn: Any, path: str) -> Any:
    """The pool whose target is ``path``, or None (libvirt refuses a second pool on one directory)."""
    from lxml import etree
    for pool in conn.listAllStoragePools(0):
        if etree.fromstring(pool.XMLDesc(0).encode()).findtext("target/path") == path:
            return pool
    return None


def drop_pool(conn: Any, name: str) -> None:
    """Stop and undefine a pool this test made; never deletes its volumes or its directory."""
    import libvirt
    try:
        pool = conn.storagePoolLookupByName(name)
        if pool.isActive():
            pool.destroy()
        pool.undefine()
    except libvirt.libvirtError:
        pass


def guest_facts(run: Any) -> Dict[str, Any]:
    """boot id, uptime, the marker file and the counter, read in the guest in one SSH call."""
    out = run("cat /proc/sys/kernel/random/boot_id; cut -d' ' -f1 /proc/uptime; cat %s; cat %s; "
              "pgrep -f mlkvm-counter-loop | head -n1" % (MARKER, COUNTER)).stdout.split()
    return {"boot_id": out[0], "uptime": float(out[1]), "marker": out[2], "counter": int(out[3]), "pid": out[4]}


def in_netns_ssh(hv2: SecondHypervisor, guest: harness.Guest) -> Any:
    """Run a command in the guest over SSH from the second hypervisor's network namespace."""
    def run(command: str) -> subprocess.CompletedProcess:
        for attempt in range(6):
            proc = subprocess.run(hv2.in_netns(guest.ssh_argv(command, connect_timeout=30)), capture_output=True,
                                  text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
            if proc.returncode != 255 or attempt == 5:
                break
            time.sleep(5)
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        return proc
    return run


def migrate(args: Dict[str, Any], timings: List[str], label: str) -> Dict[str, Dict[str, Any]]:
    began = time.monotonic()
    results = four_ways("domain_migration", args)
    timings.append("%s: four ways %.1f s" % (label, time.monotonic() - began))
    apply = results["apply"]
    assert apply["mode"] == "live" and results["check"]["actions"] == apply["actions"], apply
    assert results["apply_again"]["mode"] == "none"
    return results


def test_a_running_guest_moves_live_there_and_back_without_a_reboot(boot_guest, libvirtd, prefix, guest_image, tmp_path):
    import libvirt
    timings: List[str] = []
    began = time.monotonic()
    guest = boot_guest(memory_mib=768, vcpus=1)
    timings.append("boot to SSH %.1f s" % (time.monotonic() - began))
    token = "mlkvm-%s" % prefix.strip("-")
    guest.ssh("echo %s > %s && sync" % (token, MARKER))
    guest.ssh("setsid nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > %s; sleep 1; done' mlkvm-counter-loop "
              ">/dev/null 2>&1 </dev/null &" % COUNTER)
    time.sleep(2)
    before = guest_facts(guest.ssh)
    assert before["marker"] == token

    host = libvirt.open(libvirtd)
    workdir = str(guest.workdir)
    images = str(guest_image.disk.parent)
    start_pool(host, prefix + "guestdir", workdir, build=False)
    made_images_pool = pool_at(host, images) is None
    if made_images_pool:  # the way back needs the backing image in a pool of this host too
        start_pool(host, prefix + "images", images, build=False)
    hv2 = SecondHypervisor(tmp_path / "hv2").start()
    try:
        second = hv2.connect()
        subnet = ipaddress.ip_network("%s/24" % guest.ip, strict=False)
        net = second.networkDefineXML(harness.network_xml(guest.network, subnet, {guest.mac: guest.ip}, nat=False))
        net.create()
        start_pool(second, prefix + "guestdir", workdir, build=True)
        # the shared image store: the backing image at the same path, seen by both (never deleted: the
        # second hypervisor's definitions vanish with it, and nothing here deletes a volume of it)
        start_pool(second, prefix + "images", images, build=False)
        shutil.copy2(str(guest.workdir / "seed.iso"), str(hv2.path_here(workdir + "/seed.iso")))

        there = migrate({"name": guest.name, "dest_uri": hv2.uri, "migration_uri": hv2.migration_uri,
                         "max_downtime_ms": 1000, "timeout": 900}, timings, "to the second hypervisor")
        apply = there["apply"]
        assert apply["copy_storage"] == "incremental"
        assert {d["target"]: d["action"] for d in apply["disks"]} == {"vda": "copy-top", "sda": "present"}
        assert second.lookupByName(guest.name).isActive()
        timings.append("downtime %s ms, %d progress lines" % (apply["downtime_ms"], len(apply["progress"])))
        away = guest_facts(in_netns_ssh(hv2, guest))
        assert away["boot_id"] == before["boot_id"] and away["uptime"] > before["uptime"], (before, away)
        assert away["marker"] == token and away["pid"] == before["pid"] and away["counter"] > before["counter"]

        back = migrate({"name": guest.name, "uri": hv2.uri, "dest_uri": hv2.host_uri,
                        "migration_uri": hv2.host_migration_uri, "timeout": 900}, timings, "back to this host")
        assert back["apply"]["copy_storage"] == "incremental"
        assert host.lookupByName(guest.name).isActive()
        home = guest_facts(guest.ssh)
        assert home["boot_id"] == before["boot_id"] and home["uptime"] > away["uptime"], (away, home)
        assert home["marker"] == token and home["pid"] == before["pid"] and home["counter"] > away["counter"]
        timings.append("guest uptime %.0f s -> %.0f s -> %.0f s, counter %d -> %d -> %d" % (
            before["uptime"], away["uptime"], home["uptime"], before["counter"], away["counter"], home["counter"]))
        print("\n" + "\n".join(timings))
    finally:
        hv2.stop()
        drop_pool(host, prefix + "guestdir")
        if made_images_pool:
            drop_pool(host, prefix + "images")
        host.close()
