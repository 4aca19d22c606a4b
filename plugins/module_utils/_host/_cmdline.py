# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel_cmdline module's argument spec, runner and service.

The text of the arguments (validation, the GRUB drop-in, grubby's output) is ``_grub``'s; this
file decides what to change and changes it. The service is the only code that touches the host
(files under etc_root, /proc, the bootloader commands). Every write and command goes through
``tracker.act``, so check mode plans exactly what a real run does, and a run that fails after
the drop-in was written is reported by the base as the partial change it is.

A failed update-grub must not be forgotten: a marker file is written before the drop-in and
removed only once the command succeeded, and while it exists every run plans the command again.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .._core._atomic_file import read_text
from .._core._command import CommandNotFoundError, CommandTimeoutError, run_bounded
from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from .._core._validate import object_name
from . import _grub as grub
from ._sysfs import Roots, cmdline_args, cpu_vendor, put_file, roots_argspec

IOMMU_ARGS = {"intel": "intel_iommu=on", "amd": "amd_iommu=on"}
PENDING_NOTE = ("# Written by mlinfra.kvm.kernel_cmdline: the GRUB drop-in changed and `%s` has not succeeded "
                "since.\n# The next run of the task runs it again and removes this file.\n")


def argument_spec() -> Dict[str, Any]:
    return dict(
        args=dict(type="list", elements="str", default=[]),
        iommu=dict(type="str", default="none", choices=["none", "auto", "intel", "amd"]),
        state=dict(type="str", default="present", choices=["present", "absent"]),
        name=dict(type="str", default="90-mlinfra-kvm"),
        backend=dict(type="str", default="auto", choices=["auto", "grub_dropin", "grubby"]),
        update_grub_command=dict(type="list", elements="str", default=["update-grub"]),
        grubby_command=dict(type="list", elements="str", default=["grubby"]),
        command_timeout=dict(type="int", default=300),
        **roots_argspec("etc_root", "proc_root"),
    )


class CmdlineService:
    """Files under etc_root, /proc reads and the bootloader commands."""

    def __init__(self, roots: Roots, command_timeout: int) -> None:
        self.roots = roots
        self.command_timeout = command_timeout

    def running_args(self) -> List[str]:
        return cmdline_args(read_text(self.roots.proc("cmdline")))

    def cpu_vendor(self) -> Optional[str]:
        return cpu_vendor(read_text(self.roots.proc("cpuinfo")))

    def os_family(self) -> Optional[str]:
        return grub.os_family(read_text(self.roots.etc("os-release")))

    def run_command(self, argv: List[str]) -> str:
        """Run a bootloader command within command_timeout; any failure names the command."""
        timeout = self.command_timeout
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

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read(self, path: str) -> Optional[str]:
        return read_text(path)

    def write(self, path: str, content: Optional[str]) -> None:
        put_file(path, content)


class CmdlineRunner(ObjectRunner):
    def __init__(self, module: Any, service: CmdlineService) -> None:
        super().__init__(module, service)
        self.commands: List[List[str]] = []
        self.name = ""
        self.args: List[str] = []
        self.backend = ""

    def validate(self) -> None:
        """Everything refused before a file is written: the options, the IOMMU vendor
        (read from cpuinfo) and the backend (read from os-release)."""
        self.name = object_name("name", self.params["name"])
        if self.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.params["command_timeout"], "is below 1",
                                    "give the seconds update-grub or grubby may run, for example 300")
        self.args = self.wanted_args()
        if self.present and not self.args:
            raise InvalidInputError("args", self.params["args"], "is empty (and iommu is none)",
                                    "list kernel arguments or set iommu: auto")
        self.backend = self.resolve_backend()

    @property
    def present(self) -> bool:
        return self.params["state"] == "present"

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

    def resolve_backend(self) -> str:
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

    def converge(self) -> Dict[str, Any]:
        running = self.service.running_args()
        result: Dict[str, Any] = {"backend": self.backend, "args": self.args, "running_cmdline": running}
        if self.backend == "grub_dropin":
            args_for_reboot = self.grub_dropin(self.name, self.args, result)
        else:
            args_for_reboot = self.grubby(self.args, result)
        if self.present:
            pending = [a for a in args_for_reboot if a not in running]
        else:
            pending = [a for a in args_for_reboot if a in running]
        result.update(changed=self.tracker.changed, pending=pending, reboot_required=bool(pending),
                      commands=self.commands)
        return result

    # -- Debian / Ubuntu ------------------------------------------------------------------
    def grub_dropin(self, name: str, args: List[str], result: Dict[str, Any]) -> List[str]:
        path = self.service.roots.etc("default", "grub.d", "%s.cfg" % name)
        before = self.service.read(path)
        had = grub.parse_dropin(before)
        if self.present:
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
        if self.present or changed or pending:
            self.require_grub_defaults()
        if changed or pending:
            self.regenerate(name, path, after, changed)
        return concerned

    def require_grub_defaults(self) -> None:
        """A drop-in is only read through /etc/default/grub (grub-mkconfig sources it, then
        grub.d); without it update-grub fails or no GRUB reads the arguments, so nothing is
        written."""
        defaults = self.service.roots.etc("default", "grub")
        if not self.service.is_file(defaults):
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
        return self.service.exists(self.pending_marker(name))

    def regenerate(self, name: str, path: str, after: Optional[str], changed: bool) -> None:
        """Write the drop-in (when it changed) and run update-grub, remembering the debt."""
        command = list(self.params["update_grub_command"])
        shown = " ".join(command)
        marker = self.pending_marker(name)
        self.commands.append(command)
        written: List[str] = []
        try:
            self.tracker.act("write %s" % marker, self.service.write, marker, PENDING_NOTE % shown)
            written.append(marker)
            if changed:
                self.tracker.act("%s %s" % ("remove" if after is None else "write", path), self.service.write, path, after)
                written.append(path)
            self.tracker.act("run %s" % shown if changed else
                             "run %s again: it failed after %s last changed (%s)" % (shown, path, marker),
                             self.service.run_command, command)
            self.tracker.act("remove %s" % marker, self.service.write, marker, None)
        except KvmError as err:
            if self.service.exists(marker):
                err.msg += ("; %s is %s but grub.cfg is not regenerated: the next run of this task runs %s again"
                            % (path, "removed" if after is None else "written", shown))
            # What the failure reports besides the base's partial change: the paths on disk and the commands.
            err.details.setdefault("written", written)
            err.details.setdefault("commands", self.commands)
            raise

    # -- EL -------------------------------------------------------------------------------
    def grubby(self, args: List[str], result: Dict[str, Any]) -> List[str]:
        if not args:
            raise InvalidInputError("args", self.params["args"], "is empty", "list the arguments to remove (grubby "
                                    "removes arguments by name, it has no drop-in file to delete)")
        grubby = list(self.params["grubby_command"])
        kernels = grub.parse_grubby_info(self.service.run_command(grubby + ["--info=ALL"]))
        if not kernels:
            raise KvmError("%s --info=ALL listed no kernel" % " ".join(grubby))
        if self.present:
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
            self.commands.append(argv)
            self.tracker.act(" ".join(argv), self.service.run_command, argv)
        return args


def run_kernel_cmdline(module: Any) -> Dict[str, Any]:
    roots = Roots(proc_root=module.params["proc_root"], etc_root=module.params["etc_root"])
    return CmdlineRunner(module, CmdlineService(roots, module.params["command_timeout"])).run()
