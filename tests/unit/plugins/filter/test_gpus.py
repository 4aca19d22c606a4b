"""plugins/filter/gpus.py: gpu_hostdev and pci_selector write GPU entries out in the one PCI
selector grammar (plugins/module_utils/_host/_pci_select; its tests are in
tests/unit/plugins/module_utils/_host/test_pci_select.py)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.gpus import gpu_hostdev, pci_selector

pytestmark = pytest.mark.unit


def test_the_filters_write_entries_out_in_the_grammar() -> None:
    assert gpu_hostdev("3b:00.0") == {"address": "0000:3b:00.0", "include_functions": True}
    assert gpu_hostdev({"vendor": "10DE", "device": "2335"}) == {
        "vendor": "10de", "device": "2335", "index": 0, "include_functions": True}
    assert gpu_hostdev("10de:2335", include_functions=False) == {
        "vendor": "10de", "device": "2335", "index": 0, "include_functions": False}
    assert pci_selector("10de:2335") == {"vendor": "10de", "device": "2335", "include_functions": False}
    assert pci_selector({"vendor": "10de", "device": "2335", "index": 1}, "v") == {
        "vendor": "10de", "device": "2335", "index": 1, "include_functions": False}
    with pytest.raises(AnsibleFilterError) as err:
        gpu_hostdev({"address": "nonsense"})
    assert "option gpu entry.address: value 'nonsense' is not a PCI address" in str(err.value)
    with pytest.raises(AnsibleFilterError) as err:
        pci_selector(["10de"], "hypervisor_vfio_devices")
    assert "option hypervisor_vfio_devices: value ['10de'] is neither a string nor a dict" in str(err.value)
