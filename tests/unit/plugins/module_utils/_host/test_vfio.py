"""vfio_pci's runner (module_utils/_host/_vfio) and service (_vfio_service), in process on a synthetic
sysfs tree: the order of its side effects and what a failure half-way reports. The module's behaviour
as a whole (refusals, files, four-way idempotence) is tested in tests/unit/plugins/modules/test_vfio_pci.py."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import Roots
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._vfio import VfioRunner, argument_spec
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._vfio_service import VfioService
from sysfs_builder import EDU, FakeKernel, SysfsTree, gpu_host
from fake_module import StandInModule

pytestmark = pytest.mark.unit


class FakeModule(StandInModule):
    """The parts of AnsibleModule the runner uses; params get the argument spec's defaults."""

    def __init__(self, check_mode: bool = False, **params: Any) -> None:
        super().__init__(params, argument_spec(), check_mode)


class FailingWrite(VfioService):
    """A service whose write of one path fails (a full disk), after the writes before it."""

    def __init__(self, module: FakeModule, roots: Roots, failing: str) -> None:
        super().__init__(module, roots)
        self.failing = failing

    def write(self, path: str, content: Optional[str]) -> None:  # type: ignore[override]
        if path == self.failing:
            raise KvmError("cannot write %s: No space left on device" % path, path=path)
        VfioService.write(path, content)


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return gpu_host(tmp_path)


def module_for(tree: SysfsTree, check: bool = False, **extra: Any) -> FakeModule:
    rebuild, _unused = tree.fake_command("update-initramfs")
    modprobe, _unused = tree.fake_command("modprobe")
    params: Dict[str, Any] = dict(tree.roots(), devices=[EDU], initramfs_command=[str(rebuild), "-u"],
                                  modprobe_command=[str(modprobe)], bind_timeout=20)
    params.update(extra)
    return FakeModule(check, **params)


def test_the_module_is_loaded_before_the_devices_are_bound_in_check_mode_too(tree: SysfsTree) -> None:
    shutil.rmtree(str(tree.sys / "bus/pci/drivers/vfio-pci"))
    module = module_for(tree, check=True, persistent=False)
    result = VfioRunner(module, VfioService(module, Roots.from_params(module.params))).run()
    assert result["actions"] == ["load the vfio-pci module", "bind %s (1234:11e8) to vfio-pci (from no driver)" % EDU]
    assert result["changed"] is True and result["devices"][0]["driver"] == "vfio-pci"
    assert not (tree.base / "bin" / "modprobe.log").exists() and tree.override_of(EDU) is None, "check mode acts on nothing"


def test_a_write_that_fails_after_the_marker_leaves_the_rebuild_owed(tree: SysfsTree) -> None:
    """The marker goes before the first file: a failure on the second file is retried by the next run."""
    module = module_for(tree)
    conf = str(tree.etc / "modprobe.d" / "mlinfra-vfio-pci.conf")
    modules = str(tree.etc / "initramfs-tools" / "modules")
    runner = VfioRunner(module, FailingWrite(module, Roots.from_params(module.params), modules))
    with FakeKernel(tree), pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    bind = "bind %s (1234:11e8) to vfio-pci (from no driver)" % EDU
    assert err.details["changed"] is True
    assert err.details["actions"] == [bind, "write %s" % conf]
    assert err.details["failed_action"] == "write %s" % modules
    assert err.details["drivers"] == {EDU: "vfio-pci"}
    assert err.msg.startswith("cannot write %s: No space left on device; the boot configuration is written but the "
                              "initramfs is not rebuilt: the next run of this task runs " % modules), err.msg
    assert err.msg.endswith("(already done: %s; write %s)" % (bind, conf)), err.msg
    marker = tree.etc / "modprobe.d" / ".mlinfra-vfio-pci.initramfs-pending"
    assert marker.exists() and "has not succeeded since" in " ".join(marker.read_text().split())
    assert not (tree.base / "bin" / "update-initramfs.log").exists(), "no rebuild after the failed write"


def test_a_bind_the_kernel_does_not_answer_counts_as_a_change(tree: SysfsTree) -> None:
    """Nothing completed, but driver_override and drivers_probe were written: changed, with the drivers now."""
    module = module_for(tree, bind_timeout=1, persistent=False)
    runner = VfioRunner(module, VfioService(module, Roots.from_params(module.params)))
    with pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    assert err.details["changed"] is True and err.details["drivers"] == {EDU: None}
    assert "actions" not in err.details and "already done" not in err.msg, "no action completed"
    assert err.msg.startswith("%s did not bind to vfio-pci within 1s" % EDU), err.msg


def test_a_refusal_reports_no_change(tree: SysfsTree) -> None:
    module = module_for(tree, devices=["0000:05:00.0"])
    with pytest.raises(KvmError) as caught:
        VfioRunner(module, VfioService(module, Roots.from_params(module.params))).run()
    assert "changed" not in caught.value.details and "drivers" not in caught.value.details
