"""Testinfra checks for the nvidia_driver scenario (Debian 12, branch 535, open kernel modules).

The container shares the host's kernel, so the DKMS module is checked as built for every
kernel the guest image carries (what the guest boots), and the driver is never loaded here.
Molecule's testinfra verifier runs this file with `--connection=ansible --hosts=all`.
"""
from __future__ import annotations

import re

import pytest

PACKAGES = ["nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "firmware-nvidia-gsp"]
BRANCH = re.compile(r"^535\.[0-9.]+-\S+$")


def image_kernels(host) -> list[str]:
    kernels = sorted(host.file("/lib/modules").listdir())
    assert kernels, "no kernel under /lib/modules"
    return kernels


@pytest.mark.parametrize("name", PACKAGES)
def test_driver_package_is_on_branch_535_and_held(host, name):
    package = host.package(name)
    assert package.is_installed, name
    assert BRANCH.match(package.version), (name, package.version)
    # A held package is what keeps `apt upgrade` from moving the driver off its branch.
    status = host.check_output("dpkg-query -W -f=%s %s", "${Status}", name)
    assert status == "hold ok installed", (name, status)


def test_apt_pins_the_branch(host):
    preferences = host.file("/etc/apt/preferences.d/mlinfra-nvidia")
    assert preferences.is_file and preferences.user == "root" and preferences.mode == 0o644
    assert re.search(r"(?m)^Pin: version 535\.", preferences.content_string), preferences.content_string
    policy = host.check_output("apt-cache policy nvidia-driver")
    assert re.search(r"Candidate:\s+535\.", policy), policy


def test_open_module_is_built_for_every_image_kernel(host):
    # Debian renames the module to nvidia-current-open.ko; `modprobe nvidia` reaches it through
    # the install rule checked below, so `modinfo nvidia` would not find it.
    for kernel in image_kernels(host):
        info = host.run("modinfo -k %s nvidia-current-open", kernel)
        assert info.rc == 0, (kernel, info.stderr)
        assert re.search(r"(?m)^version:\s+535\.", info.stdout), info.stdout
        assert re.search(r"(?m)^license:\s+Dual MIT/GPL", info.stdout), info.stdout
        assert re.search(r"(?m)^vermagic:\s+%s " % re.escape(kernel), info.stdout), info.stdout


def test_modprobe_nvidia_reaches_the_open_module(host):
    rule = host.run("grep -rhsE %s /etc/nvidia /etc/modprobe.d",
                    r"^install[[:space:]]+nvidia[[:space:]]+modprobe -i nvidia-current-open")
    assert rule.rc == 0 and rule.stdout.strip(), rule.stderr


def test_nouveau_is_blacklisted(host):
    blacklist = host.file("/etc/modprobe.d/mlinfra-blacklist-nouveau.conf")
    assert blacklist.is_file and blacklist.mode == 0o644
    assert "blacklist nouveau" in blacklist.content_string.splitlines()


def test_info_module_reports_no_gpu_without_failing(host):
    # The collection's own module, run through Ansible on the guest: no GPU is visible here.
    result = host.ansible("mlinfra.kvm.nvidia_smi_info", check=False)
    assert not result.get("failed"), result
    assert result["msg"] == "no GPU visible" and result["gpus"] == [], result
    assert result["nvidia_smi"], result
