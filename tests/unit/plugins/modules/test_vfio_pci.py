"""vfio_pci on synthetic sysfs trees: the writes it makes, the kernel's answer (FakeKernel),
the persistent files, the refusals, check/diff mode and four-way idempotence."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest


from conftest import SHARED, four_ways, run_module_process  # noqa: E402
from sysfs_builder import BRIDGE, EDU, GPU, GPU_AUDIO, VGA, VGA_AUDIO, FakeKernel, SysfsTree, gpu_host  # noqa: E402

pytestmark = pytest.mark.unit

H200_TGZ = SHARED / "fixtures" / "h200-passthrough-guest" / "sysfs-pci.tgz"


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return gpu_host(tmp_path)


def args_for(tree: SysfsTree, devices: Any, **extra: Any) -> Dict[str, Any]:
    script, _unused = tree.fake_command("update-initramfs")
    modprobe, _unused = tree.fake_command("modprobe")
    args: Dict[str, Any] = dict(tree.roots(), devices=devices, initramfs_command=[str(script), "-u"],
                                modprobe_command=[str(modprobe)], bind_timeout=20)
    args.update(extra)
    return args


def calls(tree: SysfsTree, name: str) -> list:
    log = tree.base / "bin" / ("%s.log" % name)
    return log.read_text().splitlines() if log.exists() else []


def snapshot(tree: SysfsTree) -> Dict[str, Any]:
    """Everything a refused run must leave alone."""
    return {
        "drivers": {a: tree.driver_of(a) for a in tree.host_drivers},
        "overrides": {a: tree.override_of(a) for a in tree.host_drivers},
        "etc": sorted(str(p.relative_to(tree.etc)) + ":" + (p.read_text() if p.is_file() else "")
                      for p in tree.etc.rglob("*")),
        "probe": (tree.sys / "bus/pci/drivers_probe").read_text(),
    }


def assert_refused(result: Dict[str, Any], *words: str) -> None:
    assert result["failed"], result
    assert result["changed"] is False
    for word in words:
        assert word in result["msg"], (word, result["msg"])


# -- binding a whole group ---------------------------------------------------------------------
def test_bind_gpu_and_audio_four_ways(tree: SysfsTree) -> None:
    args = args_for(tree, [GPU, GPU_AUDIO])
    with FakeKernel(tree) as kernel:
        results = four_ways("vfio_pci", args)
    check, apply = results["check"], results["apply"]
    # Check mode predicted the bind and wrote nothing before the real run.
    assert any("bind %s" % GPU in a for a in check["actions"])
    assert check["diff"]["after"]["drivers"] == {GPU: "vfio-pci", GPU_AUDIO: "vfio-pci"}
    assert check["diff"]["before"]["drivers"] == {GPU: "nvidia", GPU_AUDIO: "snd_hda_intel"}
    # The real run: driver_override written, the host drivers unbound, then drivers_probe.
    assert tree.driver_of(GPU) == "vfio-pci" and tree.driver_of(GPU_AUDIO) == "vfio-pci"
    assert tree.override_of(GPU) == "vfio-pci" and tree.override_of(GPU_AUDIO) == "vfio-pci"
    assert ("unbind", "nvidia", GPU) in kernel.log and ("unbind", "snd_hda_intel", GPU_AUDIO) in kernel.log
    assert ("probe", "vfio-pci", GPU) in kernel.log
    assert tree.driver_of(BRIDGE) == "pcieport", "the bridge of the group is left alone"
    assert [d["driver"] for d in apply["devices"]] == ["vfio-pci", "vfio-pci"]
    # Persistent configuration.
    conf = (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").read_text()
    assert "options vfio-pci ids=10de:22a3,10de:2335\n" in conf
    for module in ("nvidia", "nouveau", "snd_hda_intel"):
        assert "softdep %s pre: vfio-pci\n" % module in conf
    assert "# device %s 10de:2335 host-module nvidia" % GPU in conf
    modules = (tree.etc / "initramfs-tools" / "modules").read_text()
    assert modules.startswith("# List of modules\nloop\n")
    assert "vfio\nvfio_iommu_type1\nvfio_pci\n" in modules
    # update-initramfs ran once: not in check mode, not on the second apply.
    assert len(calls(tree, "update-initramfs")) == 1 and calls(tree, "update-initramfs")[0].endswith(" -u")
    assert apply["initramfs_updated"] is True and results["apply_again"]["initramfs_updated"] is False
    assert calls(tree, "modprobe") == [], "vfio-pci was loaded: no modprobe"


def test_check_mode_writes_nothing(tree: SysfsTree) -> None:
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]), check=True, diff=True)
    assert result["changed"] is True and not result["failed"]
    assert snapshot(tree) == before
    assert calls(tree, "update-initramfs") == []
    conf = result["diff"]["after"]["files"][str(tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf")]
    assert "options vfio-pci ids=10de:22a3,10de:2335" in conf


def test_vendor_device_ids_select_devices(tree: SysfsTree) -> None:
    with FakeKernel(tree):
        result = run_module_process("vfio_pci", args_for(tree, ["1234:11e8"]))
    assert not result["failed"], result
    assert [d["address"] for d in result["devices"]] == [EDU]
    assert tree.driver_of(EDU) == "vfio-pci"
    conf = (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").read_text()
    assert "options vfio-pci ids=1234:11e8\n" in conf and "softdep" not in conf


def test_loads_vfio_pci_when_missing(tree: SysfsTree) -> None:
    shutil.rmtree(str(tree.sys / "bus/pci/drivers/vfio-pci"))
    modprobe = tree.base / "bin" / "modprobe"
    args = args_for(tree, [EDU], persistent=False)
    # A modprobe that does what the kernel does on load: the driver directory appears.
    modprobe.write_text("#!/bin/sh\necho \"$*\" >> '%s.log'\nmkdir -p '%s'\n"
                        % (modprobe, tree.sys / "bus/pci/drivers/vfio-pci"))
    with FakeKernel(tree):
        result = run_module_process("vfio_pci", args)
    assert not result["failed"], result
    assert calls(tree, "modprobe") == ["vfio-pci"]
    assert result["actions"] == ["load the vfio-pci module", "bind %s (1234:11e8) to vfio-pci (from no driver)" % EDU]
    assert tree.driver_of(EDU) == "vfio-pci"


# -- state absent ------------------------------------------------------------------------------
def test_absent_hands_back_four_ways(tree: SysfsTree) -> None:
    with FakeKernel(tree) as kernel:
        bound = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]))
        assert not bound["failed"] and tree.driver_of(GPU) == "vfio-pci"
        kernel.log.clear()
        results = four_ways("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], state="absent"))
    assert tree.driver_of(GPU) == "nvidia" and tree.driver_of(GPU_AUDIO) == "snd_hda_intel"
    assert tree.override_of(GPU) is None, "driver_override cleared"
    assert ("unbind", "vfio-pci", GPU) in kernel.log and ("probe", "nvidia", GPU) in kernel.log
    assert not (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").exists()
    assert (tree.etc / "initramfs-tools" / "modules").read_text() == "# List of modules\nloop\n"
    assert len(calls(tree, "update-initramfs")) == 2, "once for bind, once for hand-back"
    assert results["apply"]["diff"]["after"]["drivers"] == {GPU: "nvidia", GPU_AUDIO: "snd_hda_intel"}


def test_absent_on_unbound_devices_changes_nothing(tree: SysfsTree) -> None:
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], state="absent"), diff=True)
    assert not result["failed"] and result["changed"] is False, result


# -- refusals: nothing changed ------------------------------------------------------------------
def test_group_member_left_out_is_refused(tree: SysfsTree) -> None:
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [GPU]))
    assert_refused(result, GPU_AUDIO, "IOMMU group 7", "add %s to devices" % GPU_AUDIO)
    assert BRIDGE not in result["msg"], "bridges are not group members that must move"
    assert snapshot(tree) == before


def test_boot_vga_refused_without_force(tree: SysfsTree) -> None:
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [VGA, VGA_AUDIO]))
    assert_refused(result, VGA, "boot VGA", "force: true")
    assert snapshot(tree) == before
    with FakeKernel(tree):
        forced = run_module_process("vfio_pci", args_for(tree, [VGA, VGA_AUDIO], force=True))
    assert not forced["failed"], forced
    assert tree.driver_of(VGA) == "vfio-pci"
    assert "boot VGA" in str(forced.get("warnings"))
    assert "softdep bochs pre: vfio-pci" in (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").read_text()


def test_device_in_use_refused(tree: SysfsTree) -> None:
    tree.add_class_device(GPU, "drm/card1", "dri/card1")
    tree.open_fd(4242, "/dev/dri/card1")
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]))
    assert_refused(result, GPU, "/dev/dri/card1 is open by a process", "force: true")
    assert snapshot(tree) == before


def test_network_interface_up_counts_as_in_use(tree: SysfsTree) -> None:
    tree.add_device("0000:02:00.0", "15b3", "1021", "020000", driver="mlx5_core", group=9)
    tree.add_netdev("0000:02:00.0", "ens1f0", "up")
    result = run_module_process("vfio_pci", args_for(tree, ["0000:02:00.0"]))
    assert_refused(result, "network interface ens1f0 is up")


@pytest.mark.parametrize("bad", ["01:00", "0000:01:00.8", "zz:00.0", "01:00.0; rm -rf /", ""])
def test_malformed_address_refused(tree: SysfsTree, bad: str) -> None:
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [bad]))
    assert_refused(result, "option devices", "domain:bus:slot.function")
    assert result["value"] == bad
    assert snapshot(tree) == before


def test_missing_device_refused(tree: SysfsTree) -> None:
    result = run_module_process("vfio_pci", args_for(tree, ["0000:05:00.0"]))
    assert_refused(result, "option devices", "0000:05:00.0", "is not a PCI device of this host", "pci_info")
    result = run_module_process("vfio_pci", args_for(tree, ["dead:beef"]))
    assert_refused(result, "option devices", "dead:beef", "matches no PCI device")


def test_empty_request_refused(tree: SysfsTree) -> None:
    assert_refused(run_module_process("vfio_pci", args_for(tree, [])), "option devices", "is empty")


def test_bad_options_refused(tree: SysfsTree) -> None:
    assert_refused(run_module_process("vfio_pci", args_for(tree, [EDU], conf_name="../evil")), "option conf_name")
    assert_refused(run_module_process("vfio_pci", args_for(tree, [EDU], softdep_modules=["a b"])),
                   "option softdep_modules")
    assert_refused(run_module_process("vfio_pci", args_for(tree, [EDU], bind_timeout=0)), "option bind_timeout")


@pytest.mark.parametrize("vendor,argument", [("intel", "intel_iommu=on"), ("amd", "amd_iommu=on")])
def test_iommu_off_names_argument_and_reboot(tmp_path: Path, vendor: str, argument: str) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    tree.cpuinfo(vendor)
    before = snapshot(tree)
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]))
    assert_refused(result, "IOMMU is off", argument, "reboot")
    assert result["required_argument"] == argument
    assert snapshot(tree) == before


def test_iommu_off_boot_config_only(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], bind_now=False))
    assert not result["failed"], result
    assert result["reboot_required"] is True
    assert "whole-group check was skipped" in str(result.get("warnings"))
    assert tree.driver_of(GPU) == "nvidia", "nothing bound now"
    assert (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").exists()


def test_same_ids_elsewhere_refused_for_boot_config(tree: SysfsTree) -> None:
    tree.add_device("0000:81:00.0", "10de", "2335", "030200", driver="nvidia", group=20)
    tree.add_device("0000:81:00.1", "10de", "22a3", "040300", driver="snd_hda_intel", group=20)
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]))
    assert_refused(result, "0000:81:00.0", "ids=", "persistent: false")
    with FakeKernel(tree):
        runtime_only = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], persistent=False))
    assert not runtime_only["failed"], runtime_only
    assert tree.driver_of(GPU) == "vfio-pci" and tree.driver_of("0000:81:00.0") == "nvidia"


def test_dracut_hosts(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    shutil.rmtree(str(tree.etc / "initramfs-tools"))
    (tree.etc / "dracut.conf.d").mkdir()
    dracut, _unused = tree.fake_command("dracut")
    with FakeKernel(tree):
        result = run_module_process("vfio_pci", args_for(tree, [EDU], initramfs_command=[str(dracut), "-f"]))
    assert not result["failed"], result
    text = (tree.etc / "dracut.conf.d" / "mlinfra-vfio-pci.conf").read_text()
    assert 'force_drivers+=" vfio vfio_iommu_type1 vfio_pci "' in text
    assert calls(tree, "dracut")[0].endswith(" -f")


def test_initramfs_failure_is_reported(tree: SysfsTree) -> None:
    failing, _unused = tree.fake_command("update-initramfs-broken", rc=3)
    with FakeKernel(tree):
        result = run_module_process("vfio_pci", args_for(tree, [EDU], initramfs_command=[str(failing)]))
    assert result["failed"] and "rc=3" in result["msg"], result
    assert result["changed"] is True, "the device was bound and the files written before the command failed"
    # What completed before it, as every module reports a partial change.
    assert result["failed_action"] == "run %s" % failing
    assert result["actions"][0] == "bind %s (1234:11e8) to vfio-pci (from no driver)" % EDU, result["actions"]
    assert "(already done: bind %s" % EDU in result["msg"], result["msg"]


def test_an_initramfs_rebuild_that_hangs_is_killed_and_named(tree: SysfsTree) -> None:
    hang = tree.base / "bin" / "update-initramfs-hangs"
    hang.parent.mkdir(exist_ok=True)
    hang.write_text("#!/bin/sh\nsleep 120\n")
    hang.chmod(0o755)
    with FakeKernel(tree):
        result = run_module_process("vfio_pci", args_for(tree, [EDU], initramfs_command=[str(hang), "-u"],
                                                         command_timeout=1), timeout=120)
    assert result["failed"] and str(hang) in result["msg"] and "within 1 s" in result["msg"], result
    assert result["changed"] is True and "next run of this task runs" in result["msg"]
    assert result["cmd"] == [str(hang), "-u"]


def test_a_missing_modprobe_is_named(tree: SysfsTree) -> None:
    shutil.rmtree(tree.sys / "bus" / "pci" / "drivers" / "vfio-pci")
    missing = str(tree.base / "bin" / "no-such-modprobe")
    result = run_module_process("vfio_pci", args_for(tree, [EDU], modprobe_command=[missing]))
    assert result["failed"] and missing in result["msg"] and "Error executing command" not in result["msg"], result
    assert result["cmd"] == [missing, "vfio-pci"]


def test_kernel_that_does_not_bind_is_reported(tree: SysfsTree) -> None:
    """No FakeKernel: the writes land in plain files and nothing rebinds, as when a probe fails."""
    result = run_module_process("vfio_pci", args_for(tree, [EDU], bind_timeout=1, persistent=False))
    assert result["failed"] and "did not bind to vfio-pci within 1s" in result["msg"], result
    assert result["changed"] is True and result["drivers"] == {EDU: None}
    assert tree.override_of(EDU) == "vfio-pci"
    assert (tree.sys / "bus/pci/drivers_probe").read_text() == EDU


def test_h200_guest_capture_refused_iommu_off(tmp_path: Path) -> None:
    """The real captured VM: no IOMMU, so the module refuses and names the fix."""
    subprocess.run(["tar", "-xzf", str(H200_TGZ), "-C", str(tmp_path)], check=True)
    (tmp_path / "proc").mkdir()
    shutil.copy(str(tmp_path / "proc_cmdline"), str(tmp_path / "proc" / "cmdline"))
    result = run_module_process("vfio_pci", {"devices": ["10de:2335"], "sysfs_root": str(tmp_path / "sys"),
                                             "proc_root": str(tmp_path / "proc"), "etc_root": str(tmp_path / "etc")})
    assert_refused(result, "IOMMU is off", "intel_iommu=on", "reboot")
    assert not (tmp_path / "etc").exists()
    assert (tmp_path / "sys/devices/pci0000:00/0000:00:06.0/driver_override").read_text().strip() == "(null)"


def test_iommu_flag_set_but_no_groups_points_at_firmware(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    tree.cmdline("root=/dev/sda1 ro intel_iommu=on iommu=pt")
    result = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO]))
    assert_refused(result, "IOMMU is off", "firmware")


def test_absent_with_iommu_off_cleans_boot_config(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path, iommu=False)
    written = run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], bind_now=False))
    assert written["changed"] and (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").exists()
    results = four_ways("vfio_pci", args_for(tree, [GPU, GPU_AUDIO], state="absent"))
    assert not (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").exists()
    assert results["apply"]["devices"][0]["driver"] == "nvidia"


def test_absent_of_one_group_keeps_the_other(tree: SysfsTree) -> None:
    with FakeKernel(tree):
        run_module_process("vfio_pci", args_for(tree, [GPU, GPU_AUDIO, EDU]))
        # EDU has no host driver here: the hand-back waits bind_timeout for one, then says so.
        result = run_module_process("vfio_pci", args_for(tree, [EDU], state="absent", bind_timeout=2))
    assert not result["failed"], result
    assert "%s: no host driver claimed it within bind_timeout (2s)" % EDU in str(result.get("warnings")), result
    conf = (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").read_text()
    assert "ids=10de:22a3,10de:2335\n" in conf and "1234:11e8" not in conf
    assert "softdep nvidia pre: vfio-pci" in conf, "the host module remembered in the file survives"
    assert tree.driver_of(GPU) == "vfio-pci" and tree.driver_of(EDU) is None


# -- the host's own NICs and disks (issue 13): the whole subtree, holders, routes ----------------
NIC, AHCI, NVME = "0000:00:03.0", "0000:00:1f.2", "0000:02:00.0"
SATA_PATH = "ata1/host0/target0:0:0/0:0:0:0/block"


def add_virtio_nic(tree: SysfsTree, operstate: str = "up", **kw: Any) -> None:
    """virtio-net: the interface hangs below the virtio0 child device, not below the function."""
    tree.add_device(NIC, "1af4", "1041", "020000", driver="virtio-pci", group=3)
    tree.add_netdev(NIC, "eth0", operstate, under="virtio0", **kw)


def add_sata_disk(tree: SysfsTree) -> None:
    tree.add_device(AHCI, "8086", "2922", "010601", driver="ahci", group=10)
    tree.add_disk(AHCI, SATA_PATH, "sda", "8:0", partitions=(("sda1", "8:1"), ("sda2", "8:2")))


def add_nvme_disk(tree: SysfsTree) -> None:
    tree.add_device(NVME, "144d", "a808", "010802", driver="nvme", group=11)
    tree.add_disk(NVME, "nvme/nvme0", "nvme0n1", "259:0", partitions=(("nvme0n1p1", "259:1"),))


def assert_refused_both_modes(tree: SysfsTree, args: Dict[str, Any], *words: str) -> Dict[str, Any]:
    """Check mode takes the same refusal as a real run, and neither changes anything."""
    before = snapshot(tree)
    for check in (True, False):
        result = run_module_process("vfio_pci", args, check=check)
        assert_refused(result, *words)
        assert snapshot(tree) == before
    return result


def test_virtio_nic_with_default_route_refused(tree: SysfsTree) -> None:
    add_virtio_nic(tree)
    tree.routes(v4=[("eth0", "0.0.0.0", 0), ("eth0", "192.168.122.0", 24)])
    result = assert_refused_both_modes(tree, args_for(tree, [NIC]), NIC, "eth0 carries the default route",
                                       "192.168.122.0/24", "pick another device", "force: true")
    assert "eth0 carries the default route" in result["in_use"]


def test_bridge_port_counts_through_its_bridge(tree: SysfsTree) -> None:
    tree.add_virtual_netdev("br0")
    add_virtio_nic(tree, master="br0")
    tree.routes(v4=[("br0", "0.0.0.0", 0)])
    assert_refused_both_modes(tree, args_for(tree, [NIC]), "eth0 is a port of br0, which carries the default route")


def test_ipv6_only_nic_refused_link_local_ignored(tree: SysfsTree) -> None:
    add_virtio_nic(tree, operstate="down")
    tree.routes(v6=[("eth0", "fe80::", 64), ("eth0", "ff00::", 8), ("eth0", "2001:db8::", 64)],
                v6_addresses=[("eth0", "fe80::1", 64, "20"), ("eth0", "2001:db8::5", 64, "00")])
    result = assert_refused_both_modes(tree, args_for(tree, [NIC]), "eth0 carries routes to 2001:db8::/64",
                                       "eth0 has address 2001:db8::5/64")
    assert "fe80" not in result["msg"] and "ff00" not in result["msg"]


def test_mounted_root_partition_refused_even_with_force(tree: SysfsTree) -> None:
    add_sata_disk(tree)
    tree.mountinfo([("8:1", "/dev/root", "/")])  # the kernel's name for root: only major:minor matches
    for force in (False, True):
        result = assert_refused_both_modes(tree, args_for(tree, [AHCI], force=force),
                                           AHCI, "sda1 is mounted at /", "even with force", "pick another device")


def test_nvme_partition_deep_in_the_tree_mounted(tree: SysfsTree) -> None:
    add_nvme_disk(tree)
    tree.mountinfo([("8:1", "/dev/sda1", "/"), ("259:1", "/dev/nvme0n1p1", "/srv/data")])
    result = assert_refused_both_modes(tree, args_for(tree, [NVME]), "nvme0n1p1 is mounted at /srv/data",
                                       "force: true")
    assert "even with force" not in result["msg"], "a data disk is the admin's call"
    with FakeKernel(tree):
        forced = run_module_process("vfio_pci", args_for(tree, [NVME], force=True))
    assert not forced["failed"] and forced["changed"], forced
    assert tree.driver_of(NVME) == "vfio-pci"
    assert "nvme0n1p1 is mounted at /srv/data" in str(forced.get("warnings"))


def test_lvm_root_on_a_partition_refused_even_with_force(tree: SysfsTree) -> None:
    add_sata_disk(tree)
    tree.add_dm("dm-0", "vg-root", "253:0", slaves=("sda2",))
    # /proc/mounts only (no mountinfo), naming the volume by its /dev/mapper name.
    (tree.proc / "mounts").write_text("/dev/mapper/vg-root / ext4 rw,relatime 0 0\n")
    for force in (False, True):
        assert_refused_both_modes(tree, args_for(tree, [AHCI], force=force), "sda2 is held by dm-0 (vg-root)",
                                  "dm-0 (vg-root) is mounted at /", "even with force")


def test_stacked_holders_resolved_transitively(tree: SysfsTree) -> None:
    """dm-crypt on the disk, LVM on the crypt device, a volume mounted by major:minor."""
    add_sata_disk(tree)
    tree.add_dm("dm-0", "crypt-data", "253:0", slaves=("sda",))
    tree.add_dm("dm-1", "vg-data", "253:1", slaves=("dm-0",))
    tree.mountinfo([("253:1", "/dev/mapper/vg-data", "/var/lib/libvirt/images")])
    assert_refused_both_modes(tree, args_for(tree, [AHCI]), "sda is held by dm-0 (crypt-data)",
                              "dm-0 (crypt-data) is held by dm-1 (vg-data)",
                              "dm-1 (vg-data) is mounted at /var/lib/libvirt/images")


def test_swap_on_a_volume_refused(tree: SysfsTree) -> None:
    add_sata_disk(tree)
    tree.add_dm("dm-1", "vg-swap", "253:1", slaves=("sda2",))
    tree.swaps(["/dev/dm-1"])
    assert_refused_both_modes(tree, args_for(tree, [AHCI]), "dm-1 (vg-swap) is used as swap (/dev/dm-1)")


def test_unused_disk_and_nic_are_taken_four_ways(tree: SysfsTree) -> None:
    """The negative case: a disk nobody mounts or holds and a NIC that is down with only the
    link-local route leftovers are free; the host's mounts elsewhere do not matter."""
    add_sata_disk(tree)
    add_virtio_nic(tree, operstate="down")
    tree.mountinfo([("259:1", "/dev/nvme0n1p1", "/"), ("8:17", "/dev/sdb1", "/home")])
    tree.swaps(["/dev/sdb2"])
    tree.routes(v4=[("eth1", "0.0.0.0", 0)], v6=[("eth0", "fe80::", 64)])
    with FakeKernel(tree):
        results = four_ways("vfio_pci", args_for(tree, [AHCI, NIC]))
    assert tree.driver_of(AHCI) == "vfio-pci" and tree.driver_of(NIC) == "vfio-pci"
    assert not results["check"].get("warnings")


def test_walk_is_bounded_and_follows_no_links(tmp_path: Path) -> None:
    from ansible_collections.mlinfra.kvm.plugins.module_utils._host._host_usage import walk_subtree
    tree = gpu_host(tmp_path)
    add_sata_disk(tree)
    base = str(tree.device_path(AHCI))
    # A link back to the top of the tree, as sysfs' subsystem/device links are.
    os.symlink(str(tree.sys), os.path.join(base, "loop"))
    dirs, truncated = walk_subtree(base)
    assert not truncated
    assert all(os.path.realpath(d).startswith(os.path.realpath(base)) for d in dirs), "left the subtree"
    assert os.path.join(base, SATA_PATH, "sda", "sda1") in dirs
    dirs, truncated = walk_subtree(base, max_depth=3)
    assert truncated and os.path.join(base, SATA_PATH, "sda") not in dirs
    dirs, truncated = walk_subtree(base, max_dirs=4)
    assert truncated and len(dirs) == 4


# -- a failed initramfs rebuild is retried (issue 13) -------------------------------------------
def test_failed_initramfs_rebuild_is_retried_by_the_next_run(tree: SysfsTree) -> None:
    flaky, log = tree.flaky_command("update-initramfs-flaky", failures=1)
    args = args_for(tree, [EDU], initramfs_command=[str(flaky), "-u"])
    marker = tree.etc / "modprobe.d" / ".mlinfra-vfio-pci.initramfs-pending"
    with FakeKernel(tree):
        first = run_module_process("vfio_pci", args)
        assert first["failed"] and first["changed"] is True, first
        assert "broken on purpose" in first["msg"] and "next run of this task runs" in first["msg"]
        assert (tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf").exists() and marker.exists()
        check = run_module_process("vfio_pci", args, check=True)
        assert not check["failed"] and check["changed"] is True, check
        assert any("again" in a for a in check["actions"]), check["actions"]
        assert len(log.read_text().splitlines()) == 1, "check mode runs nothing"
        second = run_module_process("vfio_pci", args)
        assert not second["failed"] and second["changed"] is True and second["initramfs_updated"] is True, second
        assert not marker.exists()
        third = run_module_process("vfio_pci", args)
        assert not third["failed"] and third["changed"] is False, third
    assert len(log.read_text().splitlines()) == 2


def test_route_addresses_decode_as_the_kernel_prints_them() -> None:
    """/proc/net/route of a real x86 host: 192.168.1.0 is printed 0001A8C0."""
    from ansible_collections.mlinfra.kvm.plugins.module_utils._host._host_usage import ipv4_hex
    expected = "192.168.1.0" if sys.byteorder == "little" else "0.1.168.192"
    assert ipv4_hex("0001A8C0") == expected
