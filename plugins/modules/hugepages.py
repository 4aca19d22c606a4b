#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: hugepages
short_description: Reserve 2M or 1G hugepages now and at boot, and report what the kernel granted
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
version_added: "0.1.0"
description:
  - Sets C(<sysfs_root>/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages) to I(count) now, then
    reads it back. The kernel may grant fewer pages than asked (fragmented memory, typical for 1G
    pages after boot). C(granted) is what it gave; a warning says when it is short.
  - Persistently, pages of the default hugepage size (C(Hugepagesize) in C(/proc/meminfo), usually
    2M) go to C(<etc_root>/sysctl.d/<sysctl_name>.conf) as C(vm.nr_hugepages). Pages of another size
    (1G) can only be reserved reliably at boot; the module returns the C(kernel_args) to put on the
    kernel command line with M(mlinfra.kvm.kernel_cmdline).
  - Refuses a request that would take more than I(max_memory_percent) of C(MemTotal), counting the
    pages already reserved in the other size, before changing anything.
options:
  size:
    description: Hugepage size.
    type: str
    choices: ["2M", "1G"]
    default: "2M"
  count:
    description: Number of pages of I(size) to reserve (0 releases them).
    type: int
    required: true
  persistent:
    description: Also reserve them at every boot (sysctl.d for the default size, C(kernel_args) otherwise).
    type: bool
    default: true
  sysctl_name:
    description: Base name of the sysctl.d file.
    type: str
    default: 80-mlinfra-hugepages
  max_memory_percent:
    description: The most of C(MemTotal) all hugepages together may take, in percent.
    type: int
    default: 90
  strict:
    description: Fail (after the write) when the kernel granted fewer pages than asked, instead of warning.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.host.sysfs_root
  - mlinfra.kvm.host.proc_root
  - mlinfra.kvm.host.etc_root
notes:
  - Reads C(meminfo) below O(proc_root) and writes C(sysctl.d) below O(etc_root).
  - Supports check mode and diff mode.
  - Pages are reserved system-wide (the kernel spreads them over NUMA nodes).
seealso:
  - module: mlinfra.kvm.kernel_cmdline
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: 2M pages for VM memory, now and at boot
  mlinfra.kvm.hugepages:
    size: 2M
    count: 8192

- name: 1G pages now (as many as the kernel can find) and the boot arguments for all of them
  mlinfra.kvm.hugepages:
    size: 1G
    count: 64
  register: huge

- name: Reserve them at boot
  mlinfra.kvm.kernel_cmdline:
    name: 60-mlinfra-hugepages
    args: "{{ huge.kernel_args }}"
  when: huge.kernel_args | length > 0
'''

RETURN = r'''
size:
  description: The page size.
  returned: always
  type: str
  sample: 1G
requested:
  description: Pages asked for.
  returned: always
  type: int
granted:
  description: Pages the kernel holds after the write (read back from nr_hugepages); in check mode the count it would be asked for.
  returned: always
  type: int
fully_granted:
  description: granted equals requested.
  returned: always
  type: bool
free:
  description: Pages of this size not in use (free_hugepages).
  returned: always
  type: int
persistent_method:
  description: sysctl (default size), kernel_args (other sizes) or none.
  returned: always
  type: str
sysctl_file:
  description: The sysctl.d file (when persistent_method is sysctl).
  returned: always
  type: str
kernel_args:
  description: Kernel arguments that reserve the pages at boot (persistent_method kernel_args), else empty.
  returned: always
  type: list
  elements: str
  sample: [hugepagesz=1G, hugepages=64]
'''

import os
from typing import Any, Dict, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._diff import DifferenceTracker
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import (
    Roots, list_dir, meminfo_kib, read_attr, read_file, remove_file, roots_argspec, write_attr,
    write_file_atomic)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import object_name

SIZES_KIB = {"2M": 2048, "1G": 1048576}
HEADER = "# Managed by mlinfra.kvm.hugepages; edits are overwritten.\n"
GIB = 1024 * 1024  # kB

# 2**40 pages of 4 KiB are 4 PiB: more than any host; bigger counts are typos or attacks.
MAX_PAGES = 2 ** 40


def gib(kib: int) -> str:
    return "%.1f GiB" % (kib / GIB)


class HugepagesService:
    """sysfs and /proc reads, the nr_hugepages write and the sysctl.d file."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots

    def size_dir(self, kib: int) -> str:
        return self.roots.sys("kernel", "mm", "hugepages", "hugepages-%dkB" % kib)

    def sizes(self) -> Dict[int, int]:
        """{page size kB: nr_hugepages} for every size the kernel offers."""
        out: Dict[int, int] = {}
        for entry in list_dir(self.roots.sys("kernel", "mm", "hugepages")):
            if entry.startswith("hugepages-") and entry.endswith("kB"):
                kib = int(entry[len("hugepages-"):-2])
                out[kib] = self.count(kib, "nr_hugepages")
        return out

    def count(self, kib: int, attr: str) -> int:
        value = read_attr(os.path.join(self.size_dir(kib), attr))
        return int(value) if value and value.isdigit() else 0

    def set_count(self, kib: int, count: int) -> int:
        write_attr(os.path.join(self.size_dir(kib), "nr_hugepages"), "%d\n" % count)
        # The kernel writes back what it could allocate: that is the answer, not ``count``.
        return self.count(kib, "nr_hugepages")

    def meminfo(self) -> Dict[str, int]:
        return meminfo_kib(read_file(self.roots.proc("meminfo")))

    def write(self, path: str, content: Optional[str]) -> None:
        if content is None:
            remove_file(path)
        else:
            write_file_atomic(path, content, 0o644)


class HugepagesRunner:
    def __init__(self, module: AnsibleModule, service: HugepagesService) -> None:
        self.module = module
        self.service = service
        self.params = module.params
        self.tracker = DifferenceTracker()

    def validate(self, kib: int, sizes: Dict[int, int], meminfo: Dict[str, int]) -> None:
        count = self.params["count"]
        size = self.params["size"]
        if count is None or count < 0:
            raise InvalidInputError("count", count, "is negative", "give 0 or more pages")
        if count > MAX_PAGES:
            # Before any arithmetic: a count like '1e400' overflows the figures of the message below.
            raise InvalidInputError("count", count, "is more pages than any host holds",
                                    "give at most %d" % MAX_PAGES)
        object_name("sysctl_name", self.params["sysctl_name"])
        percent = self.params["max_memory_percent"]
        if percent is None or not 1 <= percent <= 100:
            raise InvalidInputError("max_memory_percent", percent, "is not between 1 and 100", "e.g. 90")
        if kib not in sizes:
            raise InvalidInputError("size", size, "is not offered by this kernel (no %s)" % self.service.size_dir(kib),
                                    "use one of %s (1G pages need the CPU flag pdpe1gb)"
                                    % ", ".join("%dkB" % k for k in sorted(sizes)) if sizes else
                                    "enable hugetlbfs in the kernel (no %s)" % self.service.roots.sys("kernel", "mm", "hugepages"))
        total = meminfo.get("MemTotal")
        if not total:
            raise InvalidInputError("proc_root", self.service.roots.proc_root, "holds no readable meminfo with MemTotal",
                                    "point proc_root at a mounted procfs (default /proc)")
        others = sum(k * n for k, n in sizes.items() if k != kib)
        limit = total * percent // 100
        if count * kib + others > limit:
            most = max(0, (limit - others) // kib)
            raise InvalidInputError(
                "count", count, "asks for %s of %s hugepages%s, more than %d%% of MemTotal (%s) allows"
                % (gib(count * kib), size, " on top of %s already reserved in other sizes" % gib(others) if others else "",
                   percent, gib(total)),
                "lower count to at most %d (or raise max_memory_percent)" % most, most=most)

    def persistence(self, kib: int, meminfo: Dict[str, int]) -> Dict[str, Any]:
        """How the reservation survives a reboot: a sysctl.d file or kernel arguments."""
        count = self.params["count"]
        path = self.service.roots.etc("sysctl.d", "%s.conf" % self.params["sysctl_name"])
        if not self.params["persistent"]:
            return {"method": "none", "path": path, "content": read_file(path), "kernel_args": []}
        if meminfo.get("Hugepagesize", 2048) == kib:
            # vm.nr_hugepages is the default size's count; 0 needs no file.
            content = HEADER + "vm.nr_hugepages = %d\n" % count if count else None
            return {"method": "sysctl", "path": path, "content": content, "kernel_args": []}
        size = self.params["size"]
        return {"method": "kernel_args", "path": path, "content": read_file(path),
                "kernel_args": ["hugepagesz=%s" % size, "hugepages=%d" % count] if count else []}

    def run(self) -> Dict[str, Any]:
        size = self.params["size"]
        kib = SIZES_KIB[size]
        sizes = self.service.sizes()
        meminfo = self.service.meminfo()
        self.validate(kib, sizes, meminfo)
        count = self.params["count"]
        current = sizes[kib]
        plan = self.persistence(kib, meminfo)
        file_before = read_file(plan["path"])

        if self.tracker.add("nr_hugepages", current, count):
            self.tracker.action("set %s to %d" % (os.path.join(self.service.size_dir(kib), "nr_hugepages"), count))
        if self.tracker.add("sysctl_file", file_before, plan["content"]):
            self.tracker.action("%s %s" % ("remove" if plan["content"] is None else "write", plan["path"]))

        granted = current
        if not self.module.check_mode:
            if current != count:
                granted = self.service.set_count(kib, count)
            if file_before != plan["content"]:
                self.service.write(plan["path"], plan["content"])
        else:
            granted = count
        self.report_shortfall(size, count, granted)
        return {
            "changed": self.tracker.changed,
            "size": size,
            "requested": count,
            "granted": granted,
            "fully_granted": granted == count,
            "free": self.service.count(kib, "free_hugepages"),
            "persistent_method": plan["method"],
            "sysctl_file": plan["path"],
            "kernel_args": plan["kernel_args"],
            "diff": {"before": {"nr_hugepages": current, "sysctl_file": file_before or ""},
                     "after": {"nr_hugepages": granted, "sysctl_file": plan["content"] or ""}},
        }

    def report_shortfall(self, size: str, count: int, granted: int) -> None:
        if granted >= count:
            return
        msg = ("the kernel granted %d of %d %s hugepages (not enough contiguous free memory)%s"
               % (granted, count, size, "; reserve them at boot with the returned kernel_args"
                  if size == "1G" else "; retry after dropping caches or reserve them at boot"))
        if self.params["strict"]:
            raise KvmError(msg, requested=count, granted=granted, changed=self.tracker.changed)
        self.module.warn(msg)


def main() -> None:
    argument_spec: Dict[str, Any] = dict(
        size=dict(type="str", default="2M", choices=list(SIZES_KIB)),
        count=dict(type="int", required=True),
        persistent=dict(type="bool", default=True),
        sysctl_name=dict(type="str", default="80-mlinfra-hugepages"),
        max_memory_percent=dict(type="int", default=90),
        strict=dict(type="bool", default=False),
    )
    argument_spec.update(roots_argspec("sysfs_root", "proc_root", "etc_root"))
    module = new_module(AnsibleModule, argument_spec=argument_spec, supports_check_mode=True)

    def runner() -> Dict[str, Any]:
        return HugepagesRunner(module, HugepagesService(Roots.from_params(module.params))).run()

    run(module, runner)


if __name__ == "__main__":
    main()
