"""mlinfra.kvm.domain against libvirt's test:///default driver: memory and CPU pins are checked
against the node libvirt reports for the connection (test:///default's fake node: 3072 MiB, a CPU
map of 8), not against the machine the module runs on. Each module process has its own fresh
test driver, so nothing is left between tests."""
from __future__ import annotations

import pytest

from conftest import run_module_process

pytestmark = pytest.mark.unit

libvirt = pytest.importorskip("libvirt")


def node() -> dict:
    conn = libvirt.open("test:///default")
    try:
        return {"memory_mib": conn.getInfo()[1], "cpus": conn.getCPUMap(0)[0]}
    finally:
        conn.close()


def args(**extra) -> dict:
    out = {"name": "mlkvmtest-limits", "uri": "test:///default", "virt_type": "qemu", "memory": "128M", "vcpus": 1}
    out.update(extra)
    return out


@pytest.mark.parametrize("check", [True, False], ids=["check", "apply"])
def test_memory_beyond_the_node_is_refused_with_its_figure(check):
    mib = node()["memory_mib"]
    result = run_module_process("domain", args(memory="%dM" % (mib + 1)), check=check)
    assert result["failed"] and result["changed"] is False
    assert result["option"] == "memory" and result["value"] == "%dM" % (mib + 1)
    assert "host's total memory (%d MiB, as libvirt reports it for test:///default)" % mib in result["msg"]


@pytest.mark.parametrize("check", [True, False], ids=["check", "apply"])
def test_pin_beyond_the_node_cpus_is_refused_with_its_figure(check):
    cpus = node()["cpus"]
    pinning = {"vcpupin": [{"vcpu": 0, "cpuset": "0-%d" % cpus}]}
    result = run_module_process("domain", args(cpu_pinning=pinning), check=check)
    assert result["failed"] and result["changed"] is False
    assert result["option"] == "cpu_pinning.vcpupin[0].cpuset" and result["value"] == "0-%d" % cpus
    assert "names CPU %d, but the host has %d CPUs" % (cpus, cpus) in result["msg"]


def test_what_the_node_has_is_accepted():
    limits = node()
    result = run_module_process("domain", args(
        memory="%dM" % limits["memory_mib"],
        cpu_pinning={"vcpupin": [{"vcpu": 0, "cpuset": "0-%d" % (limits["cpus"] - 1)}], "emulatorpin": "0"}))
    assert not result["failed"] and result["changed"], result
    assert result["domain"]["memory_mib"] == limits["memory_mib"]
