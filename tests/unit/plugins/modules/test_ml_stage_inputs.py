"""ml_stage's input hardening (issue 13): special files, params_file's place, private files.

Every refusal is checked in check mode and in a real run: a clear message naming the option
and the path, nothing run, the lock as it was. A FIFO used to hang the module while it held
the stage's lock, so those runs carry a timeout: a regression fails instead of hanging.
"""
from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import four_ways, run_module_process
from test_ml_stage import _project, args, lock_bytes, ok, runs

pytestmark = pytest.mark.unit

HANG_GUARD = 60  # seconds; the refusal itself takes well under one


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return _project(tmp_path)


def ml(a: Dict[str, Any], check: bool = False) -> Dict[str, Any]:
    return run_module_process("ml_stage", a, check=check, timeout=HANG_GUARD)


def refused(a: Dict[str, Any], proj: Path, *needles: str) -> None:
    """Check mode and a real run both fail with every needle in the message; nothing runs."""
    lock = proj / ".ml_stage" / "prep.lock.json"
    before = lock.read_bytes() if lock.exists() else None
    count = runs(proj)
    for check in (True, False):
        res = ml(a, check=check)
        assert res["failed"] and res.get("changed") is False, res
        for needle in needles:
            assert needle in res["msg"], (needle, res["msg"])
    assert runs(proj) == count
    assert (lock.read_bytes() if lock.exists() else None) == before


# -- FIFOs, devices and sockets are never opened ---------------------------------------------------
def test_fifo_dep_is_refused_not_read(proj: Path) -> None:
    os.mkfifo(str(proj / "feed"))  # no writer: opening it for reading would block for ever
    refused(args(proj, deps=["data/", "feed"]), proj,
            "option deps: value 'feed' is a FIFO (named pipe); ml_stage hashes regular files only",
            "remove it, point deps at regular files")


def test_fifo_inside_a_dep_directory_names_the_dep_and_the_fifo(proj: Path) -> None:
    ok(args(proj))
    os.mkfifo(str(proj / "data" / "sub" / "pipe"))
    refused(args(proj), proj, "option deps: value 'data' holds %s, which is a FIFO" % (proj / "data" / "sub" / "pipe"),
            "ignore: ['pipe']")


def test_ignored_fifo_is_left_out_four_ways(proj: Path) -> None:
    os.mkfifo(str(proj / "data" / "pipe"))
    res = four_ways("ml_stage", args(proj, ignore=["pipe"]))
    assert res["apply"]["deps"]["data"]["files"] == 3 and runs(proj) == 1


def test_socket_matched_by_a_glob_is_refused(proj: Path, tmp_path: Path) -> None:
    # A short directory for the socket (sun_path is 108 bytes), linked into the project.
    import tempfile
    short = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(short / "s.txt"))
        sock.close()
        (proj / "data" / "s.txt").symlink_to(short / "s.txt")
        refused(args(proj, deps=["data/*.txt"]), proj, "option deps: value 'data/*.txt' holds",
                "s.txt, which is a socket")
    finally:
        import shutil
        shutil.rmtree(str(short), ignore_errors=True)


def test_character_device_dep_and_code_path_are_refused(proj: Path) -> None:
    (proj / "zeros").symlink_to("/dev/zero")  # reading it would never end
    refused(args(proj, deps=["data/", "zeros"]), proj, "option deps: value 'zeros' is a character device")
    refused(args(proj, code={"paths": ["zeros"]}), proj, "option code.paths: value 'zeros' is a character device")


def test_fifo_as_a_declared_out_is_refused(proj: Path) -> None:
    os.mkfifo(str(proj / "out.txt"))
    refused(args(proj), proj, "option outs: value 'out.txt' is a FIFO (named pipe)", "declare the regular files")


def test_small_files_are_read_in_bounded_chunks_even_when_they_grew(tmp_path: Path, monkeypatch) -> None:
    from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_hash as h
    path = tmp_path / "grew.bin"
    data = os.urandom(3 * h.CHUNK + 123)
    path.write_bytes(data)
    sizes = []
    real_open = open

    class Recorder:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> "Recorder":
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

        def read(self, n: int = -1) -> bytes:
            sizes.append(n)
            return self.f.read(n)

        def readinto(self, buf: Any) -> int:
            sizes.append(len(buf))
            return self.f.readinto(buf)

    monkeypatch.setattr(h, "open", lambda *a, **k: Recorder(real_open(*a, **k)), raising=False)
    # stat said 10 bytes (a small file), it has 3 MiB now: all of it is hashed, 1 MiB at a time
    assert h.hash_file(str(path), "sha256", size=10) == hashlib.sha256(data).hexdigest()
    assert h.hash_file(str(path), "sha256", size=len(data)) == hashlib.sha256(data).hexdigest()
    assert sizes and all(0 < n <= h.CHUNK for n in sizes), sizes


# -- params_file lies inside chdir, outside the state directory ------------------------------------
@pytest.mark.parametrize("params_file,problem", [
    ("../p.json", "lies outside chdir"),
    ("/tmp/ml-stage-elsewhere.json", "lies outside chdir"),
    ("link/p.json", "lies outside chdir"),                     # a symlink inside chdir pointing out
    (".ml_stage/prep.lock.json", "lies in the state directory"),
    (".ml_stage/prep.stdout.log", "lies in the state directory"),
    ("data", "is a directory"),
])
def test_params_file_outside_chdir_or_on_state_files_is_refused(proj: Path, tmp_path: Path, params_file: str,
                                                                problem: str) -> None:
    (tmp_path / "outside").mkdir()
    (proj / "link").symlink_to(tmp_path / "outside")
    ok(args(proj))
    refused(args(proj, params_file=params_file), proj, "option params_file: value '%s' %s" % (params_file, problem),
            "give a path inside chdir")
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "outside" / "p.json").exists()


def test_params_file_inside_chdir_four_ways(proj: Path) -> None:
    res = four_ways("ml_stage", args(proj, params_file="conf/params.json"))
    assert (proj / "conf" / "params.json").read_text().startswith("{")
    assert res["apply"]["params_file"] == "conf/params.json"
    # the default spelled out is the default
    assert ok(args(proj, params_file=".ml_stage/prep.params.json"), check=True)["reasons"] == \
        ["params_file conf/params.json -> .ml_stage/prep.params.json"]


# -- the stage's records are private ------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_logs_and_lock_files_are_0600_whatever_the_umask(proj: Path) -> None:
    state = proj / ".ml_stage"
    state.mkdir()
    # Files an earlier version left world-readable are made private by the next run.
    for name in ("prep.stdout.log", "prep.flock"):
        (state / name).write_text("old")
        os.chmod(str(state / name), 0o644)
    old = os.umask(0)  # the module process inherits it: modes must not come from the umask
    try:
        res = four_ways("ml_stage", args(proj))
    finally:
        os.umask(old)
    assert res["apply"]["ran"] is True
    manifest = next(state.glob("prep.manifest.*.json"))
    for path in (state / "prep.lock.json", manifest, state / "prep.flock", state / "prep.stdout.log",
                 state / "prep.stderr.log"):
        assert _mode(path) == 0o600, (path.name, oct(_mode(path)))
    assert (state / "prep.stdout.log").read_text().strip() == "made out.txt"
    assert lock_bytes(proj)
