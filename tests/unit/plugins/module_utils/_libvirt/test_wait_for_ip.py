"""DomainService.wait_for_ip on libvirt's test driver (test:///default, an in-memory libvirt shared by
the connections of one process, where no network hands out leases): a domain that stops while the module waits for its
address fails at once, naming why, instead of after wait_for_ip_timeout. Against real guests the
lab's first boot waits through it (roles/guest/tasks/connect.yml)."""
from __future__ import annotations

from typing import Any, Iterator, List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_service import DomainService  # noqa: E402

pytestmark = pytest.mark.unit

TEST_URI = "test:///default"


@pytest.fixture
def conn() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt", reason="python3-libvirt (libvirt-python) is not installed")
    connection = libvirt.open(TEST_URI)
    yield connection
    connection.close()


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
