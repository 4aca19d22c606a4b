"""One PCI model (_pci.PciDevice, _pci.group_blockers): pci_info, vfio_pci and the domain module's
hostdev check judge an IOMMU group by the same rule, the kernel's vfio viability rule.

The rule table runs on records; the agreement test runs the real pci_info and domain modules
(libvirt's test driver, check mode) on one synthetic sysfs tree in five binding states, and each
must give the same verdict and name the same blocking devices."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List

import pytest


from conftest import run_module_process  # noqa: E402
from sysfs_builder import BRIDGE, GPU, GPU_AUDIO, SysfsTree, gpu_host  # noqa: E402

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_pci import SysfsPci  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci import (  # noqa: E402
    PciDevice, PciScanner, group_blockers, is_interconnect)
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import Roots  # noqa: E402

pytestmark = pytest.mark.unit

ISA = "0000:01:00.2"  # an ISA bridge function put into the GPU's group (ordinary header)


@pytest.mark.parametrize("class_code,driver,blocks", [
    ("0x060400", "pcieport", False),   # PCI-to-PCI bridge: keeps pcieport
    ("060900", "pcieport", False),     # semi-transparent bridge: bridge header too
    ("060700", "yenta_cardbus", False),  # CardBus bridge: bridge header
    ("060000", "amd64_edac", True),    # host bridge: ordinary header, counts like an endpoint
    ("060100", "lpc_ich", True),       # ISA bridge: likewise
    ("030200", "nvidia", True),
    ("030200", "vfio-pci", False),
    ("040300", "pci-stub", False),
    ("040300", None, False),           # no driver at all
])
def test_the_viability_rule(class_code: str, driver: str, blocks: bool) -> None:
    device = PciDevice("0000:01:00.0", "0x10de", "0x2335", class_code, driver, 7)
    assert device.blocks_vfio is blocks
    assert group_blockers([device]) == ([device] if blocks else [])
    assert device.class_code == class_code.replace("0x", "")


def test_records_normalise_ids_whichever_source() -> None:
    from_sysfs = PciDevice("0000:01:00.0", "10DE", "2335", "030200", "", None)
    from_nodedev = PciDevice("0000:01:00.0", "0x10de", "0x2335", "0x030200", None, None)
    assert vars(from_sysfs) == vars(from_nodedev)
    assert is_interconnect("0x060400") and not is_interconnect("0x060000") and not is_interconnect("")


def test_the_domain_source_reads_what_pci_info_reads(tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    scanner_records = PciScanner(Roots(sysfs_root=str(tree.sys))).records()
    domain_records = SysfsPci(str(tree.sys)).devices()
    assert sorted(domain_records) == sorted(scanner_records) and len(domain_records) == 7
    assert {a: vars(d) for a, d in domain_records.items()} == {a: vars(d) for a, d in scanner_records.items()}
    assert SysfsPci(str(tree.sys)).group_members(7) == [BRIDGE, GPU, GPU_AUDIO]


def _shipped(tree: SysfsTree) -> None:
    pass


def _gpu_on_vfio(tree: SysfsTree) -> None:
    tree.unbind(GPU)
    tree.bind(GPU, "vfio-pci")


def _audio_unbound(tree: SysfsTree) -> None:
    _gpu_on_vfio(tree)
    tree.unbind(GPU_AUDIO)


def _audio_on_pci_stub(tree: SysfsTree) -> None:
    _gpu_on_vfio(tree)
    tree.unbind(GPU_AUDIO)
    tree.bind(GPU_AUDIO, "pci-stub")


def _isa_bridge_in_the_group(tree: SysfsTree) -> None:
    _audio_unbound(tree)
    tree.add_device(ISA, "8086", "2918", "060100", driver="lpc_ich", group=7)


@pytest.mark.parametrize("arrange,blockers", [
    (_shipped, [GPU, GPU_AUDIO]),
    (_gpu_on_vfio, [GPU_AUDIO]),
    (_audio_unbound, []),
    (_audio_on_pci_stub, []),
    (_isa_bridge_in_the_group, [ISA]),
], ids=lambda v: v.__name__.lstrip("_") if callable(v) else None)
def test_pci_info_and_the_domain_module_give_one_verdict(
        tmp_path: Path, arrange: Callable[[SysfsTree], None], blockers: List[str]) -> None:
    tree = gpu_host(tmp_path)
    arrange(tree)
    info = run_module_process("pci_info", {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc)})
    assert not info["failed"], info
    passthrough = {g["address"]: g for g in info["gpus"]}[GPU]["passthrough"]
    assert passthrough["blocking_devices"] == blockers
    assert passthrough["possible"] is (not blockers)

    # The domain module, predicting (check mode) a new domain with the GPU passed through.
    domain = run_module_process("domain", {
        "name": "pci-model", "uri": "test:///default", "memory": "256M", "vcpus": 1,
        "sysfs_root": str(tree.sys), "hostdevs": [{"address": GPU}]}, check=True)
    if blockers:
        assert domain["failed"] and domain["option"] == "hostdevs" and not domain["changed"], domain
        named = [part.split(" uses ")[0] for part in
                 domain["msg"].split("not wholly bound to vfio-pci (", 1)[1].split(")", 1)[0].split(", ")]
        assert named == blockers, domain["msg"]
        assert "Traceback" not in domain["msg"]
    else:
        assert not domain["failed"] and domain["changed"], domain
