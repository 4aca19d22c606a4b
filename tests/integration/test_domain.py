"""mlinfra.kvm.domain against the real libvirtd (qemu:///system).

Domains are type='qemu' with no bootable disk: started, they sit in SeaBIOS, which is enough
to prove running/paused/destroyed, live vCPU/memory/metadata/disk changes and the restart
logic, cheaply (one small TCG process at a time). Every change is proven four ways (check,
apply, check again, apply again); every refusal leaves libvirt unchanged.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import four_ways

pytestmark = pytest.mark.integration

libvirt = pytest.importorskip("libvirt")


@pytest.fixture
def env(libvirt_cleanup, tmp_path):
    """A dir pool with three tiny qcow2 volumes and an isolated network, all named with the
    test's prefix (the cleanup fixture removes them, and any domain, afterwards)."""
    prefix = libvirt_cleanup
    uri = "qemu:///system"
    # Not under pytest's tmp_path: its parents are 0700 and QEMU runs as libvirt-qemu.
    pool_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chmod(pool_dir, 0o755)
    for name in ("a.qcow2", "b.qcow2", "c.qcow2"):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(pool_dir / name), "16M"], check=True)
    conn = libvirt.open(uri)
    pool_xml = "<pool type='dir'><name>%spool</name><target><path>%s</path></target></pool>" % (prefix, pool_dir)
    pool = conn.storagePoolDefineXML(pool_xml, 0)
    pool.create(0)
    net_xml = "<network><name>%snet</name><ip address='192.168.251.1' netmask='255.255.255.0'/></network>" % prefix
    net = conn.networkDefineXML(net_xml)
    net.create()
    try:
        yield {"prefix": prefix, "uri": uri, "conn": conn, "pool": prefix + "pool", "network": prefix + "net",
               "vm": prefix + "vm", "tmp": tmp_path}
    finally:
        conn.close()  # the cleanup fixture deletes the pool, its volumes and its directory


def base(env: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    args = {"name": env["vm"], "uri": env["uri"], "virt_type": "qemu", "memory": "128M",
            "max_memory": "256M", "vcpus": 1, "max_vcpus": 2,
            "disks": [{"pool": env["pool"], "volume": "a.qcow2"}],
            "interfaces": [{"network": env["network"]}],
            "metadata": {"role": "worker"}}
    args.update(extra)
    return args


def inactive(env, name=None) -> str:
    dom = env["conn"].lookupByName(name or env["vm"])
    return dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)


def state_of(env) -> int:
    return env["conn"].lookupByName(env["vm"]).state()[0]


# --------------------------------------------------------------------------- define

def test_define_four_ways(env):
    results = four_ways("domain", base(env))
    dom = results["apply"]["domain"]
    assert dom["state"] == "shutoff" and dom["virt_type"] == "qemu"
    assert dom["machine"].startswith("pc-q35-")
    assert dom["disks"][0]["volume"] == "a.qcow2" and dom["disks"][0]["format"] == "qcow2"
    mac = dom["interfaces"][0]["mac"]
    assert mac.startswith("52:54:00:")
    assert results["check"]["domain"]["interfaces"][0]["mac"] == mac  # check mode predicted it
    xml = inactive(env)
    assert "org.qemu.guest_agent.0" in xml and "<rng model='virtio'>" in xml
    assert "https://mlinfra.example/kvm/1" in xml


def test_check_mode_defines_nothing(env, run_module):
    result = run_module("domain", base(env), check=True)
    assert result["changed"] and not result["failed"]
    with pytest.raises(libvirt.libvirtError):
        env["conn"].lookupByName(env["vm"])


def test_mac_is_derived_deterministically(env, run_module):
    first = run_module("domain", base(env))["domain"]["interfaces"][0]["mac"]
    run_module("domain", {"name": env["vm"], "uri": env["uri"], "state": "absent"})
    again = run_module("domain", base(env))["domain"]["interfaces"][0]["mac"]
    assert first == again


# --------------------------------------------------------------------------- updates (shut off)

UPDATES = {
    "memory": {"memory": "200M"},
    "max_memory": {"max_memory": "512M"},
    "vcpus": {"vcpus": 2},
    "max_vcpus_topology": {"max_vcpus": 4, "cpu": {"mode": "maximum", "sockets": 1, "cores": 2, "threads": 2}},
    "disk_added": "disks",
    "cdrom_added": "cdroms",
    "interface_added": "interfaces",
    "metadata": {"metadata": {"role": "trainer", "team": "nlp"}},
    "description": {"description": "trainer for team nlp"},
    "hide_hypervisor": {"hide_hypervisor": True},
    "uefi": {"firmware": "uefi"},
    "kernel_boot": "kernel",
    "console_log": "console_log",
    "rng_off": {"rng": False, "guest_agent": False},
    "pinning": {"cpu_pinning": {"vcpupin": [{"vcpu": 0, "cpuset": "0"}], "emulatorpin": "0-1"}},
    "numa": {"numa_tuning": {"mode": "strict", "nodeset": "0"}},
    "hugepages": {"hugepages": True},
    "autostart": {"autostart": True},
    "machine": {"machine": "pc"},
}


def update_args(env, kind: str) -> Dict[str, Any]:
    change = UPDATES[kind]
    if change == "disks":
        return base(env, disks=[{"pool": env["pool"], "volume": "a.qcow2"},
                                {"pool": env["pool"], "volume": "b.qcow2", "readonly": True}])
    if change == "cdroms":
        iso = env["tmp"] / "seed.iso"
        iso.write_bytes(b"\0" * 4096)
        return base(env, cdroms=[{"path": str(iso)}])
    if change == "interfaces":
        return base(env, interfaces=[{"network": env["network"]},
                                     {"network": env["network"], "mac": "52:54:00:00:00:99"}])
    if change == "kernel":
        kernel = env["tmp"] / "vmlinuz"
        kernel.write_bytes(b"\0")
        return base(env, kernel=str(kernel), cmdline="console=ttyS0")
    if change == "console_log":
        return base(env, console_log=str(env["tmp"] / "serial.log"))
    return base(env, **change)


@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_update_of_a_shut_off_domain_four_ways(env, run_module, kind):
    assert not run_module("domain", base(env))["failed"]
    uuid = env["conn"].lookupByName(env["vm"]).UUIDString()
    results = four_ways("domain", update_args(env, kind))
    assert results["apply"]["restart_required"] is False
    assert "redefine" in results["apply"]["actions"] or kind == "autostart"
    # Redefined in place, never undefined: same UUID.
    assert env["conn"].lookupByName(env["vm"]).UUIDString() == uuid


def test_update_diff_names_only_what_changed(env, run_module):
    run_module("domain", base(env))
    result = run_module("domain", base(env, vcpus=2), diff=True)
    assert result["diff"] == {"before": {"vcpus": 1}, "after": {"vcpus": 2}}


def test_unset_options_are_left_alone(env, run_module):
    run_module("domain", base(env, metadata={"role": "worker"}))
    result = run_module("domain", {"name": env["vm"], "uri": env["uri"], "vcpus": 2})
    assert result["changed"] and result["domain"]["metadata"] == {"role": "worker"}
    assert result["domain"]["disks"][0]["volume"] == "a.qcow2"


def test_removing_a_disk(env, run_module):
    run_module("domain", update_args(env, "disk_added"))
    four_ways("domain", base(env))
    assert "b.qcow2" not in inactive(env)


# --------------------------------------------------------------------------- run states

def test_state_changes_and_live_updates(env, run_module):
    """One SeaBIOS guest through running, live changes, restart, paused, destroyed."""
    four_ways("domain", base(env, state="running"))
    assert state_of(env) == libvirt.VIR_DOMAIN_RUNNING
    dom = env["conn"].lookupByName(env["vm"])

    # vCPUs within the maximum: live and in the config, no restart.
    results = four_ways("domain", base(env, state="running", vcpus=2))
    assert "set vcpus live" in results["apply"]["actions"]
    assert results["apply"]["restart_required"] is False
    assert dom.vcpusFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE) == 2
    assert dom.vcpusFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG) == 2

    # Memory within the maximum: balloon target set live and in the config.
    results = four_ways("domain", base(env, state="running", vcpus=2, memory="192M"))
    assert "set memory live" in results["apply"]["actions"]
    assert "<currentMemory unit='KiB'>196608</currentMemory>" in inactive(env)

    # Metadata, live.
    results = four_ways("domain", base(env, state="running", vcpus=2, memory="192M",
                                       metadata={"role": "trainer"}))
    assert "set metadata live" in results["apply"]["actions"]
    assert "trainer" in dom.XMLDesc(0)

    # A virtio disk hot-plugged.
    disks = [{"pool": env["pool"], "volume": "a.qcow2"}, {"pool": env["pool"], "volume": "c.qcow2"}]
    results = four_ways("domain", base(env, state="running", vcpus=2, memory="192M",
                                       metadata={"role": "trainer"}, disks=disks))
    assert "attach disk vdb live" in results["apply"]["actions"]
    assert "c.qcow2" in dom.XMLDesc(0)
    current = base(env, state="running", vcpus=2, memory="192M", metadata={"role": "trainer"}, disks=disks)

    # Not live-capable: written to the config, restart required, guest untouched.
    pid_before = dom.ID()
    results = four_ways("domain", dict(current, rng=False))
    assert results["check"]["restart_required"] is True
    assert results["apply"]["restart_required"] is True
    assert results["apply_again"]["restart_required"] is False  # config already matches
    assert dom.ID() == pid_before
    assert "<rng" not in inactive(env) and "<rng" in dom.XMLDesc(0)
    current["rng"] = False

    # restart: true applies such a change (SeaBIOS ignores ACPI, so force after the timeout).
    results = four_ways("domain", dict(current, hide_hypervisor=True, restart=True,
                                       shutdown_timeout=2, force=True))
    assert results["apply"]["restarted"] is True and results["apply"]["restart_required"] is False
    dom = env["conn"].lookupByName(env["vm"])
    assert dom.ID() != pid_before and "<hidden state='on'/>" in dom.XMLDesc(0)
    current.update(hide_hypervisor=True)

    # paused, resumed, destroyed.
    four_ways("domain", dict(current, state="paused"))
    assert state_of(env) == libvirt.VIR_DOMAIN_PAUSED
    four_ways("domain", dict(current, state="running"))
    assert state_of(env) == libvirt.VIR_DOMAIN_RUNNING
    four_ways("domain", dict(current, state="destroyed"))
    assert state_of(env) == libvirt.VIR_DOMAIN_SHUTOFF
    # paused from shut off starts it paused.
    four_ways("domain", dict(current, state="paused"))
    assert state_of(env) == libvirt.VIR_DOMAIN_PAUSED


def test_shutdown_waits_then_fails_or_forces(env, run_module):
    run_module("domain", base(env, state="running"))
    # SeaBIOS has no OS to honour the ACPI request: without force the module reports the timeout.
    result = run_module("domain", base(env, state="shutdown", shutdown_timeout=2))
    assert result["failed"] and "did not shut down within 2 s" in result["msg"]
    assert "force: true" in result["msg"]
    assert state_of(env) == libvirt.VIR_DOMAIN_RUNNING
    results = four_ways("domain", base(env, state="shutdown", shutdown_timeout=2, force=True))
    assert "destroy (shutdown timed out)" in results["apply"]["actions"]
    assert state_of(env) == libvirt.VIR_DOMAIN_SHUTOFF


def test_uefi_nvram_survives_updates_and_goes_with_absent(env, run_module):
    args = base(env, firmware="uefi", state="running")
    four_ways("domain", args)
    nvram = "/var/lib/libvirt/qemu/nvram/%s_VARS.fd" % env["vm"]
    assert os.path.exists(nvram)
    run_module("domain", dict(args, state="destroyed"))
    with open(nvram, "ab") as handle:  # mark the NVRAM: an update must keep this very file
        handle.write(b"")
    inode = os.stat(nvram).st_ino
    assert run_module("domain", dict(args, state="destroyed", vcpus=2))["changed"]
    assert os.stat(nvram).st_ino == inode
    four_ways("domain", {"name": env["vm"], "uri": env["uri"], "state": "absent"})
    assert not os.path.exists(nvram)


def test_absent_four_ways(env, run_module):
    run_module("domain", base(env, state="running"))
    four_ways("domain", {"name": env["vm"], "uri": env["uri"], "state": "absent"})
    with pytest.raises(libvirt.libvirtError):
        env["conn"].lookupByName(env["vm"])


# --------------------------------------------------------------------------- refusals

def make_sysfs(root, devices):
    """bus/pci/devices/<addr>/{vendor,device,class,driver,iommu_group} + kernel/iommu_groups."""
    for dev in devices:
        path = os.path.join(root, "bus", "pci", "devices", dev["address"])
        os.makedirs(path)
        for key, value in (("vendor", "0x" + dev["vendor"]), ("device", "0x" + dev["device"]),
                           ("class", dev.get("class", "0x030000"))):
            with open(os.path.join(path, key), "w") as handle:
                handle.write(value + "\n")
        drv = os.path.join(root, "bus", "pci", "drivers", dev["driver"])
        os.makedirs(drv, exist_ok=True)
        os.symlink(drv, os.path.join(path, "driver"))
        group = os.path.join(root, "kernel", "iommu_groups", str(dev["group"]))
        os.makedirs(os.path.join(group, "devices"), exist_ok=True)
        os.symlink(path, os.path.join(group, "devices", dev["address"]))
        os.symlink(group, os.path.join(path, "iommu_group"))
    return root


HOST = [
    {"address": "0000:01:00.0", "vendor": "10de", "device": "2204", "group": 12, "driver": "vfio-pci"},
    {"address": "0000:01:00.1", "vendor": "10de", "device": "1aef", "group": 12, "driver": "vfio-pci"},
    {"address": "0000:02:00.0", "vendor": "10de", "device": "2204", "group": 13, "driver": "vfio-pci"},
    {"address": "0000:02:00.1", "vendor": "10de", "device": "1aef", "group": 13, "driver": "snd_hda_intel"},
]


@pytest.fixture
def sysfs(tmp_path):
    return make_sysfs(str(tmp_path / "sys"), HOST)


def refused(env, run_module, args, *fragments):
    """Run a request that must fail; prove it names the problem and changed nothing."""
    before = inactive(env) if _exists(env) else None
    result = run_module("domain", args)
    assert result["failed"], result
    assert result["changed"] is False
    for fragment in fragments:
        assert fragment in result["msg"], result["msg"]
    assert (inactive(env) if _exists(env) else None) == before
    return result


def _exists(env) -> bool:
    try:
        env["conn"].lookupByName(env["vm"])
        return True
    except libvirt.libvirtError:
        return False


def test_hostdev_passthrough_four_ways(env, sysfs):
    # The define only: starting would need the real device.
    args = base(env, sysfs_root=sysfs, hostdevs=[{"vendor": "10de", "device": "2204", "include_functions": True}])
    results = four_ways("domain", args)
    assert [h["address"] for h in results["apply"]["domain"]["hostdevs"]] == ["0000:01:00.0", "0000:01:00.1"]


def test_refuses_missing_hostdev(env, run_module, sysfs):
    refused(env, run_module, base(env, sysfs_root=sysfs, hostdevs=[{"address": "0000:09:00.0"}]),
            "hostdevs[0].address", "'0000:09:00.0'", "is not a PCI device")


def test_refuses_group_not_wholly_on_vfio(env, run_module, sysfs):
    run_module("domain", base(env))
    refused(env, run_module, base(env, sysfs_root=sysfs, hostdevs=[{"address": "0000:02:00.0"}]),
            "IOMMU group 13", "0000:02:00.1 uses snd_hda_intel", "vfio-pci")


def test_refuses_malformed_pci_address(env, run_module, sysfs):
    refused(env, run_module, base(env, sysfs_root=sysfs, hostdevs=[{"address": "01:0g.0"}]),
            "hostdevs[0].address", "is not a PCI address", "0000:01:00.0")


def test_refuses_memory_above_an_explicit_maximum(env, run_module):
    # A shut-off domain takes a new maximum (see below), but not one the request itself caps.
    run_module("domain", base(env))
    refused(env, run_module, {"name": env["vm"], "uri": env["uri"], "memory": "512M", "max_memory": "384M"},
            "option memory", "maximum memory (384 MiB)", "raise max_memory")


def test_shut_off_domain_raises_its_maxima_four_ways(env, run_module):
    """Memory and vCPUs above the maxima of a defined, never started domain raise the maxima:
    only a running domain needs a restart for that."""
    assert not run_module("domain", base(env))["failed"]  # max 256 MiB / 2 vCPUs, shut off
    args = {"name": env["vm"], "uri": env["uri"], "memory": "512M", "vcpus": 3}
    results = four_ways("domain", args)
    for step in ("check", "apply"):
        assert results[step]["actions"] == ["redefine"], results[step]
        assert results[step]["restart_required"] is False
        dom = results[step]["domain"]
        assert (dom["memory_mib"], dom["max_memory_mib"], dom["vcpus"], dom["max_vcpus"]) == (512, 512, 3, 3)
        assert results[step]["diff"]["before"] == {"max_memory_kib": 262144, "memory_kib": 131072,
                                                   "max_vcpus": 2, "vcpus": 1}
    domain = env["conn"].lookupByName(env["vm"])
    assert domain.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF  # never started
    assert domain.maxMemory() == 524288
    assert domain.vcpusFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_VCPU_MAXIMUM) == 3
    assert domain.vcpusFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG) == 3
    assert results["check_again"]["domain"]["max_memory_mib"] == 512


@pytest.mark.parametrize("extra,option,fragment", [
    ({"description": "colour\x1b[31m"}, "description", "control character U+001B"),
    ({"metadata": {"role": "worker\x1b[31m"}}, "metadata.role", "control character U+001B"),
    ({"cmdline": "console=ttyS0\x00", "kernel": "/boot/vmlinuz"}, "cmdline", "control character U+0000"),
    ({"memory": "8M"}, "memory", "from 16M to 16T"),
    ({"vcpus": 4097, "max_vcpus": 4097}, "vcpus", "from 1 to 4096"),
    ({"cpu_pinning": {"vcpupin": [{"vcpu": 0, "cpuset": "0-999999999"}]}}, "cpu_pinning.vcpupin[0].cpuset",
     "above the maximum 8191"),
    ({"cpu_pinning": {"emulatorpin": "5-2"}}, "cpu_pinning.emulatorpin", "descending range"),
])
def test_refuses_unbounded_or_control_character_input(env, run_module, extra, option, fragment):
    """On the real daemon: a clean failure naming the option (no lxml traceback), nothing
    defined or changed."""
    run_module("domain", base(env))
    result = refused(env, run_module, base(env, **extra), "option %s:" % option, fragment)
    assert result["option"] == option and "Traceback" not in result.get("module_stderr", "")


def host_figures(env) -> Dict[str, int]:
    """The host's memory (MiB) and CPU count as libvirt reports them for the connection."""
    return {"memory_mib": env["conn"].getInfo()[1], "cpus": env["conn"].getCPUMap(0)[0]}


@pytest.mark.parametrize("kind", ["memory", "max_memory", "vcpupin", "emulatorpin"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_refuses_memory_or_cpus_the_host_lacks(env, run_module, kind, existing):
    """Memory beyond the host's, or a pin to a CPU it lacks, used to be defined and then fail
    the start (QEMU "cannot set up guest memory", cgroup "Numerical result out of range"),
    leaving the domain defined. Refused up front, in check mode alike, naming the host's figure."""
    host = host_figures(env)
    too_much = "%dM" % (host["memory_mib"] + 1024)
    extra, option, value, figure = {
        "memory": ({"memory": too_much, "max_memory": too_much}, "memory", too_much,
                   "host's total memory (%d MiB" % host["memory_mib"]),
        "max_memory": ({"max_memory": too_much}, "max_memory", too_much,
                       "host's total memory (%d MiB" % host["memory_mib"]),
        "vcpupin": ({"cpu_pinning": {"vcpupin": [{"vcpu": 0, "cpuset": "0,%d" % host["cpus"]}]}},
                    "cpu_pinning.vcpupin[0].cpuset", "0,%d" % host["cpus"], "host has %d CPUs" % host["cpus"]),
        "emulatorpin": ({"cpu_pinning": {"emulatorpin": str(host["cpus"])}}, "cpu_pinning.emulatorpin",
                        str(host["cpus"]), "host has %d CPUs" % host["cpus"]),
    }[kind]
    if existing:
        assert not run_module("domain", base(env))["failed"]
    args = base(env, state="running", **extra)
    for check in (True, False):
        before = inactive(env) if existing else None
        result = run_module("domain", args, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["option"] == option and result["value"] == value, result
        assert "option %s: value %r" % (option, value) in result["msg"] and figure in result["msg"], result["msg"]
        assert (inactive(env) if _exists(env) else None) == before
    if existing:
        assert state_of(env) == libvirt.VIR_DOMAIN_SHUTOFF


def test_failed_first_start_undefines_what_this_run_defined(env, run_module):
    """A start that fails right after this run's define leaves nothing defined (the next run
    would otherwise find a shut-off domain and call it converged) and says so; a domain that
    existed before the run stays defined. An inactive network passes the define and fails the start."""
    env["conn"].networkLookupByName(env["network"]).destroy()
    result = run_module("domain", base(env, state="running", autostart=True))
    assert result["failed"] and "is not active" in result["msg"], result
    assert result["changed"] is False
    assert result["failed_action"] == "start"
    assert result["actions"] == ["define", "autostart on", "undefine (the start failed)"]
    assert result["undone"] == ["define", "autostart on"]
    assert "defined by this run and is undefined again" in result["msg"]
    assert not _exists(env)
    # Defined before the run: the failed start (its only step) leaves it as it was.
    assert not run_module("domain", base(env))["failed"]
    result = run_module("domain", base(env, state="running"))
    assert result["failed"] and "is not active" in result["msg"] and "undefined" not in result["msg"]
    assert result["changed"] is False and "undone" not in result
    assert _exists(env) and state_of(env) == libvirt.VIR_DOMAIN_SHUTOFF


def test_refuses_unknown_network(env, run_module):
    refused(env, run_module, base(env, interfaces=[{"network": env["prefix"] + "nonet"}]),
            "interfaces[0].network", "is not a libvirt network")


def test_refuses_missing_volume(env, run_module):
    run_module("domain", base(env))
    refused(env, run_module, base(env, disks=[{"pool": env["pool"], "volume": "missing.qcow2"}]),
            "disks[0].volume", "does not exist in pool")


def test_refuses_hostdev_of_another_running_domain(run_module, tmp_path, sysfs):
    """A running domain holding a hostdev needs the device; libvirt's test driver (a node
    description file, in process) runs one without hardware."""
    node = tmp_path / "node.xml"
    node.write_text(
        "<node><domain type='test'><name>holder</name><memory>131072</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>"
        "<source><address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></source>"
        "</hostdev></devices></domain></node>")
    args = {"name": "mlkvmtest-taker", "uri": "test://%s" % node, "virt_type": "qemu", "memory": "128M",
            "vcpus": 1, "sysfs_root": sysfs, "hostdevs": [{"address": "0000:01:00.0"}]}
    result = run_module("domain", args)
    assert result["failed"] and not result["changed"]
    assert "0000:01:00.0 is used by running domain holder" in result["msg"]
    # The same device for the holder itself is fine (it is not "another" domain).
    holder = {k: v for k, v in args.items() if k not in ("vcpus", "memory", "virt_type")}
    result = run_module("domain", dict(holder, name="holder"))
    assert not result["failed"], result


def test_wait_for_ip_timeout_reports_what_was_done(env, run_module):
    # SeaBIOS never asks for a lease: the wait times out, after the domain was defined and
    # started - so the failure must say changed=true and list those actions.
    result = run_module("domain", base(env, state="running", wait_for_ip=True, wait_for_ip_timeout=2))
    assert result["failed"] and "no IPv4 address" in result["msg"] and "wait_for_ip_timeout" in result["msg"]
    assert result["changed"] is True and result["actions"] == ["define", "start"]
    assert state_of(env) == libvirt.VIR_DOMAIN_RUNNING


# --------------------------------------------------------------------------- disk paths

def pool_dir(env) -> str:
    """The target directory of the test's pool (the disk paths the policy lets in by itself)."""
    from lxml import etree
    return etree.fromstring(env["conn"].storagePoolLookupByName(env["pool"]).XMLDesc(0).encode()).findtext("target/path")


@pytest.mark.parametrize("path", ["/etc/shadow", "/dev/zero"])
def test_refuses_a_disk_path_outside_every_pool(env, run_module, path):
    """A host file as a guest's disk (the guest would read /etc/shadow) is refused before libvirt
    is asked; the message names the pools and the way out."""
    result = refused(env, run_module, base(env, disks=[{"path": path}]),
                     "option disks[0].path: value %r lies at %s, outside the host's storage pools" % (path, path),
                     env["pool"], "list its directory in allowed_paths")
    assert result["option"] == "disks[0].path"
    assert not _exists(env)


def test_a_disk_path_inside_a_pool_four_ways(env):
    path = os.path.join(pool_dir(env), "b.qcow2")
    results = four_ways("domain", base(env, disks=[{"path": path}]))
    assert results["apply"]["domain"]["disks"][0]["path"] == path


def test_a_disk_path_outside_the_pools_needs_allowed_paths(env, run_module):
    images = env["tmp"] / "images"
    images.mkdir()
    disk = str(images / "disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "16M"], check=True)
    refused(env, run_module, base(env, disks=[{"path": disk}]), "outside the host's storage pools")
    link = os.path.join(pool_dir(env), "link.qcow2")  # a symlink in the pool does not let it in
    os.symlink(disk, link)
    refused(env, run_module, base(env, disks=[{"path": link}]), "(resolved: %s)" % disk)
    results = four_ways("domain", base(env, disks=[{"path": disk}], allowed_paths=[str(images)]))
    assert results["apply"]["domain"]["disks"][0]["path"] == disk


@pytest.mark.timeout(120)  # a looping chain or a FIFO would hold qemu-img (and libvirtd) for ever
def test_refuses_a_disk_whose_chain_loops_or_is_a_fifo(env, run_module):
    images = env["tmp"] / "chain"
    images.mkdir()
    a, b = str(images / "a.qcow2"), str(images / "b.qcow2")
    for image, backing in ((b, a), (a, b)):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, "-u", image, "16M"],
                       check=True)
    refused(env, run_module, base(env, disks=[{"path": a}], allowed_paths=[str(images)]),
            "option disks[0].path: value %r has a backing chain that loops: %s -> %s -> %s" % (a, a, b, a))
    fifo = str(images / "pipe.raw")
    os.mkfifo(fifo)
    refused(env, run_module, base(env, disks=[{"path": fifo, "format": "raw"}], allowed_paths=[str(images)]),
            "is a FIFO (named pipe), not a disk image")
    assert not _exists(env)


def test_wait_for_ip_fails_at_once_when_qemu_crashes_and_a_rerun_starts_it(env, run_module):
    """A guest whose emulator dies while the module waits for its address: the wait ends at the
    next poll with the state libvirt gives (shut off, crashed), not after wait_for_ip_timeout;
    the next run starts it, saying it was found crashed. The crash is real: QEMU gets the
    SIGSEGV that a TCG fault gives it (the isolated network hands out no lease, so the wait lasts)."""
    qemu_pid_file = Path("/run/libvirt/qemu/%s.pid" % env["vm"])
    killed = {}

    def crash_qemu_once_running() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end and "pid" not in killed:
            try:
                if state_of(env) == libvirt.VIR_DOMAIN_RUNNING and qemu_pid_file.read_text().strip():
                    time.sleep(2)  # the module is in its wait by now
                    killed["pid"] = int(qemu_pid_file.read_text().strip())
                    os.kill(killed["pid"], signal.SIGSEGV)
                    return
            except (libvirt.libvirtError, OSError, ValueError):
                pass
            time.sleep(0.5)

    crasher = threading.Thread(target=crash_qemu_once_running, daemon=True)
    crasher.start()
    started = time.monotonic()
    result = run_module("domain", base(env, state="running", wait_for_ip=True, wait_for_ip_timeout=600))
    waited = time.monotonic() - started
    crasher.join(10)
    assert "pid" in killed, "QEMU of %s was never seen running" % env["vm"]
    assert result["failed"], result
    assert "stopped while waiting for its IPv4 address (option wait_for_ip)" in result["msg"], result
    assert "shutoff (crashed)" in result["msg"] and "/var/log/libvirt/qemu/%s.log" % env["vm"] in result["msg"], result
    assert result["changed"] is True, result  # it was defined and started before the wait
    assert waited < 300, "the module waited %.0f s for a domain whose QEMU was gone" % waited
    state, reason = env["conn"].lookupByName(env["vm"]).state()
    assert (state, reason) == (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_CRASHED)

    # What the run after it says (its warning: tests/integration/test_fault_qemu.py).
    again = run_module("domain", base(env, state="running"))
    assert not again["failed"] and again["actions"] == ["start (it was shutoff: crashed)"], again
    assert state_of(env) == libvirt.VIR_DOMAIN_RUNNING
