# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vfio_pci module's argument spec and runner: bind PCI devices to vfio-pci now and at boot.

The runner decides everything before it changes anything: the request is parsed and resolved
against the devices read once, the refusals (IOMMU off, a group left half out, a device the host
uses, ids that would take more at boot) come first, then the persistent files are rendered
(:mod:`._pci_vfio`) and compared. Only then does it act, each side effect through
``tracker.act`` (so check mode takes the same decisions and reports the same actions), in the
order that keeps a failure recoverable: vfio-pci loaded, the devices rebound, the initramfs
marker, the files, the rebuild. The I/O is :class:`._vfio_service.VfioService`'s.

A failure half-way is reported by :class:`.._core._runner.ObjectRunner` as a partial change;
:meth:`VfioRunner.report_partial` adds what only this module knows (the drivers now, and that an
unfinished initramfs rebuild is retried by the next run).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .._core._errors import ConflictError, InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from .._core._validate import object_name
from ._host_usage import Use
from ._pci import VFIO_DRIVERS, PciDevice, is_interconnect
from ._pci_select import PciSelector, parse_selector
from ._pci_vfio import MODULE_NAME_RE, default_softdeps, parse_devices, render_dracut, render_initramfs_tools, render_modprobe
from ._sysfs import Roots, roots_argspec
from ._vfio_service import VFIO, VfioService

PENDING_NOTE = ("# Written by mlinfra.kvm.vfio_pci: the vfio-pci boot configuration changed and `%s` has not "
                "succeeded since.\n# The next run of the task runs it again and removes this file.\n")
Entries = Dict[str, Tuple[str, Optional[str]]]
Devices = Dict[str, Dict[str, Any]]


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        devices=dict(type="list", elements="raw", required=True),
        state=dict(type="str", default="present", choices=["present", "absent"]),
        force=dict(type="bool", default=False),
        bind_now=dict(type="bool", default=True),
        persistent=dict(type="bool", default=True),
        conf_name=dict(type="str", default="mlinfra-vfio-pci"),
        softdep_modules=dict(type="list", elements="str", default=[]),
        initramfs=dict(type="str", default="auto", choices=["auto", "initramfs-tools", "dracut", "none"]),
        initramfs_command=dict(type="list", elements="str"),
        modprobe_command=dict(type="list", elements="str", default=["modprobe"]),
        bind_timeout=dict(type="int", default=10),
        command_timeout=dict(type="int", default=300),
    )
    spec.update(roots_argspec("sysfs_root", "proc_root", "etc_root"))
    return spec


def run_vfio_pci(module: Any) -> Dict[str, Any]:
    return VfioRunner(module, VfioService(module, Roots.from_params(module.params))).run()


class VfioRunner(ObjectRunner):
    def __init__(self, module: Any, service: VfioService) -> None:
        super().__init__(module, service)
        self.scanner = service.scanner
        self.addresses: List[str] = []
        self.rebuild = False  # the initramfs is rebuilt by this run (report_partial needs it)

    # -- request --------------------------------------------------------------------------
    def parse_request(self) -> List[PciSelector]:
        """The request's entries, parsed before the host is read: malformed input is refused as such."""
        if not self.params["devices"]:
            raise InvalidInputError("devices", self.params["devices"], "is empty",
                                    "list PCI addresses (0000:01:00.0) or vendor:device ids (10de:2335)")
        return [parse_selector("devices[%d]" % n, entry) for n, entry in enumerate(self.params["devices"])]

    def resolve(self, selectors: List[PciSelector], devices: Devices) -> List[str]:
        """Addresses of the request among the devices read once by converge(); unknown ones are refused."""
        records = {address: PciDevice.from_info(info) for address, info in devices.items()}
        where = "of this host (in %s)" % self.scanner.roots.sys("bus", "pci", "devices")
        addresses: List[str] = []
        for selector in selectors:
            addresses.extend(a for a in selector.resolve(records, where) if a not in addresses)
        return sorted(addresses)

    def validate(self) -> None:
        timeout = self.params["bind_timeout"]
        if timeout is None or timeout < 1:
            raise InvalidInputError("bind_timeout", timeout, "is below 1", "give seconds, e.g. 10")
        if self.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.params["command_timeout"], "is below 1",
                                    "give the seconds modprobe or the initramfs rebuild may run, e.g. 300")
        object_name("conf_name", self.params["conf_name"])
        for module in self.params["softdep_modules"]:
            if not MODULE_NAME_RE.match(str(module)):
                raise InvalidInputError("softdep_modules", module, "is not a kernel module name",
                                        "use letters, digits, '_' or '-', e.g. nouveau")

    # -- checks before binding ------------------------------------------------------------
    def check_iommu(self, iommu: Dict[str, Any]) -> None:
        if iommu["enabled"]:
            return
        if self.params["bind_now"]:
            if iommu["cmdline_flags"] and "firmware" in (iommu["reason"] or ""):
                cause = iommu["reason"]
            else:
                cause = ("no IOMMU groups under %s, so vfio-pci cannot take devices: add %s (and iommu=pt) to the "
                         "kernel command line (mlinfra.kvm.kernel_cmdline with iommu: auto) and reboot"
                         % (self.scanner.roots.sys("kernel", "iommu_groups"), iommu["required_argument"]))
            raise ConflictError("the IOMMU is off: %s; or set bind_now: false to write only the boot configuration now"
                                % cause, required_argument=iommu["required_argument"], reboot_required=True)
        self.module.warn("IOMMU groups are unknown while the IOMMU is off: the whole-group check was skipped; "
                         "run this task again with bind_now: true after the reboot")

    def check_groups(self, addresses: List[str], devices: Devices) -> None:
        for address in addresses:
            members = self.scanner.group_members(address)
            # The group goes to vfio whole: every member but a bridge-header device (which keeps
            # pcieport, as the kernel allows; _pci.is_interconnect) must be in the request.
            missing = [m for m in members
                       if m not in addresses and not is_interconnect(devices.get(m, {}).get("class", ""))]
            if missing:
                raise ConflictError(
                    "%s is in IOMMU group %s with %s, which the request leaves out: vfio can only give a whole "
                    "group to a VM; add %s to devices (or move the card to a slot with its own group)"
                    % (address, devices[address]["iommu_group"],
                       ", ".join("%s (%s, driver %s)" % (m, devices[m]["id"], devices[m]["driver"] or "none")
                                 for m in missing), ", ".join(missing)),
                    address=address, missing=missing)

    def check_safety(self, addresses: List[str], devices: Devices) -> None:
        """Refuse a device the host needs; force overrides all but a disk under the host's own
        filesystems (/, /usr, /boot...), whose loss would crash the host mid-run."""
        for address in addresses:
            info = devices[address]
            if info["driver"] in VFIO_DRIVERS:
                continue
            uses = self.scanner.usage_details(address)
            if info["boot_vga"]:
                uses.insert(0, Use("it is the boot VGA device (the host console)"))
            if not uses:
                continue
            reasons = "; ".join(u.reason for u in uses)
            if any(u.critical for u in uses):
                # All reasons, not only the critical one: the chain (partition, LVM, mount) is the story.
                raise ConflictError(
                    "refusing to take %s (%s) from the host, even with force: %s; pick another device (the host "
                    "cannot give away the disk it runs from)" % (address, info["id"], reasons),
                    address=address, in_use=[u.reason for u in uses])
            if not self.params["force"]:
                raise ConflictError(
                    "refusing to take %s (%s) from the host: %s; pick another device or free it first (unmount, "
                    "swapoff, remove it from LVM/dm, take the address and routes off the interface, close the "
                    "device), or set force: true to take it anyway" % (address, info["id"], reasons),
                    address=address, in_use=[u.reason for u in uses])
            self.module.warn("force: taking %s although %s" % (address, reasons))

    def check_same_ids(self, addresses: List[str], devices: Devices) -> None:
        """`ids=` takes every device with these ids at boot: refuse to take more than asked."""
        wanted = {devices[a]["id"] for a in addresses}
        others = [a for a, d in devices.items() if d["id"] in wanted and a not in addresses]
        if others:
            raise ConflictError(
                "the boot configuration (options vfio-pci ids=%s) would also take %s, which the request leaves out: "
                "add them to devices or set persistent: false" % (",".join(sorted(wanted)), ", ".join(others)),
                others=others)

    # -- persistent files -----------------------------------------------------------------
    def initramfs_kind(self) -> str:
        kind = self.params["initramfs"]
        if kind != "auto":
            return kind
        if self.service.etc_has_dir("initramfs-tools"):
            return "initramfs-tools"
        if self.service.etc_has_dir("dracut.conf.d"):
            return "dracut"
        return "none"

    def modprobe_path(self) -> str:
        return self.service.roots.etc("modprobe.d", "%s.conf" % self.params["conf_name"])

    def desired_files(self, entries: Entries, softdeps: List[str]) -> Dict[str, Optional[str]]:
        """{path: content or None (absent)} for the persistent configuration."""
        keep = bool(entries)
        files: Dict[str, Optional[str]] = {self.modprobe_path(): render_modprobe(entries, softdeps) if keep else None}
        kind = self.initramfs_kind()
        if kind == "initramfs-tools":
            path = self.service.roots.etc("initramfs-tools", "modules")
            current = self.service.read(path)
            files[path] = None if current is None and not keep else render_initramfs_tools(current, keep)
        elif kind == "dracut":
            files[self.service.roots.etc("dracut.conf.d", "%s.conf" % self.params["conf_name"])] = (
                render_dracut() if keep else None)
        elif keep:
            self.module.warn("no initramfs tool found under %s (initramfs-tools or dracut): vfio-pci is "
                             "not added to the initramfs" % self.service.roots.etc_root)
        return files

    def present_entries(self, addresses: List[str], devices: Devices) -> Tuple[Entries, List[str]]:
        recorded = parse_devices(self.service.read(self.modprobe_path()))
        entries: Entries = {}
        softdeps = set(self.params["softdep_modules"])
        for address in addresses:
            info = devices[address]
            driver = info["driver"]
            if driver and driver not in VFIO_DRIVERS:
                module = self.scanner.driver_module(driver)
            else:
                module = recorded.get(address, (None, None))[1]
            entries[address] = (info["id"], module)
            if module:
                softdeps.add(module)
            softdeps.update(default_softdeps(info["vendor_id"], info["class"]))
        return entries, sorted(softdeps)

    def remaining_entries(self, addresses: List[str], devices: Devices) -> Tuple[Entries, List[str]]:
        """state=absent: the devices the file keeps once the request's devices are taken out."""
        entries = {a: e for a, e in parse_devices(self.service.read(self.modprobe_path())).items()
                   if a not in addresses}
        softdeps = {m for _unused, m in entries.values() if m} | set(self.params["softdep_modules"])
        for address in entries:
            if address in devices:
                softdeps.update(default_softdeps(devices[address]["vendor_id"], devices[address]["class"]))
        return entries, sorted(softdeps)

    def compare_files(self, desired: Dict[str, Optional[str]]) -> Dict[str, bool]:
        """{path: whether it changes}; the tracker keeps each changing file's content before."""
        return {path: self.tracker.add("file:" + path, self.service.read(path), content)
                for path, content in desired.items()}

    # -- run ------------------------------------------------------------------------------
    def converge(self) -> Dict[str, Any]:
        selectors = self.parse_request()
        devices = self.scanner.devices()
        addresses = self.addresses = self.resolve(selectors, devices)
        iommu = self.scanner.iommu()
        present = self.params["state"] == "present"
        if present:
            self.check_iommu(iommu)
            if iommu["enabled"]:
                self.check_groups(addresses, devices)
            self.check_safety(addresses, devices)
            if self.params["persistent"]:
                self.check_same_ids(addresses, devices)

        # Decide everything before the first change: the files are read as they were.
        to_change = self.runtime_changes(addresses, devices, present)
        files_changed: Dict[str, bool] = {}
        desired: Dict[str, Optional[str]] = {}
        if self.params["persistent"]:
            if present:
                entries, softdeps = self.present_entries(addresses, devices)
            else:
                entries, softdeps = self.remaining_entries(addresses, devices)
            desired = self.desired_files(entries, softdeps)
            files_changed = self.compare_files(desired)
        self.rebuild = self.rebuild_due(any(files_changed.values()))

        before_drivers = {a: devices[a]["driver"] for a in addresses}
        after_drivers = self.apply_runtime(to_change, devices, present, dict(before_drivers))
        self.apply_persistent(desired, files_changed)
        return self.result(addresses, devices, before_drivers, after_drivers, files_changed, desired)

    def report_partial(self, err: KvmError) -> None:
        """The common partial report, plus what only this module knows about a failed step."""
        if not self.check and self.tracker.failed_action is not None:
            if self.rebuild and self.service.exists(self.pending_marker()):
                err.msg += ("; the boot configuration is written but the initramfs is not rebuilt: "
                            "the next run of this task runs %s again" % " ".join(self.initramfs_command()))
            # The failed step itself may have changed the host, which the completed actions do not
            # show (a bind writes driver_override and unbinds the host driver before the kernel answers).
            err.details.setdefault("changed", True)
            err.details.setdefault("drivers", {a: self.scanner.driver(a) for a in self.addresses})
        super().report_partial(err)

    def pending_marker(self) -> str:
        """Exists while an initramfs rebuild is owed (written before the persistent files,
        removed after the command succeeded), so a failed rebuild is retried by the next run
        instead of leaving an old initramfs behind an unchanged file. modprobe.d reads only
        *.conf files, so the marker never configures anything."""
        return self.service.roots.etc("modprobe.d", ".%s.initramfs-pending" % self.params["conf_name"])

    def rebuild_due(self, files_changed: bool) -> bool:
        """Rebuild when a persistent file changes now or an earlier rebuild failed."""
        pending = self.service.exists(self.pending_marker())
        if pending and (not self.params["persistent"] or self.initramfs_kind() == "none"):
            self.module.warn("an earlier initramfs rebuild failed (%s exists) and this task does not rebuild it: "
                             "run it with persistent: true and an initramfs tool, or rebuild the initramfs by hand "
                             "and remove the file" % self.pending_marker())
            return False
        return self.initramfs_kind() != "none" and (files_changed or pending)

    def runtime_changes(self, addresses: List[str], devices: Devices, present: bool) -> List[str]:
        """The devices whose binding changes now (none without bind_now)."""
        if not self.params["bind_now"]:
            return []
        if present:
            return [a for a in addresses if devices[a]["driver"] != VFIO]
        return [a for a in addresses if VFIO in (devices[a]["driver"], devices[a]["driver_override"])]

    def apply_runtime(self, to_change: List[str], devices: Devices, present: bool,
                      drivers: Dict[str, Optional[str]]) -> Dict[str, Optional[str]]:
        """Rebind ``to_change``; returns ``drivers`` with each device's driver after (predicted in check mode)."""
        timeout = self.params["bind_timeout"]
        if present and to_change and not self.service.vfio_loaded():
            self.tracker.act("load the vfio-pci module", self.service.load_vfio, self.params["modprobe_command"])
        for address in to_change:
            info = devices[address]
            if present:
                found = self.tracker.act("bind %s (%s) to vfio-pci (from %s)"
                                         % (address, info["id"], info["driver"] or "no driver"),
                                         self.service.bind, address, timeout)
                drivers[address] = VFIO if self.check else found
                continue
            found = self.tracker.act("hand %s (%s) back to its host driver" % (address, info["id"]),
                                     self.service.release, address, timeout)
            drivers[address] = "host driver" if self.check else found
            if drivers[address] == VFIO:
                self.module.warn("%s went back to vfio-pci: vfio-pci still has its id from the boot "
                                 "configuration; it is free after the next reboot" % address)
            elif drivers[address] is None:
                self.module.warn("%s: no host driver claimed it within bind_timeout (%ss); it is unbound "
                                 "(load its driver, or raise bind_timeout when probing is slow)" % (address, timeout))
        return drivers

    def apply_persistent(self, desired: Dict[str, Optional[str]], files_changed: Dict[str, bool]) -> None:
        """Write the changed files, then rebuild the initramfs. The pending marker goes before the
        first file: whatever fails from there on, the next run rebuilds."""
        note = PENDING_NOTE % " ".join(self.initramfs_command()) if self.rebuild else None
        for path, changed in files_changed.items():
            if changed:
                owed = (self.pending_marker(), note) if note is not None else None
                self.tracker.act("%s %s" % ("remove" if desired[path] is None else "write", path),
                                 self.service.write_config, path, desired[path], owed)
                note = None  # written with the first file
        if not self.rebuild:
            return
        command = " ".join(self.initramfs_command())
        if any(files_changed.values()):
            action = "run %s" % command
        else:
            action = "run %s again: it failed after the boot configuration last changed (%s)" % (command, self.pending_marker())
        self.tracker.act(action, self.service.rebuild_initramfs, self.initramfs_command(), self.pending_marker(), note)

    def initramfs_command(self) -> List[str]:
        if self.params["initramfs_command"]:
            return list(self.params["initramfs_command"])
        return ["dracut", "-f"] if self.initramfs_kind() == "dracut" else ["update-initramfs", "-u"]

    def result(self, addresses: List[str], devices: Devices, before: Dict[str, Optional[str]],
               after: Dict[str, Optional[str]], files_changed: Dict[str, bool],
               desired: Dict[str, Optional[str]]) -> Dict[str, Any]:
        listed = [{"address": a, "id": devices[a]["id"], "iommu_group": devices[a]["iommu_group"],
                   "driver_before": before[a], "driver": after[a]} for a in addresses]
        return {
            "changed": self.tracker.changed,
            "devices": listed,
            "files": files_changed,
            "initramfs_updated": self.rebuild and not self.check,
            "reboot_required": bool(any(files_changed.values()) and not self.params["bind_now"]),
            "actions": self.tracker.actions,
            "diff": {
                "before": {"drivers": before, "files": {p: self._before_file(p, desired) for p in files_changed}},
                "after": {"drivers": dict(after), "files": {p: desired.get(p) for p in files_changed}},
            },
        }

    def _before_file(self, path: str, desired: Dict[str, Optional[str]]) -> Optional[str]:
        # The tracker kept the content read before any write.
        for diff in self.tracker.differences:
            if diff["name"] == "file:" + path:
                return diff["before"]
        return desired.get(path)
