"""What the libvirt layer reads, in-process on libvirt's test driver (test:///default, an in-memory
libvirt shared by the connections of one process, where no network hands out leases): the two
read-only reports, _domain_info (domain_info) and _snapshot_info (snapshot_info), and the domain
modules' wait for an address (DomainService.wait_for_ip). Against a real libvirtd they are tested by
tests/integration/test_domain_info.py, test_snapshot.py and test_domain.py (a real QEMU crash)."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_info import (  # noqa: E402
    DomainInfoReader, argument_spec as domain_info_spec, stats_report)
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import DomainService  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._snapshot import SnapshotService  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._snapshot_info import (  # noqa: E402
    argument_spec as snapshot_info_spec, snapshot_report)

pytestmark = pytest.mark.unit

TEST_URI = "test:///default"


@pytest.fixture
def conn() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt", reason="python3-libvirt (libvirt-python) is not installed")
    connection = libvirt.open(TEST_URI)
    yield connection
    connection.close()


# -- domain_info --------------------------------------------------------------------------------
def domain_info(conn: Any, **params: Any) -> Dict[str, Any]:
    values = {"name": None, "guest_agent": True, "stats": True}
    values.update(params)
    return DomainInfoReader(values, DomainService(conn, TEST_URI)).run()


def test_domain_info_spec() -> None:
    spec = domain_info_spec()
    assert {k: spec[k] for k in ("name", "guest_agent", "stats")} == {
        "name": {"type": "str"}, "guest_agent": {"type": "bool", "default": True},
        "stats": {"type": "bool", "default": True}}
    assert "uri" in spec


def test_one_domain_with_its_devices_and_stats(conn: Any) -> None:
    result = domain_info(conn, name="test")
    assert result["changed"] is False and result["exists"] is True
    [dom] = result["domains"]
    assert (dom["name"], dom["state"], dom["persistent"], dom["autostart"]) == ("test", "running", True, False)
    assert (dom["vcpus"], dom["max_vcpus"], dom["memory_mib"], dom["max_memory_mib"]) == (2, 2, 2048, 8192)
    assert dom["interfaces"] == [{"mac": "aa:bb:cc:dd:ee:ff", "network": "default", "bridge": None, "model": None,
                                  "ip_addresses": []}]
    assert [(d["device"], d["target"], d["path"]) for d in dom["disks"]] == [("disk", "vda", "/guest/diskimage1")]
    assert set(dom["stats"]) == {"cpu_time_ns", "memory_actual_kib", "memory_rss_kib", "block"}


def test_without_stats_and_for_all_domains(conn: Any) -> None:
    result = domain_info(conn, stats=False)
    assert result["exists"] is True and [d["name"] for d in result["domains"]] == ["test"]
    assert result["domains"][0]["stats"] == {}


def test_a_missing_domain_is_not_an_error(conn: Any) -> None:
    assert domain_info(conn, name="absent-one") == {"changed": False, "exists": False, "domains": []}


def test_a_bad_name_is_refused_before_libvirt(conn: Any) -> None:
    with pytest.raises(InvalidInputError) as err:
        domain_info(conn, name="a/b")
    assert err.value.details["option"] == "name"


def test_stats_report_nests_libvirts_flat_keys() -> None:
    raw = {"cpu.time": 12, "balloon.current": 2048, "balloon.rss": 1024, "block.count": 2,
           "block.0.name": "vda", "block.0.rd.bytes": 5, "block.0.wr.bytes": 6, "block.1.name": "sda"}
    assert stats_report(raw) == {"cpu_time_ns": 12, "memory_actual_kib": 2048, "memory_rss_kib": 1024,
                                 "block": [{"target": "vda", "rd_bytes": 5, "wr_bytes": 6},
                                           {"target": "sda", "rd_bytes": 0, "wr_bytes": 0}]}
    assert stats_report({}) == {"cpu_time_ns": None, "memory_actual_kib": None, "memory_rss_kib": None, "block": []}


# -- snapshot_info ------------------------------------------------------------------------------
def snapshot_info(conn: Any, domain: str = "test", name: Any = None) -> Dict[str, Any]:
    return snapshot_report(SnapshotService(conn), domain, name)


def test_snapshot_info_spec() -> None:
    spec = snapshot_info_spec()
    assert spec["domain"] == {"type": "str", "required": True} and spec["name"] == {"type": "str"}
    assert "uri" in spec


def test_snapshots_oldest_first_and_the_named_one(conn: Any) -> None:
    dom = conn.lookupByName("test")
    for name in ("first", "second"):
        dom.snapshotCreateXML("<domainsnapshot><name>%s</name></domainsnapshot>" % name, 0)
    listed = snapshot_info(conn)
    assert [s["name"] for s in listed["snapshots"]] == ["first", "second"]
    assert listed["current"] == "second" and listed["snapshot"] is None
    assert listed["changed"] is False and listed["domain_state"] == "running"
    one = snapshot_info(conn, name="first")
    assert one["snapshot"]["name"] == "first" and one["snapshot"]["parent"] is None
    assert one["snapshots"] == listed["snapshots"]


def test_an_unknown_snapshot_names_the_ones_there(conn: Any) -> None:
    with pytest.raises(InvalidInputError) as err:
        snapshot_info(conn, name="s1")
    assert err.value.msg == "option name: value 's1' is not a snapshot of domain test; pick one of: (none)"


@pytest.mark.parametrize("domain, name, option", [("nope", None, "domain"), ("a/b", None, "domain"), ("test", "a/b", "name")])
def test_a_missing_domain_or_bad_name_is_refused_naming_the_option(conn: Any, domain: str, name: Any, option: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        snapshot_info(conn, domain, name)
    assert err.value.details["option"] == option


# -- wait_for_ip ---------------------------------------------------------------------------------
@pytest.fixture
def dom(conn: Any) -> Iterator[Any]:
    """A running domain without a network interface: no lease will ever name it."""
    domain = conn.defineXML("<domain type='test'><name>mlkvm-no-lease</name><memory unit='MiB'>64</memory>"
                            "<os><type>hvm</type></os></domain>")
    domain.create()
    yield domain
    if domain.isActive():
        domain.destroy()
    domain.undefine()


def service_counting_sleeps(conn: Any, sleeps: List[float]) -> DomainService:
    return DomainService(conn, TEST_URI, sleep=sleeps.append)


def test_a_domain_destroyed_while_waiting_fails_at_once_naming_its_state(conn: Any, dom: Any) -> None:
    dom.destroy()
    sleeps: List[float] = []
    with pytest.raises(KvmError) as raised:
        service_counting_sleeps(conn, sleeps).wait_for_ip(dom, 3600)
    message = str(raised.value)
    assert "domain mlkvm-no-lease stopped while waiting for its IPv4 address (option wait_for_ip)" in message
    assert "shutoff (destroyed)" in message and "starts it again" in message
    assert sleeps == []  # not one poll interval spent on a domain that cannot get an address


def test_a_running_domain_without_a_lease_waits_until_the_timeout(conn: Any, dom: Any) -> None:
    sleeps: List[float] = []
    with pytest.raises(KvmError) as raised:
        service_counting_sleeps(conn, sleeps).wait_for_ip(dom, 0)
    assert "got no IPv4 address from its networks' DHCP leases within 0 s" in str(raised.value)
    assert "stopped" not in str(raised.value)


def test_a_domain_that_stops_during_the_wait_fails_on_the_next_poll(conn: Any, dom: Any) -> None:
    sleeps: List[float] = []

    def stop_on_first_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:
            dom.destroy()

    with pytest.raises(KvmError) as raised:
        DomainService(conn, TEST_URI, sleep=stop_on_first_sleep).wait_for_ip(dom, 3600)
    assert "stopped while waiting" in str(raised.value)
    assert sleeps == [1.0]
