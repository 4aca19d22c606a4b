# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn the domain module's options into desired field values (see ``_domain_spec``).

Everything here runs before any side effect: bad input raises InvalidInputError (naming
option, value and fix), references to things that do not exist (networks, volumes, PCI
devices) and hostdevs that cannot be passed through raise too, so a refused request
changes nothing.

Only options the user set become fields; defaults for a *new* domain (q35, BIOS, a serial
console, rng, guest agent...) are added by :func:`creation_defaults`, so an update never
touches what the user did not ask about.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ._domain_spec import (
    DEFAULT_OVMF_CODE, DEFAULT_OVMF_VARS, assign_targets, derived_mac, hostdev_addresses,
    is_xml_name, read_cpu, read_max_memory, read_max_vcpus, read_memory, read_vcpus)
from .._core._errors import ConflictError, InvalidInputError
from ._storage_paths import check_allowed_paths
from .._host._pci import group_blockers
from .._host._pci_select import parse_selector
from .._core._validate import (
    CPU_INDEX_MAX, VCPUS_MAX, absolute_path, cpuset, int_range, mac_address, memory_kib_range,
    object_name, plain_texts, size_bytes)

_BARE_NUMBER_RE = re.compile(r"^\s*\d+\s*$")

# Every free-text option that ends up in the domain XML: a control character in any of them
# would make lxml raise instead of the module reporting the option (see _validate.plain_texts).
TEXT_OPTIONS = (
    "memory", "max_memory", "machine", "arch", "kernel", "initrd", "cmdline", "ovmf_code",
    "ovmf_vars", "console_log", "description", "hypervisor_vendor_id", "hugepage_size", "metadata{}",
    "disks[].pool", "disks[].volume", "disks[].path", "disks[].format", "disks[].target",
    "cdroms[].pool", "cdroms[].volume", "cdroms[].path", "cdroms[].target",
    "interfaces[].network", "interfaces[].bridge", "interfaces[].model", "interfaces[].mac",
    "cpu_pinning.vcpupin[].cpuset", "cpu_pinning.emulatorpin", "numa_tuning.nodeset",
    "hostdevs[].address", "hostdevs[].vendor", "hostdevs[].device",
)

# Linux keeps at most 1024 NUMA nodes (MAX_NUMNODES with NODES_SHIFT=10).
NUMA_NODE_MAX = 1023
# Hugepage sizes are powers of two; x86 has 2 MiB and 1 GiB, other architectures go from
# 64 KiB (arm64 contiguous PTEs) to 16 GiB (ppc64).
HUGEPAGE_MIN_KIB = 4
HUGEPAGE_MAX_KIB = 16 * 1024 * 1024
# Seconds: a day is more than any guest shutdown or DHCP lease wait this module should block on.
TIMEOUT_MAX_S = 86400
# Linux interface names are at most 15 characters (IFNAMSIZ - 1).
IFNAME_MAX = 15


def memory_kib(option: str, value: Any) -> Optional[int]:
    """Sizes with a unit (2G, 512M, 1.5GiB); a bare number means MiB, as in virt-install.
    Bounded to 16 MiB..16 TiB (see _validate.MEMORY_MIN_KIB)."""
    if value is None:
        return None
    if isinstance(value, int) or _BARE_NUMBER_RE.match(str(value)):
        kib = int(value) * 1024
    else:
        size = size_bytes(option, value)
        if size % 1024:
            raise InvalidInputError(option, value, "is not a whole number of KiB",
                                    "give a size such as 2G or 512M")
        kib = size // 1024
    return memory_kib_range(option, value, kib)


def hugepage_kib(option: str, value: Any) -> int:
    """A hugepage size in KiB: a power of two between 4 KiB and 16 GiB."""
    size = size_bytes(option, value)
    kib = size // 1024
    if size % 1024 or kib & (kib - 1) or not HUGEPAGE_MIN_KIB <= kib <= HUGEPAGE_MAX_KIB:
        raise InvalidInputError(option, value, "is not a hugepage size",
                                "give a power of two from 4K to 16G, such as 2M or 1G (see "
                                "/sys/kernel/mm/hugepages for this host's sizes)")
    return kib


class DomainRequest:
    """The validated request: ``desired`` field values plus what the runner needs besides.

    ``shut_off`` says the existing domain will not be running when the definition is written:
    then a memory or vCPU count above its maximum raises the maximum too (only a running
    domain cannot take a new maximum).
    """

    def __init__(self, params: Dict[str, Any], service: Any, existing_root: Any,
                 shut_off: bool = False) -> None:
        self.params = params
        self.service = service
        self.existing = existing_root
        self.shut_off = shut_off
        self.name = object_name("name", params["name"])
        self.desired: Dict[str, Any] = {}
        self.new_hostdevs: List[str] = []
        self._storage_policy: Any = False  # read from the host once, by the first disk with a path

    # ------------------------------------------------------------------ entry point
    def build(self) -> Dict[str, Any]:
        p = self.params
        d = self.desired
        plain_texts(p, TEXT_OPTIONS, multiline=("description",))
        for option in ("shutdown_timeout", "wait_for_ip_timeout"):
            if p.get(option) is not None:
                int_range(option, p[option], 0, TIMEOUT_MAX_S, "seconds; a day at most")
        if p.get("virt_type"):
            d["virt_type"] = p["virt_type"]
        if p.get("machine"):
            d["machine"] = p["machine"]
        if p.get("arch"):
            d["arch"] = p["arch"]
        self._memory_and_vcpus()
        self._cpu()
        self._firmware()
        self._storage()
        self._interfaces()
        for option in ("rng", "guest_agent", "memballoon"):
            if p.get(option) is not None:
                d[option] = p[option]
        if p.get("console") is not None or p.get("console_log"):
            log = absolute_path("console_log", p["console_log"]) if p.get("console_log") else None
            d["console"] = {"enabled": p.get("console") is not False, "log": log}
            if log and p.get("console") is False:
                raise InvalidInputError("console_log", log, "needs a serial console",
                                        "drop console: false or console_log")
        if p.get("hide_hypervisor") is not None:
            vendor = p.get("hypervisor_vendor_id") or "mlinfra"
            if not re.match(r"^[A-Za-z0-9]{1,12}$", vendor):
                raise InvalidInputError("hypervisor_vendor_id", vendor, "is not 1-12 letters or digits",
                                        "use a short alphanumeric string such as 'mlinfra'")
            d["hide_hypervisor"] = ({"kvm_hidden": True, "vendor_id": vendor} if p["hide_hypervisor"]
                                    else {"kvm_hidden": False, "vendor_id": None})
        if p.get("metadata") is not None:
            d["metadata"] = self._metadata(p["metadata"])
        if p.get("description") is not None:
            d["description"] = p["description"] or None
        self._hostdevs()
        return d

    def creation_defaults(self) -> None:
        """Fill what a new domain needs and the user left out."""
        d = self.desired
        if d.get("memory_kib") is None or d.get("vcpus") is None:
            missing = "memory" if d.get("memory_kib") is None else "vcpus"
            why = ("to declare the whole domain %s (state replaced or overridden)" % self.name
                   if self.existing is not None else "to define domain %s, which does not exist yet" % self.name)
            raise InvalidInputError(missing, None, "is required %s" % why, "set memory and vcpus")
        d.setdefault("virt_type", "kvm" if self.service.kvm_available() else "qemu")
        d.setdefault("machine", "q35")
        d.setdefault("arch", "x86_64")
        d.setdefault("max_memory_kib", d["memory_kib"])
        d.setdefault("max_vcpus", d["vcpus"])
        cpu = d.setdefault("cpu", {"mode": None, "sockets": None, "cores": None, "threads": None})
        if cpu.get("mode") is None:
            # host-passthrough needs KVM; TCG offers 'maximum' (see lab-facts).
            cpu["mode"] = "host-passthrough" if d["virt_type"] == "kvm" else "maximum"
        d.setdefault("firmware", {"type": "bios"})
        if d["firmware"]["type"] != "kernel":
            d.setdefault("boot", ["hd"])
        d.setdefault("console", {"enabled": True, "log": None})
        d.setdefault("rng", True)
        d.setdefault("guest_agent", True)
        self._check_limits(d["memory_kib"], d["max_memory_kib"], d["vcpus"], d["max_vcpus"])

    def replacement_defaults(self) -> None:
        """What a request that declares the whole domain means by leaving an option out: no
        such devices, no metadata or description, no pinning, hugepages or hidden hypervisor.
        The scalar options fall back to creation_defaults (a new domain's values)."""
        d = self.desired
        for option in ("disks", "cdroms", "interfaces", "hostdevs"):
            d.setdefault(option, [])
        d.setdefault("metadata", {})
        d.setdefault("description", None)
        d.setdefault("memballoon", True)
        d.setdefault("cputune", {"vcpupin": [], "emulatorpin": None})
        d.setdefault("hugepages", {"enabled": False, "page_size_kib": None})
        d.setdefault("hide_hypervisor", {"kvm_hidden": False, "vendor_id": None})

    # ------------------------------------------------------------------ parts
    def _memory_and_vcpus(self) -> None:
        p, d = self.params, self.desired
        mem = memory_kib("memory", p.get("memory"))
        max_mem = memory_kib("max_memory", p.get("max_memory"))
        for option in ("vcpus", "max_vcpus"):
            if p.get(option) is not None:
                int_range(option, p[option], 1, VCPUS_MAX, "QEMU's q35 and KVM's x86 maximum; "
                          "`virsh domcapabilities` shows this host's")
        self._check_host_memory("memory", mem)
        self._check_host_memory("max_memory", max_mem)
        if mem is not None:
            d["memory_kib"] = mem
        if max_mem is not None:
            d["max_memory_kib"] = max_mem
        if p.get("vcpus") is not None:
            d["vcpus"] = p["vcpus"]
        if p.get("max_vcpus") is not None:
            d["max_vcpus"] = p["max_vcpus"]
        if self.existing is not None and self.shut_off:
            self._raise_maxima()
        if self.existing is not None:
            self._check_limits(
                d.get("memory_kib", read_memory(self.existing)),
                d.get("max_memory_kib", read_max_memory(self.existing)),
                d.get("vcpus", read_vcpus(self.existing)),
                d.get("max_vcpus", read_max_vcpus(self.existing)))
        else:
            self._check_limits(mem, max_mem, p.get("vcpus"), p.get("max_vcpus"))

    def _check_host_memory(self, option: str, kib: Optional[int]) -> None:
        """Memory beyond the host's can be defined, but QEMU cannot allocate it at the start
        ("cannot set up guest memory"): refused before anything is defined."""
        host = self.service.host_limits() if kib is not None else None
        if host is None or kib <= host["memory_kib"]:
            return
        raise InvalidInputError(
            option, self.params.get(option),
            "is %d MiB, more than the host's total memory (%d MiB, as libvirt reports it for %s)"
            % (kib // 1024, host["memory_kib"] // 1024, host["uri"]),
            "give less than %dM: the host needs memory of its own" % (host["memory_kib"] // 1024))

    def _host_cpuset(self, option: str, value: Any) -> List[int]:
        """A cpuset of host CPUs. A pin to a CPU the host lacks is defined, then fails the
        start (cgroup cpuset.cpus: 'Numerical result out of range'): refused before anything
        is defined."""
        cpus = cpuset(option, value, CPU_INDEX_MAX)
        host = self.service.host_limits()
        missing = [c for c in cpus if host is not None and c >= host["cpus"]]
        if missing:
            raise InvalidInputError(
                option, value, "names CPU %d, but the host has %d CPUs (0-%d, as libvirt reports them for %s)"
                % (missing[0], host["cpus"], host["cpus"] - 1, host["uri"]),
                "pin to CPUs from 0 to %d (see lscpu or `virsh nodeinfo` on the host)" % (host["cpus"] - 1))
        return cpus

    def _raise_maxima(self) -> None:
        """A shut-off domain takes a new maximum with its next definition: memory or vCPUs
        above the current maximum raise it, unless the request sets the maximum itself."""
        d = self.desired
        if "max_memory_kib" not in d and d.get("memory_kib", 0) > (read_max_memory(self.existing) or 0):
            d["max_memory_kib"] = d["memory_kib"]
        if "max_vcpus" not in d and d.get("vcpus", 0) > (read_max_vcpus(self.existing) or 0):
            self._check_topology_allows(d["vcpus"])
            d["max_vcpus"] = d["vcpus"]

    def _check_topology_allows(self, vcpus: int) -> None:
        """An existing CPU topology fixes the maximum (libvirt refuses a mismatch): raising
        it needs a topology that multiplies to the new count."""
        if (self.params.get("cpu") or {}).get("sockets"):
            return  # the request's own topology is checked against vcpus in _cpu
        topo = read_cpu(self.existing)
        if all(topo.get(k) for k in ("sockets", "cores", "threads")):
            total = topo["sockets"] * topo["cores"] * topo["threads"]
            if total != vcpus:
                raise InvalidInputError(
                    "vcpus", vcpus, "is above the domain's maximum vCPUs (%d), which its CPU topology "
                    "fixes (sockets*cores*threads = %d)" % (read_max_vcpus(self.existing), total),
                    "set cpu.sockets, cpu.cores and cpu.threads to multiply to %d (with max_vcpus: %d)"
                    % (vcpus, vcpus))

    def _check_limits(self, mem: Optional[int], max_mem: Optional[int],
                      vcpus: Optional[int], max_vcpus: Optional[int]) -> None:
        if mem is not None and max_mem is not None and mem > max_mem:
            if self.params.get("memory") is None:
                raise InvalidInputError(
                    "max_memory", self.params.get("max_memory"),
                    "is below the domain's current memory (%d MiB)" % (mem // 1024),
                    "lower memory with it or give a larger max_memory")
            raise InvalidInputError(
                "memory", self.params.get("memory"),
                "is above the domain's maximum memory (%d MiB)" % (max_mem // 1024),
                "lower memory or raise max_memory" + self._restart_note())
        if vcpus is not None and max_vcpus is not None and vcpus > max_vcpus:
            if self.params.get("vcpus") is None:
                raise InvalidInputError(
                    "max_vcpus", self.params.get("max_vcpus"),
                    "is below the domain's current vCPUs (%d)" % vcpus,
                    "lower vcpus with it or give a larger max_vcpus")
            raise InvalidInputError(
                "vcpus", self.params.get("vcpus"), "is above the domain's maximum vCPUs (%d)" % max_vcpus,
                "lower vcpus or raise max_vcpus" + self._restart_note())

    def _restart_note(self) -> str:
        # Only a running domain needs the restart; a shut-off one gets here only when the
        # request itself sets a maximum below the current value.
        running = self.existing is not None and not self.shut_off
        return " (a running domain applies a new maximum at its next restart)" if running else ""

    def _cpu(self) -> None:
        p, d = self.params, self.desired
        cpu = p.get("cpu")
        if cpu:
            d["cpu"] = {k: cpu.get(k) for k in ("mode", "sockets", "cores", "threads")}
            topo = [cpu.get(k) for k in ("sockets", "cores", "threads")]
            for key in ("sockets", "cores", "threads"):
                if cpu.get(key) is not None:
                    int_range("cpu." + key, cpu[key], 1, VCPUS_MAX, "at most the vCPU maximum")
            if any(topo):
                if not all(topo):
                    raise InvalidInputError("cpu", cpu, "sets only part of the topology",
                                            "set cpu.sockets, cpu.cores and cpu.threads together")
                total = topo[0] * topo[1] * topo[2]
                max_vcpus = d.get("max_vcpus") or p.get("vcpus") or (
                    read_max_vcpus(self.existing) if self.existing is not None else None)
                if max_vcpus and total != max_vcpus:
                    raise InvalidInputError(
                        "cpu", cpu, "has sockets*cores*threads = %d, not the maximum vCPUs (%d)"
                        % (total, max_vcpus), "make the topology multiply to max_vcpus")
        pinning = p.get("cpu_pinning")
        if pinning is not None:
            d["cputune"] = {"vcpupin": self._vcpupins(pinning.get("vcpupin") or []),
                            "emulatorpin": (self._host_cpuset("cpu_pinning.emulatorpin", pinning["emulatorpin"])
                                            if pinning.get("emulatorpin") else None)}
        numa = p.get("numa_tuning")
        if numa is not None:
            d["numatune"] = {"mode": numa.get("mode") or "strict",
                             "nodeset": cpuset("numa_tuning.nodeset", numa.get("nodeset"), NUMA_NODE_MAX)}
        if p.get("hugepage_size") and not p.get("hugepages"):
            # Validated even when unused, so that a typo does not wait for hugepages: true.
            hugepage_kib("hugepage_size", p["hugepage_size"])
        if p.get("hugepages") is not None:
            page = hugepage_kib("hugepage_size", p["hugepage_size"]) if p.get("hugepage_size") else None
            d["hugepages"] = {"enabled": bool(p["hugepages"]),
                              "page_size_kib": page if page and p["hugepages"] else None}

    def _vcpupins(self, items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """vcpupin entries: each vCPU once, and below the maximum (libvirt refuses both)."""
        # The maximum the definition will have: requested, else the existing one, else (a new
        # domain) vcpus, which creation_defaults makes the maximum.
        limit = self.desired.get("max_vcpus") or (
            read_max_vcpus(self.existing) if self.existing is not None else self.desired.get("vcpus")) \
            or VCPUS_MAX
        pins: Dict[int, Dict[str, Any]] = {}
        for index, pin in enumerate(items):
            option = "cpu_pinning.vcpupin[%d]" % index
            vcpu = int_range(option + ".vcpu", pin["vcpu"], 0, limit - 1,
                             "vCPUs count from 0 to max_vcpus - 1")
            if vcpu in pins:
                raise InvalidInputError(option + ".vcpu", vcpu, "is pinned twice",
                                        "give one vcpupin entry per vCPU")
            pins[vcpu] = {"vcpu": vcpu, "cpuset": self._host_cpuset(option + ".cpuset", pin["cpuset"])}
        return [pins[v] for v in sorted(pins)]

    def _firmware(self) -> None:
        p, d = self.params, self.desired
        firmware = p.get("firmware")
        if firmware is None and p.get("kernel"):
            firmware = "kernel"
        if firmware is None:
            for option in ("initrd", "cmdline"):
                if p.get(option):
                    raise InvalidInputError(option, p[option], "is set without firmware",
                                            "set firmware: kernel and kernel with initrd and cmdline")
        if firmware == "uefi":
            d["firmware"] = {"type": "uefi",
                             "loader": absolute_path("ovmf_code", p.get("ovmf_code") or DEFAULT_OVMF_CODE),
                             "nvram_template": absolute_path("ovmf_vars", p.get("ovmf_vars") or DEFAULT_OVMF_VARS)}
            for option in ("ovmf_code", "ovmf_vars"):
                path = d["firmware"]["loader" if option == "ovmf_code" else "nvram_template"]
                if self.service.path_exists(path) is False:
                    raise InvalidInputError(option, path, "does not exist",
                                            "install the ovmf package or give the OVMF file's path")
        elif firmware == "kernel":
            if not p.get("kernel"):
                raise InvalidInputError("kernel", None, "is required with firmware: kernel",
                                        "give the path of the guest kernel (vmlinuz)")
            d["firmware"] = {"type": "kernel", "kernel": absolute_path("kernel", p["kernel"]),
                             "initrd": absolute_path("initrd", p["initrd"]) if p.get("initrd") else None,
                             "cmdline": p.get("cmdline") or None}
        elif firmware == "bios":
            d["firmware"] = {"type": "bios"}
        if p.get("boot") is not None:
            d["boot"] = list(p["boot"])

    def _storage(self) -> None:
        p, d = self.params, self.desired
        check_allowed_paths(p.get("allowed_paths"))
        disks = [self._disk("disks[%d]" % i, item, "disk") for i, item in enumerate(p.get("disks") or [])]
        cdroms = [self._disk("cdroms[%d]" % i, item, "cdrom") for i, item in enumerate(p.get("cdroms") or [])]
        assign_targets(disks, cdroms)
        targets = [x["target"] for x in disks + cdroms]
        if len(set(targets)) != len(targets):
            raise InvalidInputError("disks", targets, "use one target name twice",
                                    "give each disk and cdrom its own target (vda, vdb, sda...)")
        if p.get("disks") is not None:
            d["disks"] = sorted(disks, key=lambda x: x["target"])
        if p.get("cdroms") is not None:
            d["cdroms"] = sorted(cdroms, key=lambda x: x["target"])

    def _disk(self, option: str, item: Dict[str, Any], device: str) -> Dict[str, Any]:
        pool, volume, path = item.get("pool"), item.get("volume"), item.get("path")
        if bool(path) == bool(pool or volume) or bool(pool) != bool(volume):
            raise InvalidInputError(option, item, "needs either pool and volume, or path",
                                    "give pool + volume for a pool volume, or path for a file")
        fmt = item.get("format")
        if pool:
            if not self.service.pool_exists(pool):
                raise InvalidInputError(option + ".pool", pool, "is not a storage pool of this libvirt",
                                        "create it first (mlinfra.kvm.pool) or fix the name")
            found = self.service.volume_format(pool, volume)
            if found is None:
                raise InvalidInputError(option + ".volume", volume,
                                        "does not exist in pool %s (or the pool is not active)" % pool,
                                        "create it first (mlinfra.kvm.volume) or fix the name")
            fmt = fmt or found
        else:
            path = absolute_path(option + ".path", path)
            if self.service.path_exists(path) is False:
                raise InvalidInputError(option + ".path", path, "does not exist",
                                        "create the image first or fix the path")
            if device == "disk":
                self._check_disk_path(option + ".path", path)
            fmt = fmt or ("qcow2" if path.endswith(".qcow2") else "raw")
        out = {"pool": pool, "volume": volume, "path": path, "format": fmt,
               "bus": item.get("bus") or ("virtio" if device == "disk" else "sata"),
               "target": item.get("target")}
        if device == "disk":
            out["readonly"] = bool(item.get("readonly"))
        return out

    def _check_disk_path(self, option: str, path: str) -> None:
        """A disk file the guest will read and write: inside the host's storage pools or
        allowed_paths, with a backing chain of image files that ends (_storage_paths)."""
        if self._storage_policy is False:
            self._storage_policy = self.service.storage_policy(self.params.get("allowed_paths"))
        if self._storage_policy is not None:  # None: rendered, no host to ask
            self._storage_policy.check_image(option, path)

    def _interfaces(self) -> None:
        p = self.params
        if p.get("interfaces") is None:
            return
        out = []
        for index, item in enumerate(p["interfaces"]):
            option = "interfaces[%d]" % index
            network, bridge = item.get("network"), item.get("bridge")
            if bool(network) == bool(bridge):
                raise InvalidInputError(option, item, "needs exactly one of network or bridge",
                                        "give the libvirt network name (network) or a host bridge (bridge)")
            if bridge and len(bridge) > IFNAME_MAX:
                raise InvalidInputError(option + ".bridge", bridge, "is longer than %d characters" % IFNAME_MAX,
                                        "give the host bridge's name as `ip link` shows it")
            if network and not self.service.network_exists(network):
                raise InvalidInputError(option + ".network", network, "is not a libvirt network here",
                                        "define it first (mlinfra.kvm.network) or fix the name")
            mac = (mac_address(option + ".mac", item["mac"]) if item.get("mac")
                   else derived_mac(self.name, index))
            out.append({"network": network, "bridge": bridge, "model": item.get("model") or "virtio",
                        "mac": mac})
        macs = [x["mac"] for x in out]
        if len(set(macs)) != len(macs):
            raise InvalidInputError("interfaces", macs, "repeat a MAC address", "give each interface its own MAC")
        self.desired["interfaces"] = out

    def _metadata(self, value: Dict[str, Any]) -> Dict[str, str]:
        out = {}
        for key, item in value.items():
            if not is_xml_name(str(key)):
                raise InvalidInputError("metadata", key, "is not usable as an XML element name",
                                        "use keys of letters, digits, '_', '-' and '.', starting with a letter")
            if isinstance(item, (dict, list)):
                raise InvalidInputError("metadata.%s" % key, item, "is not a scalar",
                                        "give strings (join lists with commas)")
            out[str(key)] = "" if item is None else str(item)
        return out

    # ------------------------------------------------------------------ hostdevs
    def _hostdevs(self) -> None:
        items = self.params.get("hostdevs")
        if items is None:
            return
        # Parse every entry before looking at the host: a malformed address is bad input
        # whatever the host holds. One entry is one device (and, with include_functions, its
        # slot's other functions): a selector without an index takes the first match.
        parsed = []
        for index, item in enumerate(items):
            selector = parse_selector("hostdevs[%d]" % index, item)
            if selector.index is None and selector.address is None:
                selector.index = 0
            parsed.append((selector, bool(item.get("managed", True))))
        if not parsed:  # no passthrough: the host's PCI devices are not read at all
            self.desired["hostdevs"] = []
            return
        pci = self.service.pci()
        devices = pci.devices()
        wanted: Dict[str, bool] = {}
        for selector, managed in parsed:
            for addr in selector.resolve(devices, "in " + pci.describe()):
                wanted.setdefault(addr, managed)
        self.desired["hostdevs"] = sorted(({"address": a, "managed": m} for a, m in wanted.items()),
                                          key=lambda h: h["address"])
        already = {h["address"] for h in hostdev_addresses(self.existing)} if self.existing is not None else set()
        self.new_hostdevs = [a for a in sorted(wanted) if a not in already]
        self._check_passthrough(self.new_hostdevs)

    def _check_passthrough(self, addresses: List[str]) -> None:
        """Refuse hostdevs that QEMU could not take: a group with a device on a host driver fails
        at start with 'group N is not viable' (``_pci.group_blockers``, the rule pci_info reports
        too); a device of a running domain cannot be shared."""
        if not addresses:
            return
        pci = self.service.pci()
        devices = pci.devices()
        for address in addresses:
            dev = devices[address]
            if dev.iommu_group is None:
                raise InvalidInputError(
                    "hostdevs", address, "has no IOMMU group on the host",
                    "enable the IOMMU (intel_iommu=on / amd_iommu=on, see mlinfra.kvm host roles) and reboot")
            members = [devices[m] for m in pci.group_members(dev.iommu_group) if m in devices]
            blockers = group_blockers(members)
            if blockers:
                raise InvalidInputError(
                    "hostdevs", address,
                    "is in IOMMU group %d, which is not wholly bound to vfio-pci (%s)"
                    % (dev.iommu_group, ", ".join("%s uses %s" % (b.address, b.driver) for b in blockers)),
                    "bind every device of the group to vfio-pci (mlinfra.kvm.vfio_pci) and pass "
                    "them all (include_functions: true for the other functions of the slot)")
        own_uuid = self.existing.findtext("uuid") if self.existing is not None else None
        in_use = self.service.hostdevs_in_use(own_uuid)
        for address in addresses:
            if address in in_use:
                raise ConflictError(
                    "option hostdevs: PCI device %s is used by running domain %s; stop that domain "
                    "or remove the device from it first" % (address, in_use[address]),
                    option="hostdevs", value=address, used_by=in_use[address])
