"""The resource-list modules (networks, pools, volumes) without a libvirtd: their option docs
against the single-object modules', rendered (which never connects), input refused before any
connection. The guest role's filters that feed them: tests/unit/plugins/filter/test_guest.py."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
import yaml
from lxml import etree

from conftest import ROOT, run_module_process
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _network
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _pool
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _volume
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import list_argument_spec

pytestmark = pytest.mark.unit
# A URI whose connection fails at once, here: a call that must not connect proves it did not.
NO_LIBVIRT = "qemu+unix:///system?socket=/nonexistent/mlinfra-no-libvirtd"
KINDS = {"networks": _network, "pools": _pool, "volumes": _volume, "domains": _domain}


def doc_options(module: str) -> dict:
    text = (ROOT / "plugins" / "modules" / (module + ".py")).read_text()
    return yaml.safe_load(re.search(r"DOCUMENTATION = r'''\n(.*?)'''", text, re.S).group(1))["options"]


def test_generated_config_docs_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_list_module_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_items_take_the_single_module_options(plural):
    kind = KINDS[plural].LIST_KIND
    single = doc_options(kind.kind)
    documented = doc_options(plural)["config"]["suboptions"]
    spec = list_argument_spec(kind)["config"]["options"]
    assert sorted(documented) == sorted(set(single) - {"uri"}) == sorted(spec)
    for option, desc in spec.items():
        assert "default" not in desc, option  # merged must see what an item leaves out
        assert documented[option]["type"] == desc.get("type", "str"), option
        assert documented[option].get("choices") == desc.get("choices"), option
        assert bool(documented[option].get("required")) == (option in kind.key_fields), option


def test_rendered_never_connects():
    result = run_module_process("networks", {"uri": NO_LIBVIRT, "state": "rendered", "config": [
        {"name": "lab", "address": "192.168.150.1", "prefix": 24,
         "dhcp_range": {"start": "192.168.150.100", "end": "192.168.150.200"}}]})
    assert not result["failed"], result
    xml = result["rendered"]["lab"]
    assert '<ip address="192.168.150.1" prefix="24">' in xml and '<forward mode="nat"/>' in xml
    pools = run_module_process("pools", {"uri": NO_LIBVIRT, "state": "rendered",
                                         "config": [{"name": "images", "target": "/var/lib/x/../images"}]})
    assert "<path>/var/lib/images</path>" in pools["rendered"]["images"], pools
    vols = run_module_process("volumes", {"uri": NO_LIBVIRT, "state": "rendered", "config": [
        {"pool": "p", "name": "d.qcow2", "capacity": "1G", "backing": "/b/base.qcow2"}]})
    assert "<capacity unit=\"bytes\">1073741824</capacity>" in vols["rendered"]["p/d.qcow2"], vols
    missing = run_module_process("volumes", {"uri": NO_LIBVIRT, "state": "rendered", "config": [
        {"pool": "p", "name": "d.qcow2"}]})
    assert missing["failed"] and missing["msg"].startswith("config[0] (p/d.qcow2): option capacity"), missing


def test_rendered_refuses_a_pool_the_module_would_refuse():
    """rendered and the module share one precheck: a netfs pool without its server is refused
    by both, naming the options, instead of rendering a <host/> without a name."""
    item = {"name": "nfs", "type": "netfs", "target": "/mnt/nfs", "source_dir": "/export"}
    rendered = run_module_process("pools", {"uri": NO_LIBVIRT, "state": "rendered", "config": [item]})
    assert rendered["failed"] and "option source_host/source_dir" in rendered["msg"], rendered
    single = run_module_process("pool", dict(item, uri=NO_LIBVIRT))
    assert single["failed"] and "option source_host/source_dir" in single["msg"], single
    assert not single["changed"]


def test_rendered_domains_never_connect():
    result = run_module_process("domains", {"uri": NO_LIBVIRT, "state": "rendered", "config": [
        {"name": "w1", "virt_type": "qemu", "memory": "2G", "vcpus": 2, "disks": [{"pool": "lab", "volume": "w1.qcow2"}],
         "interfaces": [{"network": "lab"}], "metadata": {"role": "worker"}}]})
    assert not result["failed"], result
    root = etree.fromstring(result["rendered"]["w1"].encode())
    assert root.get("type") == "qemu" and root.findtext("memory") == str(2 * 1024 * 1024)
    assert root.find("devices/disk/driver").get("type") == "qcow2"  # from the volume's name
    assert root.find("devices/disk/source").attrib == {"pool": "lab", "volume": "w1.qcow2"}
    assert root.find("devices/interface/source").get("network") == "lab"
    gpu = run_module_process("domains", {"uri": NO_LIBVIRT, "state": "rendered", "config": [
        {"name": "g1", "memory": "2G", "vcpus": 2, "hostdevs": [{"address": "0000:01:00.0"}]}]})
    assert gpu["failed"] and gpu["msg"].startswith("config[0] (g1): option hostdevs"), gpu
    assert "cannot be rendered" in gpu["msg"]


@pytest.mark.parametrize("plural,args,expected", [
    ("networks", {"config": [{"name": "a", "mode": "tunnel"}]}, "value of mode must be one of"),
    ("networks", {"config": [{"name": "a"}, {"name": "a"}]}, "names the same network as config[0]"),
    ("networks", {"state": "replaced", "config": [{"name": "a", "mtu": 9}]}, "config[0] (a): option mtu"),
    ("pools", {"state": "replaced", "config": [{"name": "a"}]}, "config[0] (a): option target"),
    ("volumes", {"state": "replaced", "config": [{"pool": "p", "name": "x.mlinfra-partial", "capacity": "1G"}]},
     "ends with .mlinfra-partial"),
    ("volumes", {"state": "overridden", "config": []}, "option scope: value None is required with state: overridden"),
    ("domains", {"state": "replaced", "config": [{"name": "a", "memory": "1G"}]},
     "option config[0] (a).vcpus: value None is required with state: replaced"),
    ("domains", {"config": [{"name": "a", "state": "rebooted"}]}, "value of state must be one of"),
    ("pools", {"state": "merged", "scope": {"name_prefix": "lab-"}, "config": [{"name": "other", "target": "/x"}]},
     "is outside scope.name_prefix lab-"),
])
def test_bad_input_fails_before_connecting(plural, args, expected):
    result = run_module_process(plural, dict(args, uri=NO_LIBVIRT))
    assert result["failed"] and not result.get("changed"), result
    assert expected in result["msg"], result["msg"]
    assert "Traceback" not in result["msg"]


def test_list_modules_are_in_the_libvirt_group():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert {"networks", "pools", "volumes", "domains"} <= set(runtime["action_groups"]["libvirt"])
    for plural in KINDS:
        importlib.import_module("ansible_collections.mlinfra.kvm.plugins.modules." + plural)


def test_an_object_removed_while_listed_is_left_out():
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import LibvirtCallError
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._resource_list import read_listed

    def read(name):
        if name == "gone":
            raise LibvirtCallError("reading pool XML", 49, "Storage pool not found")
        if name == "broken":
            raise LibvirtCallError("reading pool XML", 1, "internal error")
        return {"name": name}

    assert read_listed(["a", "gone", "b"], read) == [{"name": "a"}, {"name": "b"}]
    with pytest.raises(LibvirtCallError, match="internal error"):
        read_listed(["a", "broken"], read)


@pytest.mark.parametrize("args", [
    {"config": "mlinfra-lab"},
    {"config": ["mlinfra-lab"]},
    {"config": [{"name": "a", "hosts": "52:54:00:00:00:01"}]},
    {"config": [{"name": "a", "dhcp_range": {"start": "10.0.0.2"}}]},
    {"config": [{"name": "a", "mtu": "big"}]},
    {"config": [{"name": "a", "color": "blue"}]},
    {"config": [{"name": "a\nb", "address": "10.9.0.1", "prefix": 24}], "state": "rendered"},
    {"config": [{"name": "a", "address": "10.9.0.300", "prefix": 24}], "state": "rendered"},
    {"config": [], "scope": {"name_prefix": None}, "state": "deleted"},
    {"config": [], "scope": "mlinfra-", "state": "deleted"},
    {"state": "sideways"},
])
def test_malformed_input_is_an_error_never_a_traceback(args):
    result = run_module_process("networks", dict(args, uri=NO_LIBVIRT))
    assert result["failed"] and not result.get("changed"), result
    assert result["msg"] and "Traceback" not in str(result), result
