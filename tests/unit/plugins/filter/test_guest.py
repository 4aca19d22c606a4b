"""plugins/filter/guest.py: the guest role's VM list as items of mlinfra.kvm.volumes and
mlinfra.kvm.domains (the domains items are checked by rendering them with the real module)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from lxml import etree

from conftest import run_module_process
from ansible_collections.mlinfra.kvm.plugins.filter.guest import guest_domains, guest_volumes

pytestmark = pytest.mark.unit

NO_LIBVIRT = "qemu+unix:///system?socket=/nonexistent/mlinfra-no-libvirtd"


def test_guest_volumes_filter():
    vms = [{"name": "w1", "disk": "20G"}, {"name": "w2"}]
    assert guest_volumes(vms, "lab", "/b/ml.qcow2", "10G") == [
        {"name": "w1.qcow2", "pool": "lab", "backing": "/b/ml.qcow2", "capacity": "20G"},
        {"name": "w2.qcow2", "pool": "lab", "backing": "/b/ml.qcow2", "capacity": "10G"}]
    with pytest.raises(AnsibleFilterError, match="VM 0 .* has no name"):
        guest_volumes([{"disk": "1G"}], "lab", "/b", "1G")


GUEST_SETTINGS = {"virt_type": "qemu", "cpu_mode": "maximum", "default_memory": "2G", "default_vcpus": 2,
                  "firmware": "kernel", "kernel": "/b/vmlinuz", "initrd": "/b/initrd.img", "cmdline": "root=/dev/vda",
                  "pool": "lab", "state_dir": "/var/lib/g", "network": "labnet"}


def test_guest_domains_filter_items_are_what_the_domains_module_renders():
    vms = [{"name": "w1", "memory": "4G", "vcpus": 3, "role": "trainer"},
           {"name": "w2", "network": "other", "gpus": ["0000:3b:00.0"]}]
    items = guest_domains(vms, GUEST_SETTINGS)
    assert [i["memory"] for i in items] == ["4G", "2G"] and [i["vcpus"] for i in items] == [3, 2]
    assert items[0]["metadata"] == {"role": "trainer", "managed_by": "mlinfra.kvm"}
    assert items[1]["interfaces"] == [{"network": "other"}]
    assert items[1]["hostdevs"] == [{"address": "0000:3b:00.0", "include_functions": True}]
    assert items[0]["cdroms"] == [{"path": "/var/lib/g/w1-seed.iso"}] and items[0]["kernel"] == "/b/vmlinuz"
    bios = guest_domains(vms[:1], dict(GUEST_SETTINGS, firmware="bios"))
    assert "kernel" not in bios[0] and bios[0]["firmware"] == "bios"
    # The items are valid domains input: the module renders them (no hypervisor needed).
    rendered = run_module_process("domains", {"uri": NO_LIBVIRT, "state": "rendered", "config": items[:1]})
    assert not rendered["failed"], rendered
    root = etree.fromstring(rendered["rendered"]["w1"].encode())
    assert root.findtext("os/kernel") == "/b/vmlinuz" and root.find("devices/serial/source").get("path") == "/var/lib/g/w1-console.log"
    with pytest.raises(AnsibleFilterError, match="settings lack network"):
        guest_domains(vms, {k: v for k, v in GUEST_SETTINGS.items() if k != "network"})
    with pytest.raises(AnsibleFilterError, match="VM 0 .* has no name"):
        guest_domains([{"memory": "1G"}], GUEST_SETTINGS)
