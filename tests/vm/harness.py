"""Boot real TCG guests from the debootstrap image for the ``vm`` test tier.

Independent of the collection's domain modules on purpose (they are under test elsewhere):
domains and networks are built here with lxml and the libvirt API directly. The seed ISO is
made by the collection's own ``cloud_init`` module, through the ``run_module`` fixture.

One guest = a private directory under /var/lib/libvirt/images (qemu runs as libvirt-qemu and
must reach its files; pytest's tmp dirs are 0700 root), a qcow2 overlay on lab/build/base.qcow2,
a NoCloud seed, an isolated (or NAT) network with a DHCP reservation for the guest's MAC, and
a ``type='qemu'`` domain booting the image's kernel directly with the serial console logged
to a file. Every piece is registered in an ExitStack the moment it exists, so teardown runs
on every path (failed boot, failed test, KeyboardInterrupt in the fixture).

SSH is pinned, never trust-on-first-use: the harness generates the guest's ed25519 host key,
hands it to cloud-init (``ssh_keys``) and writes it to a per-guest known_hosts file, so the
first connection already verifies the host (StrictHostKeyChecking=yes).
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from lxml import etree

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "lab" / "image" / "build.sh"
GUEST_DIR_ROOT = Path(os.environ.get("MLKVM_VM_DIR", "/var/lib/libvirt/images"))
GUEST_USER = "mlkvm"
KERNEL_CMDLINE = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
# 40-80 s on an idle 2-core host; seen 200 s+ to cloud-init "finished" when other work loads
# the host (TCG shares the 2 cores). Polling, so a fast boot does not wait for it.
BOOT_TIMEOUT = float(os.environ.get("MLKVM_VM_BOOT_TIMEOUT", "600"))


class GuestError(AssertionError):
    """A guest did not come up; the message carries the tail of its console log."""


class EmulatorCrashed(GuestError):
    """QEMU itself died under the guest (libvirt: shut off, reason crashed).

    Seen once in ~150 TCG boots on this kind of host: ``CPU 0/TCG: segfault at a0`` in
    qemu-system-x86_64 7.2 a few seconds into the guest kernel (kernel log in dmesg). It is an
    emulator fault, not something the code under test did, so a first boot may be retried.
    """


# ---------------------------------------------------------------------------------------------
# Image
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Image:
    disk: Path
    kernel: Path
    initrd: Path


def ensure_image(extra_packages: str = "", name: str = "") -> Image:
    """Run lab/image/build.sh (a no-op when its stamp matches the recipe) and return the paths."""
    args = ["bash", str(BUILD_SCRIPT)]
    if extra_packages:
        args += ["--extra-packages", extra_packages]
    if name:
        args += ["--name", name]
    subprocess.run(args, check=True, cwd=str(ROOT))
    paths = dict(line.split("=", 1) for line in subprocess.run(
        args + ["--print-paths"], check=True, capture_output=True, text=True, cwd=str(ROOT)).stdout.split())
    image = Image(Path(paths["IMAGE"]), Path(paths["KERNEL"]), Path(paths["INITRD"]))
    for path in (image.disk, image.kernel, image.initrd):
        if not path.is_file():
            raise GuestError("image build reported success but %s is missing" % path)
    return image


# ---------------------------------------------------------------------------------------------
# XML (lxml only)
# ---------------------------------------------------------------------------------------------
def _sub(parent: Any, tag: str, attrs: Optional[Dict[str, str]] = None, text: Optional[str] = None) -> Any:
    el = etree.SubElement(parent, tag, {k: str(v) for k, v in (attrs or {}).items()})
    if text is not None:
        el.text = str(text)
    return el


def network_xml(name: str, subnet: ipaddress.IPv4Network, reservations: Dict[str, str], nat: bool) -> str:
    root = etree.Element("network")
    _sub(root, "name", text=name)
    if nat:
        _sub(root, "forward", {"mode": "nat"})
    hosts = list(subnet.hosts())
    ip = _sub(root, "ip", {"address": str(hosts[0]), "netmask": str(subnet.netmask)})
    dhcp = _sub(ip, "dhcp")
    _sub(dhcp, "range", {"start": str(hosts[99]), "end": str(hosts[199])})
    for mac, addr in reservations.items():
        _sub(dhcp, "host", {"mac": mac, "ip": addr})
    return etree.tostring(root, encoding="unicode")


def domain_xml(name: str, image: Image, overlay: Path, seed: Path, serial_log: Path, network: str, mac: str,
               memory_mib: int = 1024, vcpus: int = 2, cmdline: str = KERNEL_CMDLINE) -> str:
    root = etree.Element("domain", {"type": "qemu"})  # TCG: KVM hangs stock kernels on this host
    _sub(root, "name", text=name)
    _sub(root, "memory", {"unit": "MiB"}, memory_mib)
    _sub(root, "vcpu", text=vcpus)
    os_el = _sub(root, "os")
    _sub(os_el, "type", {"arch": "x86_64", "machine": "q35"}, "hvm")
    _sub(os_el, "kernel", text=str(image.kernel))
    _sub(os_el, "initrd", text=str(image.initrd))
    _sub(os_el, "cmdline", text=cmdline)
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    _sub(root, "cpu", {"mode": "maximum"})
    _sub(root, "clock", {"offset": "utc"})
    _sub(root, "on_poweroff", text="destroy")
    _sub(root, "on_reboot", text="restart")
    _sub(root, "on_crash", text="destroy")
    dev = _sub(root, "devices")
    disk = _sub(dev, "disk", {"type": "file", "device": "disk"})
    _sub(disk, "driver", {"name": "qemu", "type": "qcow2"})
    _sub(disk, "source", {"file": str(overlay)})
    _sub(disk, "target", {"dev": "vda", "bus": "virtio"})
    cdrom = _sub(dev, "disk", {"type": "file", "device": "cdrom"})
    _sub(cdrom, "driver", {"name": "qemu", "type": "raw"})
    _sub(cdrom, "source", {"file": str(seed)})
    _sub(cdrom, "target", {"dev": "sda", "bus": "sata"})
    _sub(cdrom, "readonly")
    iface = _sub(dev, "interface", {"type": "network"})
    _sub(iface, "source", {"network": network})
    _sub(iface, "mac", {"address": mac})
    _sub(iface, "model", {"type": "virtio"})
    serial = _sub(dev, "serial", {"type": "file"})
    _sub(serial, "source", {"path": str(serial_log), "append": "on"})
    _sub(serial, "target", {"port": "0"})
    # The guest generates keys at first boot; TCG starves /dev/random without a virtio rng.
    rng = _sub(dev, "rng", {"model": "virtio"})
    _sub(rng, "backend", {"model": "random"}, "/dev/urandom")
    channel = _sub(dev, "channel", {"type": "unix"})
    _sub(channel, "target", {"type": "virtio", "name": "org.qemu.guest_agent.0"})
    return etree.tostring(root, encoding="unicode")


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------
def make_keypair(path: Path, comment: str) -> str:
    """A fresh ed25519 key (private file 0600); returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    os.chmod(path, 0o600)
    return Path(str(path) + ".pub").read_text().strip()


# ---------------------------------------------------------------------------------------------
# Guest
# ---------------------------------------------------------------------------------------------
@dataclass
class Guest:
    name: str
    ip: str
    mac: str
    network: str
    uri: str
    workdir: Path
    serial_log: Path
    key: Path
    known_hosts: Path
    user: str = GUEST_USER
    boot_seconds: Optional[float] = None
    emulator_crashes: int = 0
    _conn: Any = field(default=None, repr=False)

    # -- ssh ------------------------------------------------------------------------------
    def ssh_argv(self, command: str = "", connect_timeout: int = 10) -> List[str]:
        """argv that runs ``command`` in the guest over pinned SSH (never TOFU)."""
        argv = ["ssh", "-i", str(self.key),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes",
                "-o", "UserKnownHostsFile=%s" % self.known_hosts,
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "HostKeyAlgorithms=ssh-ed25519",
                "-o", "ConnectTimeout=%d" % connect_timeout,
                "-o", "LogLevel=ERROR",
                "%s@%s" % (self.user, self.ip)]
        if command:
            argv += ["--", command]
        return argv

    def ssh(self, command: str, check: bool = True, timeout: float = 120,
            connect_retries: int = 5) -> subprocess.CompletedProcess:
        """Run ``command`` in the guest. ssh's own failures (exit 255: 'Connection timed out
        during banner exchange' was seen when TCG guests share 2 loaded cores) are retried;
        the command's own exit status is returned as it is."""
        for attempt in range(connect_retries + 1):
            proc = subprocess.run(self.ssh_argv(command, connect_timeout=30), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
            if proc.returncode != 255 or attempt == connect_retries:
                break
            time.sleep(5)
        if check and proc.returncode != 0:
            raise GuestError("ssh %s %r exited %d\nstdout: %s\nstderr: %s"
                             % (self.name, command, proc.returncode, proc.stdout, proc.stderr))
        return proc

    def console_tail(self, lines: int = 60) -> str:
        try:
            text = self.serial_log.read_text(errors="replace")
        except OSError as exc:
            return "<no console log: %s>" % exc
        return "\n".join(text.splitlines()[-lines:])

    # -- libvirt --------------------------------------------------------------------------
    @property
    def domain(self) -> Any:
        import libvirt
        try:
            return self._conn.lookupByName(self.name)
        except libvirt.libvirtError as exc:
            # Seen in practice: tests/conftest.py's pytest_sessionfinish in ANOTHER pytest
            # session removes every 'mlkvmtest-' object, including a guest still booting here.
            raise GuestError("domain %s vanished (%s); was it removed by another test session's "
                             "cleanup of all 'mlkvmtest-' objects?\n--- console ---\n%s"
                             % (self.name, exc, self.console_tail(20)))

    def is_active(self) -> bool:
        return bool(self.domain.isActive())

    def start(self) -> None:
        self.domain.create()

    def wait_ready(self, timeout: float = BOOT_TIMEOUT, restarts_on_emulator_crash: int = 0) -> float:
        """Poll for the DHCP lease, then for SSH; returns seconds waited.

        ``restarts_on_emulator_crash``: how many times to start the domain again when QEMU
        crashed under it (only for a plain first boot, where starting again changes nothing the
        test looks at; a test that reverts to a live checkpoint must not use it).
        """
        started = time.monotonic()
        deadline = started + timeout
        while True:
            try:
                wait_lease(self._conn, self.network, self.mac, deadline, self)
                wait_ssh(self, deadline)
                return time.monotonic() - started
            except EmulatorCrashed as exc:
                if restarts_on_emulator_crash <= 0:
                    raise
                restarts_on_emulator_crash -= 1
                self.emulator_crashes += 1
                sys.stderr.write("WARNING: %s\nstarting %s again\n" % (str(exc).splitlines()[0], self.name))
                self.start()


def wait_lease(conn: Any, network: str, mac: str, deadline: float, guest: Guest) -> str:
    net = conn.networkLookupByName(network)
    while True:
        for lease in net.DHCPLeases(mac) or []:
            if lease.get("ipaddr") and lease.get("type") == 0:  # 0: IPv4
                return lease["ipaddr"]
        check_alive(guest)
        if time.monotonic() > deadline:
            raise GuestError("guest %s got no DHCP lease on %s in time\n--- console ---\n%s"
                             % (guest.name, network, guest.console_tail()))
        time.sleep(2)


def wait_ssh(guest: Guest, deadline: float) -> None:
    last = ""
    while True:
        try:
            proc = subprocess.run(guest.ssh_argv("true", connect_timeout=5), capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL, check=False)
            if proc.returncode == 0:
                return
            last = proc.stderr.strip()
        except subprocess.TimeoutExpired:
            last = "ssh timed out"
        check_alive(guest)
        if time.monotonic() > deadline:
            raise GuestError("guest %s (%s) did not answer SSH in time; last error: %s\n--- console ---\n%s"
                             % (guest.name, guest.ip, last, guest.console_tail()))
        time.sleep(3)


def check_alive(guest: Guest) -> None:
    if guest.is_active():
        return
    import libvirt
    state, reason = guest.domain.state()
    if state == libvirt.VIR_DOMAIN_SHUTOFF and reason == libvirt.VIR_DOMAIN_SHUTOFF_CRASHED:
        raise EmulatorCrashed("QEMU crashed under guest %s while it booted (see dmesg for a "
                              "qemu-system-x86_64 segfault and /var/log/libvirt/qemu/%s.log)"
                              "\n--- console ---\n%s" % (guest.name, guest.name, guest.console_tail()))
    raise GuestError("guest %s stopped while booting (state %d, reason %d)\n--- console ---\n%s"
                     % (guest.name, state, reason, guest.console_tail()))


# ---------------------------------------------------------------------------------------------
# Building a guest
# ---------------------------------------------------------------------------------------------
def _used_subnets(conn: Any) -> List[ipaddress.IPv4Network]:
    used = []
    import libvirt  # only the vm tier needs it
    for net in conn.listAllNetworks():
        try:
            xml = net.XMLDesc(0)
        except libvirt.libvirtError as exc:
            # Another client removed the network between the listing and this read: it no
            # longer occupies a subnet. Anything else is a real error.
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NETWORK:
                continue
            raise
        root = etree.fromstring(xml.encode())
        for ip in root.findall("ip"):
            if ip.get("address") and ip.get("family", "ipv4") == "ipv4":
                mask = ip.get("netmask") or ip.get("prefix") or "24"
                used.append(ipaddress.IPv4Network("%s/%s" % (ip.get("address"), mask), strict=False))
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout.split()
    for token in out:
        if "/" in token and token[0].isdigit():
            used.append(ipaddress.IPv4Network(token, strict=False))
    return used


def pick_subnet(conn: Any) -> ipaddress.IPv4Network:
    """A random /24 in 10.200-249.x nobody on this host uses (parallel sessions make networks too)."""
    used = _used_subnets(conn)
    for _unused in range(200):
        candidate = ipaddress.IPv4Network("10.%d.%d.0/24" % (random.randint(200, 249), random.randint(0, 255)))
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise GuestError("no free /24 found in 10.200.0.0-10.249.255.0")


def random_mac() -> str:
    return "52:54:00:%02x:%02x:%02x" % (random.randint(0, 255), random.randint(0, 255), random.randint(0, 255))


def user_data_for(public_key: str, host_private: str, host_public: str, extra: Optional[Dict[str, Any]] = None
                  ) -> Dict[str, Any]:
    data: Dict[str, Any] = {
        "locale": "C.UTF-8",
        "users": [{"name": GUEST_USER, "shell": "/bin/bash", "sudo": "ALL=(ALL) NOPASSWD:ALL",
                   "lock_passwd": True, "ssh_authorized_keys": [public_key]}],
        "ssh_pwauth": False,
        # The host key the harness already pinned in its known_hosts. With ssh_keys set,
        # cloud-init generates no other keys (ssh_genkeytypes: [] is invalid in its schema).
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": host_private, "ed25519_public": host_public},
    }
    data.update(extra or {})
    return data


@contextlib.contextmanager
def booted_guest(uri: str, prefix: str, image: Image, run_module: Callable[..., Dict[str, Any]],
                 keydir: Path, nat: bool = False, memory_mib: int = 1024, vcpus: int = 2,
                 user_data_extra: Optional[Dict[str, Any]] = None, wait: bool = True,
                 timeout: float = BOOT_TIMEOUT, start: bool = True):
    """Yield a running, SSH-reachable :class:`Guest`; tear everything down on every path.

    ``start=False`` yields it defined and never started (its disk as the image left it); the
    test starts it (``guest.start()``, ``guest.wait_ready()``)."""
    import libvirt  # only the vm tier needs it
    # Errors are raised as exceptions anyway; the default handler would also print them.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

    with contextlib.ExitStack() as stack:
        conn = libvirt.open(uri)
        stack.callback(conn.close)
        name = "%sguest" % prefix
        net_name = "%snet" % prefix

        workdir = GUEST_DIR_ROOT / name
        workdir.mkdir(mode=0o711, parents=False, exist_ok=False)
        stack.callback(shutil.rmtree, str(workdir), True)

        keydir.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = keydir / "id_ed25519"
        public = make_keypair(key, "mlkvm-test")
        host_key = keydir / "host_ed25519"
        host_public = make_keypair(host_key, "root@%s" % name)

        mac = random_mac()
        subnet = pick_subnet(conn)
        ip = str(list(subnet.hosts())[9])
        known_hosts = keydir / "known_hosts"
        known_hosts.write_text("%s %s\n" % (ip, " ".join(host_public.split()[:2])))
        os.chmod(known_hosts, 0o600)

        net = conn.networkDefineXML(network_xml(net_name, subnet, {mac: ip}, nat))
        stack.callback(_remove_network, net)
        net.create()

        overlay = workdir / "disk.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk),
                        str(overlay)], check=True)
        seed = workdir / "seed.iso"
        result = run_module("cloud_init", {
            "dest": str(seed), "instance_id": "%s-%s" % (name, uuid.uuid4().hex[:8]),
            "meta_data": {"local-hostname": "mlkvm-guest"},
            "user_data": user_data_for(public, host_key.read_text(), host_public, user_data_extra)})
        if result.get("failed") or not seed.exists():
            raise GuestError("cloud_init module failed to build the seed: %s" % result.get("msg"))
        serial_log = workdir / "console.log"

        dom = conn.defineXML(domain_xml(name, image, overlay, seed, serial_log, net_name, mac,
                                        memory_mib=memory_mib, vcpus=vcpus))
        stack.callback(_remove_domain, dom)
        guest = Guest(name=name, ip=ip, mac=mac, network=net_name, uri=uri, workdir=workdir,
                      serial_log=serial_log, key=key, known_hosts=known_hosts, _conn=conn)
        if start:
            dom.create()
        if start and wait:
            guest.boot_seconds = guest.wait_ready(timeout, restarts_on_emulator_crash=1)
        yield guest


def _remove_domain(dom: Any) -> None:
    import libvirt
    try:
        if dom.isActive():
            dom.destroy()
    except libvirt.libvirtError:
        pass
    try:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
                          | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
    except libvirt.libvirtError:
        pass


def _remove_network(net: Any) -> None:
    import libvirt
    try:
        if net.isActive():
            net.destroy()
    except libvirt.libvirtError:
        pass
    try:
        net.undefine()
    except libvirt.libvirtError:
        pass


def shell_quote(text: str) -> str:
    return shlex.quote(text)
