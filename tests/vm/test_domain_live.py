"""mlinfra.kvm.domain with a real guest (TCG) that the module defines and starts entirely (kernel
boot, seed cdrom, derived MAC, console log, wait_for_ip), then changes live in ways the guest sees
(a hot-plugged vCPU, memory given back through the balloon) and shuts down cleanly with a wait.

One guest for all of it: each boot under TCG costs a minute or more of the 2 cores, and the live
changes need only a running guest. Objects are named with the vm tier's 'mlkvmvm-' prefix.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

import harness
from conftest import four_ways

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_spec import derived_mac

pytestmark = pytest.mark.vm


def _when(value, accept):
    """value when accept(value) holds, else None (wait_until polls again)."""
    return value if accept(value) else None


def mem_total_mib(guest) -> int:
    line = guest.ssh("grep MemTotal /proc/meminfo").stdout.split()
    return int(line[1]) // 1024


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(2)


@pytest.fixture
def module_guest(libvirtd, prefix, guest_image, run_module, tmp_path):
    """Network, overlay, seed and keys for a guest the *module* defines (harness pieces only)."""
    import libvirt
    conn = libvirt.open(libvirtd)
    name = prefix + "modvm"
    mac = derived_mac(name, 0)  # what the module will give interface 0 of this domain
    subnet = harness.pick_subnet(conn)
    ip = str(list(subnet.hosts())[9])
    net = conn.networkDefineXML(harness.network_xml(prefix + "net", subnet, {mac: ip}, nat=False))
    net.create()
    workdir = harness.GUEST_DIR_ROOT / name
    workdir.mkdir(mode=0o711)
    keydir = tmp_path / "keys"
    keydir.mkdir(mode=0o700)
    public = harness.make_keypair(keydir / "id_ed25519", "mlkvm-test")
    host_public = harness.make_keypair(keydir / "host_ed25519", "root@" + name)
    known_hosts = keydir / "known_hosts"
    known_hosts.write_text("%s %s\n" % (ip, " ".join(host_public.split()[:2])))
    os.chmod(known_hosts, 0o600)
    overlay = workdir / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                    str(guest_image.disk), str(overlay)], check=True)
    seed = workdir / "seed.iso"
    seeded = run_module("cloud_init", {
        "dest": str(seed), "instance_id": "%s-%s" % (name, uuid.uuid4().hex[:8]),
        "meta_data": {"local-hostname": "mlkvm-guest"},
        "user_data": harness.user_data_for(public, (keydir / "host_ed25519").read_text(), host_public)})
    assert not seeded.get("failed"), seeded
    guest = harness.Guest(name=name, ip=ip, mac=mac, network=prefix + "net", uri=libvirtd, workdir=workdir,
                          serial_log=workdir / "console.log", key=keydir / "id_ed25519",
                          known_hosts=known_hosts, _conn=conn)
    try:
        yield guest, overlay, seed
    finally:
        try:
            harness._remove_domain(conn.lookupByName(name))
        except libvirt.libvirtError:
            pass
        harness._remove_network(net)
        shutil.rmtree(str(workdir), ignore_errors=True)
        conn.close()


def test_module_defined_guest_boots_takes_a_vcpu_and_gives_memory_back_live(module_guest, run_module, libvirtd, guest_image) -> None:
    guest, overlay, seed = module_guest
    args = {"uri": libvirtd, "name": guest.name, "virt_type": "qemu", "memory": "1G", "vcpus": 1, "max_vcpus": 2,
            "kernel": str(guest_image.kernel), "initrd": str(guest_image.initrd), "cmdline": harness.KERNEL_CMDLINE,
            "disks": [{"path": str(overlay), "format": "qcow2"}], "cdroms": [{"path": str(seed)}],
            # The overlay and its base (lab/build) need not lie in a storage pool of this host.
            "allowed_paths": [str(harness.GUEST_DIR_ROOT), str(guest_image.disk.parent)],
            "interfaces": [{"network": guest.network}], "console_log": str(guest.serial_log),
            "metadata": {"role": "worker"}, "state": "running", "wait_for_ip": True,
            # Generous: on a shared 2-core host under load a TCG boot to DHCP took 8 minutes.
            "wait_for_ip_timeout": int(os.environ.get("MLKVM_VM_BOOT_TIMEOUT", "900"))}
    started = run_module("domain", args)
    assert not started["failed"], started
    assert started["actions"] == ["define", "start"]
    assert started["domain"]["interfaces"][0]["mac"] == guest.mac
    # wait_for_ip returned the address the network reserved for the derived MAC.
    assert guest.ip in [a["address"] for a in started["domain"]["ip_addresses"]]
    harness.wait_ssh(guest, time.monotonic() + 600)
    assert guest.ssh("nproc").stdout.strip() == "1"

    # One more vCPU within max_vcpus: hot-plugged, no restart; the guest kernel sees it.
    results = four_ways("domain", dict(args, vcpus=2))
    assert results["apply"]["actions"] == ["set vcpus live"]
    assert results["apply"]["restart_required"] is False
    present = wait_until(lambda: guest.ssh("cat /sys/devices/system/cpu/present").stdout.strip() == "0-1", 60,
                         "the guest to see a second CPU")
    assert present
    # Debian's udev onlines hot-added CPUs only on Hyper-V/Xen; online it by hand.
    guest.ssh("[ \"$(cat /sys/devices/system/cpu/cpu1/online)\" = 1 ] || echo 1 | sudo tee /sys/devices/system/cpu/cpu1/online")
    assert guest.ssh("nproc").stdout.strip() == "2"
    assert "Linux version" in guest.serial_log.read_text(errors="replace")  # console_log was written

    # Less memory, live: the balloon shrinks the running guest, nothing restarts.
    before = mem_total_mib(guest)
    shrunk = dict(args, vcpus=2, memory="768M")
    results = four_ways("domain", shrunk)
    assert results["apply"]["actions"] == ["set memory live"]
    assert results["apply"]["restart_required"] is False
    # The balloon driver in the guest gives the memory back: MemTotal drops by about 256 MiB.
    after = wait_until(lambda: _when(mem_total_mib(guest), lambda m: m <= before - 200), 90,
                       "the guest's MemTotal to drop below %d MiB" % (before - 200))
    assert after >= before - 300, (before, after)
    # domain_info reports the running domain's balloon, which the guest moves to the new size
    # asynchronously (792 MiB was seen on the way to 768): poll until it arrives.
    info = wait_until(
        lambda: _when(run_module("domain_info", {"uri": libvirtd, "name": guest.name})["domains"][0],
                      lambda d: d["memory_mib"] == 768),
        120, "domain_info to report the 768 MiB balloon")
    # ... and the guest's address from the network's DHCP leases.
    assert guest.ip in [a["address"] for i in info["interfaces"] for a in i["ip_addresses"]]

    guest.ssh("sync", check=False)
    stopped = run_module("domain", dict(shrunk, state="shutdown", shutdown_timeout=180, wait_for_ip=False))
    assert not stopped["failed"], stopped
    # A clean ACPI shutdown, waited for: no forced stop, nothing to redefine.
    assert stopped["actions"] == ["shutdown"]
    assert stopped["domain"]["state"] == "shutoff" and stopped["domain"]["vcpus"] == 2
    assert not guest.is_active()
    assert run_module("domain", dict(shrunk, state="shutdown", wait_for_ip=False))["changed"] is False
