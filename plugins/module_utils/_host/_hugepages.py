# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hugepages module's argument spec, runner and service.

The service is the only code that touches the host (nr_hugepages under sysfs, meminfo under
/proc, the sysctl.d file under /etc), so the runner's decisions can be tested with a service
that plays a kernel granting fewer pages than asked. The runner refuses a request the host
cannot hold before the first write, and writes through ``tracker.act`` so that check mode
and a real run take the same decisions.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .._core._atomic_file import read_text
from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from .._core._validate import object_name
from ._sysfs import Roots, list_dir, meminfo_kib, put_file, read_attr, roots_argspec, write_attr

SIZES_KIB = {"2M": 2048, "1G": 1048576}
HEADER = "# Managed by mlinfra.kvm.hugepages; edits are overwritten.\n"
GIB = 1024 * 1024  # kB

# 2**40 pages of 4 KiB are 4 PiB: more than any host; bigger counts are typos or attacks.
MAX_PAGES = 2 ** 40


def argument_spec() -> Dict[str, Any]:
    spec: Dict[str, Any] = dict(
        size=dict(type="str", default="2M", choices=list(SIZES_KIB)),
        count=dict(type="int", required=True),
        persistent=dict(type="bool", default=True),
        sysctl_name=dict(type="str", default="80-mlinfra-hugepages"),
        max_memory_percent=dict(type="int", default=90),
        strict=dict(type="bool", default=False),
    )
    spec.update(roots_argspec("sysfs_root", "proc_root", "etc_root"))
    return spec


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
        return meminfo_kib(read_text(self.roots.proc("meminfo")))

    def read(self, path: str) -> Optional[str]:
        return read_text(path)

    def write(self, path: str, content: Optional[str]) -> None:
        put_file(path, content)


class HugepagesRunner(ObjectRunner):
    def __init__(self, module: Any, service: HugepagesService) -> None:
        super().__init__(module, service)
        self.kib = SIZES_KIB[self.params["size"]]

    def run(self) -> Dict[str, Any]:
        """The run, then the verdict on what the kernel granted. A short grant is not a change
        that failed half-way (every write completed), so it is judged after the base's
        partial-change reporting, and a strict failure keeps its own message."""
        result = super().run()
        self.report_shortfall(result["size"], result["requested"], result["granted"])
        return result

    def validate(self) -> None:
        """The options alone; what the host holds is judged in ``refuse_beyond_host``."""
        count = self.params["count"]
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

    def refuse_beyond_host(self, sizes: Dict[int, int], meminfo: Dict[str, int]) -> None:
        """A size the kernel does not offer, or more memory than max_memory_percent allows
        (counting the pages reserved in the other sizes): refused before the first write."""
        kib, count, size, percent = self.kib, self.params["count"], self.params["size"], self.params["max_memory_percent"]
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

    def persistence(self, meminfo: Dict[str, int]) -> Dict[str, Any]:
        """How the reservation survives a reboot: a sysctl.d file or kernel arguments."""
        count = self.params["count"]
        path = self.service.roots.etc("sysctl.d", "%s.conf" % self.params["sysctl_name"])
        if not self.params["persistent"]:
            return {"method": "none", "path": path, "content": self.service.read(path), "kernel_args": []}
        if meminfo.get("Hugepagesize", 2048) == self.kib:
            # vm.nr_hugepages is the default size's count; 0 needs no file.
            content = HEADER + "vm.nr_hugepages = %d\n" % count if count else None
            return {"method": "sysctl", "path": path, "content": content, "kernel_args": []}
        size = self.params["size"]
        return {"method": "kernel_args", "path": path, "content": self.service.read(path),
                "kernel_args": ["hugepagesz=%s" % size, "hugepages=%d" % count] if count else []}

    def converge(self) -> Dict[str, Any]:
        kib, count = self.kib, self.params["count"]
        sizes = self.service.sizes()
        meminfo = self.service.meminfo()
        self.refuse_beyond_host(sizes, meminfo)
        current = sizes[kib]
        plan = self.persistence(meminfo)
        file_before = self.service.read(plan["path"])

        granted = current
        if self.tracker.add("nr_hugepages", current, count):
            nr_path = os.path.join(self.service.size_dir(kib), "nr_hugepages")
            answer = self.tracker.act("set %s to %d" % (nr_path, count), self.service.set_count, kib, count)
            # Check mode predicts a full grant; a real run reports what the kernel wrote back.
            granted = count if self.check else answer
        if self.tracker.add("sysctl_file", file_before, plan["content"]):
            self.tracker.act("%s %s" % ("remove" if plan["content"] is None else "write", plan["path"]),
                             self.service.write, plan["path"], plan["content"])
        return {
            "changed": self.tracker.changed,
            "size": self.params["size"],
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


def run_hugepages(module: Any) -> Dict[str, Any]:
    return HugepagesRunner(module, HugepagesService(Roots.from_params(module.params))).run()
