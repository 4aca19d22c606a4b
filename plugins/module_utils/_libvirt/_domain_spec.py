# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Domain XML as a set of named fields: read each from libvirt's XML, write each into it.

The domain module never compares whole documents. Every option maps to one *field*; a field
has a reader (XML -> canonical Python value) and a writer (replace that part of the XML).
An update compares only the fields the user set with what libvirt's *inactive* XML holds,
then writes only the differing fields into that same inactive document, so everything
libvirt added (PCI addresses, aliases, controllers, seclabels, NVRAM paths) survives a
redefinition untouched.

Canonical values are plain dicts/lists/ints/strings so that they can be shown in ``diff``.
"""
from __future__ import annotations

import copy
import hashlib
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._core._xml import etree, element, sub
from ._fields import LIVE, RESTART, Field, keys_with_change, option_specs

MLINFRA_NS = "https://mlinfra.example/kvm/1"
MLINFRA_PREFIX = "mlinfra"
GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
DEFAULT_OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
DEFAULT_OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"

# Machine aliases libvirt expands on define ('q35' is stored as 'pc-q35-7.2').
_MACHINE_ALIASES = {"q35": "pc-q35-", "pc": "pc-i440fx-"}
_BUS_PREFIX = {"virtio": "vd", "sata": "sd", "scsi": "sd", "usb": "sd"}


# --------------------------------------------------------------------------- small helpers

def derived_mac(domain_name: str, index: int) -> str:
    """A stable locally administered MAC from the domain name and interface index.

    Re-runs and redefinitions therefore never change a guest's MAC (and so its DHCP lease).
    """
    digest = hashlib.sha256(("%s/%d" % (domain_name, index)).encode("utf-8")).digest()
    return "52:54:00:%02x:%02x:%02x" % (digest[0], digest[1], digest[2])


def parse_cpuset(value: Optional[str]) -> Optional[List[int]]:
    """'0-2,^1,4' -> [0, 2, 4]; libvirt reformats cpusets, so they compare as sets."""
    if value is None:
        return None
    wanted: set = set()
    excluded: set = set()
    for part in str(value).replace(" ", "").split(","):
        if not part:
            continue
        target = excluded if part.startswith("^") else wanted
        part = part.lstrip("^")
        if "-" in part:
            low, high = part.split("-", 1)
            target.update(range(int(low), int(high) + 1))
        else:
            target.add(int(part))
    return sorted(wanted - excluded)


def format_cpuset(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in cpus)


def pci_tuple(address: str) -> Tuple[int, int, int, int]:
    dom, bus, rest = address.split(":")
    slot, func = rest.split(".")
    return int(dom, 16), int(bus, 16), int(slot, 16), int(func, 16)


def pci_string(dom: int, bus: int, slot: int, func: int) -> str:
    return "%04x:%02x:%02x.%x" % (dom, bus, slot, func)


def _int(value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    return int(value, 16) if value.lower().startswith("0x") else int(value)


def _kib(el: Any) -> Optional[int]:
    """A libvirt memory element's value in KiB, whatever its unit attribute."""
    if el is None or el.text is None:
        return None
    units = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024 ** 2,
             "mib": 1024 ** 2, "mb": 1000 ** 2, "g": 1024 ** 3, "gib": 1024 ** 3,
             "gb": 1000 ** 3, "t": 1024 ** 4, "tib": 1024 ** 4}
    factor = units.get(el.get("unit", "KiB").lower(), 1024)
    return int(el.text.strip()) * factor // 1024


def _devices(root: Any) -> Any:
    devices = root.find("devices")
    if devices is None:
        devices = sub(root, "devices")
    return devices


def _ensure(parent: Any, tag: str, attrs: Optional[Dict[str, Any]] = None) -> Any:
    found = parent.find(tag)
    if found is None:
        found = sub(parent, tag, attrs)
    return found


def _remove(elements: Iterable[Any]) -> None:
    for el in list(elements):
        el.getparent().remove(el)


def _replace_or_append(parent: Any, tag: str, new: Any) -> None:
    """Put ``new`` where the first ``tag`` child was (libvirt ignores top-level order, but
    keeping the position keeps diffs of the stored XML small)."""
    old = parent.find(tag)
    if old is None:
        parent.append(new)
    else:
        parent.replace(old, new)


def machine_matches(wanted: Optional[str], actual: Optional[str]) -> bool:
    if wanted is None:
        return True
    if wanted == actual:
        return True
    alias = _MACHINE_ALIASES.get(wanted)
    return bool(alias and actual and actual.startswith(alias))


# --------------------------------------------------------------------------- field readers

def read_virt_type(root: Any) -> Optional[str]:
    return root.get("type")


def read_machine(root: Any) -> Optional[str]:
    type_el = root.find("os/type")
    return type_el.get("machine") if type_el is not None else None


def read_arch(root: Any) -> Optional[str]:
    type_el = root.find("os/type")
    return type_el.get("arch") if type_el is not None else None


def read_max_memory(root: Any) -> Optional[int]:
    return _kib(root.find("memory"))


def read_memory(root: Any) -> Optional[int]:
    current = _kib(root.find("currentMemory"))
    return current if current is not None else _kib(root.find("memory"))


def read_max_vcpus(root: Any) -> Optional[int]:
    vcpu = root.find("vcpu")
    return int(vcpu.text) if vcpu is not None and vcpu.text else None


def read_vcpus(root: Any) -> Optional[int]:
    vcpu = root.find("vcpu")
    if vcpu is None:
        return None
    return int(vcpu.get("current")) if vcpu.get("current") else read_max_vcpus(root)


def read_cpu(root: Any) -> Dict[str, Any]:
    cpu = root.find("cpu")
    out: Dict[str, Any] = {"mode": None, "sockets": None, "cores": None, "threads": None}
    if cpu is None:
        return out
    out["mode"] = cpu.get("mode", "custom")
    topo = cpu.find("topology")
    if topo is not None:
        for key in ("sockets", "cores", "threads"):
            out[key] = _int(topo.get(key))
    return out


def read_cputune(root: Any) -> Dict[str, Any]:
    pins = []
    for pin in root.findall("cputune/vcpupin"):
        pins.append({"vcpu": int(pin.get("vcpu")), "cpuset": parse_cpuset(pin.get("cpuset"))})
    emulator = root.find("cputune/emulatorpin")
    return {"vcpupin": sorted(pins, key=lambda p: p["vcpu"]),
            "emulatorpin": parse_cpuset(emulator.get("cpuset")) if emulator is not None else None}


def read_numatune(root: Any) -> Dict[str, Any]:
    mem = root.find("numatune/memory")
    if mem is None:
        return {"mode": None, "nodeset": None}
    return {"mode": mem.get("mode", "strict"), "nodeset": parse_cpuset(mem.get("nodeset"))}


def read_hugepages(root: Any) -> Dict[str, Any]:
    huge = root.find("memoryBacking/hugepages")
    if huge is None:
        return {"enabled": False, "page_size_kib": None}
    page = huge.find("page")
    return {"enabled": True, "page_size_kib": _kib_attr(page) if page is not None else None}


def _kib_attr(page: Any) -> Optional[int]:
    fake = element("page", {"unit": page.get("unit", "KiB")}, page.get("size"))
    return _kib(fake)


def read_firmware(root: Any) -> Dict[str, Any]:
    os_el = root.find("os")
    if os_el is None:
        return {"type": "bios"}
    if os_el.find("kernel") is not None:
        return {"type": "kernel",
                "kernel": (os_el.findtext("kernel") or "").strip() or None,
                "initrd": (os_el.findtext("initrd") or "").strip() or None,
                "cmdline": (os_el.findtext("cmdline") or "").strip() or None}
    loader = os_el.find("loader")
    if os_el.get("firmware") == "efi" or (loader is not None and loader.get("type") == "pflash"):
        nvram = os_el.find("nvram")
        return {"type": "uefi",
                "loader": (loader.text or "").strip() if loader is not None and loader.text else None,
                "nvram_template": nvram.get("template") if nvram is not None else None}
    return {"type": "bios"}


def read_boot(root: Any) -> List[str]:
    return [b.get("dev") for b in root.findall("os/boot")]


def read_hide_hypervisor(root: Any) -> Dict[str, Any]:
    hidden = root.find("features/kvm/hidden")
    vendor = root.find("features/hyperv/vendor_id")
    return {"kvm_hidden": hidden is not None and hidden.get("state") == "on",
            "vendor_id": vendor.get("value") if vendor is not None and vendor.get("state") == "on" else None}


def _disk_dict(disk: Any) -> Dict[str, Any]:
    source = disk.find("source")
    target = disk.find("target")
    driver = disk.find("driver")
    out: Dict[str, Any] = {
        "pool": None, "volume": None, "path": None,
        "format": driver.get("type") if driver is not None else None,
        "bus": target.get("bus") if target is not None else None,
        "target": target.get("dev") if target is not None else None,
    }
    if source is not None:
        if disk.get("type") == "volume":
            out["pool"], out["volume"] = source.get("pool"), source.get("volume")
        else:
            out["path"] = source.get("file") or source.get("dev")
    if disk.get("device") == "disk":
        out["readonly"] = disk.find("readonly") is not None
    return out


def read_disks(root: Any) -> List[Dict[str, Any]]:
    return sorted((_disk_dict(d) for d in root.findall("devices/disk[@device='disk']")),
                  key=lambda d: d["target"] or "")


def read_cdroms(root: Any) -> List[Dict[str, Any]]:
    return sorted((_disk_dict(d) for d in root.findall("devices/disk[@device='cdrom']")),
                  key=lambda d: d["target"] or "")


def _interface_dict(iface: Any) -> Dict[str, Any]:
    source = iface.find("source")
    model = iface.find("model")
    mac = iface.find("mac")
    kind = iface.get("type")
    src = None
    if source is not None:
        src = source.get("network") if kind == "network" else source.get("bridge")
    return {"network": src if kind == "network" else None,
            "bridge": src if kind == "bridge" else None,
            "model": model.get("type") if model is not None else None,
            "mac": mac.get("address").lower() if mac is not None else None}


def read_interfaces(root: Any) -> List[Dict[str, Any]]:
    # Interface order is guest-visible (eth0, eth1), so it is compared as a list.
    return [_interface_dict(i) for i in root.findall("devices/interface")]


def read_console(root: Any) -> Dict[str, Any]:
    serial = root.find("devices/serial")
    if serial is None:
        return {"enabled": False, "log": None}
    if serial.get("type") == "file":
        source = serial.find("source")
        return {"enabled": True, "log": source.get("path") if source is not None else None}
    log = serial.find("log")
    return {"enabled": True, "log": log.get("file") if log is not None else None}


def read_rng(root: Any) -> bool:
    return root.find("devices/rng[@model='virtio']") is not None


def read_guest_agent(root: Any) -> bool:
    return any(t.get("name") == GUEST_AGENT_CHANNEL for t in root.findall("devices/channel/target"))


def read_memballoon(root: Any) -> bool:
    balloon = root.find("devices/memballoon")
    # libvirt adds a virtio balloon to every qemu domain unless told model='none'.
    return balloon is None or balloon.get("model") != "none"


def hostdev_addresses(root: Any) -> List[Dict[str, Any]]:
    out = []
    for hostdev in root.findall("devices/hostdev[@type='pci']"):
        addr = hostdev.find("source/address")
        if addr is None:
            continue
        out.append({"address": pci_string(_int(addr.get("domain", "0")), _int(addr.get("bus")),
                                          _int(addr.get("slot")), _int(addr.get("function"))),
                    "managed": hostdev.get("managed", "no") == "yes"})
    return sorted(out, key=lambda h: h["address"])


def read_metadata(root: Any) -> Dict[str, str]:
    vm = root.find("metadata/{%s}vm" % MLINFRA_NS)
    if vm is None:
        return {}
    return {etree.QName(child).localname: (child.text or "") for child in vm
            if isinstance(child.tag, str)}


def read_description(root: Any) -> Optional[str]:
    return root.findtext("description")


# --------------------------------------------------------------------------- field writers

def write_virt_type(root: Any, value: str) -> None:
    root.set("type", value)


def _os_type(root: Any) -> Any:
    os_el = _ensure(root, "os")
    type_el = os_el.find("type")
    if type_el is None:
        type_el = element("type", None, "hvm")
        os_el.insert(0, type_el)
    return type_el


def _machine_family(machine: Optional[str]) -> str:
    machine = machine or ""
    return "q35" if "q35" in machine else ("pc" if machine.startswith("pc") else machine)


def write_machine(root: Any, value: str) -> None:
    type_el = _os_type(root)
    if _machine_family(type_el.get("machine")) != _machine_family(value):
        # q35 (PCIe) and pc (PCI) need different controllers and device addresses; drop the
        # ones libvirt assigned so that it lays the new machine out itself.
        devices = _devices(root)
        _remove(devices.findall("controller"))
        _remove(devices.findall("*/address"))
    type_el.set("machine", value)


def write_arch(root: Any, value: str) -> None:
    _os_type(root).set("arch", value)


def write_max_memory(root: Any, value: int) -> None:
    _replace_or_append(root, "memory", element("memory", {"unit": "KiB"}, value))


def write_memory(root: Any, value: int) -> None:
    _replace_or_append(root, "currentMemory", element("currentMemory", {"unit": "KiB"}, value))


def write_max_vcpus(root: Any, value: int) -> None:
    vcpu = _ensure(root, "vcpu", {"placement": "static"})
    vcpu.text = str(value)


def write_vcpus(root: Any, value: int) -> None:
    vcpu = _ensure(root, "vcpu", {"placement": "static"})
    vcpu.set("current", str(value))


def write_cpu(root: Any, value: Dict[str, Any]) -> None:
    cpu = _ensure(root, "cpu")
    if value.get("mode"):
        cpu.set("mode", value["mode"])
        if value["mode"] != "custom":
            # A model left from a former custom CPU would make libvirt refuse the mode.
            _remove(cpu.findall("model"))
    if any(value.get(k) for k in ("sockets", "cores", "threads")):
        topo = _ensure(cpu, "topology")
        for key in ("sockets", "cores", "threads"):
            if value.get(key):
                topo.set(key, str(value[key]))


def write_cputune(root: Any, value: Dict[str, Any]) -> None:
    tune = _ensure(root, "cputune")
    _remove(tune.findall("vcpupin"))
    _remove(tune.findall("emulatorpin"))
    for pin in value.get("vcpupin") or []:
        sub(tune, "vcpupin", {"vcpu": pin["vcpu"], "cpuset": format_cpuset(pin["cpuset"])})
    if value.get("emulatorpin"):
        sub(tune, "emulatorpin", {"cpuset": format_cpuset(value["emulatorpin"])})
    if len(tune) == 0:
        root.remove(tune)


def write_numatune(root: Any, value: Dict[str, Any]) -> None:
    _remove(root.findall("numatune"))
    if value.get("nodeset"):
        tune = sub(root, "numatune")
        sub(tune, "memory", {"mode": value.get("mode") or "strict",
                             "nodeset": format_cpuset(value["nodeset"])})


def write_hugepages(root: Any, value: Dict[str, Any]) -> None:
    backing = root.find("memoryBacking")
    if backing is not None:
        _remove(backing.findall("hugepages"))
    if value.get("enabled"):
        backing = _ensure(root, "memoryBacking")
        huge = sub(backing, "hugepages")
        if value.get("page_size_kib"):
            sub(huge, "page", {"size": value["page_size_kib"], "unit": "KiB"})
    if backing is not None and len(backing) == 0:
        root.remove(backing)


def write_firmware(root: Any, value: Dict[str, Any]) -> None:
    os_el = _ensure(root, "os")
    # Keep the <nvram> element (and so its per-VM path) when the domain stays on UEFI.
    current = read_firmware(root)
    keep_nvram = current["type"] == "uefi" and value["type"] == "uefi"
    for tag in ("kernel", "initrd", "cmdline", "loader") + (() if keep_nvram else ("nvram",)):
        _remove(os_el.findall(tag))
    if "firmware" in os_el.attrib:
        del os_el.attrib["firmware"]
    _remove(os_el.findall("firmware"))
    type_el = _os_type(root)
    position = os_el.index(type_el) + 1
    new: List[Any] = []
    if value["type"] == "uefi":
        new.append(element("loader", {"readonly": "yes", "type": "pflash"}, value["loader"]))
        nvram = os_el.find("nvram")
        if nvram is None:
            new.append(element("nvram", {"template": value["nvram_template"]}))
        else:
            nvram.set("template", value["nvram_template"])
    elif value["type"] == "kernel":
        new.append(element("kernel", None, value["kernel"]))
        if value.get("initrd"):
            new.append(element("initrd", None, value["initrd"]))
        if value.get("cmdline"):
            new.append(element("cmdline", None, value["cmdline"]))
    for offset, el in enumerate(new):
        os_el.insert(position + offset, el)


def write_boot(root: Any, value: List[str]) -> None:
    os_el = _ensure(root, "os")
    _remove(os_el.findall("boot"))
    for dev in value:
        sub(os_el, "boot", {"dev": dev})


def write_hide_hypervisor(root: Any, value: Dict[str, Any]) -> None:
    features = _ensure(root, "features")
    for path, parent_tag in (("kvm/hidden", "kvm"), ("hyperv/vendor_id", "hyperv")):
        _remove(features.findall(path))
        parent = features.find(parent_tag)
        if parent is not None and len(parent) == 0:
            features.remove(parent)
    if value.get("kvm_hidden"):
        sub(_ensure(features, "kvm"), "hidden", {"state": "on"})
    if value.get("vendor_id"):
        sub(_ensure(features, "hyperv", {"mode": "custom"}), "vendor_id",
            {"state": "on", "value": value["vendor_id"]})


def disk_element(item: Dict[str, Any], device: str) -> Any:
    kind = "volume" if item.get("pool") else "file"
    disk = element("disk", {"type": kind, "device": device})
    sub(disk, "driver", {"name": "qemu", "type": item.get("format") or "raw"})
    if kind == "volume":
        sub(disk, "source", {"pool": item["pool"], "volume": item["volume"]})
    elif item.get("path"):
        sub(disk, "source", {"file": item["path"]})
    sub(disk, "target", {"dev": item["target"], "bus": item["bus"]})
    if device == "cdrom" or item.get("readonly"):
        sub(disk, "readonly")
    return disk


def _merge_devices(root: Any, existing: List[Any], reader: Callable[[Any], Dict[str, Any]],
                   wanted: List[Dict[str, Any]], build: Callable[[Dict[str, Any]], Any]) -> None:
    """Keep existing device elements that already match a wanted item (with the PCI
    addresses libvirt gave them), remove the others, append new ones for what is missing."""
    remaining = list(wanted)
    for el in existing:
        current = reader(el)
        if current in remaining:
            remaining.remove(current)
        else:
            el.getparent().remove(el)
    devices = _devices(root)
    for item in remaining:
        devices.append(build(item))


def write_disks(root: Any, value: List[Dict[str, Any]]) -> None:
    _merge_devices(root, root.findall("devices/disk[@device='disk']"), _disk_dict, value,
                   lambda item: disk_element(item, "disk"))


def write_cdroms(root: Any, value: List[Dict[str, Any]]) -> None:
    _merge_devices(root, root.findall("devices/disk[@device='cdrom']"), _disk_dict, value,
                   lambda item: disk_element(item, "cdrom"))


def interface_element(item: Dict[str, Any]) -> Any:
    kind = "network" if item.get("network") else "bridge"
    iface = element("interface", {"type": kind})
    sub(iface, "mac", {"address": item["mac"]})
    sub(iface, "source", {kind: item.get("network") or item.get("bridge")})
    sub(iface, "model", {"type": item["model"]})
    return iface


def write_interfaces(root: Any, value: List[Dict[str, Any]]) -> None:
    existing = root.findall("devices/interface")
    if [_interface_dict(i) for i in existing] == value:
        return
    # Order matters to the guest: rebuild the list, reusing matching elements in place.
    devices = _devices(root)
    pool = list(existing)
    for iface in existing:
        devices.remove(iface)
    for item in value:
        reuse = next((el for el in pool if _interface_dict(el) == item), None)
        if reuse is not None:
            pool.remove(reuse)
            devices.append(reuse)
        else:
            devices.append(interface_element(item))


def write_console(root: Any, value: Dict[str, Any]) -> None:
    devices = _devices(root)
    _remove(devices.findall("serial"))
    _remove(devices.findall("console"))
    if not value.get("enabled"):
        return
    if value.get("log"):
        # A file-backed port, not a pty with a <log>: seen here, a guest kernel writing to a
        # pty that nobody reads stalls at its first console line. libvirt adds the matching
        # <console> itself.
        serial = sub(devices, "serial", {"type": "file"})
        sub(serial, "source", {"path": value["log"], "append": "on"})
        sub(serial, "target", {"port": 0})
        return
    serial = sub(devices, "serial", {"type": "pty"})
    sub(serial, "target", {"port": 0})
    console = sub(devices, "console", {"type": "pty"})
    sub(console, "target", {"type": "serial", "port": 0})


def write_rng(root: Any, value: bool) -> None:
    devices = _devices(root)
    _remove(devices.findall("rng[@model='virtio']"))
    if value:
        rng = sub(devices, "rng", {"model": "virtio"})
        sub(rng, "backend", {"model": "random"}, "/dev/urandom")


def guest_agent_element() -> Any:
    channel = element("channel", {"type": "unix"})
    sub(channel, "target", {"type": "virtio", "name": GUEST_AGENT_CHANNEL})
    return channel


def write_guest_agent(root: Any, value: bool) -> None:
    devices = _devices(root)
    for target in devices.findall("channel/target"):
        if target.get("name") == GUEST_AGENT_CHANNEL:
            devices.remove(target.getparent())
    if value:
        devices.append(guest_agent_element())


def write_memballoon(root: Any, value: bool) -> None:
    devices = _devices(root)
    if read_memballoon(root) == value:
        return
    _remove(devices.findall("memballoon"))
    sub(devices, "memballoon", {"model": "virtio" if value else "none"})


def hostdev_element(item: Dict[str, Any]) -> Any:
    dom, bus, slot, func = pci_tuple(item["address"])
    hostdev = element("hostdev", {"mode": "subsystem", "type": "pci",
                                  "managed": "yes" if item["managed"] else "no"})
    source = sub(hostdev, "source")
    sub(source, "address", {"domain": "0x%04x" % dom, "bus": "0x%02x" % bus,
                            "slot": "0x%02x" % slot, "function": "0x%x" % func})
    return hostdev


def _hostdev_dict(el: Any) -> Dict[str, Any]:
    fake = element("domain")
    devices = sub(fake, "devices")
    devices.append(copy.deepcopy(el))
    found = hostdev_addresses(fake)
    return found[0] if found else {}


def write_hostdevs(root: Any, value: List[Dict[str, Any]]) -> None:
    _merge_devices(root, root.findall("devices/hostdev[@type='pci']"), _hostdev_dict, value,
                   hostdev_element)


def metadata_element(value: Dict[str, str]) -> Any:
    vm = etree.Element("{%s}vm" % MLINFRA_NS, nsmap={MLINFRA_PREFIX: MLINFRA_NS})
    for key in sorted(value):
        child = etree.SubElement(vm, key)
        child.text = str(value[key])
    return vm


def write_metadata(root: Any, value: Dict[str, str]) -> None:
    metadata = root.find("metadata")
    if metadata is not None:
        _remove(metadata.findall("{%s}vm" % MLINFRA_NS))
    if value:
        metadata = _ensure(root, "metadata")
        metadata.append(metadata_element(value))
    if metadata is not None and len(metadata) == 0:
        root.remove(metadata)


def write_description(root: Any, value: Optional[str]) -> None:
    _remove(root.findall("description"))
    if value:
        desc = element("description", None, value)
        root.insert(2 if len(root) >= 2 else len(root), desc)


# --------------------------------------------------------------------------- the field table

def _subset_equal(wanted: Any, actual: Any) -> bool:
    """Dict fields compare only the keys the request sets (None = not managed)."""
    if isinstance(wanted, dict) and isinstance(actual, dict):
        return all(v is None or actual.get(k) == v for k, v in wanted.items())
    return wanted == actual


# What a change costs on a running domain (_fields): LIVE, the domain takes it at once and in its
# definition (the runner's can_apply_live adds the conditions: within the maxima, with a balloon,
# virtio disks only); RESTART, written to the definition and applied at the next start.
_DISK_OPTIONS = dict(pool=dict(type="str"), volume=dict(type="str"), path=dict(type="path"),
                     format=dict(type="str"),
                     bus=dict(type="str", choices=["virtio", "sata", "scsi", "usb"], default="virtio"),
                     target=dict(type="str"), readonly=dict(type="bool", default=False))
_CDROM_OPTIONS = dict(pool=dict(type="str"), volume=dict(type="str"), path=dict(type="path"),
                      bus=dict(type="str", choices=["sata", "scsi", "usb"], default="sata"),
                      target=dict(type="str"))


def _field(key: str, read: Callable[[Any], Any], write: Callable[[Any, Any], None], change: str, label: str,
           **options: Dict[str, Any]) -> Field:
    return Field(key, options, change, label, read, write)


# In write order: maxima before current values, so that a document is never left with
# current > maximum in between.
FIELD_TABLE: Tuple[Field, ...] = (
    _field("virt_type", read_virt_type, write_virt_type, RESTART, "virt type",
           virt_type=dict(type="str", choices=["kvm", "qemu"])),
    _field("machine", read_machine, write_machine, RESTART, "machine", machine=dict(type="str")),
    _field("arch", read_arch, write_arch, RESTART, "architecture", arch=dict(type="str")),
    _field("max_memory_kib", read_max_memory, write_max_memory, RESTART, "maximum memory",
           max_memory=dict(type="str")),
    _field("memory_kib", read_memory, write_memory, LIVE, "memory", memory=dict(type="str")),
    _field("max_vcpus", read_max_vcpus, write_max_vcpus, RESTART, "maximum vCPUs", max_vcpus=dict(type="int")),
    _field("vcpus", read_vcpus, write_vcpus, LIVE, "vCPUs", vcpus=dict(type="int")),
    _field("cpu", read_cpu, write_cpu, RESTART, "CPU", cpu=dict(type="dict", options=dict(
        mode=dict(type="str", choices=["host-passthrough", "host-model", "maximum"]),
        sockets=dict(type="int"), cores=dict(type="int"), threads=dict(type="int")))),
    _field("cputune", read_cputune, write_cputune, RESTART, "pinning", cpu_pinning=dict(type="dict", options=dict(
        vcpupin=dict(type="list", elements="dict", options=dict(
            vcpu=dict(type="int", required=True), cpuset=dict(type="str", required=True))),
        emulatorpin=dict(type="str")))),
    _field("numatune", read_numatune, write_numatune, RESTART, "NUMA", numa_tuning=dict(type="dict", options=dict(
        mode=dict(type="str", default="strict", choices=["strict", "preferred", "interleave", "restrictive"]),
        nodeset=dict(type="str", required=True)))),
    _field("hugepages", read_hugepages, write_hugepages, RESTART, "hugepages",
           hugepages=dict(type="bool"), hugepage_size=dict(type="str")),
    _field("firmware", read_firmware, write_firmware, RESTART, "firmware",
           firmware=dict(type="str", choices=["bios", "uefi", "kernel"]),
           ovmf_code=dict(type="path", default=DEFAULT_OVMF_CODE),
           ovmf_vars=dict(type="path", default=DEFAULT_OVMF_VARS),
           kernel=dict(type="path"), initrd=dict(type="path"), cmdline=dict(type="str")),
    _field("boot", read_boot, write_boot, RESTART, "boot order",
           boot=dict(type="list", elements="str", choices=["hd", "cdrom", "network", "fd"])),
    _field("hide_hypervisor", read_hide_hypervisor, write_hide_hypervisor, RESTART, "hypervisor hiding",
           hide_hypervisor=dict(type="bool"), hypervisor_vendor_id=dict(type="str", default="mlinfra")),
    _field("disks", read_disks, write_disks, LIVE, "virtio disks",
           disks=dict(type="list", elements="dict", options=_DISK_OPTIONS)),
    _field("cdroms", read_cdroms, write_cdroms, RESTART, "cdroms",
           cdroms=dict(type="list", elements="dict", options=_CDROM_OPTIONS)),
    _field("interfaces", read_interfaces, write_interfaces, RESTART, "interfaces",
           interfaces=dict(type="list", elements="dict", options=dict(
               network=dict(type="str"), bridge=dict(type="str"),
               model=dict(type="str", default="virtio"), mac=dict(type="str")))),
    _field("console", read_console, write_console, RESTART, "console",
           console=dict(type="bool"), console_log=dict(type="path")),
    _field("rng", read_rng, write_rng, RESTART, "rng", rng=dict(type="bool")),
    _field("guest_agent", read_guest_agent, write_guest_agent, RESTART, "agent", guest_agent=dict(type="bool")),
    _field("memballoon", read_memballoon, write_memballoon, RESTART, "balloon", memballoon=dict(type="bool")),
    _field("hostdevs", hostdev_addresses, write_hostdevs, LIVE, "hostdevs",
           hostdevs=dict(type="list", elements="dict", options=dict(
               address=dict(type="str"), vendor=dict(type="str"), device=dict(type="str"),
               index=dict(type="int", default=0), include_functions=dict(type="bool", default=False),
               managed=dict(type="bool", default=True)))),
    _field("metadata", read_metadata, write_metadata, LIVE, "metadata", metadata=dict(type="dict")),
    _field("description", read_description, write_description, LIVE, "description",
           description=dict(type="str")),
)

FIELDS: Dict[str, Field] = {f.key: f for f in FIELD_TABLE}
WRITE_ORDER = [f.key for f in FIELD_TABLE]
LIVE_FIELDS = keys_with_change(FIELD_TABLE, LIVE)


def field_option_specs() -> Dict[str, Dict[str, Any]]:
    return option_specs(FIELD_TABLE)


def field_matches(name: str, wanted: Any, actual: Any) -> bool:
    if name == "machine":
        return machine_matches(wanted, actual)
    if name == "metadata":
        # Replaced as a whole (as documented), so a key the request drops is a difference; its
        # values are never None, so "only the keys the request sets" does not apply.
        return wanted == actual
    return _subset_equal(wanted, actual)


def read_fields(root: Any, names: Iterable[str]) -> Dict[str, Any]:
    return {name: FIELDS[name].read(root) for name in names}


def differing_fields(root: Any, desired: Dict[str, Any]) -> List[str]:
    """Names of the requested fields whose value in ``root`` differs, in write order."""
    actual = read_fields(root, desired)
    return [n for n in WRITE_ORDER if n in desired and not field_matches(n, desired[n], actual[n])]


def apply_fields(root: Any, desired: Dict[str, Any], names: Iterable[str]) -> Any:
    """Write ``names`` from ``desired`` into a copy of ``root`` and return the copy."""
    new = copy.deepcopy(root)
    wanted = set(names)
    for name in WRITE_ORDER:
        if name in wanted:
            FIELDS[name].write(new, desired[name])
    return new


def skeleton(name: str, virt_type: str) -> Any:
    """The parts of a new domain that no option manages (ACPI is needed for a clean shutdown)."""
    root = element("domain", {"type": virt_type})
    sub(root, "name", None, name)
    os_el = sub(root, "os")
    sub(os_el, "type", None, "hvm")
    features = sub(root, "features")
    sub(features, "acpi")
    sub(features, "apic")
    sub(root, "clock", {"offset": "utc"})
    sub(root, "on_poweroff", None, "destroy")
    sub(root, "on_reboot", None, "restart")
    sub(root, "on_crash", None, "destroy")
    sub(root, "devices")
    return root


def build_new(name: str, desired: Dict[str, Any]) -> Any:
    return apply_fields(skeleton(name, desired.get("virt_type") or "qemu"), desired, desired)


def assign_targets(disks: List[Dict[str, Any]], cdroms: List[Dict[str, Any]]) -> None:
    """Fill missing target names per bus prefix (vda, vdb, ...; sda, ... for SATA/cdroms)."""
    used = {d["target"] for d in disks + cdroms if d.get("target")}
    for item in disks + cdroms:
        if item.get("target"):
            continue
        prefix = _BUS_PREFIX.get(item["bus"], "sd")
        for index in range(26):
            candidate = prefix + chr(ord("a") + index)
            if candidate not in used:
                item["target"] = candidate
                used.add(candidate)
                break


_XML_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def is_xml_name(value: str) -> bool:
    return bool(_XML_NAME_RE.match(value)) and not value.lower().startswith("xml")
