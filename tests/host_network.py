"""The host's IPv4 networks, for the test fixtures that put daemons in network namespaces of their
own (tests/second_hypervisor.py, tests/slurm_cluster.py): the subnets this host already has an
address in or a route to, and the first of a fixture's candidate subnets that overlaps none of
them, so that the fixture's links never shadow a route of the host."""
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
