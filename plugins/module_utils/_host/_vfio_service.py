# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The I/O of the vfio_pci module: sysfs binding writes, the files under /etc and the commands.

Kept apart from the runner (:mod:`._vfio`), which only decides: every write, read of a file the
module owns and command goes through :class:`VfioService`, and the runner calls each side effect
through ``tracker.act`` so that check mode skips it and a failure half-way says what was done.
The read-only model of the devices is :class:`._pci.PciScanner`, reached as ``service.scanner``.
"""
from __future__ import annotations

import os
import time
from typing import Any, List, Optional, Tuple

from .._core._atomic_file import read_text
from .._core._command import CommandNotFoundError, CommandTimeoutError, run_bounded
from .._core._errors import KvmError
from ._pci import PciScanner
from ._sysfs import Roots, remove_file, write_attr, write_file_atomic

VFIO = "vfio-pci"


class VfioService:
    """The only code that writes sysfs, /etc or runs commands for this module."""

    def __init__(self, module: Any, roots: Roots) -> None:
        self.module = module
        self.roots = roots
        self.scanner = PciScanner(roots)

    # -- reads ----------------------------------------------------------------------------
    def vfio_loaded(self) -> bool:
        return os.path.isdir(self.roots.sys("bus", "pci", "drivers", VFIO))

    @staticmethod
    def read(path: str) -> Optional[str]:
        """A persistent file's content, None when it is absent."""
        return read_text(path)

    @staticmethod
    def exists(path: str) -> bool:
        return os.path.exists(path)

    def etc_has_dir(self, *parts: str) -> bool:
        """Whether ``<etc_root>/<parts>`` is a directory (which initramfs tool the host has)."""
        return os.path.isdir(self.roots.etc(*parts))

    # -- the running kernel ---------------------------------------------------------------
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

    # -- the boot configuration -----------------------------------------------------------
    @staticmethod
    def write(path: str, content: Optional[str]) -> None:
        if content is None:
            remove_file(path)
        else:
            write_file_atomic(path, content, 0o644)

    def write_config(self, path: str, content: Optional[str], owed: Optional[Tuple[str, str]]) -> None:
        """Write (or remove, for None) one persistent file; ``owed`` (marker path, note), when
        given, is written first: from then on a failure leaves the initramfs rebuild owed."""
        if owed is not None:
            self.write(*owed)
        self.write(path, content)

    def rebuild_initramfs(self, argv: List[str], marker: str, note: Optional[str]) -> None:
        """Run the initramfs command and remove the marker once it succeeded. ``note``, when
        given, is written to the marker first (no file write put it there in this run)."""
        if note is not None:
            self.write(marker, note)
        self.run_command(argv)
        self.write(marker, None)
