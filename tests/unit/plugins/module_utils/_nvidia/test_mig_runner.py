"""nvidia_mig's runner in process, over a stand-in service on the recorded H200 profile table:
which GPU an option names, refusals before any read, check mode that plans and runs nothing,
and a create that fails after the mode change reported as the partial change it is. The module
against a stand-in nvidia-smi is tests/unit/plugins/modules/test_nvidia_mig.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _mig as M
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_runner import (
    MigRunner, argument_spec, instance_views, select_gpu)
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_service import MigService

from conftest import ROOT
from fake_module import StandInModule

pytestmark = pytest.mark.unit

FIXTURES = Path(ROOT) / "tests" / "fixtures" / "mig"
H200 = M.profile_table((FIXTURES / "h200-lgip.txt").read_text(), (FIXTURES / "h200-lgipp.txt").read_text(), 0)
UUID = "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"
ROWS = [M.GpuRow(0, UUID, "00000000:00:06.0", "NVIDIA H200", "disabled", "disabled"),
        M.GpuRow(1, "GPU-00000000-1111-2222-3333-444444444444", "00000000:00:07.0", "NVIDIA H200", "disabled", "disabled")]


class FakeModule(StandInModule):
    def __init__(self, check_mode: bool = False, **params: Any) -> None:
        super().__init__(params, argument_spec(), check_mode, diff=True)


class StandInService:
    """The reads of MigService over one H200 held in memory; changes are recorded and applied
    (-mig and -cgi), or raise where ``fail_on`` names their flag."""

    binary = "/usr/bin/nvidia-smi"
    mode_args = staticmethod(MigService.mode_args)
    destroy_args = staticmethod(MigService.destroy_args)
    create_args = staticmethod(MigService.create_args)

    def __init__(self, fail_on: Optional[str] = None) -> None:
        self.row = ROWS[0]
        self.gis: List[M.GpuInstance] = []
        self.changes: List[List[str]] = []
        self.fail_on = fail_on

    def gpus(self) -> List[M.GpuRow]:
        return [self.row]

    def gpu(self, index: int) -> M.GpuRow:
        return self.row

    def profiles(self, index: int) -> List[M.Profile]:
        return list(H200)

    def instances(self, index: int) -> List[M.GpuInstance]:
        return list(self.gis)

    def devices_and_processes(self, index: int) -> Any:
        return [], []

    def run_change(self, args: Sequence[str]) -> str:
        if self.fail_on in args:
            raise KvmError("`nvidia-smi %s` exited 2: Insufficient Resources" % " ".join(args))
        self.changes.append(list(args))
        if "-mig" in args:
            mode = "enabled" if args[-1] == "1" else "disabled"
            self.row = self.row._replace(mig_current=mode, mig_pending=mode)
            return "Enabled MIG Mode for GPU 00000000:00:06.0\nAll done."
        for start, item in enumerate(args[args.index("-cgi") + 1].split(",")):
            profile = next(p for p in H200 if p.id == int(item.split(":")[0]))
            placed = int(item.split(":")[1])
            ci = M.ComputeInstance(start + 1, 0, 0, profile.name)
            self.gis.append(M.GpuInstance(start + 1, profile.id, profile.name, placed, profile.size, (ci,)))
        return ""


class ReadsNothing:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError("the runner read %s before refusing" % name)


@pytest.mark.parametrize("value", ["0", UUID.upper(), "00000000:00:06.0", "0000:00:06.0", "00:06.0"])
def test_the_gpu_option_names_a_gpu_by_index_uuid_or_bus_id(value):
    assert select_gpu(value, ROWS) == ROWS[0]


@pytest.mark.parametrize("value, needle", [
    ("MIG-3b6c7b9e-8f0a-5d3c-9d62-0e1b2c3d4e5f", "is a MIG device UUID"),
    ("7", "matches none of the GPUs"),
    ("gpu zero", "is neither an index, a GPU UUID nor a PCI bus id"),
])
def test_a_gpu_option_that_names_no_gpu_is_refused_with_the_gpus_there_are(value, needle):
    with pytest.raises(InvalidInputError) as caught:
        select_gpu(value, ROWS)
    assert needle in caught.value.msg and "GPU-00000000-1111-2222-3333-444444444444" in caught.value.msg


@pytest.mark.parametrize("params, option", [
    ({"mig_mode": "disabled", "instances": []}, "instances"),
    ({"command_timeout": 0}, "command_timeout"),
    ({"force_timeout": -1}, "force_timeout"),
])
def test_bad_input_is_refused_before_nvidia_smi_is_read(params, option):
    with pytest.raises(InvalidInputError) as caught:
        MigRunner(FakeModule(**params), ReadsNothing()).run()
    assert caught.value.details["option"] == option


def test_check_mode_plans_the_mode_and_the_geometry_and_changes_nothing():
    service = StandInService()
    module = FakeModule(check_mode=True, instances=[{"profile": "3g.71gb", "count": 1}, {"profile": "1g.18gb", "count": 2}])
    result = MigRunner(module, service).run()
    assert service.changes == [] and service.row == ROWS[0]
    assert result["changed"] is True and result["reset_required"] is False
    assert result["mig_mode"] == {"current": "enabled", "pending": "enabled"}
    assert [c[1:] for c in result["commands"]] == [["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "9:0,19:4,19:5", "-C"]]
    assert result["geometry"] == ["3g.71gb@0:4", "1g.18gb@4:1", "1g.18gb@5:1"]
    assert all(item["uuid"] is None and item["gpu_instance_id"] is None for item in result["instances"])
    assert result["diff"]["before"] == {"mig_mode": "disabled", "mig_mode_pending": "disabled", "geometry": []}


def test_a_create_refused_after_the_mode_change_is_a_partial_change_with_the_commands():
    service = StandInService(fail_on="-cgi")
    runner = MigRunner(FakeModule(instances=[{"profile": "3g.71gb", "count": 1}]), service)
    with pytest.raises(KvmError) as caught:
        runner.run()
    err = caught.value
    assert service.changes == [["-i", "0", "-mig", "1"]]
    assert err.details["changed"] is True
    assert err.details["actions"] == ["enable MIG mode on GPU 0 (NVIDIA H200)"]
    assert err.details["failed_action"] == "create 3g.71gb@0:4, each with one compute instance spanning it"
    assert err.details["commands"][-1][-3:] == ["-cgi", "9:0", "-C"]
    assert err.msg.endswith("(already done: enable MIG mode on GPU 0 (NVIDIA H200))")


def test_a_real_run_reads_the_geometry_back_after_creating_it():
    service = StandInService()
    result = MigRunner(FakeModule(instances=[{"profile": "2g.35gb", "count": 1}]), service).run()
    assert result["changed"] is True and result["geometry"] == ["2g.35gb@0:2"]
    assert result["mig_mode_message"] == "Enabled MIG Mode for GPU 00000000:00:06.0\nAll done."
    again = MigRunner(FakeModule(instances=[{"profile": "2g.35gb", "count": 1}]), service).run()
    assert again["changed"] is False and again["actions"] == [] and again["commands"] == []


def test_instance_views_order_kept_and_planned_instances_by_placement():
    kept = M.GpuInstance(2, 9, "3g.71gb", 4, 4, (M.ComputeInstance(2, 0, 2, "3g.71gb"),))
    device = M.MigDevice(0, 2, 0, "3g.71gb", "MIG-3b6c7b9e-8f0a-5d3c-9d62-0e1b2c3d4e5f")
    one_g = next(p for p in H200 if p.name == "1g.18gb")
    plan = M.Plan((kept,), (), ((one_g, 0),), ())
    views = instance_views(plan, [kept], [device])
    assert [v["placement"]["start"] for v in views] == [0, 4]
    assert views[0]["uuid"] is None and views[0]["profile"] == "1g.18gb"
    assert views[1]["uuid"] == device.uuid and views[1]["mig_device_index"] == 0 and views[1]["compute_instance_id"] == 0
