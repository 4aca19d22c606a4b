"""Testinfra checks for the cuda scenario (Debian's CUDA 11.8 toolkit, driver branch 535).

Molecule's testinfra verifier runs this file with `--connection=ansible --hosts=all`, so each
test gets the scenario's container as `host`, reached over SSH with the pinned host key.
No GPU is needed to install the toolkit or to compile device code.
"""
from __future__ import annotations

import re

# Debian 12 ships the toolkit as 11.8.89~11.8.0-<n>~deb12u<m> in non-free.
TOOLKIT_VERSION = re.compile(r"^11\.8\.\d+~11\.8\.\d+-")


def test_toolkit_package_is_debians_11_8(host):
    toolkit = host.package("nvidia-cuda-toolkit")
    assert toolkit.is_installed
    assert TOOLKIT_VERSION.match(toolkit.version), toolkit.version


def test_host_compiler_nvcc_probes_is_installed(host):
    # nvcc probes plain `gcc`/`g++` from PATH (roles/cuda/vars/main.yml says why the role adds g++).
    assert host.package("g++").is_installed
    assert host.exists("g++")


def test_non_free_components_source_is_written(host):
    sources = host.file("/etc/apt/sources.list.d/mlinfra-nvidia.sources")
    assert sources.is_file
    assert sources.user == "root" and sources.mode == 0o644
    assert re.search(r"(?m)^Components:.*\bnon-free\b", sources.content_string), sources.content_string


def test_nvcc_reports_release_11_8(host):
    out = host.check_output("nvcc --version")
    assert re.search(r"release 11\.8\b", out), out


def test_nvcc_compiles_a_kernel(host):
    # The role leaves its compile-check source in place; compiling it again here proves the
    # toolkit works now, not only when the role ran.
    source = host.file("/usr/local/share/mlinfra/cuda/nvcc_check.cu")
    assert source.is_file and "__global__" in source.content_string
    workdir = host.check_output("mktemp -d")
    try:
        obj = workdir + "/check.o"
        result = host.run("nvcc -c -o %s %s", obj, source.path)
        assert result.rc == 0, result.stderr
        assert host.file(obj).size > 0
        symbols = host.run("nm -C %s", obj)
        assert symbols.rc == 0 and "mlinfra_scale" in symbols.stdout, symbols.stdout + symbols.stderr
    finally:
        host.run("rm -rf -- %s", workdir)
