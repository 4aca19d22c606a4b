"""Unit tests of the domain module's XML fields, request validation and hostdev checks.

No daemon: pure functions, a fake service, a synthetic sysfs tree, and libvirt's test driver
(test:///default, in process) to prove that what we build is what libvirt stores.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain_spec as S
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_pci import SysfsPci
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_request import DomainRequest, memory_kib
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import DomainService
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError, InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import parse, to_string
from fake_module import StandInModule

pytestmark = pytest.mark.unit

# What libvirt 9 stores for a small q35 domain: expanded machine, addresses, controllers,
# aliases-free inactive XML plus a seclabel. None of these may count as a difference.
LIBVIRT_STORED = """
<domain type='qemu'>
  <name>vm1</name>
  <uuid>9dbdef7e-7ef2-4282-98b7-2e0baf076de0</uuid>
  <metadata>
    <mlinfra:vm xmlns:mlinfra="https://mlinfra.example/kvm/1"><role>worker</role></mlinfra:vm>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>131072</currentMemory>
  <vcpu placement='static' current='1'>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>/var/lib/libvirt/qemu/nvram/vm1_VARS.fd</nvram>
    <boot dev='hd'/>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='maximum' check='none'><topology sockets='1' dies='1' cores='2' threads='1'/></cpu>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source pool='p1' volume='vm1.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>
    </disk>
    <controller type='pci' index='0' model='pcie-root'/>
    <interface type='network'>
      <mac address='52:54:00:aa:bb:cc'/>
      <source network='net1'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
    </interface>
    <serial type='pty'><log file='/tmp/vm1.log' append='on'/><target type='isa-serial' port='0'><model name='isa-serial'/></target></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></source>
      <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>
    </hostdev>
    <memballoon model='virtio'><address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></memballoon>
  </devices>
  <seclabel type='dynamic' model='dac' relabel='yes'/>
</domain>
"""


def desired_like_stored() -> Dict[str, Any]:
    return {
        "virt_type": "qemu", "machine": "q35", "arch": "x86_64",
        "max_memory_kib": 262144, "memory_kib": 131072, "max_vcpus": 2, "vcpus": 1,
        "cpu": {"mode": "maximum", "sockets": 1, "cores": 2, "threads": 1},
        "firmware": {"type": "uefi", "loader": S.DEFAULT_OVMF_CODE, "nvram_template": S.DEFAULT_OVMF_VARS},
        "boot": ["hd"],
        "disks": [{"pool": "p1", "volume": "vm1.qcow2", "path": None, "format": "qcow2",
                   "bus": "virtio", "target": "vda", "readonly": False}],
        "interfaces": [{"network": "net1", "bridge": None, "model": "virtio", "mac": "52:54:00:aa:bb:cc"}],
        "console": {"enabled": True, "log": "/tmp/vm1.log"},
        "hostdevs": [{"address": "0000:01:00.0", "managed": True}],
        "memballoon": True, "metadata": {"role": "worker"},
    }


# --------------------------------------------------------------------------- pure helpers

def test_derived_mac_is_stable_local_and_distinct():
    first = S.derived_mac("vm1", 0)
    assert first == S.derived_mac("vm1", 0)
    assert first.startswith("52:54:00:")
    assert first != S.derived_mac("vm1", 1) != S.derived_mac("vm2", 0)


@pytest.mark.parametrize("text,cpus", [("0-3", [0, 1, 2, 3]), ("0-3,^2", [0, 1, 3]), ("4,2", [2, 4])])
def test_cpuset_parsing(text, cpus):
    assert S.parse_cpuset(text) == cpus


@pytest.mark.parametrize("wanted,actual,same", [
    ("q35", "pc-q35-7.2", True), ("pc", "pc-i440fx-7.2", True), ("q35", "pc-i440fx-7.2", False),
    ("pc-q35-7.2", "pc-q35-7.2", True)])
def test_machine_aliases(wanted, actual, same):
    assert S.machine_matches(wanted, actual) is same


@pytest.mark.parametrize("value,kib", [("2G", 2 * 1024 * 1024), ("512M", 524288), (1024, 1048576), ("1024", 1048576)])
def test_memory_sizes(value, kib):
    assert memory_kib("memory", value) == kib


def test_libvirt_additions_are_no_difference():
    root = parse(LIBVIRT_STORED)
    assert S.differing_fields(root, desired_like_stored()) == []


def test_unset_fields_are_not_compared():
    # Only vcpus requested: nothing else of the stored XML matters.
    assert S.differing_fields(parse(LIBVIRT_STORED), {"vcpus": 2}) == ["vcpus"]


def test_update_keeps_libvirt_additions():
    root = parse(LIBVIRT_STORED)
    desired = desired_like_stored()
    desired["vcpus"] = 2
    desired["disks"].append({"pool": None, "volume": None, "path": "/tmp/x.raw", "format": "raw",
                             "bus": "virtio", "target": "vdb", "readonly": True})
    new = S.apply_fields(root, desired, S.differing_fields(root, desired))
    assert S.differing_fields(new, desired) == []
    xml = to_string(new)
    # The unchanged disk and hostdev kept libvirt's PCI addresses; the NVRAM path and seclabel stayed.
    assert new.find("devices/disk[@device='disk']/address").get("bus") == "0x04"
    assert new.find("devices/hostdev/address").get("bus") == "0x05"
    assert "/var/lib/libvirt/qemu/nvram/vm1_VARS.fd" in xml
    assert new.find("seclabel") is not None
    assert parse(LIBVIRT_STORED).find("vcpu").get("current") == "1"  # input untouched


def test_removing_a_hostdev_and_changing_metadata():
    root = parse(LIBVIRT_STORED)
    desired = {"hostdevs": [], "metadata": {"role": "trainer", "team": "nlp"}}
    new = S.apply_fields(root, desired, S.differing_fields(root, desired))
    assert new.find("devices/hostdev") is None
    assert S.read_metadata(new) == {"role": "trainer", "team": "nlp"}
    assert S.differing_fields(new, desired) == []


def test_every_field_round_trips_from_a_new_domain():
    desired = desired_like_stored()
    desired.update({
        "cputune": {"vcpupin": [{"vcpu": 0, "cpuset": [1]}], "emulatorpin": [0]},
        "numatune": {"mode": "strict", "nodeset": [0]},
        "hugepages": {"enabled": True, "page_size_kib": 2048},
        "hide_hypervisor": {"kvm_hidden": True, "vendor_id": "mlinfra"},
        "cdroms": [{"pool": None, "volume": None, "path": "/tmp/seed.iso", "format": "raw", "bus": "sata", "target": "sda"}],
        "rng": True, "guest_agent": True, "description": "a test",
    })
    root = S.build_new("vm1", desired)
    assert S.differing_fields(root, desired) == []
    assert root.find("features/acpi") is not None  # needed for a clean shutdown
    # The console log is a file-backed port (a pty nobody reads stalled a guest kernel here).
    assert root.find("devices/serial").get("type") == "file"


def test_kernel_boot_and_back_to_bios():
    kernel = {"type": "kernel", "kernel": "/boot/vmlinuz", "initrd": "/boot/initrd.img", "cmdline": "console=ttyS0"}
    root = S.build_new("vm1", {"virt_type": "qemu", "firmware": kernel})
    assert S.read_firmware(root) == kernel
    bios = S.apply_fields(root, {"firmware": {"type": "bios"}}, ["firmware"])
    assert S.read_firmware(bios) == {"type": "bios"}
    assert bios.find("os/kernel") is None


def test_interfaces_keep_order():
    a = {"network": "a", "bridge": None, "model": "virtio", "mac": "52:54:00:00:00:01"}
    b = {"network": "b", "bridge": None, "model": "virtio", "mac": "52:54:00:00:00:02"}
    root = S.build_new("vm1", {"interfaces": [a, b]})
    swapped = S.apply_fields(root, {"interfaces": [b, a]}, ["interfaces"])
    assert S.read_interfaces(swapped) == [b, a]


def test_built_xml_is_what_libvirt_stores():
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open("test:///default")
    try:
        desired = desired_like_stored()
        desired["firmware"] = {"type": "bios"}
        desired["disks"][0].update(pool=None, volume=None, path="/tmp/vm1.qcow2")
        desired["hostdevs"] = []
        dom = conn.defineXML(to_string(S.build_new("mlkvmtest-unit", desired)))
        stored = parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        assert S.differing_fields(stored, desired) == []
    finally:
        conn.close()


# --------------------------------------------------------------------------- request validation

class FakeService:
    """Stands in for DomainService: what exists is given, nothing is changed."""

    def __init__(self, sysfs_root: str = "/nonexistent", networks=("net1",), volumes=None,
                 in_use: Optional[Dict[str, str]] = None) -> None:
        self.sysfs_root = sysfs_root
        self.networks = set(networks)
        self.volumes = volumes if volumes is not None else {("p1", "vm1.qcow2"): "qcow2"}
        self.in_use = in_use or {}

    def kvm_available(self) -> bool:
        return False

    def host_limits(self) -> Optional[Dict[str, Any]]:
        return None  # no host figures: the bounds tests see only the collection's own limits

    def network_exists(self, name: str) -> bool:
        return name in self.networks

    def pool_exists(self, name: str) -> bool:
        return any(p == name for p, _unused in self.volumes)

    def volume_format(self, pool: str, volume: str) -> Optional[str]:
        return self.volumes.get((pool, volume))

    def path_exists(self, path: str) -> bool:
        return os.path.exists(path)

    def pci(self) -> SysfsPci:
        return SysfsPci(self.sysfs_root)

    def hostdevs_in_use(self, exclude_uuid: Optional[str]) -> Dict[str, str]:
        return dict(self.in_use)


def make_sysfs(root: str, devices: List[Dict[str, Any]]) -> str:
    """A synthetic sysfs: bus/pci/devices/<addr>/{vendor,device,class,driver,iommu_group}."""
    for dev in devices:
        path = os.path.join(root, "bus", "pci", "devices", dev["address"])
        os.makedirs(path)
        for key in ("vendor", "device"):
            with open(os.path.join(path, key), "w") as handle:
                handle.write("0x%s\n" % dev[key])
        with open(os.path.join(path, "class"), "w") as handle:
            handle.write(dev.get("class", "0x030000") + "\n")
        if dev.get("driver"):
            drv = os.path.join(root, "bus", "pci", "drivers", dev["driver"])
            os.makedirs(drv, exist_ok=True)
            os.symlink(drv, os.path.join(path, "driver"))
        group = os.path.join(root, "kernel", "iommu_groups", str(dev["group"]), "devices")
        os.makedirs(group, exist_ok=True)
        os.symlink(path, os.path.join(group, dev["address"]))
        os.symlink(os.path.dirname(group), os.path.join(path, "iommu_group"))
    return root


GPU_HOST = [
    # A GPU and its audio function, one group, both on vfio-pci.
    {"address": "0000:01:00.0", "vendor": "10de", "device": "2204", "group": 12, "driver": "vfio-pci"},
    {"address": "0000:01:00.1", "vendor": "10de", "device": "1aef", "group": 12, "driver": "vfio-pci", "class": "0x040300"},
    # A second GPU whose audio function is still on snd_hda_intel.
    {"address": "0000:02:00.0", "vendor": "10de", "device": "2204", "group": 13, "driver": "vfio-pci"},
    {"address": "0000:02:00.1", "vendor": "10de", "device": "1aef", "group": 13, "driver": "snd_hda_intel", "class": "0x040300"},
    # A NIC without IOMMU group membership problems but not on vfio.
    {"address": "0000:03:00.0", "vendor": "8086", "device": "1533", "group": 14, "driver": "igb", "class": "0x020000"},
]


def request(params: Dict[str, Any], service: Any, existing: Any = None) -> DomainRequest:
    full = {"name": "vm1", "ovmf_code": S.DEFAULT_OVMF_CODE, "ovmf_vars": S.DEFAULT_OVMF_VARS,
            "hypervisor_vendor_id": "mlinfra"}
    full.update(params)
    req = DomainRequest(full, service, existing)
    req.build()
    return req


@pytest.fixture
def gpu_host(tmp_path):
    return FakeService(sysfs_root=make_sysfs(str(tmp_path / "sys"), GPU_HOST))


def test_selector_with_functions_resolves_the_whole_slot(gpu_host):
    req = request({"hostdevs": [{"vendor": "10de", "device": "2204", "index": 0,
                                 "include_functions": True, "managed": True}]}, gpu_host)
    assert [h["address"] for h in req.desired["hostdevs"]] == ["0000:01:00.0", "0000:01:00.1"]


def test_selector_index_picks_in_address_order(gpu_host):
    with pytest.raises(InvalidInputError) as err:  # the second 2204 has a group not on vfio
        request({"hostdevs": [{"vendor": "10de", "device": "2204", "index": 1}]}, gpu_host)
    assert "0000:02:00.1 uses snd_hda_intel" in err.value.msg


@pytest.mark.parametrize("params,option,fragment", [
    ({"hostdevs": [{"address": "0000:1:00.0"}]}, "hostdevs[0].address", "is not a PCI address"),
    ({"hostdevs": [{"address": "0000:09:00.0"}]}, "hostdevs[0].address", "is not a PCI device"),
    ({"hostdevs": [{"vendor": "10de", "device": "2204", "index": 5}]}, "hostdevs[0]", "matches no PCI device"),
    ({"hostdevs": [{"address": "0000:02:00.0"}]}, "hostdevs", "not wholly bound to vfio-pci"),
    ({"hostdevs": [{"address": "0000:03:00.0"}]}, "hostdevs", "igb"),
    ({"memory": "2G", "max_memory": "1G", "vcpus": 1}, "memory", "above the domain's maximum memory"),
    ({"vcpus": 4, "max_vcpus": 2}, "vcpus", "above the domain's maximum vCPUs"),
    ({"interfaces": [{"network": "nope", "model": "virtio"}]}, "interfaces[0].network", "is not a libvirt network"),
    ({"disks": [{"pool": "p1", "volume": "missing.qcow2", "bus": "virtio"}]}, "disks[0].volume", "does not exist"),
    ({"disks": [{"pool": "nopool", "volume": "x", "bus": "virtio"}]}, "disks[0].pool", "is not a storage pool"),
    ({"disks": [{"path": "/nonexistent/x.qcow2", "bus": "virtio"}]}, "disks[0].path", "does not exist"),
    ({"cpu": {"mode": "maximum", "sockets": 1, "cores": 2, "threads": 1}, "vcpus": 4}, "cpu", "sockets*cores*threads"),
    ({"metadata": {"1bad": "x"}}, "metadata", "XML element name"),
    ({"interfaces": [{"network": "net1", "model": "virtio", "mac": "01:00:00:00:00:01"}]}, "interfaces[0].mac", "multicast"),
])
def test_bad_input_is_refused(gpu_host, params, option, fragment):
    with pytest.raises(InvalidInputError) as err:
        request(params, gpu_host)
    assert err.value.details["option"] == option
    assert fragment in err.value.msg


def test_memory_above_existing_maximum_is_refused(gpu_host):
    # A running domain (shut_off=False) cannot take a new maximum before its next restart.
    with pytest.raises(InvalidInputError) as err:
        request({"memory": "512M"}, gpu_host, existing=parse(LIBVIRT_STORED))
    assert "maximum memory (256 MiB)" in err.value.msg and "next restart" in err.value.msg


def test_vcpus_above_existing_maximum_of_a_running_domain_is_refused(gpu_host):
    with pytest.raises(InvalidInputError) as err:
        request({"vcpus": 3}, gpu_host, existing=parse(LIBVIRT_STORED))
    assert err.value.details["option"] == "vcpus" and "maximum vCPUs (2)" in err.value.msg


def shut_off_request(params: Dict[str, Any], service: Any, xml: str = LIBVIRT_STORED) -> DomainRequest:
    full = {"name": "vm1", "ovmf_code": S.DEFAULT_OVMF_CODE, "ovmf_vars": S.DEFAULT_OVMF_VARS,
            "hypervisor_vendor_id": "mlinfra"}
    full.update(params)
    req = DomainRequest(full, service, parse(xml), shut_off=True)
    req.build()
    return req


NO_TOPOLOGY = LIBVIRT_STORED.replace("<topology sockets='1' dies='1' cores='2' threads='1'/>", "")


@pytest.mark.parametrize("params,xml,expected", [
    # Above the maximum: the maximum follows.
    ({"memory": "512M"}, LIBVIRT_STORED, {"memory_kib": 524288, "max_memory_kib": 524288}),
    ({"vcpus": 3}, NO_TOPOLOGY, {"vcpus": 3, "max_vcpus": 3}),
    # A topology in the request that fits the new count.
    ({"vcpus": 4, "cpu": {"mode": "maximum", "sockets": 1, "cores": 4, "threads": 1}}, LIBVIRT_STORED,
     {"vcpus": 4, "max_vcpus": 4}),
    # Within the maximum: the maximum is not touched (not even compared).
    ({"memory": "200M"}, LIBVIRT_STORED, {"memory_kib": 204800}),
    ({"vcpus": 2}, LIBVIRT_STORED, {"vcpus": 2}),
])
def test_shut_off_domain_raises_its_maximum(gpu_host, params, xml, expected):
    desired = shut_off_request(params, gpu_host, xml).desired
    assert {k: desired.get(k) for k in ("memory_kib", "max_memory_kib", "vcpus", "max_vcpus")
            if k in desired} == expected


@pytest.mark.parametrize("params,option,fragment", [
    # An explicit maximum below the request is a contradiction, shut off or not.
    ({"memory": "512M", "max_memory": "300M"}, "memory", "above the domain's maximum memory (300 MiB)"),
    ({"vcpus": 4, "max_vcpus": 3}, "vcpus", "above the domain's maximum vCPUs (3)"),
    ({"max_memory": "100M"}, "max_memory", "below the domain's current memory (128 MiB)"),
    # The stored topology (1*2*1) fixes the maximum at 2: raising it needs a new topology.
    ({"vcpus": 4}, "vcpus", "sockets*cores*threads = 2"),
])
def test_shut_off_domain_still_refuses_contradictions(gpu_host, params, option, fragment):
    with pytest.raises(InvalidInputError) as err:
        shut_off_request(params, gpu_host)
    assert err.value.details["option"] == option and fragment in err.value.msg, err.value.msg
    assert "restart" not in err.value.msg  # a shut-off domain needs none


def test_hostdev_of_another_running_domain_is_refused(tmp_path):
    service = FakeService(sysfs_root=make_sysfs(str(tmp_path / "sys"), GPU_HOST),
                          in_use={"0000:01:00.0": "other-vm"})
    with pytest.raises(ConflictError) as err:
        request({"hostdevs": [{"address": "0000:01:00.0"}]}, service)
    assert "used by running domain other-vm" in err.value.msg


def test_hostdev_already_in_the_domain_is_not_rechecked(tmp_path):
    # managed='yes' hands a device back to its host driver while the domain is off: an
    # unchanged hostdev must not fail the group check on every re-run.
    host = [dict(GPU_HOST[0], driver="nvidia"), GPU_HOST[1]]
    service = FakeService(sysfs_root=make_sysfs(str(tmp_path / "sys"), host))
    req = request({"hostdevs": [{"address": "0000:01:00.0", "managed": True}]}, service,
                  existing=parse(LIBVIRT_STORED))
    assert req.new_hostdevs == []


def test_creation_defaults_for_tcg(gpu_host):
    req = request({"memory": "1G", "vcpus": 1}, gpu_host)
    req.creation_defaults()
    d = req.desired
    assert (d["machine"], d["virt_type"], d["cpu"]["mode"], d["firmware"]) == ("q35", "qemu", "maximum", {"type": "bios"})
    assert d["max_memory_kib"] == d["memory_kib"] == 1048576


def test_new_domain_needs_memory_and_vcpus(gpu_host):
    req = request({"vcpus": 1}, gpu_host)
    with pytest.raises(InvalidInputError) as err:
        req.creation_defaults()
    assert err.value.details["option"] == "memory"


# --------------------------------------------------------------------------- live vs restart decisions

class RecordingService(FakeService):
    """A running domain (LIBVIRT_STORED) whose service records every side effect."""

    def __init__(self, sysfs_root: str, state: str = "running", xml: str = LIBVIRT_STORED,
                 reason: str = "") -> None:
        super().__init__(sysfs_root=sysfs_root)
        self.root = parse(xml)
        self._state = state
        self._reason = reason
        self.calls: List[tuple] = []
        self.performed: List[str] = []

    class Dom:
        def name(self):
            return "vm1"

        def UUIDString(self):
            return "9dbdef7e-7ef2-4282-98b7-2e0baf076de0"

    def lookup(self, name):
        return self.Dom()

    def inactive_root(self, dom):
        return self.root

    def state(self, dom):
        return self._state

    def state_and_reason(self, dom):
        return self._state, self._reason

    def autostart(self, dom):
        return False

    def __getattr__(self, action):
        # define, attach, detach, set_vcpus, set_memory, request_shutdown, start, ... are recorded.
        def record(*args, **kwargs):
            self.calls.append((action,) + tuple(to_string(a) if hasattr(a, "tag") else a for a in args[1:]))
            if action == "define":
                self.root = args[0]
            return True
        return record


class FakeModule(StandInModule):
    def __init__(self, params: Dict[str, Any], check: bool = False) -> None:
        from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain import argument_spec
        super().__init__(params, argument_spec(), check, diff=True)


def run_domain(service, check=False, warnings=None, **params):
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain import DomainRunner
    params.setdefault("name", "vm1")
    params.setdefault("sysfs_root", service.sysfs_root)
    module = FakeModule(params, check)
    result = DomainRunner(module, service).run()
    if warnings is not None:
        warnings.extend(module.warnings)
    return result


@pytest.mark.parametrize("check", [True, False])
def test_a_crashed_domain_is_started_and_the_crash_reported(tmp_path, check):
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="shutoff", reason="crashed")
    warnings: List[str] = []
    result = run_domain(service, check=check, warnings=warnings, state="running")
    assert result["changed"] is True and result["actions"] == ["start (it was shutoff: crashed)"]
    assert len(warnings) == 1 and "vm1 was found shutoff (crashed)" in warnings[0], warnings
    assert "without a shutdown" in warnings[0] and "/var/log/libvirt/qemu/vm1.log" in warnings[0]
    assert [c[0] for c in service.calls if c[0] == "start"] == ([] if check else ["start"])


def test_a_crashed_domain_left_as_asked_still_warns(tmp_path):
    # state present leaves the run state alone, but a crash is never reported as a plain "ok".
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="shutoff", reason="crashed")
    warnings: List[str] = []
    result = run_domain(service, warnings=warnings, state="present")
    assert result["changed"] is False and warnings and "crashed" in warnings[0]


@pytest.mark.parametrize("state, reason", [("shutoff", "shutdown"), ("shutoff", "destroyed"), ("shutoff", "unknown"),
                                           ("paused", "user")])
def test_ordinary_states_start_without_a_warning(tmp_path, state, reason):
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state=state, reason=reason)
    warnings: List[str] = []
    result = run_domain(service, warnings=warnings, state="running")
    assert result["actions"] == ["resume" if state == "paused" else "start"] and warnings == []


def test_a_paused_on_io_error_domain_is_resumed_and_reported(tmp_path):
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="paused", reason="ioerror")
    warnings: List[str] = []
    result = run_domain(service, warnings=warnings, state="running")
    assert result["actions"] == ["resume (it was paused: ioerror)"]
    assert "disk I/O error" in warnings[0]


def test_state_reasons_follow_libvirts_codes():
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import state_reason
    import libvirt
    assert state_reason("shutoff", libvirt.VIR_DOMAIN_SHUTOFF_CRASHED) == "crashed"
    assert state_reason("shutoff", libvirt.VIR_DOMAIN_SHUTOFF_DESTROYED) == "destroyed"
    assert state_reason("paused", libvirt.VIR_DOMAIN_PAUSED_IOERROR) == "ioerror"
    assert state_reason("running", libvirt.VIR_DOMAIN_RUNNING_BOOTED) == "booted"
    assert state_reason("crashed", libvirt.VIR_DOMAIN_CRASHED_PANICKED) == "panicked"
    assert state_reason("shutoff", 99) == "" and state_reason("blocked", 0) == "" and state_reason("shutoff", None) == ""


@pytest.fixture
def running(tmp_path):
    return RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST))


def test_hostdev_attached_live(running):
    result = run_domain(running, hostdevs=[{"address": "0000:01:00.0", "managed": True, "index": 0,
                                            "include_functions": True}])
    assert result["actions"] == ["attach hostdev 0000:01:00.1 live"]
    assert result["restart_required"] is False
    (call,) = [c for c in running.calls if c[0] == "attach"]
    assert "bus=\"0x01\"" in call[1] and "function=\"0x1\"" in call[1]


def test_hostdev_detached_live(running):
    result = run_domain(running, hostdevs=[])
    assert result["actions"] == ["detach hostdev 0000:01:00.0 live"]
    assert [c[0] for c in running.calls if c[0] in ("attach", "detach", "define")] == ["detach"]


def test_new_maximum_needs_a_restart(running):
    result = run_domain(running, vcpus=4, max_vcpus=4)
    assert result["restart_required"] is True
    assert [c[0] for c in running.calls if c[0] in ("set_vcpus", "define")] == ["define"]
    assert result["domain"]["max_vcpus"] == 4


def test_memory_without_balloon_needs_a_restart(tmp_path):
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST),
                               xml=LIBVIRT_STORED.replace("<memballoon model='virtio'>", "<memballoon model='none'>"))
    result = run_domain(service, memory="200M")
    assert result["restart_required"] is True and "set_memory" not in [c[0] for c in service.calls]


def test_check_mode_predicts_without_side_effects(running):
    result = run_domain(running, check=True, vcpus=2, rng=True)
    assert result["changed"] is True and result["restart_required"] is True
    assert "set vcpus live" in result["actions"]
    assert [c for c in running.calls if c[0] not in ("lookup",)] == []


def test_restart_option_restarts_after_a_non_live_change(running):
    running.wait_shutoff = lambda dom, timeout: True
    result = run_domain(running, rng=True, restart=True)
    assert result["restarted"] is True and result["restart_required"] is False
    assert [c[0] for c in running.calls if c[0] in ("define", "request_shutdown", "start")] == \
        ["define", "request_shutdown", "start"]


def test_shut_off_domain_is_redefined_once(tmp_path):
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="shutoff")
    result = run_domain(service, vcpus=2, rng=True, hostdevs=[])
    assert result["actions"] == ["redefine"] and result["restart_required"] is False
    assert [c[0] for c in service.calls if c[0] in ("define", "attach", "detach", "set_vcpus")] == ["define"]


@pytest.mark.parametrize("check", [True, False])
def test_shut_off_domain_memory_and_vcpus_above_maximum_four_fields(tmp_path, check):
    """The runner: check mode predicts exactly the redefinition a real run performs."""
    service = RecordingService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="shutoff", xml=NO_TOPOLOGY)
    result = run_domain(service, check=check, memory="512M", vcpus=3)
    assert result["actions"] == ["redefine"] and result["restart_required"] is False
    assert result["diff"]["after"] == {"max_memory_kib": 524288, "memory_kib": 524288, "max_vcpus": 3, "vcpus": 3}
    assert result["diff"]["before"] == {"max_memory_kib": 262144, "memory_kib": 131072, "max_vcpus": 2, "vcpus": 1}
    summary = result["domain"]
    assert (summary["memory_mib"], summary["max_memory_mib"], summary["vcpus"], summary["max_vcpus"]) == (512, 512, 3, 3)
    defines = [c for c in service.calls if c[0] == "define"]
    assert len(defines) == (0 if check else 1)


def test_running_domain_memory_above_maximum_is_refused_by_the_runner(running):
    with pytest.raises(InvalidInputError) as err:
        run_domain(running, memory="512M")
    assert "next restart" in err.value.msg
    assert [c for c in running.calls if c[0] in ("define", "set_memory")] == []


def test_metadata_is_compared_whole():
    """metadata is replaced as a whole (as documented): a key the request drops is a difference,
    and an empty dict removes every key (they once compared as a subset, and reported ok)."""
    assert S.field_matches("metadata", {"role": "worker"}, {"role": "worker"})
    assert not S.field_matches("metadata", {"role": "worker"}, {"role": "worker", "team": "nlp"})
    assert not S.field_matches("metadata", {}, {"role": "worker"})


def test_a_domains_list_reads_the_host_pci_devices_once(tmp_path, monkeypatch):
    """Items of one mlinfra.kvm.domains call share one PCI scan; an item without hostdevs
    reads none. (test:///default stands in for libvirt; the devices are a synthetic sysfs.)"""
    import libvirt
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain_pci
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import ItemModule
    scans = []
    real_devices = _domain_pci.SysfsPci.devices

    def counting(self):
        if self._cache is None:
            scans.append(self.root)
        return real_devices(self)

    monkeypatch.setattr(_domain_pci.SysfsPci, "devices", counting)
    sysfs = make_sysfs(str(tmp_path / "sys"), GPU_HOST)
    conn = libvirt.open("test:///default")
    shared: Dict[str, Any] = {}
    try:
        for index, hostdevs in enumerate(([], [{"address": "0000:01:00.0"}], [{"address": "0000:01:00.1"}])):
            params = {"name": "pci-share-%d" % index, "uri": "test:///default", "sysfs_root": sysfs,
                      "virt_type": "qemu", "memory": "64M", "vcpus": 1, "hostdevs": hostdevs}
            single = FakeModule(params, check=True)  # the params completed with the defaults
            module = ItemModule(single, single.params, True, "config[%d]" % index, {}, shared)
            assert _domain.run_domain(module, conn, True)["changed"] is True
            assert len(scans) == (0 if index == 0 else 1), scans
    finally:
        conn.close()


class AddressedService(RecordingService):
    """A domain with a DHCP lease: what the wait would return, and what one read finds."""

    LEASES = [{"name": "vnet0", "type": "ipv4", "address": "192.0.2.7", "prefix": 24, "mac": "52:54:00:00:00:07"},
              {"name": "vnet0", "type": "ipv6", "address": "2001:db8::7", "prefix": 64, "mac": "52:54:00:00:00:07"}]

    def lease_addresses(self, dom):
        self.calls.append(("lease_addresses",))
        return self.LEASES

    lease_ipv4 = DomainService.lease_ipv4  # the service's own filter over the leases above

    def wait_for_ip(self, dom, timeout):
        self.calls.append(("wait_for_ip", timeout))
        return self.LEASES[:1]


@pytest.mark.parametrize("check", [True, False])
def test_a_running_domain_reports_its_address_in_check_mode_too(tmp_path, check):
    """Check mode reads the address of a domain that already runs (once, no wait), so that the
    plays after it (the guest role's) predict on the guest as a real run would act on it."""
    service = AddressedService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="running")
    result = run_domain(service, check=check, state="running", wait_for_ip=True, wait_for_ip_timeout=30)
    assert result["changed"] is False
    assert [a["address"] for a in result["domain"]["ip_addresses"]] == ["192.0.2.7"], result["domain"]
    assert [c for c in service.calls if c[0] in ("wait_for_ip", "lease_addresses")] == \
        ([("lease_addresses",)] if check else [("wait_for_ip", 30)])


def test_a_domain_check_mode_would_start_has_no_address_yet(tmp_path):
    service = AddressedService(make_sysfs(str(tmp_path / "sys"), GPU_HOST), state="shutoff")
    result = run_domain(service, check=True, state="running", wait_for_ip=True)
    assert result["changed"] is True and result["actions"] == ["start"]
    assert result["domain"]["ip_addresses"] == []
    assert not [c for c in service.calls if c[0] in ("wait_for_ip", "lease_addresses", "start")]
