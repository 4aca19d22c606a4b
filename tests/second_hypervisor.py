"""A second hypervisor on this machine for mlinfra.kvm.domain_migration's tests: a libvirtd of
its own in network and mount namespaces of its own, reached over a veth pair.

What it has of its own (docs/migration.md says why this is a fair second host, and what it is not):

* **its own daemons**: a libvirtd and a virtlogd started for it, with their own pid files, and
  the QEMU processes that libvirtd starts;
* **its own state**: private mounts over /run/libvirt (a tmpfs: sockets, runtime state; /var/run
  is a link to /run here), /var/lib/libvirt (its images, QEMU's per-domain directories),
  /var/cache/libvirt (a copy of the host's QEMU capability cache, so that it does not probe QEMU
  for seconds at start), /var/log/libvirt and /etc/libvirt (a copy of the host's configuration
  files without the host's domains, networks, pools or secrets). A disk image at
  /var/lib/libvirt/images/... on one host is therefore not the one on the other: storage is not
  shared unless a test makes it so (a path outside those mounts);
* **its own network stack**: a network namespace whose only link is one end of a veth pair with an
  address from a free /30 (picked free of the host's addresses and routes, as tests/slurm_cluster.py
  picks its /24). libvirtd listens on TCP on that address only (listen_tcp, auth_tcp "none": a test
  harness on a private link), so the source reaches it as qemu+tcp://ADDRESS/system, and every QEMU
  migration stream and NBD disk copy to it crosses the veth.

For the way back (this daemon as the source of a peer-to-peer migration), it must reach the host's
libvirtd. The host's /run/libvirt is bound at /run/mlkvm-hv2-PID before the namespace is made, so
``host_uri`` (qemu+unix with socket= that path) names the host's daemon from both sides: from the
host's namespace, where the module's preflight opens it, and from this daemon's, where libvirt's
peer-to-peer connection opens it. The "+unix" matters: a daemon asked for plain qemu:///system
answers with its own driver, which is the source itself ("Attempt to migrate guest to the same
host"). The QEMU stream back goes over the veth to the host's address (``host_migration_uri``).

Start and stop poll with bounded waits; ``stop()`` runs on every path of ``start()`` (and the
fixture calls it after the tests): every process in the namespace is killed (TERM, then KILL),
the namespace deleted (which removes the veth pair), the bind of the host's /run/libvirt unmounted.
The private mounts vanish with the last process of their namespace.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, List, Optional

from host_network import free_subnet, run as _run

# The daemons' mount namespace: private mounts over libvirt's directories, then virtlogd and
# libvirtd (in the foreground, the harness's child). An argv, never a string with values pasted in:
# the paths come in as positional parameters.
INNER_SCRIPT = r"""
set -e
root=$1
kvm_node=$2
mount -t tmpfs -o mode=0755,size=64m tmpfs /run/libvirt
mount --bind "$root/etc" /etc/libvirt
mount --bind "$root/lib" /var/lib/libvirt
mount --bind "$root/cache" /var/cache/libvirt
mount --bind "$root/log" /var/log/libvirt
if [ -n "$kvm_node" ]; then mount --bind "$kvm_node" /dev/kvm; fi
virtlogd -p /run/libvirt/virtlogd.pid &
exec libvirtd --listen -p /run/libvirt/libvirtd.pid
"""

# The host's libvirtd set-up (scripts/ensure-libvirtd.sh): when it runs with a private copy of
# /dev/kvm (this machine's KVM is advertised but unusable), the second daemon gets the same node,
# so that the capability cache copied from the host stays valid for it too.
KVM_VIEW_FILE = Path("/run/mlinfra/libvirtd-kvm-view")
KVM_NODE = Path("/run/mlinfra/kvm-node")

CONFIG_FILES = ("libvirtd.conf", "qemu.conf", "virtlogd.conf", "libvirt.conf", "libvirt-admin.conf")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def free_link_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.251.0.0/16 that nothing on this host uses (two addresses: host and hypervisor)."""
    start = os.getpid() % 16384
    return free_subnet((ipaddress.ip_network("10.251.%d.%d/30" % (index // 64, (index % 64) * 4))
                        for index in ((start + step) % 16384 for step in range(16384))),
                       "no free /30 in 10.251.0.0/16 for the second hypervisor's link")


def mounted(path: Path) -> bool:
    """Whether something is mounted on ``path`` (os.path.ismount misses a bind mount of a directory
    of the same file system, which the host view is where /run is no tmpfs)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return any(line.split()[4] == str(path) for line in info)


class SecondHypervisor:
    """``SecondHypervisor(tmp).start()``; ``uri`` reaches it, ``host_uri`` reaches the host's
    libvirtd from it; ``stop()`` removes everything."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = Path(tmp)
        tag = "%x" % (os.getpid() % 0xfffff)
        self.netns = "mlkvm-hv2-%d" % os.getpid()
        self.veth_host = "mlkvh%sh" % tag
        self.veth_inner = "mlkvh%sg" % tag
        net = free_link_subnet()
        hosts = list(net.hosts())
        self.prefixlen = net.prefixlen
        self.host_addr = str(hosts[0])
        self.addr = str(hosts[1])
        self.host_view = Path("/run/mlkvm-hv2-%d" % os.getpid())
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.tmp / "daemon.log"
        self.started_s: Optional[float] = None

    # -- what the tests use --------------------------------------------------------------------
    @property
    def uri(self) -> str:
        return "qemu+tcp://%s/system" % self.addr

    @property
    def migration_uri(self) -> str:
        return "tcp://%s" % self.addr

    @property
    def host_uri(self) -> str:
        return "qemu+unix:///system?socket=%s/libvirt-sock" % self.host_view

    @property
    def host_migration_uri(self) -> str:
        return "tcp://%s" % self.host_addr

    @property
    def lib(self) -> Path:
        """This hypervisor's /var/lib/libvirt, as the host sees it."""
        return self.tmp / "lib"

    def path_here(self, path: str) -> Path:
        """Where a path under /var/lib/libvirt of this hypervisor lies on the host."""
        rel = Path(path).relative_to("/var/lib/libvirt")
        return self.lib / rel

    def in_netns(self, argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", self.netns] + argv

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "SecondHypervisor":
        began = time.monotonic()
        try:
            self._files()
            self._link()
            self._host_view()
            self._daemons()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def _files(self) -> None:
        for sub in ("etc", "lib", "cache", "log"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
            # QEMU runs as libvirt-qemu and walks from these mount roots down to its files.
            os.chmod(self.tmp / sub, 0o755)
        for name in CONFIG_FILES:
            if Path("/etc/libvirt", name).exists():
                shutil.copy2(Path("/etc/libvirt", name), self.tmp / "etc" / name)
        if Path("/etc/libvirt/nwfilter").is_dir():
            shutil.copytree("/etc/libvirt/nwfilter", self.tmp / "etc" / "nwfilter", dirs_exist_ok=True)
        for sub in ("qemu/networks", "storage", "secrets"):
            (self.tmp / "etc" / sub).mkdir(parents=True, exist_ok=True)
        with open(self.tmp / "etc" / "libvirtd.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# tests/second_hypervisor.py: TCP on the private link only, no auth (a test harness)\n"
                       'listen_tls = 0\nlisten_tcp = 1\nlisten_addr = "%s"\nauth_tcp = "none"\n'
                       'host_uuid = "%s"\n' % (self.addr, uuid.uuid4()))
        caps = Path("/var/cache/libvirt/qemu/capabilities")
        if caps.is_dir():
            shutil.copytree(caps, self.tmp / "cache" / "qemu" / "capabilities", dirs_exist_ok=True)
        (self.lib / "images").mkdir(exist_ok=True)

    def _link(self) -> None:
        _run(["ip", "netns", "add", self.netns])
        _run(["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_inner])
        _run(["ip", "link", "set", self.veth_inner, "netns", self.netns])
        _run(["ip", "addr", "add", "%s/%d" % (self.host_addr, self.prefixlen), "dev", self.veth_host])
        _run(["ip", "link", "set", self.veth_host, "up"])
        _run(self.in_netns(["ip", "addr", "add", "%s/%d" % (self.addr, self.prefixlen), "dev", self.veth_inner]))
        _run(self.in_netns(["ip", "link", "set", self.veth_inner, "up"]))
        _run(self.in_netns(["ip", "link", "set", "lo", "up"]))

    def _host_view(self) -> None:
        self.host_view.mkdir(mode=0o755, exist_ok=True)
        _run(["mount", "--bind", "/run/libvirt", str(self.host_view)])

    def _daemons(self) -> None:
        kvm = ""
        if KVM_VIEW_FILE.exists() and KVM_VIEW_FILE.read_text().strip() not in ("", "host") and KVM_NODE.exists():
            kvm = str(KVM_NODE)
        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(
                self.in_netns(["unshare", "--mount", "--propagation", "private", "sh", "-c", INNER_SCRIPT, "sh",
                               str(self.tmp), kvm]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()

    def _wait_ready(self) -> None:
        import libvirt
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("the second libvirtd exited (rc %s): %s" % (self.proc.returncode, self.log_tail()))
            try:
                conn = libvirt.open(self.uri)
                conn.close()
                return
            except libvirt.libvirtError as exc:
                last = str(exc)
            time.sleep(0.3)
        raise RuntimeError("the second libvirtd did not answer on %s within %.0f s (%s): %s"
                           % (self.uri, START_TIMEOUT_S, last, self.log_tail()))

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return "<no log: %s>" % exc

    def netns_pids(self) -> List[int]:
        proc = _run(["ip", "netns", "pids", self.netns], check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]

    def stop(self) -> None:
        """Kill every process of the namespace (libvirtd, virtlogd, QEMU, dnsmasq), delete the
        namespace and the veth pair, unmount the host view. Safe to call twice and after a failed
        start."""
        if _run(["ip", "netns", "list"], check=False).stdout.split().count(self.netns):
            self._kill_all()
            _run(["ip", "netns", "del", self.netns], check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        _run(["ip", "link", "del", self.veth_host], check=False)  # gone with the namespace, normally
        if mounted(self.host_view):
            _run(["umount", str(self.host_view)], check=False)
            if mounted(self.host_view):
                _run(["umount", "-l", str(self.host_view)], check=False)
        try:
            self.host_view.rmdir()
        except OSError:
            pass

    def _kill_all(self) -> None:
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
            pids = self.netns_pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while self.netns_pids() and time.monotonic() < deadline:
                if self.proc is not None:
                    self.proc.poll()  # reap our own child, else it lingers as a zombie in the list
                time.sleep(0.2)
            if not self.netns_pids():
                return

    def connect(self) -> Any:
        import libvirt
        return libvirt.open(self.uri)
