"""Issue 13: every numeric option is bounded and every free-text option refuses control
characters, with an error that names the option, the value and the fix - never an lxml
traceback. Table-driven over the shared validators and over the domain and network modules'
request builders (no daemon: the domain side uses the fake service of test_domain_xml).
"""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain_request as R
from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _validate as V
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_spec import build_new
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.modules import domain as domain_module
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _network as network_module

from test_domain_xml import FakeService, request

pytestmark = pytest.mark.unit


def refused(func, *args, **kwargs) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as err:
        func(*args, **kwargs)
    return err.value


# --------------------------------------------------------------------------- int_range

@pytest.mark.parametrize("value,low,high,expected", [
    (1, 1, 4096, 1), (4096, 1, 4096, 4096), ("68", 68, 65535, 68), (0, 0, 10, 0),
])
def test_int_range_accepts_the_bounds(value, low, high, expected):
    assert V.int_range("opt", value, low, high) == expected


@pytest.mark.parametrize("value,low,high,problem", [
    (0, 1, 4096, "is out of range"), (4097, 1, 4096, "is out of range"),
    (-1, 0, 10, "is out of range"), ("x", 0, 10, "is not a whole number"),
    (True, 0, 10, "is not a whole number"), (1.5, 0, 10, "is not a whole number"),
])
def test_int_range_refuses(value, low, high, problem):
    err = refused(V.int_range, "opt", value, low, high, "why")
    assert err.details["option"] == "opt" and err.details["value"] == value
    assert problem in err.msg and "from %d to %d" % (low, high) in err.msg


# --------------------------------------------------------------------------- cpusets

@pytest.mark.parametrize("text,cpus", [
    ("0-3", [0, 1, 2, 3]), ("0-3,^2", [0, 1, 3]), ("4,2", [2, 4]), ("8191", [8191]),
    ("0 - 1", [0, 1]), ("3-3", [3]), (5, [5]),
])
def test_cpuset_accepts(text, cpus):
    assert V.cpuset("cs", text) == cpus


@pytest.mark.parametrize("text,fragment", [
    ("0-999999999", "names index 999999999, above the maximum 8191"),
    ("8192", "above the maximum 8191"),
    ("5-2", "descending range '5-2'"),
    ("0,,1", "has an empty item"),
    ("0,", "has an empty item"),
    ("", "is not a CPU/node set"),
    ("1-", "is not N or N-M"),
    ("-1", "is not N or N-M"),
    ("a", "is not N or N-M"),
    ("^1", "selects no CPU"),
    ("0-3,^0-3", "selects no CPU"),
    (None, "is not a CPU/node set"),
])
def test_cpuset_refuses(text, fragment):
    err = refused(V.cpuset, "cs", text)
    assert err.details["option"] == "cs" and fragment in err.msg


def test_cpuset_takes_its_own_maximum():
    assert V.cpuset("nodes", "1023", 1023) == [1023]
    assert "above the maximum 1023" in refused(V.cpuset, "nodes", "1024", 1023).msg


# --------------------------------------------------------------------------- control characters

CONTROL = [chr(c) for c in range(0x20)] + ["\x7f", "\ud800", "\ufffe", "\uffff"]


@pytest.mark.parametrize("char", CONTROL, ids=["U+%04X" % ord(c) for c in CONTROL])
def test_plain_text_refuses_every_control_character(char):
    err = refused(V.plain_text, "opt", "ab" + char + "c")
    assert err.details["option"] == "opt"
    assert "control character U+%04X at position 2" % ord(char) in err.msg
    assert "remove control characters" in err.msg


@pytest.mark.parametrize("value", ["plain", "with space", "caf\u00e9", "\u00a0nbsp", "emoji \U0001f600", 42, None])
def test_plain_text_accepts_printable_text(value):
    assert V.plain_text("opt", value) == value


@pytest.mark.parametrize("params,path,option", [
    ({"a": "x\n"}, "a", "a"),
    ({"a": {"b": "x\n"}}, "a.b", "a.b"),
    ({"a": [{"b": "ok"}, {"b": "x\n"}]}, "a[].b", "a[1].b"),
    ({"a": [{"b": ["ok", "x\n"]}]}, "a[].b[]", "a[0].b[1]"),
    ({"a": {"k": "x\n"}}, "a{}", "a.k"),
    ({"a": {"k\n": "v"}}, "a{}", "a"),
])
def test_plain_texts_walks_lists_and_dicts(params, path, option):
    assert refused(V.plain_texts, params, [path]).details["option"] == option


@pytest.mark.parametrize("params", [{}, {"a": None}, {"a": [None]}, {"a": {"k": 1}}, {"a": [{"b": None}]}])
def test_plain_texts_skips_what_is_not_set(params):
    for path in ("a", "a[].b", "a{}", "a.b"):
        V.plain_texts(params, [path])


def _text_paths(spec: Dict[str, Any], prefix: str = "") -> List[str]:
    """Every free-text (str/path, no choices) option of an argument spec, as plain_texts paths."""
    out = []
    for name, opt in spec.items():
        kind, elements = opt.get("type", "str"), opt.get("elements")
        if kind in ("str", "path") and not opt.get("choices"):
            out.append(prefix + name)
        elif kind == "list" and elements in ("str", "path") and not opt.get("choices"):
            out.append(prefix + name + "[]")
        elif kind == "list" and opt.get("options"):
            out.extend(_text_paths(opt["options"], prefix + name + "[]."))
        elif kind == "dict" and opt.get("options"):
            out.extend(_text_paths(opt["options"], prefix + name + "."))
        elif kind == "dict":
            out.append(prefix + name + "{}")
    return out


# Not written into XML (uri, sysfs_root, allowed_paths: check_allowed_paths refuses control
# characters itself), or validated strictly before (name: object_name).
NOT_XML = {"name", "uri", "sysfs_root", "allowed_paths[]"}


@pytest.mark.parametrize("module,table", [
    (domain_module, R.TEXT_OPTIONS), (network_module, network_module.TEXT_OPTIONS)])
def test_the_tables_cover_every_free_text_option(module, table):
    wanted = set(_text_paths(module.argument_spec())) - NOT_XML
    # A list of strings is walked by its own path ("x[]"); the table may spell nested ones.
    assert wanted - set(table) == set(), "free-text options missing from the table"


def _nest(path: str, value: Any) -> Dict[str, Any]:
    """Params holding ``value`` at ``path`` (the plain_texts syntax), and the option label."""
    steps = path.split(".")
    node: Any = value
    for step in reversed(steps):
        name = step.rstrip("[]{}")
        if step.endswith("{}"):
            node = {name: {"key": node}}
        elif step.endswith("[]"):
            node = {name: [node]}
        else:
            node = {name: node}
    return node


def _label(path: str) -> str:
    return path.replace("[]", "[0]").replace("{}", ".key")


@pytest.mark.parametrize("path", R.TEXT_OPTIONS)
def test_domain_refuses_control_characters_in_every_text_option(path):
    err = refused(request, _nest(path, "bad\x01value"), FakeService())
    assert err.details["option"] == _label(path)
    assert "control character U+0001" in err.msg


def test_without_the_check_lxml_would_raise():
    """Why the table exists: lxml refuses such text with a bare ValueError."""
    with pytest.raises(ValueError, match="XML compatible"):
        build_new("vm1", {"description": "a\x01b"})


# --------------------------------------------------------------------------- domain numbers

@pytest.mark.parametrize("params,option,fragment", [
    ({"memory": "8M", "vcpus": 1}, "memory", "from 16M to 16T"),
    ({"memory": "15", "vcpus": 1}, "memory", "from 16M to 16T"),
    ({"memory": 0, "vcpus": 1}, "memory", "is out of range"),
    ({"memory": -1024, "vcpus": 1}, "memory", "is out of range"),
    ({"memory": "17T", "vcpus": 1}, "memory", "from 16M to 16T"),
    ({"memory": "16777217", "vcpus": 1}, "memory", "a bare number means MiB"),
    ({"memory": "1G", "max_memory": "32P", "vcpus": 1}, "max_memory", "from 16M to 16T"),
    ({"memory": "16.0001M", "vcpus": 1}, "memory", "whole number of KiB"),
    ({"memory": "9" * 400 + "G", "vcpus": 1}, "memory", "larger than any size"),  # was OverflowError
    ({"memory": "9" * 400, "vcpus": 1}, "memory", "from 16M to 16T"),
    ({"memory": "1G", "vcpus": 0}, "vcpus", "from 1 to 4096"),
    ({"memory": "1G", "vcpus": 4097}, "vcpus", "from 1 to 4096"),
    ({"memory": "1G", "vcpus": 1, "max_vcpus": 5000}, "max_vcpus", "from 1 to 4096"),
    ({"memory": "1G", "vcpus": 2, "cpu": {"sockets": 0, "cores": 2, "threads": 1}}, "cpu.sockets", "from 1 to 4096"),
    ({"memory": "1G", "vcpus": 2, "cpu": {"sockets": 1, "cores": 5000, "threads": 1}}, "cpu.cores", "from 1 to 4096"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": 2, "cpuset": "0"}]}},
     "cpu_pinning.vcpupin[0].vcpu", "from 0 to 1"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": -1, "cpuset": "0"}]}},
     "cpu_pinning.vcpupin[0].vcpu", "is out of range"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": 1, "cpuset": "0"}, {"vcpu": 1, "cpuset": "1"}]}},
     "cpu_pinning.vcpupin[1].vcpu", "is pinned twice"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": 0, "cpuset": "0-999999999"}]}},
     "cpu_pinning.vcpupin[0].cpuset", "above the maximum 8191"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": 0, "cpuset": "5-2"}]}},
     "cpu_pinning.vcpupin[0].cpuset", "descending range"),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"emulatorpin": "0,,1"}}, "cpu_pinning.emulatorpin", "empty item"),
    ({"memory": "1G", "vcpus": 1, "numa_tuning": {"mode": "strict", "nodeset": "1024"}},
     "numa_tuning.nodeset", "above the maximum 1023"),
    ({"memory": "1G", "vcpus": 1, "hugepages": True, "hugepage_size": "3M"}, "hugepage_size", "power of two"),
    ({"memory": "1G", "vcpus": 1, "hugepages": True, "hugepage_size": "2K"}, "hugepage_size", "from 4K to 16G"),
    ({"memory": "1G", "vcpus": 1, "hugepages": True, "hugepage_size": "32G"}, "hugepage_size", "power of two"),
    ({"memory": "1G", "vcpus": 1, "hugepage_size": "1000"}, "hugepage_size", "is not a hugepage size"),
    ({"memory": "1G", "vcpus": 1, "shutdown_timeout": -1}, "shutdown_timeout", "from 0 to 86400"),
    ({"memory": "1G", "vcpus": 1, "wait_for_ip_timeout": 86401}, "wait_for_ip_timeout", "from 0 to 86400"),
    ({"memory": "1G", "vcpus": 1, "interfaces": [{"bridge": "b" * 16, "model": "virtio"}]},
     "interfaces[0].bridge", "longer than 15"),
    ({"hostdevs": [{"vendor": "10de", "device": "2204", "index": -1}]}, "hostdevs[0].index", "is out of range"),
])
def test_domain_numbers_are_bounded(params, option, fragment):
    err = refused(request, params, FakeService())
    assert err.details["option"] == option, err.msg
    assert fragment in err.msg, err.msg


@pytest.mark.parametrize("params,field,value", [
    ({"memory": "16M", "vcpus": 1}, "memory_kib", 16384),
    ({"memory": "16T", "vcpus": 1}, "memory_kib", 16 * 1024 ** 3),
    ({"memory": "16", "vcpus": 1}, "memory_kib", 16384),
    ({"memory": "1G", "vcpus": 4096}, "vcpus", 4096),
    ({"memory": "1G", "vcpus": 2, "cpu_pinning": {"vcpupin": [{"vcpu": 1, "cpuset": "8191"}]}},
     "cputune", {"vcpupin": [{"vcpu": 1, "cpuset": [8191]}], "emulatorpin": None}),
    ({"memory": "1G", "vcpus": 1, "numa_tuning": {"mode": "strict", "nodeset": "0-1023"}},
     "numatune", {"mode": "strict", "nodeset": list(range(1024))}),
    ({"memory": "1G", "vcpus": 1, "hugepages": True, "hugepage_size": "1G"},
     "hugepages", {"enabled": True, "page_size_kib": 1048576}),
])
def test_domain_bounds_are_inclusive(params, field, value):
    assert request(params, FakeService()).desired[field] == value


# --------------------------------------------------------------------------- network

def net_params(**extra: Any) -> Dict[str, Any]:
    params = {k: v.get("default") for k, v in network_module.argument_spec().items()}
    params.update(name="n1", address="10.1.2.1", prefix=24)
    params.update(extra)
    return params


@pytest.mark.parametrize("extra,option,fragment", [
    ({"mtu": 67}, "mtu", "from 68 to 65535"),
    ({"mtu": 65536}, "mtu", "from 68 to 65535"),
    ({"mtu": 0}, "mtu", "from 68 to 65535"),
    ({"prefix": 7}, "prefix", "from 8 to 30"),
    ({"prefix": 31}, "prefix", "from 8 to 30"),
    ({"prefix": None, "netmask": "255.255.255.254"}, "netmask", "is a /31 network"),
    ({"prefix": None, "netmask": "254.0.0.0"}, "netmask", "is a /7 network"),
    ({"bridge": "b" * 16}, "bridge", "longer than 15"),
    ({"forward_dev": "eth:0"}, "forward_dev", "not a Linux interface name"),
    ({"forward_dev": "f" * 16}, "forward_dev", "longer than 15"),
    ({"domain": "a..b"}, "domain", "is not a DNS name"),
    ({"domain": "a" * 64 + ".lab"}, "domain", "is not a DNS name"),
    ({"dns_hosts": [{"ip": "10.1.2.5", "hostnames": [""]}]}, "dns_hosts[0].hostnames[0]", "is not a DNS name"),
    ({"dns_hosts": [{"ip": "10.1.2.5", "hostnames": ["x" * 254]}]}, "dns_hosts[0].hostnames[0]", "253"),
])
def test_network_values_are_bounded(extra, option, fragment):
    err = refused(network_module.validated_request, net_params(**extra), False)
    assert err.details["option"] == option, err.msg
    assert fragment in err.msg, err.msg


@pytest.mark.parametrize("extra", [
    {"mtu": 68}, {"mtu": 65535}, {"prefix": 8}, {"prefix": 30}, {"forward_dev": "enp0s31f6"},
    {"bridge": "b" * 15}, {"domain": "lab.internal"},
    {"dns_hosts": [{"ip": "10.1.2.5", "hostnames": ["_srv.lab", "mlflow.lab."]}]},
])
def test_network_bounds_are_inclusive(extra):
    spec = network_module.validated_request(net_params(**extra), False)
    key = next(iter(extra))
    if key in spec and key != "dns_hosts":
        assert spec[key] == extra[key]


@pytest.mark.parametrize("path", network_module.TEXT_OPTIONS)
def test_network_refuses_control_characters_in_every_text_option(path):
    params = net_params(**_nest(path, "bad\x1bvalue"))
    err = refused(network_module.validated_request, params, False)
    assert err.details["option"] == _label(path)
    assert "control character U+001B" in err.msg


def test_a_description_may_span_lines_but_holds_no_other_control_character():
    """A domain's description is prose: lines and tabs are content there, an escape is not."""
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import plain_texts
    plain_texts({"description": "GPU worker\n\tH200, rack 4"}, ["description"], multiline=["description"])
    with pytest.raises(InvalidInputError) as err:
        plain_texts({"description": "GPU worker\x1b[31m"}, ["description"], multiline=["description"])
    assert "U+001B" in str(err.value)
    with pytest.raises(InvalidInputError):
        plain_texts({"name": "vm\n1"}, ["name"], multiline=["description"])
