# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel command line arguments: validation, the GRUB drop-in, grubby's output.

The GRUB drop-in is sourced by grub-mkconfig as shell, so an argument with a space, a quote,
``$``, a backtick or a backslash would break the line or run code: :func:`validate_arg`
allows only the characters real kernel arguments use.
"""
from __future__ import annotations

import re
import shlex
from typing import Dict, List, Optional

from .._core._errors import InvalidInputError

# Letters, digits and the punctuation kernel arguments use (console=ttyS0,115200n8,
# isolcpus=1-3, root=UUID=..., rd.lvm.lv=vg/root, vfio-pci.ids=10de:2335). No shell syntax.
ARG_RE = re.compile(r"^[A-Za-z0-9_.,:=/+@%~-]+$")
HEADER = "# Managed by mlinfra.kvm.kernel_cmdline; edits are overwritten.\n"
DROPIN_RE = re.compile(r'^GRUB_CMDLINE_LINUX_DEFAULT="\$GRUB_CMDLINE_LINUX_DEFAULT ?(.*)"$')


def validate_arg(option: str, value: object) -> str:
    text = value if isinstance(value, str) else None
    if not text or not ARG_RE.match(text) or text.startswith(("=", "-")):
        raise InvalidInputError(
            option, value, "cannot go on the GRUB command line (spaces, quotes, $, backticks, backslashes "
            "and other shell characters break the GRUB line or run as code)",
            "give one argument per list item, made of letters, digits and . , : = / + @ % ~ - _ "
            "(e.g. intel_iommu=on)")
    return text


def arg_key(arg: str) -> str:
    return arg.split("=", 1)[0]


def render_dropin(args: List[str]) -> str:
    """A /etc/default/grub.d/<name>.cfg that appends ``args`` to GRUB_CMDLINE_LINUX_DEFAULT."""
    return HEADER + 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT %s"\n' % " ".join(args)


def parse_dropin(text: Optional[str]) -> List[str]:
    """The arguments a drop-in of ours appends (empty for none or a foreign file)."""
    for line in (text or "").splitlines():
        match = DROPIN_RE.match(line.strip())
        if match:
            return match.group(1).split()
    return []


def parse_grubby_info(text: str) -> Dict[str, List[str]]:
    """``grubby --info=ALL`` -> {kernel path: its args}."""
    kernels: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        key, _unused, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key == "kernel":
            current = value
            kernels[current] = []
        elif key == "args" and current is not None:
            kernels[current] = shlex.split(value) if value else []
    return kernels


def os_family(os_release: Optional[str]) -> Optional[str]:
    """``debian`` (Debian, Ubuntu and their kin) or ``redhat`` (RHEL, Rocky, Alma, Fedora...)."""
    fields: Dict[str, str] = {}
    for line in (os_release or "").splitlines():
        key, _unused, value = line.partition("=")
        fields[key.strip()] = value.strip().strip('"').lower()
    names = [fields.get("ID", "")] + fields.get("ID_LIKE", "").split()
    if any(n in ("debian", "ubuntu") for n in names):
        return "debian"
    if any(n in ("rhel", "fedora", "centos", "rocky", "almalinux", "ol") for n in names):
        return "redhat"
    return None
