"""Synthetic sysfs/procfs/etc trees for the host modules' unit tests.

The layout copies the kernel's (and the captured H200 fixture's): devices live under
``sys/devices/pci0000:00/<address>``, ``sys/bus/pci/devices/<address>`` are relative
symlinks to them, ``driver`` / ``iommu_group`` are symlinks, drivers have
``bind``/``unbind``/``new_id``/``remove_id`` files and links to their devices, and
``sys/kernel/iommu_groups/<n>/devices/<address>`` link back.

The attribute files are plain files: a module writes them and the test reads what was
written. :class:`FakeKernel` plays the kernel's part where a test needs the effect of a
write (unbind, drivers_probe): a thread watches those files, moves the symlinks the way the
kernel would, and logs every write it consumed.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

CPU_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge"


class SysfsTree:
    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.sys = self.base / "sys"
        self.proc = self.base / "proc"
        self.etc = self.base / "etc"
        for path in (self.sys / "bus" / "pci" / "devices", self.sys / "bus" / "pci" / "drivers",
                     self.sys / "devices" / "pci0000:00", self.proc, self.etc):
            path.mkdir(parents=True, exist_ok=True)
        (self.sys / "bus" / "pci" / "drivers_probe").write_text("")
        self.host_drivers: Dict[str, Optional[str]] = {}
        self.cmdline("BOOT_IMAGE=/boot/vmlinuz root=/dev/vda1 ro quiet")
        self.cpuinfo("intel")

    # -- roots for module arguments ------------------------------------------------------
    def roots(self) -> Dict[str, str]:
        return {"sysfs_root": str(self.sys), "proc_root": str(self.proc), "etc_root": str(self.etc)}

    # -- procfs -------------------------------------------------------------------------
    def cmdline(self, text: str) -> None:
        (self.proc / "cmdline").write_text(text + "\n")

    def cpuinfo(self, vendor: str, hypervisor: bool = False) -> None:
        vendor_id = {"intel": "GenuineIntel", "amd": "AuthenticAMD"}.get(vendor, vendor)
        flags = CPU_FLAGS + (" hypervisor" if hypervisor else "")
        text = "".join("processor\t: %d\nvendor_id\t: %s\nflags\t\t: %s\n\n" % (n, vendor_id, flags) for n in range(2))
        (self.proc / "cpuinfo").write_text(text)

    def meminfo(self, total_kib: int, hugepagesize_kib: int = 2048) -> None:
        (self.proc / "meminfo").write_text(
            "MemTotal:       %d kB\nMemFree:        %d kB\nHugePages_Total:       0\n"
            "Hugepagesize:       %d kB\n" % (total_kib, total_kib // 2, hugepagesize_kib))

    def open_fd(self, pid: int, target: str, fd: int = 3) -> None:
        fd_dir = self.proc / str(pid) / "fd"
        fd_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(target, str(fd_dir / str(fd)))

    # -- hugepages ----------------------------------------------------------------------
    def hugepages(self, sizes_kib: Tuple[int, ...] = (2048, 1048576), nr: int = 0) -> None:
        for size in sizes_kib:
            path = self.sys / "kernel" / "mm" / "hugepages" / ("hugepages-%dkB" % size)
            path.mkdir(parents=True, exist_ok=True)
            (path / "nr_hugepages").write_text("%d\n" % nr)
            (path / "free_hugepages").write_text("%d\n" % nr)

    # -- PCI ----------------------------------------------------------------------------
    def add_driver(self, name: str, module: Optional[str] = None) -> Path:
        path = self.sys / "bus" / "pci" / "drivers" / name
        path.mkdir(parents=True, exist_ok=True)
        for attr in ("bind", "unbind", "new_id", "remove_id"):
            if not (path / attr).exists():
                (path / attr).write_text("")
        if module and not (path / "module").exists():
            mod = self.sys / "module" / module
            mod.mkdir(parents=True, exist_ok=True)
            os.symlink("../../../../module/%s" % module, str(path / "module"))
        return path

    def enable_iommu(self) -> None:
        (self.sys / "kernel" / "iommu_groups").mkdir(parents=True, exist_ok=True)
        (self.sys / "class" / "iommu" / "dmar0").mkdir(parents=True, exist_ok=True)

    def device_path(self, address: str) -> Path:
        return self.sys / "devices" / "pci0000:00" / address

    def add_device(self, address: str, vendor: str, device: str, cls: str, driver: Optional[str] = None,
                   group: Optional[int] = None, boot_vga: Optional[bool] = None, numa_node: int = -1,
                   subsystem: Tuple[str, str] = ("1af4", "1100"), driver_module: Optional[str] = None) -> Path:
        path = self.device_path(address)
        path.mkdir(parents=True)
        attrs = {"vendor": "0x" + vendor, "device": "0x" + device, "class": "0x" + cls,
                 "subsystem_vendor": "0x" + subsystem[0], "subsystem_device": "0x" + subsystem[1],
                 "revision": "0x01", "numa_node": str(numa_node), "driver_override": "(null)",
                 "enable": "1" if driver else "0"}
        if boot_vga is not None:
            attrs["boot_vga"] = "1" if boot_vga else "0"
        for name, value in attrs.items():
            (path / name).write_text(value + "\n")
        (path / "uevent").write_text("PCI_ID=%s:%s\nPCI_SLOT_NAME=%s\n" % (vendor.upper(), device.upper(), address))
        os.symlink("../../../devices/pci0000:00/%s" % address, str(self.sys / "bus" / "pci" / "devices" / address))
        os.symlink("../../../bus/pci", str(path / "subsystem"))
        self.host_drivers[address] = driver
        if driver:
            self.add_driver(driver, driver_module)
            self.bind(address, driver)
        if group is not None:
            self.enable_iommu()
            gdir = self.sys / "kernel" / "iommu_groups" / str(group) / "devices"
            gdir.mkdir(parents=True, exist_ok=True)
            os.symlink("../../../../devices/pci0000:00/%s" % address, str(gdir / address))
            os.symlink("../../../kernel/iommu_groups/%d" % group, str(path / "iommu_group"))
        return path

    def add_class_device(self, address: str, subdir: str, devname: str) -> None:
        """A class device below the PCI device (drm/card0, sound/card0/controlC0) with its DEVNAME."""
        path = self.device_path(address) / subdir
        path.mkdir(parents=True, exist_ok=True)
        (path / "uevent").write_text("MAJOR=226\nMINOR=0\nDEVNAME=%s\n" % devname)

    def add_netdev(self, address: str, name: str, operstate: str = "up", under: str = "",
                   master: Optional[str] = None) -> Path:
        """A network interface below the PCI device, optionally below a child device
        (``under="virtio0"``, as virtio-net does), with its /sys/class/net link."""
        path = self.device_path(address) / under / "net" / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "operstate").write_text(operstate + "\n")
        (path / "uevent").write_text("INTERFACE=%s\nIFINDEX=%d\n" % (name, 2 + len(self._listing("class/net"))))
        self._class_link("net", name, path)
        if master:
            os.symlink(os.path.relpath(str(self.sys / "devices" / "virtual" / "net" / master), str(path)),
                       str(path / "master"))
        return path

    def add_virtual_netdev(self, name: str, operstate: str = "up") -> Path:
        """A bridge or bond (no PCI device of its own) under /sys/devices/virtual/net."""
        path = self.sys / "devices" / "virtual" / "net" / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "operstate").write_text(operstate + "\n")
        self._class_link("net", name, path)
        return path

    # -- block devices ------------------------------------------------------------------
    def add_disk(self, address: str, under: str, name: str, majmin: str,
                 partitions: Tuple[Tuple[str, str], ...] = ()) -> Path:
        """A disk below the PCI device at ``under`` (``ata1/host0/target0:0:0/0:0:0:0/block``,
        ``nvme/nvme0``), with its partitions, class/block links and /sys/block link."""
        path = self.device_path(address) / under / name
        self._block_dir(path, name, majmin, "disk")
        for part, part_majmin in partitions:
            self._block_dir(path / part, part, part_majmin, "partition")
            (path / part / "partition").write_text("%s\n" % part_majmin.split(":")[1])
        (self.sys / "block").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(str(path), str(self.sys / "block")), str(self.sys / "block" / name))
        return path

    def add_dm(self, name: str, dm_name: str, majmin: str, slaves: Tuple[str, ...]) -> Path:
        """A device-mapper device (LVM volume, dm-crypt) stacked on ``slaves``: the kernel
        lists it under each slave's holders/ and names it in dm/name."""
        path = self.sys / "devices" / "virtual" / "block" / name
        self._block_dir(path, name, majmin, "disk")
        (path / "dm").mkdir()
        (path / "dm" / "name").write_text(dm_name + "\n")
        (path / "slaves").mkdir()
        for slave in slaves:
            slave_dir = Path(os.path.realpath(str(self.sys / "class" / "block" / slave)))
            os.symlink(os.path.relpath(str(path), str(slave_dir / "holders")), str(slave_dir / "holders" / name))
            os.symlink(os.path.relpath(str(slave_dir), str(path / "slaves")), str(path / "slaves" / slave))
        (self.sys / "block").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(str(path), str(self.sys / "block")), str(self.sys / "block" / name))
        return path

    def _block_dir(self, path: Path, name: str, majmin: str, devtype: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "holders").mkdir(exist_ok=True)
        major, minor = majmin.split(":")
        (path / "dev").write_text(majmin + "\n")
        (path / "uevent").write_text("MAJOR=%s\nMINOR=%s\nDEVNAME=%s\nDEVTYPE=%s\n" % (major, minor, name, devtype))
        self._class_link("block", name, path)
        # The loop a walk that followed links would never leave: subsystem -> class/block -> the device.
        os.symlink(os.path.relpath(str(self.sys / "class" / "block"), str(path)), str(path / "subsystem"))

    def _class_link(self, cls: str, name: str, target: Path) -> None:
        directory = self.sys / "class" / cls
        directory.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(str(target), str(directory)), str(directory / name))

    def _listing(self, rel: str) -> List[str]:
        path = self.sys / rel
        return sorted(os.listdir(str(path))) if path.is_dir() else []

    # -- procfs: mounts, swap, routes -----------------------------------------------------
    def mountinfo(self, mounts: List[Tuple[str, str, str]]) -> None:
        """/proc/self/mountinfo from (major:minor, source, mount point) triples."""
        lines = ["%d 1 %s / %s rw,relatime shared:1 - ext4 %s rw" % (20 + n, majmin, target, source)
                 for n, (majmin, source, target) in enumerate(mounts)]
        (self.proc / "self").mkdir(exist_ok=True)
        (self.proc / "self" / "mountinfo").write_text("".join(line + "\n" for line in lines))

    def swaps(self, devices: List[str]) -> None:
        text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        text += "".join("%s\tpartition\t1048572\t\t0\t\t-2\n" % d for d in devices)
        (self.proc / "swaps").write_text(text)

    def routes(self, v4: Sequence[Tuple[str, str, int]] = (), v6: Sequence[Tuple[str, str, int]] = (),
               v6_addresses: Sequence[Tuple[str, str, int, str]] = ()) -> None:
        """/proc/net/route, ipv6_route and if_inet6 as the kernel writes them, from
        (iface, destination, prefix length) and (iface, address, prefix length, scope hex)."""
        net = self.proc / "net"
        net.mkdir(exist_ok=True)
        rows = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]

        def native(packed):  # the kernel prints a u32 in host byte order
            return "%08X" % struct.unpack("=I", packed)[0]

        for iface, dest, prefix in v4:
            mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF if prefix else 0
            rows.append("%s\t%s\t00000000\t0001\t0\t0\t0\t%s\t0\t0\t0"
                        % (iface, native(socket.inet_aton(dest)), native(struct.pack(">I", mask))))
        (net / "route").write_text("\n".join(rows) + "\n")
        v6rows = ["%s %02x %s 00 %s 00000100 00000001 00000000 00000001 %8s"
                  % (ipaddress.IPv6Address(dest).exploded.replace(":", ""), prefix, "0" * 32, "0" * 32, iface)
                  for iface, dest, prefix in v6]
        (net / "ipv6_route").write_text("".join(row + "\n" for row in v6rows))
        addr_rows = ["%s %02x %02x %s 80 %8s" % (ipaddress.IPv6Address(addr).exploded.replace(":", ""), n + 2,
                                                 prefix, scope, iface)
                     for n, (iface, addr, prefix, scope) in enumerate(v6_addresses)]
        (net / "if_inet6").write_text("".join(row + "\n" for row in addr_rows))

    def driver_of(self, address: str) -> Optional[str]:
        link = self.device_path(address) / "driver"
        return os.path.basename(os.readlink(str(link))) if link.is_symlink() else None

    def bind(self, address: str, driver: str) -> None:
        path = self.device_path(address)
        os.symlink("../../../bus/pci/drivers/%s" % driver, str(path / "driver"))
        os.symlink("../../../../devices/pci0000:00/%s" % address,
                   str(self.sys / "bus" / "pci" / "drivers" / driver / address))

    def unbind(self, address: str) -> Optional[str]:
        driver = self.driver_of(address)
        if driver:
            os.unlink(str(self.device_path(address) / "driver"))
            os.unlink(str(self.sys / "bus" / "pci" / "drivers" / driver / address))
        return driver

    def override_of(self, address: str) -> Optional[str]:
        value = (self.device_path(address) / "driver_override").read_text().strip()
        return None if value in ("", "(null)") else value

    # -- etc ----------------------------------------------------------------------------
    def os_release(self, os_id: str, like: str = "") -> None:
        text = 'ID=%s\n' % os_id + ('ID_LIKE="%s"\n' % like if like else "")
        (self.etc / "os-release").write_text(text)

    def fake_command(self, name: str, rc: int = 0) -> Tuple[Path, Path]:
        """An executable that logs its argv (one line per call) to <name>.log and exits rc."""
        bindir = self.base / "bin"
        bindir.mkdir(exist_ok=True)
        log = bindir / ("%s.log" % name)
        script = bindir / name
        script.write_text("#!/bin/sh\necho \"$0 $*\" >> '%s'\nexit %d\n" % (log, rc))
        script.chmod(0o755)
        return script, log

    def flaky_command(self, name: str, failures: int = 1, rc: int = 1) -> Tuple[Path, Path]:
        """Like :meth:`fake_command`, but the first ``failures`` calls exit ``rc`` (a broken
        update-grub that the admin then fixes); every call is logged."""
        script, log = self.fake_command(name)
        script.write_text("#!/bin/sh\necho \"$0 $*\" >> '%s'\n"
                          "if [ \"$(wc -l < '%s')\" -le %d ]; then echo 'broken on purpose' >&2; exit %d; fi\n"
                          "exit 0\n" % (log, log, failures, rc))
        return script, log


class FakeKernel:
    """Plays the kernel for unbind/bind/drivers_probe writes while a module runs.

    A thread polls the attribute files; when one holds an address it applies the effect
    (moves the driver symlinks), logs ``(action, driver, address)`` and empties the file,
    as the kernel consumes a write. On drivers_probe a device without a driver is bound to
    its driver_override, or when that is empty to its host driver (``tree.host_drivers``)
    """

    def __init__(self, tree: SysfsTree, interval: float = 0.01) -> None:
        self.tree = tree
        self.interval = interval
        self.log: List[Tuple[str, Optional[str], str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "FakeKernel":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @staticmethod
    def _take(path: Path) -> List[str]:
        try:
            text = path.read_text()
        except OSError:
            return []
        if not text.strip():
            return []
        path.write_text("")
        return text.split()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            time.sleep(self.interval)

    def step(self) -> None:
        drivers = self.tree.sys / "bus" / "pci" / "drivers"
        # Take the probe requests first: a module writes unbind before drivers_probe, so any
        # unbind that belongs to a probe seen here is already in its file for the scan below.
        probes = self._take(self.tree.sys / "bus" / "pci" / "drivers_probe")
        for drv in sorted(p for p in drivers.iterdir() if p.is_dir()):
            for address in self._take(drv / "unbind"):
                if self.tree.driver_of(address) == drv.name:
                    self.tree.unbind(address)
                self.log.append(("unbind", drv.name, address))
            for address in self._take(drv / "bind"):
                if self.tree.driver_of(address) is None:
                    self.tree.bind(address, drv.name)
                self.log.append(("bind", drv.name, address))
        for address in probes:
            if self.tree.driver_of(address) is None:
                target = self.tree.override_of(address) or self.tree.host_drivers.get(address)
                if target and (drivers / target).is_dir():
                    self.tree.bind(address, target)
            self.log.append(("probe", self.tree.driver_of(address), address))


# -- a standard host ---------------------------------------------------------------------------
GPU, GPU_AUDIO, BRIDGE = "0000:01:00.0", "0000:01:00.1", "0000:00:1c.0"
VGA, VGA_AUDIO, EDU = "0000:00:0b.0", "0000:00:0b.1", "0000:00:0a.0"


def gpu_host(base: Path, iommu: bool = True) -> SysfsTree:
    """A host like the issue's lab VM plus a real-looking NVIDIA card behind a root port."""
    tree = SysfsTree(base)
    g = (lambda n: n) if iommu else (lambda n: None)
    tree.add_device("0000:00:00.0", "8086", "29c0", "060000", group=g(0))
    tree.add_device(BRIDGE, "8086", "a110", "060400", driver="pcieport", group=g(7))
    tree.add_device(EDU, "1234", "11e8", "00ff00", group=g(5))
    tree.add_device(VGA, "1234", "1111", "030000", driver="bochs-drm", driver_module="bochs", boot_vga=True, group=g(6))
    tree.add_device(VGA_AUDIO, "8086", "293e", "040300", driver="snd_hda_intel", group=g(6))
    tree.add_device(GPU, "10de", "2335", "030200", driver="nvidia", boot_vga=False, group=g(7), numa_node=0)
    tree.add_device(GPU_AUDIO, "10de", "22a3", "040300", driver="snd_hda_intel", group=g(7), numa_node=0)
    tree.add_driver("vfio-pci", module="vfio_pci")
    tree.add_driver("pci-stub")
    (tree.etc / "initramfs-tools").mkdir()
    (tree.etc / "initramfs-tools" / "modules").write_text("# List of modules\nloop\n")
    return tree
