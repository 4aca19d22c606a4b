"""The one whole-file writer (_atomic_file): the caller's mode from the first instant, the old
file kept when the write fails, no temporary left behind; and _sysfs's wrapper around it."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _atomic_file as A
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import write_file_atomic

pytestmark = pytest.mark.unit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_secret_replacing_a_readable_file_is_private_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What AnsibleModule.atomic_move would not do: it gives the new file the old one's mode."""
    target = tmp_path / "credentials.json"
    target.write_text("old")
    target.chmod(0o644)
    seen = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:  # the mode the file has when it takes the name
        seen.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(A.os, "replace", replace)
    A.write_bytes_atomic(str(target), b"new", mode=0o600)
    assert target.read_bytes() == b"new" and mode(target) == 0o600 and seen == [0o600]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "drop-in.conf"
    target.write_text("old")
    with pytest.raises(TypeError):
        A.write_bytes_atomic(str(target), "not bytes")  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drop-in.conf"]


def test_missing_directories_are_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file"
    A.write_bytes_atomic(str(target), b"x", fsync=False, mode=0o640)
    assert target.read_bytes() == b"x" and mode(target) == 0o640


def test_sysfs_writer_names_the_path_it_could_not_write(tmp_path: Path) -> None:
    (tmp_path / "etc").write_text("a file where a directory should be")
    with pytest.raises(KvmError) as err:
        write_file_atomic(str(tmp_path / "etc" / "modprobe.d" / "vfio.conf"), "options vfio-pci ids=10de:2335\n")
    assert "cannot write %s" % (tmp_path / "etc" / "modprobe.d" / "vfio.conf") in err.value.msg
