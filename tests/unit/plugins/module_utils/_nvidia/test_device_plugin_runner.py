"""nvidia_device_plugin_config's runner in process, on files under tmp_path: check mode writes
nothing, only a file that differs (or has another mode) is written, and a write that fails after
the first one is reported as a partial change. The configs' rules and the module itself are
tests/unit/plugins/modules/test_device_plugin_config.py."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _mig as M
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._device_plugin_runner import (
    DevicePluginConfigRunner, PluginConfigFiles, argument_spec, run_nvidia_device_plugin_config)

from conftest import ROOT
from fake_module import StandInModule

pytestmark = pytest.mark.unit

FIXTURES = Path(ROOT) / "tests" / "fixtures" / "mig"
H200 = M.profile_table((FIXTURES / "h200-lgip.txt").read_text(), (FIXTURES / "h200-lgipp.txt").read_text(), 0)


class FakeModule(StandInModule):
    def __init__(self, check_mode: bool = False, **params: Any) -> None:
        super().__init__(params, argument_spec(), check_mode)


def with_geometry(tmp_path: Path, parted: Path, check_mode: bool = False) -> FakeModule:
    return FakeModule(check_mode=check_mode, mig_strategy="mixed", mig_profiles=[p.as_dict() for p in H200],
                      dest=str(tmp_path / "plugin.yaml"), mig_parted_dest=str(parted),
                      mig_configs=[{"name": "h200-one", "devices": "all", "mig_mode": "enabled",
                                    "instances": [{"profile": "3g.71gb", "count": 2}]}])


def test_check_mode_writes_nothing_and_shows_both_files(tmp_path):
    parted = tmp_path / "mig-parted.yaml"
    result = run_nvidia_device_plugin_config(with_geometry(tmp_path, parted, check_mode=True))
    assert result["changed"] is True and os.listdir(tmp_path) == []
    assert result["diff"]["before"] == {str(tmp_path / "plugin.yaml"): "", str(parted): ""}
    assert result["diff"]["after"][str(parted)] == result["mig_parted_yaml"]


def test_only_a_file_that_differs_or_has_another_mode_is_written(tmp_path):
    parted = tmp_path / "mig-parted.yaml"
    first = DevicePluginConfigRunner(with_geometry(tmp_path, parted), PluginConfigFiles())
    assert first.run()["changed"] is True
    assert first.tracker.performed == ["write %s" % (tmp_path / "plugin.yaml"), "write %s" % parted]
    assert stat.S_IMODE(parted.stat().st_mode) == 0o644
    again = DevicePluginConfigRunner(with_geometry(tmp_path, parted), PluginConfigFiles())
    assert again.run()["changed"] is False and again.tracker.actions == []
    os.chmod(parted, 0o600)
    mode = DevicePluginConfigRunner(with_geometry(tmp_path, parted), PluginConfigFiles())
    assert mode.run()["changed"] is True and mode.tracker.performed == ["set mode 0644 on %s" % parted]
    assert stat.S_IMODE(parted.stat().st_mode) == 0o644


class FullDisk(PluginConfigFiles):
    """The disk fills up after the first file."""

    def __init__(self, full_at: str) -> None:
        self.full_at = full_at

    def write(self, path: str, content: str) -> None:
        if path == self.full_at:
            raise KvmError("cannot write %s: [Errno 28] No space left on device" % path, path=path)
        super().write(path, content)


def test_a_write_that_fails_after_the_first_is_a_partial_change(tmp_path):
    parted = tmp_path / "mig-parted.yaml"
    with pytest.raises(KvmError) as caught:
        DevicePluginConfigRunner(with_geometry(tmp_path, parted), FullDisk(str(parted))).run()
    err = caught.value
    assert (tmp_path / "plugin.yaml").is_file() and not parted.exists()
    assert err.details["changed"] is True
    assert err.details["actions"] == ["write %s" % (tmp_path / "plugin.yaml")]
    assert err.details["failed_action"] == "write %s" % parted
    assert err.msg == "cannot write %s: [Errno 28] No space left on device (already done: write %s)" % (
        parted, tmp_path / "plugin.yaml")


def test_an_unreadable_file_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(KvmError) as caught:
        run_nvidia_device_plugin_config(with_geometry(tmp_path, tmp_path / "a-file" / "mig-parted.yaml"))
    assert caught.value.msg.startswith("cannot read %s: " % (tmp_path / "a-file" / "mig-parted.yaml"))


def test_a_directory_as_dest_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(InvalidInputError) as caught:
        run_nvidia_device_plugin_config(FakeModule(dest=str(tmp_path)))
    assert caught.value.details["option"] == "dest" and "is a directory or not an absolute path" in caught.value.msg
    assert os.listdir(tmp_path) == []
