#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: kernel_cmdline
short_description: Kernel command line arguments present or absent (GRUB drop-in or grubby), with reboot_required
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
version_added: "0.1.0"
description:
  - Makes kernel arguments (C(intel_iommu=on), C(iommu=pt), C(default_hugepagesz=1G hugepagesz=1G hugepages=N),
    C(vfio-pci.ids=...)) part of the boot configuration.
  - On Debian and Ubuntu it writes a drop-in C(<etc_root>/default/grub.d/<name>.cfg) that appends the
    arguments to C(GRUB_CMDLINE_LINUX_DEFAULT), then runs C(update-grub), only when the drop-in changed.
    The drop-in holds exactly the arguments of the task; use one I(name) per concern.
  - A failed C(update-grub) is not forgotten. A marker C(<etc_root>/default/grub.d/.<name>.update-grub-pending)
    (not a C(.cfg), so GRUB never reads it) is written before the drop-in and removed only once the
    command succeeded; while it exists every run (check mode included) plans C(update-grub) again and
    reports C(changed). The failing run itself reports failed with C(changed=true), the C(commands)
    it ran and what it wrote.
  - On EL (RHEL, Rocky, Alma, Fedora) it runs C(grubby --update-kernel=ALL --args=...) or
    C(--remove-args=...) when a kernel lacks (or still has) an argument.
  - Returns C(reboot_required) by comparing the wanted arguments with the running kernel's
    C(/proc/cmdline); it never reboots.
  - Refuses arguments that would break the GRUB line or run as shell code (spaces, quotes, C($),
    backticks, backslashes...), before changing anything.
options:
  args:
    description: Kernel arguments, one per item (C(intel_iommu=on), C(iommu=pt)).
    type: list
    elements: str
    default: []
  iommu:
    description:
      - Add the argument that turns the IOMMU on. C(auto) picks C(intel_iommu=on) or C(amd_iommu=on)
        from the CPU vendor in C(<proc_root>/cpuinfo).
    type: str
    choices: [none, auto, intel, amd]
    default: none
  state:
    description:
      - C(present) puts the arguments on the command line. C(absent) takes them off; with the GRUB
        backend and no I(args) the whole drop-in is removed.
    type: str
    choices: [present, absent]
    default: present
  name:
    description: Base name of the GRUB drop-in (C(<etc_root>/default/grub.d/<name>.cfg)).
    type: str
    default: 90-mlinfra-kvm
  backend:
    description:
      - C(grub_dropin) (Debian/Ubuntu) or C(grubby) (EL). C(auto) reads C(<etc_root>/os-release).
    type: str
    choices: [auto, grub_dropin, grubby]
    default: auto
  update_grub_command:
    description: argv that regenerates grub.cfg after the drop-in changed.
    type: list
    elements: str
    default: [update-grub]
  grubby_command:
    description: argv prefix for grubby.
    type: list
    elements: str
    default: [grubby]
  command_timeout:
    description:
      - Seconds each I(update_grub_command) or I(grubby_command) run may take. One that runs longer
        is killed (with its child processes) and the task fails naming it.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.host.etc_root
  - mlinfra.kvm.host.proc_root
notes:
  - Reads C(cmdline) and C(cpuinfo) below O(proc_root), C(os-release) below O(etc_root), and writes
    C(default/grub.d) below O(etc_root).
  - The C(grub_dropin) backend needs C(default/grub) below O(etc_root) (the GRUB configuration
    update-grub reads); without it the task fails before writing anything.
  - When the update command fails after the drop-in was written, the task fails with
    C(changed=true), the paths it wrote (C(written)), the failing command (C(cmd)), its C(rc) and
    C(stderr); the next run runs the command again.
  - Supports check mode and diff mode.
  - The new arguments take effect at the next boot; C(reboot_required) says whether one is
    needed. The role P(mlinfra.kvm.hypervisor#role) orchestrates that reboot.
seealso:
  - module: mlinfra.kvm.vfio_pci
  - module: mlinfra.kvm.pci_info
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Turn the IOMMU on for this CPU, in passthrough mode
  mlinfra.kvm.kernel_cmdline:
    iommu: auto
    args: [iommu=pt]
    name: 50-mlinfra-iommu
  register: cmdline

- name: Reboot when the running kernel lacks them
  ansible.builtin.reboot:
  when: cmdline.reboot_required

- name: 1G hugepages at boot
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: [default_hugepagesz=1G, hugepagesz=1G, hugepages=64]

- name: Drop them again
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: [default_hugepagesz=1G, hugepagesz=1G, hugepages=64]
    state: absent
'''

RETURN = r'''
args:
  description: The arguments of the task (with the IOMMU argument when I(iommu) is set).
  returned: always
  type: list
  elements: str
  sample: [intel_iommu=on, iommu=pt]
backend:
  description: grub_dropin or grubby.
  returned: always
  type: str
path:
  description: The GRUB drop-in (grub_dropin backend).
  returned: when backend is grub_dropin
  type: str
reboot_required:
  description: The running kernel's command line differs from what the task wants.
  returned: always
  type: bool
pending:
  description: Arguments the running kernel lacks (present) or still has (absent).
  returned: always
  type: list
  elements: str
running_cmdline:
  description: The running kernel's arguments (C(/proc/cmdline), init's part left out).
  returned: always
  type: list
  elements: str
commands:
  description: Commands run (or that would run, in check mode).
  returned: always
  type: list
  elements: list
written:
  description:
    - The paths this run wrote or removed before the update command failed (the pending marker,
      then the drop-in); the failure also carries C(cmd), C(rc) and C(stderr).
  returned: when the update command fails
  type: list
  elements: str
uid:
  description: Numeric owner of the GRUB drop-in (Ansible adds the file's attributes to a result that names a file).
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 0
gid:
  description: Numeric group of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 0
owner:
  description: Owner name of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: root
group:
  description: Group name of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: root
size:
  description: Size of the GRUB drop-in in bytes.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: int
  sample: 374784
state:
  description: Kind of the GRUB drop-in (C(file)).
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: file
mode:
  description: File mode of the GRUB drop-in.
  returned: when the drop-in exists after the run (grub_dropin backend; check mode only for an existing one)
  type: str
  sample: "0644"
'''

import os
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._host import _grub as grub
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import (
    CommandNotFoundError, CommandTimeoutError, run_bounded)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import (
    Roots, cmdline_args, cpu_vendor, read_file, remove_file, roots_argspec, write_file_atomic)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import object_name

IOMMU_ARGS = {"intel": "intel_iommu=on", "amd": "amd_iommu=on"}
PENDING_NOTE = ("# Written by mlinfra.kvm.kernel_cmdline: the GRUB drop-in changed and `%s` has not succeeded "
                "since.\n# The next run of the task runs it again and removes this file.\n")


class CmdlineService:
    """Files under etc_root, /proc reads and the bootloader commands."""

    def __init__(self, module: AnsibleModule, roots: Roots) -> None:
        self.module = module
        self.roots = roots

    def running_args(self) -> List[str]:
        return cmdline_args(read_file(self.roots.proc("cmdline")))

    def cpu_vendor(self) -> Optional[str]:
        return cpu_vendor(read_file(self.roots.proc("cpuinfo")))

    def os_family(self) -> Optional[str]:
        return grub.os_family(read_file(self.roots.etc("os-release")))

    def run_command(self, argv: List[str]) -> str:
        """Run a bootloader command within command_timeout; any failure names the command."""
        timeout = self.module.params["command_timeout"]
        try:
            rc, out, err = run_bounded(argv, timeout_s=timeout)
        except CommandNotFoundError as exc:
            raise KvmError("command %s cannot be run: %s" % (argv, exc.msg.rsplit(": ", 1)[-1]), cmd=argv, rc=None,
                           stderr="")
        except CommandTimeoutError:
            raise KvmError("command %s did not finish within %s s (command_timeout) and was killed" % (argv, timeout),
                           cmd=argv, rc=None, stderr="", timeout_s=timeout)
        if rc != 0:
            raise KvmError("command %s failed with rc=%s: %s" % (argv, rc, (err or out).strip()),
                           rc=rc, stdout=out, stderr=err, cmd=argv)
        return out

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def write(self, path: str, content: Optional[str]) -> None:
        if content is None:
            remove_file(path)
        else:
            write_file_atomic(path, content, 0o644)


class CmdlineRunner:
    def __init__(self, module: AnsibleModule, service: CmdlineService) -> None:
        self.module = module
        self.service = service
        self.params = module.params
        self.tracker = DifferenceTracker()
        self.commands: List[List[str]] = []

    def wanted_args(self) -> List[str]:
        args: List[str] = []
        for arg in self.params["args"]:
            arg = grub.validate_arg("args", arg)
            if arg not in args:
                args.append(arg)
        iommu = self.params["iommu"]
        if iommu == "auto":
            vendor = self.service.cpu_vendor()
            if vendor is None:
                raise InvalidInputError("iommu", "auto", "cannot tell the CPU vendor from %s (no GenuineIntel or "
                                        "AuthenticAMD vendor_id)" % self.service.roots.proc("cpuinfo"),
                                        "set iommu: intel or iommu: amd")
            iommu = vendor
        if iommu in IOMMU_ARGS and IOMMU_ARGS[iommu] not in args:
            args.insert(0, IOMMU_ARGS[iommu])
        return args

    def backend(self) -> str:
        backend = self.params["backend"]
        if backend != "auto":
            return backend
        family = self.service.os_family()
        if family == "debian":
            return "grub_dropin"
        if family == "redhat":
            return "grubby"
        raise InvalidInputError("backend", "auto", "cannot be resolved: %s names neither a Debian nor an EL family"
                                % self.service.roots.etc("os-release"),
                                "set backend: grub_dropin (GRUB with /etc/default/grub.d) or backend: grubby")

    def run(self) -> Dict[str, Any]:
        name = object_name("name", self.params["name"])
        if self.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.params["command_timeout"], "is below 1",
                                    "give the seconds update-grub or grubby may run, for example 300")
        args = self.wanted_args()
        present = self.params["state"] == "present"
        if present and not args:
            raise InvalidInputError("args", self.params["args"], "is empty (and iommu is none)",
                                    "list kernel arguments or set iommu: auto")
        backend = self.backend()
        running = self.service.running_args()
        result: Dict[str, Any] = {"backend": backend, "args": args, "running_cmdline": running}
        if backend == "grub_dropin":
            args_for_reboot = self.grub_dropin(name, args, present, result)
        else:
            args_for_reboot = self.grubby(args, present, result)
        if present:
            pending = [a for a in args_for_reboot if a not in running]
        else:
            pending = [a for a in args_for_reboot if a in running]
        result.update(changed=self.tracker.changed, pending=pending, reboot_required=bool(pending),
                      commands=self.commands)
        return result

    # -- Debian / Ubuntu ------------------------------------------------------------------
    def grub_dropin(self, name: str, args: List[str], present: bool, result: Dict[str, Any]) -> List[str]:
        path = self.service.roots.etc("default", "grub.d", "%s.cfg" % name)
        before = read_file(path)
        had = grub.parse_dropin(before)
        if present:
            after: Optional[str] = grub.render_dropin(args)
            concerned = args
        else:
            keep = [a for a in had if a not in args] if args else []
            after = grub.render_dropin(keep) if keep else None
            concerned = args or had
        result["path"] = path
        result["diff"] = {"before": before or "", "after": after or "", "before_header": path, "after_header": path}
        changed = self.tracker.add(path, before, after)
        pending = self.regeneration_pending(name)
        if present or changed or pending:
            self.require_grub_defaults()
        if changed:
            self.tracker.action("%s %s" % ("remove" if after is None else "write", path))
        if changed or pending:
            self.regenerate(name, path, after, changed)
        return concerned

    def require_grub_defaults(self) -> None:
        """A drop-in is only read through /etc/default/grub (grub-mkconfig sources it, then
        grub.d); without it update-grub fails or no GRUB reads the arguments, so nothing is
        written."""
        defaults = self.service.roots.etc("default", "grub")
        if not self.service.exists(defaults):
            raise InvalidInputError(
                "backend", "grub_dropin", "needs %s (the GRUB settings update-grub reads, which source the drop-ins), "
                "and it does not exist; nothing was written" % defaults,
                "install GRUB on this host (the grub-pc or grub-efi-amd64 package creates it), or set backend: grubby "
                "on a host whose bootloader grubby manages", path=defaults)

    def pending_marker(self, name: str) -> str:
        """Exists while update-grub is owed for the drop-in (written before the drop-in,
        removed after the command succeeded), so a failed update-grub is retried by the next
        run. grub-mkconfig sources only *.cfg files, so the marker never reaches GRUB."""
        return self.service.roots.etc("default", "grub.d", ".%s.update-grub-pending" % name)

    def regeneration_pending(self, name: str) -> bool:
        return os.path.exists(self.pending_marker(name))

    def regenerate(self, name: str, path: str, after: Optional[str], changed: bool) -> None:
        """Write the drop-in (when it changed) and run update-grub, remembering the debt."""
        command = list(self.params["update_grub_command"])
        marker = self.pending_marker(name)
        if not changed:
            self.tracker.action("run %s again: it failed after %s last changed (%s)"
                                % (" ".join(command), path, marker))
        self.commands.append(command)
        if self.module.check_mode:
            return
        written: List[str] = []
        try:
            self.service.write(marker, PENDING_NOTE % " ".join(command))
            written.append(marker)
            if changed:
                self.service.write(path, after)
                written.append(path)
            self.service.run_command(command)
            self.service.write(marker, None)
        except KvmError as err:
            if os.path.exists(marker):
                err.msg += ("; %s is %s but grub.cfg is not regenerated: the next run of this task runs %s again"
                            % (path, "removed" if after is None else "written", " ".join(command)))
            # The marker (and the drop-in) are on disk: that is a change, whatever failed after.
            err.details.setdefault("changed", bool(written))
            err.details.setdefault("written", written)
            err.details.setdefault("commands", self.commands)
            raise

    # -- EL -------------------------------------------------------------------------------
    def grubby(self, args: List[str], present: bool, result: Dict[str, Any]) -> List[str]:
        if not args:
            raise InvalidInputError("args", self.params["args"], "is empty", "list the arguments to remove (grubby "
                                    "removes arguments by name, it has no drop-in file to delete)")
        grubby = list(self.params["grubby_command"])
        kernels = grub.parse_grubby_info(self.service.run_command(grubby + ["--info=ALL"]))
        if not kernels:
            raise KvmError("%s --info=ALL listed no kernel" % " ".join(grubby))
        if present:
            todo = [a for a in args if any(a not in kargs for kargs in kernels.values())]
            argv = grubby + ["--update-kernel=ALL", "--args=%s" % " ".join(todo)]
            after = {k: v + [a for a in todo if a not in v] for k, v in kernels.items()}
        else:
            todo = [a for a in args if any(a in kargs for kargs in kernels.values())]
            argv = grubby + ["--update-kernel=ALL", "--remove-args=%s" % " ".join(todo)]
            after = {k: [a for a in v if a not in todo] for k, v in kernels.items()}
        result["diff"] = {"before": {"kernels": kernels}, "after": {"kernels": after}}
        if todo:
            self.tracker.add("kernels", kernels, after)
            self.tracker.action(" ".join(argv))
            self.commands.append(argv)
            if not self.module.check_mode:
                self.service.run_command(argv)
        return args


def main() -> None:
    module = new_module(
        AnsibleModule,
        argument_spec=dict(
            args=dict(type="list", elements="str", default=[]),
            iommu=dict(type="str", default="none", choices=["none", "auto", "intel", "amd"]),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            name=dict(type="str", default="90-mlinfra-kvm"),
            backend=dict(type="str", default="auto", choices=["auto", "grub_dropin", "grubby"]),
            update_grub_command=dict(type="list", elements="str", default=["update-grub"]),
            grubby_command=dict(type="list", elements="str", default=["grubby"]),
            command_timeout=dict(type="int", default=300),
            **roots_argspec("etc_root", "proc_root"),
        ),
        supports_check_mode=True,
    )

    def runner() -> Dict[str, Any]:
        roots = Roots(proc_root=module.params["proc_root"], etc_root=module.params["etc_root"])
        return CmdlineRunner(module, CmdlineService(module, roots)).run()

    run(module, runner)


if __name__ == "__main__":
    main()
