"""roles/venv_bundle/files/build_venv_bundle.py without pip: layout, #! rewriting, tar order.

pip itself is replaced here by a function that lays down what ``pip install --target`` leaves
(packages plus a ``bin`` of console scripts); the real pip against a real guest is
tests/vm/test_venv_bundle.py.
"""
from __future__ import annotations

import importlib.util
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = Path(ROOT) / "roles" / "venv_bundle" / "files" / "build_venv_bundle.py"


@pytest.fixture
def builder():
    spec = importlib.util.spec_from_file_location("build_venv_bundle", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_pip(target: Path, _args) -> None:
    (target / "pkg").mkdir(parents=True)
    (target / "pkg" / "__init__.py").write_text("VERSION = '1'\n")
    (target / "bin").mkdir()
    (target / "bin" / "pkg-cli").write_text("#!/root/.venv/bin/python3.11\nimport pkg\n")
    (target / "bin" / "helper.sh").write_text("#!/bin/sh\necho hi\n")


def test_tree_is_the_venv_marker_last_scripts_pointed_at_the_venv(builder, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(builder, "pip_install", fake_pip)
    dest = tmp_path / "out" / "b.tar"
    assert builder.main(["--dest", str(dest), "--venv", "/opt/v", "--python-version", "3.11",
                         "--platform", "manylinux2014_x86_64", "--marker", "abc123", "--", "pkg==1"]) == 0
    with tarfile.open(dest) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names[-1] == ".mlinfra-requirements.sha1", "an interrupted unpack must leave no marker"
        assert tar.extractfile(".mlinfra-requirements.sha1").read() == b"abc123\n"
        assert "lib/python3.11/site-packages/pkg/__init__.py" in names
        assert tar.extractfile("bin/pkg-cli").read().splitlines()[0] == b"#!/opt/v/bin/python"
        assert tar.extractfile("bin/helper.sh").read().splitlines()[0] == b"#!/bin/sh", "not a python script"
        assert {(m.uid, m.gid, m.uname) for m in members} == {(0, 0, "root")}
    # Only the tar is left: the temporary tree and the partial file are gone.
    assert sorted(p.name for p in dest.parent.iterdir()) == ["b.tar"]


def test_failed_pip_leaves_no_bundle(builder, tmp_path, monkeypatch) -> None:
    def broken_pip(target: Path, _args) -> None:
        target.mkdir()
        raise builder.subprocess.CalledProcessError(1, ["pip"])
    monkeypatch.setattr(builder, "pip_install", broken_pip)
    dest = tmp_path / "b.tar"
    with pytest.raises(builder.subprocess.CalledProcessError):
        builder.main(["--dest", str(dest), "--venv", "/opt/v", "--python-version", "3.11",
                      "--platform", "x", "--marker", "m", "--", "pkg==1"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--venv", "opt/v"], "is not an absolute path"),
    (["--venv", "/opt/v", "--no-platform"], "at least one --platform"),
])
def test_bad_arguments_are_named(builder, tmp_path, capsys, argv, message) -> None:
    base = ["--dest", str(tmp_path / "b.tar"), "--python-version", "3.11", "--marker", "m"]
    if "--no-platform" in argv:
        argv = [a for a in argv if a != "--no-platform"]
    else:
        base += ["--platform", "x"]
    with pytest.raises(SystemExit):
        builder.main(base + argv + ["--", "pkg==1"])
    assert message in capsys.readouterr().err
