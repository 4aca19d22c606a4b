"""One PCI selector grammar (module_utils/_host/_pci_select): vfio_pci's devices, domain's hostdevs,
pci_info's per-GPU selector, the gpu_hostdev and pci_selector filters (their tests:
tests/unit/plugins/filter/test_gpus.py) and the hypervisor role's hypervisor_vfio_devices all
parse and resolve entries the same way.

The round trip runs the real modules on one synthetic host with two identical GPUs: the selector
pci_info reports for the second GPU names that GPU (and its audio function) in vfio_pci's plan
and in the domain module's, both in check mode."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List

import pytest


from conftest import run_module_process  # noqa: E402
from sysfs_builder import GPU, GPU_AUDIO, SysfsTree, gpu_host  # noqa: E402
from test_roles_static import failures, run_playbook  # noqa: E402

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci import PciDevice  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._pci_select import (  # noqa: E402
    index_among_twins, parse_selector)

pytestmark = pytest.mark.unit

GPU2, GPU2_AUDIO = "0000:02:00.0", "0000:02:00.1"


def two_gpu_host(base: Path) -> SysfsTree:
    """gpu_host plus a second card of the same model in its own group, both cards on vfio-pci
    (so passthrough is possible and the domain module's group check passes)."""
    tree = gpu_host(base)
    tree.add_device(GPU2, "10de", "2335", "030200", driver="vfio-pci", group=8)
    tree.add_device(GPU2_AUDIO, "10de", "22a3", "040300", driver="vfio-pci", group=8)
    for address in (GPU, GPU_AUDIO):
        tree.unbind(address)
        tree.bind(address, "vfio-pci")
    return tree


RECORDS = {a: PciDevice(a, v, d, c, None, None) for a, v, d, c in [
    (GPU, "10de", "2335", "030200"), (GPU_AUDIO, "10de", "22a3", "040300"),
    (GPU2, "10de", "2335", "030200"), (GPU2_AUDIO, "10de", "22a3", "040300"),
    ("0000:00:1c.0", "8086", "a110", "060400")]}


@pytest.mark.parametrize("entry,expected", [
    ("3b:00.0", ["0000:3b:00.0"]),           # domain 0000 when omitted (not on this host: resolve refuses)
    (GPU2, [GPU2]),
    ({"address": GPU2, "include_functions": True}, [GPU2, GPU2_AUDIO]),
    ("10DE:2335", [GPU, GPU2]),                 # ids: every device with them
    ({"vendor": "10de", "device": "2335"}, [GPU, GPU2]),
    ({"vendor": "0x10de", "device": "2335", "index": 1}, [GPU2]),
    ({"vendor": "10de", "device": "2335", "index": 0, "include_functions": True}, [GPU, GPU_AUDIO]),
])
def test_the_grammar_resolves(entry: Any, expected: List[str]) -> None:
    selector = parse_selector("devices[0]", entry)
    if expected == ["0000:3b:00.0"]:
        assert selector.address == "0000:3b:00.0"
        with pytest.raises(InvalidInputError) as err:
            selector.resolve(RECORDS, "in the test's records")
        assert "is not a PCI device in the test's records" in err.value.msg
        return
    assert selector.resolve(RECORDS, "in the test's records") == expected


@pytest.mark.parametrize("entry,option,fragment", [
    ("0000:zz:00.0", "devices[0]", "is not a PCI address"),
    ("10de:23", "devices[0]", "is not a PCI address"),
    (7, "devices[0]", "is neither a string nor a dict"),
    ({"address": GPU, "vendor": "10de", "device": "2335"}, "devices[0]", "needs either address or vendor + device"),
    ({"vendor": "10de"}, "devices[0]", "needs both vendor and device"),
    ({"vendor": "nvidia", "device": "2335"}, "devices[0].vendor", "is not a 4-digit PCI id"),
    ({"vendor": "10de", "device": "2335", "index": -1}, "devices[0].index", "is out of range"),
    ({"vendor": "10de", "device": "2335", "index": "two"}, "devices[0].index", "is not a whole number"),
    ({"address": GPU, "include_functions": "yes"}, "devices[0].include_functions", "is not a boolean"),
    ({"address": GPU, "slot": 3}, "devices[0]", "has unknown keys slot"),
])
def test_the_grammar_refuses_with_the_option(entry: Any, option: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_selector("devices[0]", entry)
    assert err.value.msg.startswith("option %s: value " % option) and fragment in err.value.msg, err.value.msg


def test_an_index_past_the_matches_is_refused_with_the_count() -> None:
    selector = parse_selector("hostdevs[0]", {"vendor": "10de", "device": "2335", "index": 2})
    with pytest.raises(InvalidInputError) as err:
        selector.resolve(RECORDS, "in the test's records")
    assert "matches no PCI device in the test's records (2 with these ids)" in err.value.msg


def test_index_among_twins_inverts_resolve() -> None:
    for address, record in RECORDS.items():
        index = index_among_twins(address, RECORDS)
        selector = parse_selector("x", {"vendor": record.vendor, "device": record.device, "index": index})
        assert selector.resolve(RECORDS, "here") == [address]


def test_pci_info_selector_names_the_same_gpu_in_vfio_pci_and_domain(tmp_path: Path) -> None:
    tree = two_gpu_host(tmp_path)
    info = run_module_process("pci_info", {"sysfs_root": str(tree.sys), "proc_root": str(tree.proc)})
    assert not info["failed"], info
    selectors = {g["address"]: g["selector"] for g in info["gpus"] if g["vendor_id"] == "10de"}
    assert selectors == {
        GPU: {"vendor": "10de", "device": "2335", "index": 0, "include_functions": True},
        GPU2: {"vendor": "10de", "device": "2335", "index": 1, "include_functions": True}}

    # vfio_pci, check mode: both functions of the second card. The boot-time binding goes by ids,
    # so it would take the first card too: refused, naming it; bound now only, it is the two.
    script, _unused = tree.fake_command("update-initramfs")
    modprobe, _unused = tree.fake_command("modprobe")
    args = dict(tree.roots(), devices=[selectors[GPU2]], initramfs_command=[str(script), "-u"],
                modprobe_command=[str(modprobe)], bind_timeout=20)
    refused = run_module_process("vfio_pci", args, check=True)
    assert refused["failed"] and "also take %s, %s" % (GPU, GPU_AUDIO) in refused["msg"], refused
    vfio = run_module_process("vfio_pci", dict(args, persistent=False), check=True)
    assert not vfio["failed"], vfio
    assert sorted(d["address"] for d in vfio["devices"]) == [GPU2, GPU2_AUDIO], vfio["devices"]

    # domain, check mode: a new domain would get the same two functions.
    domain = run_module_process("domain", {
        "name": "pci-select", "uri": "test:///default", "memory": "256M", "vcpus": 1,
        "sysfs_root": str(tree.sys), "hostdevs": [selectors[GPU2]]}, check=True, diff=True)
    assert not domain["failed"] and domain["changed"], domain
    assert [h["address"] for h in domain["diff"]["after"]["hostdevs"]] == [GPU2, GPU2_AUDIO], domain["diff"]


def test_the_hypervisor_role_refuses_a_malformed_entry_before_any_change(tmp_path: Path) -> None:
    path = tmp_path / "play.yml"
    devices = ["0000:01:00.0", {"vendor": "10de", "device": "2335", "index": "second"}]
    path.write_text(json.dumps([{
        "name": "hypervisor preflight with a malformed vfio entry", "hosts": "localhost", "gather_facts": False,
        "roles": [{"role": "mlinfra.kvm.hypervisor", "vars": {"hypervisor_vfio_devices": devices}}]}]))
    proc = run_playbook(path, "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = failures(proc)
    assert failed and failed[0][0] == "mlinfra.kvm.hypervisor : Derive the role's internal facts (nothing on the host changes)", failed
    assert "option hypervisor_vfio_devices.index: value 'second' is not a whole number" in failed[0][1], failed
