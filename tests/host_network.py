"""The host's IPv4 networks, for the test fixtures that put daemons in network namespaces of their
own (tests/second_hypervisor.py, tests/slurm_cluster.py): the subnets this host already has an
address in or a route to, and the first of a fixture's candidate subnets that overlaps none of
them, so that the fixture's links never shadow a route of the host. For the tests that define
libvirt networks (tests/integration/test_network.py, test_resource_lists.py), the text in which
a free subnet's prefix does not occur."""
from __future__ import annotations

import ipaddress
import subprocess
from typing import Dict, Iterable, List, Optional


def run(argv: List[str], timeout: float = 30, check: bool = True,
        env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check, env=env)


def used_subnets() -> List[ipaddress.IPv4Network]:
    """Every IPv4 network this host has an address in or a route to."""
    out = run(["ip", "-4", "-o", "addr"]).stdout + run(["ip", "-4", "route"]).stdout
    found = []
    for word in out.split():
        if "/" in word and word[0].isdigit():
            try:
                found.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
    return found


def free_subnet(candidates: Iterable[ipaddress.IPv4Network], none_free: str) -> ipaddress.IPv4Network:
    """The first of the candidates that nothing on this host uses; RuntimeError(none_free) when
    every one is taken."""
    used = used_subnets()
    for net in candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(none_free)


def addresses_in_use(uri: str) -> str:
    """The XML of every libvirt network of uri and the host's IPv4 addresses and routes, as one
    text: a /24 such as 10.213.7.0 is free when "10.213.7." does not occur in it."""
    import libvirt  # only the tests that reach libvirtd import this

    def xml_or_empty(net: "libvirt.virNetwork") -> str:
        """A network's XML; '' when another test removed it between the listing and the read."""
        try:
            return net.XMLDesc(0)
        except libvirt.libvirtError:
            return ""

    conn = libvirt.open(uri)
    try:
        used = "".join(xml_or_empty(n) for n in conn.listAllNetworks())
    finally:
        conn.close()
    return used + run(["ip", "-4", "addr", "show"], check=False).stdout + run(["ip", "-4", "route", "show"], check=False).stdout
