# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a network start that libvirtd did not finish leaves on the host, and how to clear it.

libvirtd starts a network in steps: it creates the bridge, gives it the address, starts dnsmasq,
and only then records the network as started (its status file under /run/libvirt/network).
Killed in between, it comes back with the network inactive while the bridge and dnsmasq still
run, and nothing in libvirt will ever stop them: the next start of that network fails ("error
creating bridge interface NAME: File exists", "Network is already in use by interface NAME"),
and a network undefined meanwhile leaves an orphaned dnsmasq that takes the address of any later
network given the same subnet (dnsmasq: "failed to create listening socket for ADDRESS: Address
already in use").

Only leftovers that cannot be anyone else's are ever named: the network's own bridge when no
active network uses it and nothing is plugged in, the dnsmasq that runs the network's own
configuration while the network is inactive, and a dnsmasq that runs the configuration of a
network libvirt does not have at all. Host-side, so for local URIs only (the caller checks).
"""
from __future__ import annotations

import os
import re
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._core._command import module_runner
from .._core._errors import KvmError

# Where libvirt keeps each system network's dnsmasq configuration (dnsmasq runs with
# --conf-file=<this>/<network>.conf).
LIBVIRT_DNSMASQ_DIR = "/var/lib/libvirt/dnsmasq"
SYS_CLASS_NET = "/sys/class/net"
PROC = "/proc"
DNSMASQ_EXIT_WAIT = 5.0
# Seconds for `ip link delete`: immediate, the bound only keeps a wedged netlink from hanging.
IP_TIMEOUT_S = 30

# The start failures a leftover causes; "bridge" is the interface the message names.
BRIDGE_IN_THE_WAY = (
    re.compile(r"error creating bridge interface (?P<bridge>\S+): File exists"),
    re.compile(r"Network is already in use by interface (?P<bridge>\S+)"),
)
ADDRESS_TAKEN = re.compile(r"dnsmasq: failed to create listening socket for \S+: Address already in use")

Clear = Callable[[], None]


class Leftovers:
    """Leftovers of network ``name`` (inactive), given its own bridge name and the other
    networks (other_networks' dicts: name, active, bridge). ``run_command`` runs ``ip``: a
    bounded runner (_command.module_runner, the default)."""

    def __init__(self, name: str, own_bridge: Optional[str], others: List[Dict[str, Any]],
                 run_command: Optional[Callable[..., Tuple[int, str, str]]] = None) -> None:
        self.name = name
        self.own_bridge = own_bridge
        self.others = others
        self.run_command = run_command or module_runner(IP_TIMEOUT_S)
        self._dnsmasqs: Optional[Dict[str, List[int]]] = None

    @property
    def dnsmasqs(self) -> Dict[str, List[int]]:
        """libvirt_dnsmasqs(), read from /proc once per instance."""
        if self._dnsmasqs is None:
            self._dnsmasqs = libvirt_dnsmasqs()
        return self._dnsmasqs

    def blocking(self, message: str) -> List[Tuple[str, Clear]]:
        """(description, clear) for each leftover when ``message`` (libvirt's, from a failed
        start) is a failure leftovers cause; [] when it is not, or when what is in the way is
        not a leftover (another network's bridge, a bridge with something plugged in)."""
        named = next((m.group("bridge") for m in (p.search(message) for p in BRIDGE_IN_THE_WAY) if m), None)
        if named is not None:
            return self.own() if named == self.own_bridge and self.bridge_is_stale() else []
        if ADDRESS_TAKEN.search(message):
            return self.own() + self.orphans()
        return []

    def own(self) -> List[Tuple[str, Clear]]:
        """This network's own leftovers: its dnsmasq, then its bridge (each a reported step)."""
        description = "stop dnsmasq %d (left by an unfinished start)"
        out: List[Tuple[str, Clear]] = [self._stop(description % pid, pid) for pid in self.dnsmasqs.get(self.name, [])]
        if self.own_bridge and self.bridge_is_stale():
            bridge = self.own_bridge
            out.append(("delete bridge %s (left by an unfinished start)" % bridge, lambda: self.delete_bridge(bridge)))
        return out

    def orphans(self) -> List[Tuple[str, Clear]]:
        """dnsmasq processes of networks libvirt does not have at all: nothing else can stop them."""
        known = {other["name"] for other in self.others} | {self.name}
        return [self._stop("stop dnsmasq %d (of network %s, which libvirt no longer has)" % (pid, network), pid)
                for network, pids in sorted(self.dnsmasqs.items()) if network not in known for pid in pids]

    def bridge_is_stale(self) -> bool:
        bridge = self.own_bridge
        in_use = {other["bridge"] for other in self.others if other.get("active")}
        ports = os.path.join(SYS_CLASS_NET, bridge or "", "brif")
        return bool(bridge) and bridge not in in_use and os.path.isdir(ports) and not os.listdir(ports)

    def delete_bridge(self, bridge: str) -> None:
        rc, _out, errout = self.run_command(["ip", "link", "delete", bridge, "type", "bridge"])
        if rc != 0:
            raise KvmError("network %s: its bridge %s is left from an unfinished start, and deleting it failed "
                           "(%s); delete it by hand (ip link delete %s) and run again"
                           % (self.name, bridge, errout.strip(), bridge))

    def _stop(self, description: str, pid: int) -> Tuple[str, Clear]:
        return description, lambda: stop_process(pid, self.name)


def libvirt_dnsmasqs() -> Dict[str, List[int]]:
    """{network name: [pid]} of the running dnsmasq processes libvirt started for its networks
    (known by their --conf-file in LIBVIRT_DNSMASQ_DIR); only the main process of each, not the
    helper it forks for --dhcp-script."""
    found: Dict[str, List[Tuple[int, int]]] = {}
    pattern = re.compile(r"--conf-file=%s/(?P<network>[^/]+)\.conf$" % re.escape(LIBVIRT_DNSMASQ_DIR))
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        argv = _cmdline(int(entry))
        if not argv or os.path.basename(argv[0]) != "dnsmasq":
            continue
        network = next((m.group("network") for m in map(pattern.match, argv) if m), None)
        stat = _stat(int(entry))
        if network is not None and stat is not None and stat[0] != "Z":
            found.setdefault(network, []).append((int(entry), stat[1]))
    return {network: sorted(pid for pid, ppid in procs if ppid not in {parent for parent, _ppid in procs})
            for network, procs in found.items()}


def stop_process(pid: int, network: str) -> None:
    """SIGTERM ``pid`` and wait for it to go (DNSMASQ_EXIT_WAIT at most)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + DNSMASQ_EXIT_WAIT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        raise KvmError("network %s: the dnsmasq left by an unfinished start (pid %d) did not stop within %d s; "
                       "stop it by hand (kill %d) and run again" % (network, pid, DNSMASQ_EXIT_WAIT, pid))


def _cmdline(pid: int) -> List[str]:
    try:
        with open(os.path.join(PROC, str(pid), "cmdline"), "rb") as handle:
            return [arg for arg in handle.read().decode("utf-8", "replace").split("\0") if arg]
    except OSError:
        return []


def _stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state, parent pid) of ``pid``; None when it is gone."""
    try:
        with open(os.path.join(PROC, str(pid), "stat")) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, sockets closed, not yet reaped) does not."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"
