"""A guest boots from the debootstrap image with a seed from mlinfra.kvm.cloud_init and answers SSH."""
from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.vm


def test_guest_boots_and_answers_pinned_ssh(boot_guest) -> None:
    guest = boot_guest()
    assert guest.boot_seconds is not None
    # The identity and the seed's settings arrived: user from user-data, hostname from meta-data.
    out = guest.ssh("id -un; hostname; cat /proc/cmdline; ip -4 -o addr show eth0").stdout
    lines = out.splitlines()
    assert lines[0] == "mlkvm"
    assert lines[1] == "mlkvm-guest"
    assert "root=/dev/vda" in lines[2] and "net.ifnames=0" in lines[2]
    assert guest.ip in lines[3]
    # Passwordless sudo from user-data works, and cloud-init finished without errors.
    assert guest.ssh("sudo -n true").returncode == 0
    # SSH can answer before cloud-final is done: wait for cloud-init to finish.
    status = guest.ssh("cloud-init status --wait --long", check=False, timeout=600)
    assert "status: done" in status.stdout, status.stdout + status.stderr
    # The guest serves exactly the host key the harness pinned (it never learned one over the wire).
    fingerprint = guest.ssh("sudo -n ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
    pinned = guest.known_hosts.read_text().split()

    local = subprocess.run(["ssh-keygen", "-lf", "-"], input=" ".join(pinned[1:3]) + "\n",
                           capture_output=True, text=True, check=True).stdout.split()[1]
    assert fingerprint == local
