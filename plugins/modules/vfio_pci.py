#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: vfio_pci
short_description: Bind PCI devices (GPUs) to vfio-pci now and at every boot, whole IOMMU groups only
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
version_added: "0.1.0"
description:
  - Binds the requested devices to C(vfio-pci) now (C(driver_override), unbind from the host
    driver, C(drivers_probe)) and persistently (a modprobe.d file with
    C(options vfio-pci ids=...) and C(softdep <driver> pre vfio-pci) lines so vfio-pci wins
    over nvidia, nouveau, snd_hda_intel...; the vfio modules in the initramfs; then
    C(update-initramfs -u) or C(dracut -f), only when a file changed).
  - A failed initramfs rebuild is not forgotten. A marker
    C(<etc_root>/modprobe.d/.<conf_name>.initramfs-pending) is written before the files and
    removed only once the command succeeded; while it exists every run (check mode included)
    plans the rebuild again and reports C(changed). The failing run itself reports failed with
    C(changed=true).
  - Binds a whole IOMMU group or nothing; a request that leaves another endpoint of a group
    out is refused, naming it (bridges are ignored, as vfio ignores them).
  - Safe by default, it never takes a device the host needs. The whole sysfs subtree of each
    device is searched (symlinks are not followed, the walk is bounded), so interfaces below a
    child device (virtio-net's C(virtio0/net/eth0)) and disks and partitions deep below a
    controller (AHCI, SCSI, NVMe) are found; stacked block devices (LVM, dm-crypt, md) are
    followed through C(/sys/class/block/<dev>/holders), transitively.
  - A device is in use when it is the boot VGA device, one of its device nodes is open by a
    process, one of its disks, partitions or their holders is mounted (C(<proc_root>/self/mountinfo)
    by major:minor and source, C(/dev/mapper/<name>) included; else C(<proc_root>/mounts)), used
    as swap (C(<proc_root>/swaps)) or held by another block device, or one of its network
    interfaces (or the bridge or bond it is a port of) carries a route
    (C(<proc_root>/net/route), C(<proc_root>/net/ipv6_route); link-local and multicast routes
    do not count) or a global IPv6 address (C(<proc_root>/net/if_inet6)), or is up.
    The refusal names the device, each use (C(eth0 carries the default route),
    C(dm-0 (vg-root) is mounted at /)) and the fix, and changes nothing; check mode refuses the same way.
  - I(force=true) takes a device in use anyway, with a warning, except a disk under the host's own
    filesystems (mounted at C(/), C(/usr), C(/var), C(/etc), C(/boot) or C(/boot/efi)), which
    is refused even with I(force).
  - Refuses when the IOMMU is off, naming the kernel argument (C(intel_iommu=on) or
    C(amd_iommu=on)) and the reboot that are missing (see M(mlinfra.kvm.kernel_cmdline)).
  - C(state=absent) hands the devices back to their host driver (clears driver_override,
    unbinds from vfio-pci, C(drivers_probe)) and removes them from the persistent files.
options:
  devices:
    description:
      - Devices, each a PCI address (C(0000:01:00.0) or C(01:00.0)), C(vendor:device) ids
        (C(10de:2335), every device with these ids), or a dict, C({address}) or
        C({vendor, device, index}) (V(index) counts from 0 among the devices with these ids, in
        address order; without it, every such device), either with V(include_functions=true)
        for the slot's other functions (a GPU's HDMI audio).
      - The grammar M(mlinfra.kvm.domain)'s O(mlinfra.kvm.domain#module:hostdevs), the
        P(mlinfra.kvm.gpu_hostdev#filter) filter and M(mlinfra.kvm.pci_info)'s C(selector) share.
    type: list
    elements: raw
    required: true
  state:
    description: C(present) binds to vfio-pci, C(absent) hands back to the host driver.
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - Also bind the boot VGA device and devices in use (warns, naming each use).
      - Never overrides a disk mounted at C(/), C(/usr), C(/var), C(/etc), C(/boot) or C(/boot/efi).
    type: bool
    default: false
  bind_now:
    description:
      - Change the running kernel's binding. With C(false) only the persistent files are
        written (for a host that will reboot anyway, e.g. to turn the IOMMU on); the IOMMU
        group check then needs groups, and is skipped with a warning when there are none.
    type: bool
    default: true
  persistent:
    description: Write the modprobe.d and initramfs configuration so the binding survives a reboot.
    type: bool
    default: true
  conf_name:
    description:
      - Base name of the modprobe.d file (C(<etc_root>/modprobe.d/<conf_name>.conf)) and of the
        dracut file. The file lists exactly the devices of the request, so give all
        passthrough devices of a host in one task (vfio-pci reads one C(ids=) list).
    type: str
    default: mlinfra-vfio-pci
  softdep_modules:
    description:
      - Extra host driver modules that vfio-pci must load before. The modules of the drivers
        the devices are bound to now, and nouveau/nvidia (NVIDIA GPUs), amdgpu/radeon (AMD)
        and snd_hda_intel (audio functions) are added by themselves.
    type: list
    elements: str
    default: []
  initramfs:
    description:
      - How the vfio modules get into the initramfs. C(auto) picks C(initramfs-tools) when
        C(<etc_root>/initramfs-tools) exists, else C(dracut) when C(<etc_root>/dracut.conf.d)
        exists, else C(none) (with a warning).
    type: str
    choices: [auto, initramfs-tools, dracut, none]
    default: auto
  initramfs_command:
    description:
      - argv that rebuilds the initramfs after a persistent file changed. Default
        C([update-initramfs, -u]) for initramfs-tools, C([dracut, -f]) for dracut.
    type: list
    elements: str
  modprobe_command:
    description: argv prefix that loads a module (C(vfio-pci) is appended) when vfio-pci is not loaded yet.
    type: list
    elements: str
    default: [modprobe]
  bind_timeout:
    description: Seconds to wait for the kernel to show the new binding after C(drivers_probe).
    type: int
    default: 10
  command_timeout:
    description:
      - Seconds I(modprobe_command) or I(initramfs_command) may run. One that runs longer is killed
        (with its child processes) and the task fails naming it, saying what was already changed.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.host.sysfs_root
  - mlinfra.kvm.host.proc_root
  - mlinfra.kvm.host.etc_root
notes:
  - Reads C(self/mountinfo), C(mounts), C(swaps), C(net/route), C(net/ipv6_route), C(net/if_inet6) and
    C(<pid>/fd) below O(proc_root), and writes C(modprobe.d/<conf_name>.conf) and
    C(initramfs-tools/modules) or C(dracut.conf.d/<conf_name>.conf) below O(etc_root).
  - Supports check mode and diff mode. Check mode takes the same decisions (and refusals) as a
    real run and reports them.
  - Needs root on the target. Run M(mlinfra.kvm.pci_info) first to see groups and drivers.
seealso:
  - module: mlinfra.kvm.pci_info
  - module: mlinfra.kvm.kernel_cmdline
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Give both functions of the GPU (display and HDMI audio) to vfio-pci, now and at boot
  mlinfra.kvm.vfio_pci:
    devices: ["0000:01:00.0", "0000:01:00.1"]

- name: Every H200 of the host
  mlinfra.kvm.vfio_pci:
    devices: ["10de:2335"]

- name: The second H200 (address order) with its slot's other functions
  mlinfra.kvm.vfio_pci:
    devices:
      - {vendor: "10de", device: "2335", index: 1, include_functions: true}

- name: Write only the boot configuration; the IOMMU comes on with the next reboot
  mlinfra.kvm.vfio_pci:
    devices: ["10de:2335"]
    bind_now: false

- name: Hand the GPU back to its host driver
  mlinfra.kvm.vfio_pci:
    devices: ["0000:01:00.0", "0000:01:00.1"]
    state: absent
'''

RETURN = r'''
devices:
  description: The devices of the request with their driver before and after.
  returned: always
  type: list
  elements: dict
  sample:
    - {address: "0000:01:00.0", id: "10de:2335", iommu_group: "14", driver_before: nvidia, driver: vfio-pci}
files:
  description: Persistent files managed and whether each changed.
  returned: always
  type: dict
  sample: {"/etc/modprobe.d/mlinfra-vfio-pci.conf": true}
initramfs_updated:
  description: Whether the initramfs command ran.
  returned: always
  type: bool
reboot_required:
  description: True when only the boot configuration changed (I(bind_now=false)), so the binding starts with the next boot.
  returned: always
  type: bool
in_use:
  description: On a refusal for a device the host uses, each use found.
  returned: failure
  type: list
  elements: str
  sample:
    - sda2 is held by dm-0 (vg-root)
    - dm-0 (vg-root) is mounted at / (a filesystem the host itself runs from)
actions:
  description: What was done (or would be, in check mode).
  returned: always
  type: list
  elements: str
'''

import os
import time
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._host import _pci_vfio as persist
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import (
    CommandNotFoundError, CommandTimeoutError, run_bounded)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError, InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._host_usage import Use
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci import VFIO_DRIVERS, PciDevice, PciScanner, is_interconnect
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci_select import PciSelector, parse_selector
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import (
    Roots, read_file, remove_file, roots_argspec, write_attr, write_file_atomic)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import object_name

VFIO = "vfio-pci"
PENDING_NOTE = ("# Written by mlinfra.kvm.vfio_pci: the vfio-pci boot configuration changed and `%s` has not "
                "succeeded since.\n# The next run of the task runs it again and removes this file.\n")


class VfioService:
    """The only code that writes sysfs, /etc or runs commands for this module."""

    def __init__(self, module: AnsibleModule, roots: Roots) -> None:
        self.module = module
        self.roots = roots
        self.scanner = PciScanner(roots)

    def vfio_loaded(self) -> bool:
        return os.path.isdir(self.roots.sys("bus", "pci", "drivers", VFIO))

    def load_vfio(self, modprobe: List[str]) -> None:
        self.run_command(modprobe + [VFIO])
        if not self.vfio_loaded():
            raise KvmError("%s ran but %s does not exist: the kernel has no vfio-pci driver"
                           % (" ".join(modprobe + [VFIO]), self.roots.sys("bus", "pci", "drivers", VFIO)))

    def run_command(self, argv: List[str]) -> None:
        """Run modprobe or the initramfs rebuild within command_timeout; a failure names it."""
        timeout = self.module.params["command_timeout"]
        try:
            rc, out, err = run_bounded(argv, timeout_s=timeout)
        except CommandNotFoundError as exc:
            raise KvmError("command %s cannot be run: %s" % (argv, exc.msg.rsplit(": ", 1)[-1]), cmd=argv)
        except CommandTimeoutError:
            raise KvmError("command %s did not finish within %s s (command_timeout) and was killed" % (argv, timeout),
                           cmd=argv, timeout_s=timeout)
        if rc != 0:
            raise KvmError("command %s failed with rc=%s: %s" % (argv, rc, (err or out).strip()),
                           rc=rc, stdout=out, stderr=err, cmd=argv)

    def _wait_driver(self, address: str, done: Any, timeout: int) -> Optional[str]:
        """Poll until ``done(driver)``: probing can be asynchronous (driver_async_probe)."""
        deadline = time.monotonic() + timeout
        while True:
            driver = self.scanner.driver(address)
            if done(driver) or time.monotonic() >= deadline:
                return driver
            time.sleep(0.05)

    def bind(self, address: str, timeout: int) -> str:
        dev = self.scanner.device_dir(address)
        write_attr(os.path.join(dev, "driver_override"), VFIO)
        current = self.scanner.driver(address)
        if current and current != VFIO:
            write_attr(self.roots.sys("bus", "pci", "drivers", current, "unbind"), address)
        write_attr(self.roots.sys("bus", "pci", "drivers_probe"), address)
        driver = self._wait_driver(address, lambda d: d == VFIO, timeout)
        if driver != VFIO:
            raise KvmError("%s did not bind to vfio-pci within %ss (driver now: %s); see dmesg"
                           % (address, timeout, driver or "none"), address=address)
        return driver

    def release(self, address: str, timeout: int) -> Optional[str]:
        dev = self.scanner.device_dir(address)
        # An empty line clears driver_override ("(null)" again).
        write_attr(os.path.join(dev, "driver_override"), "\n")
        if self.scanner.driver(address) == VFIO:
            write_attr(self.roots.sys("bus", "pci", "drivers", VFIO, "unbind"), address)
            self._wait_driver(address, lambda d: d != VFIO, timeout)
        write_attr(self.roots.sys("bus", "pci", "drivers_probe"), address)
        # Until a driver claims it: right after the unbind there is none, which is not yet the
        # answer (an asynchronous probe binds the host driver later, or vfio-pci again).
        return self._wait_driver(address, lambda d: d is not None, timeout)

    def write(self, path: str, content: Optional[str]) -> None:
        if content is None:
            remove_file(path)
        else:
            write_file_atomic(path, content, 0o644)


class VfioRunner:
    def __init__(self, module: AnsibleModule, service: VfioService) -> None:
        self.module = module
        self.service = service
        self.scanner = service.scanner
        self.params = module.params
        self.tracker = DifferenceTracker()

    # -- request --------------------------------------------------------------------------
    def parse_request(self) -> List[PciSelector]:
        """The request's entries, parsed before the host is read: malformed input is refused as such."""
        if not self.params["devices"]:
            raise InvalidInputError("devices", self.params["devices"], "is empty",
                                    "list PCI addresses (0000:01:00.0) or vendor:device ids (10de:2335)")
        return [parse_selector("devices[%d]" % n, entry) for n, entry in enumerate(self.params["devices"])]

    def resolve(self, selectors: List[PciSelector], devices: Dict[str, Dict[str, Any]]) -> List[str]:
        """Addresses of the request among the devices read once by run(); unknown ones are refused."""
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
            if not persist.MODULE_NAME_RE.match(str(module)):
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

    def check_groups(self, addresses: List[str], devices: Dict[str, Dict[str, Any]]) -> None:
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

    def check_safety(self, addresses: List[str], devices: Dict[str, Dict[str, Any]]) -> None:
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

    def check_same_ids(self, addresses: List[str], devices: Dict[str, Dict[str, Any]]) -> None:
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
        if os.path.isdir(self.service.roots.etc("initramfs-tools")):
            return "initramfs-tools"
        if os.path.isdir(self.service.roots.etc("dracut.conf.d")):
            return "dracut"
        return "none"

    def modprobe_path(self) -> str:
        return self.service.roots.etc("modprobe.d", "%s.conf" % self.params["conf_name"])

    def desired_files(self, entries: Dict[str, Tuple[str, Optional[str]]], softdeps: List[str]
                      ) -> Dict[str, Optional[str]]:
        """{path: content or None (absent)} for the persistent configuration."""
        keep = bool(entries)
        files: Dict[str, Optional[str]] = {
            self.modprobe_path(): persist.render_modprobe(entries, softdeps) if keep else None}
        kind = self.initramfs_kind()
        if kind == "initramfs-tools":
            path = self.service.roots.etc("initramfs-tools", "modules")
            current = read_file(path)
            files[path] = None if current is None and not keep else persist.render_initramfs_tools(current, keep)
        elif kind == "dracut":
            files[self.service.roots.etc("dracut.conf.d", "%s.conf" % self.params["conf_name"])] = (
                persist.render_dracut() if keep else None)
        elif keep:
            self.module.warn("no initramfs tool found under %s (initramfs-tools or dracut): vfio-pci is "
                             "not added to the initramfs" % self.service.roots.etc_root)
        return files

    def present_entries(self, addresses: List[str], devices: Dict[str, Dict[str, Any]]
                        ) -> Tuple[Dict[str, Tuple[str, Optional[str]]], List[str]]:
        recorded = persist.parse_devices(read_file(self.modprobe_path()))
        entries: Dict[str, Tuple[str, Optional[str]]] = {}
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
            softdeps.update(persist.default_softdeps(info["vendor_id"], info["class"]))
        return entries, sorted(softdeps)

    def remaining_entries(self, addresses: List[str], devices: Dict[str, Dict[str, Any]]
                          ) -> Tuple[Dict[str, Tuple[str, Optional[str]]], List[str]]:
        """state=absent: the devices the file keeps once the request's devices are taken out."""
        entries = {a: e for a, e in persist.parse_devices(read_file(self.modprobe_path())).items()
                   if a not in addresses}
        softdeps = {m for _unused, m in entries.values() if m} | set(self.params["softdep_modules"])
        for address in entries:
            if address in devices:
                softdeps.update(persist.default_softdeps(devices[address]["vendor_id"], devices[address]["class"]))
        return entries, sorted(softdeps)

    def plan_files(self, desired: Dict[str, Optional[str]]) -> Dict[str, bool]:
        changed: Dict[str, bool] = {}
        for path, content in desired.items():
            before = read_file(path)
            changed[path] = self.tracker.add("file:" + path, before, content)
            if changed[path]:
                self.tracker.action("%s %s" % ("remove" if content is None else "write", path))
        return changed

    # -- run ------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        self.validate()
        selectors = self.parse_request()
        devices = self.scanner.devices()
        addresses = self.resolve(selectors, devices)
        iommu = self.scanner.iommu()
        present = self.params["state"] == "present"
        if present:
            self.check_iommu(iommu)
            if iommu["enabled"]:
                self.check_groups(addresses, devices)
            self.check_safety(addresses, devices)
            if self.params["persistent"]:
                self.check_same_ids(addresses, devices)

        # Decide everything first (check mode stops after this block).
        to_change = self.plan_runtime(addresses, devices, present)
        files_changed: Dict[str, bool] = {}
        desired: Dict[str, Optional[str]] = {}
        if self.params["persistent"]:
            if present:
                entries, softdeps = self.present_entries(addresses, devices)
            else:
                entries, softdeps = self.remaining_entries(addresses, devices)
            desired = self.desired_files(entries, softdeps)
            files_changed = self.plan_files(desired)
        rebuild = self.plan_rebuild(any(files_changed.values()))

        after_drivers = {a: devices[a]["driver"] for a in addresses}
        if not self.module.check_mode:
            try:
                after_drivers = self.apply_runtime(to_change, present, after_drivers)
                if rebuild:
                    # Before the files: whatever fails from here on, the next run rebuilds.
                    self.service.write(self.pending_marker(), PENDING_NOTE % " ".join(self.initramfs_command()))
                for path, changed in files_changed.items():
                    if changed:
                        self.service.write(path, desired[path])
                if rebuild:
                    self.service.run_command(self.initramfs_command())
                    self.service.write(self.pending_marker(), None)
            except KvmError as err:
                # Something was already done (a device rebound, a file written): say so.
                if rebuild and os.path.exists(self.pending_marker()):
                    err.msg += ("; the boot configuration is written but the initramfs is not rebuilt: "
                                "the next run of this task runs %s again" % " ".join(self.initramfs_command()))
                err.details.setdefault("changed", bool(to_change or any(files_changed.values()) or rebuild))
                err.details.setdefault("drivers", {a: self.scanner.driver(a) for a in addresses})
                raise
        else:
            for address in to_change:
                after_drivers[address] = VFIO if present else "host driver"

        before_drivers = {a: devices[a]["driver"] for a in addresses}
        return self.result(addresses, devices, before_drivers, after_drivers, files_changed, desired, rebuild)

    def pending_marker(self) -> str:
        """Exists while an initramfs rebuild is owed (written before the persistent files,
        removed after the command succeeded), so a failed rebuild is retried by the next run
        instead of leaving an old initramfs behind an unchanged file. modprobe.d reads only
        *.conf files, so the marker never configures anything."""
        return self.service.roots.etc("modprobe.d", ".%s.initramfs-pending" % self.params["conf_name"])

    def plan_rebuild(self, files_changed: bool) -> bool:
        """Rebuild when a persistent file changes now or an earlier rebuild failed."""
        pending = os.path.exists(self.pending_marker())
        if pending and (not self.params["persistent"] or self.initramfs_kind() == "none"):
            self.module.warn("an earlier initramfs rebuild failed (%s exists) and this task does not rebuild it: "
                             "run it with persistent: true and an initramfs tool, or rebuild the initramfs by hand "
                             "and remove the file" % self.pending_marker())
            return False
        if self.initramfs_kind() == "none" or not (files_changed or pending):
            return False
        command = " ".join(self.initramfs_command())
        if files_changed:
            self.tracker.action("run %s" % command)
        else:
            self.tracker.action("run %s again: it failed after the boot configuration last changed (%s)"
                                % (command, self.pending_marker()))
        return True

    def plan_runtime(self, addresses: List[str], devices: Dict[str, Dict[str, Any]], present: bool) -> List[str]:
        if not self.params["bind_now"]:
            return []
        to_change = []
        for address in addresses:
            info = devices[address]
            if present and info["driver"] != VFIO:
                to_change.append(address)
                self.tracker.action("bind %s (%s) to vfio-pci (from %s)" % (address, info["id"], info["driver"] or "no driver"))
            elif not present and (info["driver"] == VFIO or info["driver_override"] == VFIO):
                to_change.append(address)
                self.tracker.action("hand %s (%s) back to its host driver" % (address, info["id"]))
        if present and to_change and not self.service.vfio_loaded():
            self.tracker.action("load the vfio-pci module")
        return to_change

    def apply_runtime(self, to_change: List[str], present: bool, drivers: Dict[str, Optional[str]]
                      ) -> Dict[str, Optional[str]]:
        timeout = self.params["bind_timeout"]
        if present and to_change and not self.service.vfio_loaded():
            self.service.load_vfio(self.params["modprobe_command"])
        for address in to_change:
            if present:
                drivers[address] = self.service.bind(address, timeout)
            else:
                drivers[address] = self.service.release(address, timeout)
                if drivers[address] == VFIO:
                    self.module.warn("%s went back to vfio-pci: vfio-pci still has its id from the boot "
                                     "configuration; it is free after the next reboot" % address)
                elif drivers[address] is None:
                    self.module.warn("%s: no host driver claimed it within bind_timeout (%ss); it is unbound "
                                     "(load its driver, or raise bind_timeout when probing is slow)" % (address, timeout))
        return drivers

    def initramfs_command(self) -> List[str]:
        if self.params["initramfs_command"]:
            return list(self.params["initramfs_command"])
        return ["dracut", "-f"] if self.initramfs_kind() == "dracut" else ["update-initramfs", "-u"]

    def result(self, addresses: List[str], devices: Dict[str, Dict[str, Any]], before: Dict[str, Optional[str]],
               after: Dict[str, Optional[str]], files_changed: Dict[str, bool], desired: Dict[str, Optional[str]],
               rebuild: bool) -> Dict[str, Any]:
        listed = [{"address": a, "id": devices[a]["id"], "iommu_group": devices[a]["iommu_group"],
                   "driver_before": before[a], "driver": after[a]} for a in addresses]
        result: Dict[str, Any] = {
            "changed": self.tracker.changed,
            "devices": listed,
            "files": files_changed,
            "initramfs_updated": rebuild and not self.module.check_mode,
            "reboot_required": bool(any(files_changed.values()) and not self.params["bind_now"]),
            "actions": self.tracker.actions,
            "diff": {
                "before": {"drivers": before, "files": {p: self._before_file(p, desired) for p in files_changed}},
                "after": {"drivers": dict(after), "files": {p: desired.get(p) for p in files_changed}},
            },
        }
        return result

    def _before_file(self, path: str, desired: Dict[str, Optional[str]]) -> Optional[str]:
        # The tracker kept the content read before any write.
        for diff in self.tracker.differences:
            if diff["name"] == "file:" + path:
                return diff["before"]
        return desired.get(path)


def main() -> None:
    argument_spec: Dict[str, Any] = dict(
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
    argument_spec.update(roots_argspec("sysfs_root", "proc_root", "etc_root"))
    module = new_module(AnsibleModule, argument_spec=argument_spec, supports_check_mode=True)

    def runner() -> Dict[str, Any]:
        service = VfioService(module, Roots.from_params(module.params))
        return VfioRunner(module, service).run()

    run(module, runner)


if __name__ == "__main__":
    main()
