"""A guest boots from the debootstrap image with a seed from mlinfra.kvm.cloud_init and answers
SSH; then the same guest takes a venv bundle.

One guest for this module: the boot checks only read it, and the bundle goes to its own path, so
booting a second guest under TCG (about a minute) would prove nothing more.

The bundle: mlinfra.kvm.venv_bundle against a real guest (TCG): the controller's pip builds the
venv's tree for the guest's CPython; the guest gets it with one ``tar -x``. The path that
ml_runtime_source=bundle and mlflow_server_source=bundle take on sites whose images do not
carry the venvs (the lab bakes the same bundles into its image instead).

Four ways through ansible-playbook: check (predicts a change, changes nothing on the guest),
apply, check again and apply again (both unchanged); then the guest imports the package and
runs its console script, whose #! was pointed at the venv.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

import harness
from conftest import ROOT, VM_PREFIX, run_module_process

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def guest(libvirtd, guest_image, tmp_path_factory):
    """One booted guest for the tests of this module; removed after them, on every path."""
    prefix = "%s%d-%s-" % (VM_PREFIX, os.getpid(), uuid.uuid4().hex[:6])
    with harness.booted_guest(libvirtd, prefix, guest_image, run_module_process,
                              tmp_path_factory.mktemp("guest-keys")) as booted:
        yield booted


def test_guest_boots_and_answers_pinned_ssh(guest) -> None:
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


VENV = "/opt/mlkvm-test/venv"
PACKAGES = ["sqlparse==0.6.0", "six==1.17.0"]


def recap(output: str) -> dict:
    line = [l for l in output.split("PLAY RECAP")[-1].splitlines() if l.strip().startswith("guest")][0]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_bundle_made_on_controller_unpacked_on_guest(guest, tmp_path) -> None:
    bundle = tmp_path / "bundles" / "test-bundle.tar"
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"guest": {
        "ansible_host": guest.ip, "ansible_user": guest.user,
        "ansible_ssh_private_key_file": str(guest.key),
        # Pinned host key, never trust on first use.
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=%s "
                                   "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes" % guest.known_hosts,
        "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    play = tmp_path / "play.yml"
    role_vars = {"venv_bundle_venv": VENV, "venv_bundle_packages": PACKAGES, "venv_bundle_python_version": "3.11",
                 "venv_bundle_platforms": ["manylinux2014_x86_64"], "venv_bundle_marker": "test-marker-1",
                 "venv_bundle_file": str(bundle)}
    play.write_text(json.dumps([{"hosts": "guest", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "mlinfra.kvm.venv_bundle", "tasks_from": "build"}, "vars": role_vars},
        {"ansible.builtin.include_role": {"name": "mlinfra.kvm.venv_bundle", "tasks_from": "install"}, "vars": role_vars},
    ]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(Path(ROOT) / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    bin_dir = Path(ROOT) / ".venv" / "bin"

    def run(*extra: str) -> dict:
        proc = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(play), *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        return recap(proc.stdout)

    predicted = run("--check")
    assert predicted["changed"] > 0 and predicted["failed"] == 0
    assert not bundle.exists(), "check mode built the bundle"
    assert guest.ssh("test -e %s && echo yes || echo no" % VENV).stdout.strip() == "no", "check mode made the venv"

    applied = run()
    assert applied["changed"] > 0
    assert bundle.is_file()
    assert run("--check")["changed"] == 0
    assert run()["changed"] == 0

    assert guest.ssh("cat %s/.mlinfra-requirements.sha1" % VENV).stdout.strip() == "test-marker-1"
    out = guest.ssh("%s/bin/python -c 'import six, sqlparse; print(six.__version__, sqlparse.__version__)'" % VENV)
    assert out.stdout.split() == ["1.17.0", "0.6.0"]
    # The console script runs with the venv's interpreter on the guest.
    assert guest.ssh("head -1 %s/bin/sqlformat" % VENV).stdout.strip() == "#!%s/bin/python" % VENV
    assert guest.ssh("echo 'select 1' | %s/bin/sqlformat -k upper -" % VENV).stdout.strip() == "SELECT 1"
    # The pushed tar does not stay behind on the guest.
    assert "test-bundle.tar" not in guest.ssh("ls -a /var/tmp").stdout
