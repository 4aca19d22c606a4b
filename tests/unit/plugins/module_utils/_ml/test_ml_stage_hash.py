"""ml_stage's hashing, stat cache and lock files, in process."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import COLLECTIONS

sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _atomic_file as A  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_hash as H  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_lock as L  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_spec import StageSpec  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    (root / "d" / "e").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 10)
    (root / "d" / "b.txt").write_text("bee")
    (root / "d" / "e" / "c.tmp").write_text("sea")
    return root


@pytest.fixture
def no_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat every file as old enough to cache (the real window is 2 s)."""
    monkeypatch.setattr(H, "RACY_NS", -10 ** 12)


def test_algorithm_choice() -> None:
    assert H.choose_algorithm("sha256", "blake3") == "sha256"
    assert H.choose_algorithm("auto", "sha256") == "sha256"      # the lock's algorithm is kept
    assert H.choose_algorithm("auto", None) == H.PREFERENCE[0]    # both accelerators installed here
    assert H.choose_algorithm("auto", "nonsense") == H.PREFERENCE[0]
    with pytest.raises(ValueError):
        H.choose_algorithm("crc32", None)


@pytest.mark.parametrize("algo", [a for a in H.SUPPORTED if H.available(a)])
def test_hash_file_matches_reference(tmp_path: Path, algo: str) -> None:
    for size in (0, 5, H.SMALL, H.SMALL + 1, 3 * H.CHUNK + 7):
        data = os.urandom(size)
        p = tmp_path / ("f%d" % size)
        p.write_bytes(data)
        assert H.hash_file(str(p), algo, size) == H.hash_bytes(algo, data)
        assert H.hash_file(str(p), algo) == H.hash_bytes(algo, data)
    if algo in ("sha256", "md5"):
        assert H.hash_bytes(algo, b"x") == hashlib.new(algo, b"x").hexdigest()


def test_ignore_matcher() -> None:
    m = H.IgnoreMatcher(["*.tmp", "cache/", "raw/*.csv", "/top.txt"])
    assert m("x/y.tmp", "y.tmp", False)
    assert m("a/cache", "cache", True) and not m("a/cache", "cache", False)
    assert m("raw/a.csv", "a.csv", False) and not m("other/a.csv", "a.csv", False)
    assert m("top.txt", "top.txt", False)
    assert not m("keep.txt", "keep.txt", False)
    assert not H.IgnoreMatcher([]).active


def test_tree_hash_is_deterministic_and_content_addressed(tree: Path, tmp_path: Path) -> None:
    h = H.Hasher(H.StatCache(None, "sha256"))
    one = h.path("t", str(tmp_path), want_manifest=True)
    assert one["kind"] == "dir" and one["files"] == 3 and one["size"] == 16
    assert sorted(one["manifest"]) == ["a.bin", "d/b.txt", "d/e/c.tmp"]
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(tree, copy)
    assert h.path("copy", str(tmp_path))["hash"] == one["hash"]   # location does not matter
    (copy / "d" / "b.txt").rename(copy / "d" / "B.txt")
    assert h.path("copy", str(tmp_path))["hash"] != one["hash"]   # names do
    ignored = h.path("t", str(tmp_path), H.IgnoreMatcher(["*.tmp"]))
    assert ignored["files"] == 2 and ignored["hash"] != one["hash"]
    assert h.path("missing", str(tmp_path))["kind"] == "missing"
    glob = h.path("t/**/*.txt", str(tmp_path), want_manifest=True)
    assert glob["kind"] == "glob" and list(glob["manifest"]) == ["t/d/b.txt"]


def test_stat_cache_serves_unchanged_files_and_sees_ctime(tree: Path, tmp_path: Path, no_racy: None) -> None:
    cache_path = str(tmp_path / "sc")
    c1 = H.StatCache(cache_path, "xxh3_128" if H.HAS_XXHASH else "sha256")
    first = H.Hasher(c1).path("t", str(tmp_path))
    assert c1.stats["hashed"] == 3 and c1.save() is True
    c2 = H.StatCache(cache_path, c1.algo)
    again = H.Hasher(c2).path("t", str(tmp_path))
    assert again["hash"] == first["hash"]
    assert c2.stats == {"files": 3, "hashed": 0, "cached": 3, "bytes_hashed": 0}
    assert c2._files is None            # the tree signature matched: per-file cache never loaded
    assert c2.save() is False           # nothing changed: nothing written
    # same size, mtime put back: only the ctime tells
    target = tree / "d" / "b.txt"
    st = target.stat()
    target.write_text("BEE")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    c3 = H.StatCache(cache_path, c1.algo)
    changed = H.Hasher(c3).path("t", str(tmp_path))
    assert changed["hash"] != first["hash"]
    assert c3.stats["hashed"] == 1 and c3.stats["cached"] == 2
    c3.save()
    # a removed file drops out of the cache
    (tree / "a.bin").unlink()
    c4 = H.StatCache(cache_path, c1.algo)
    H.Hasher(c4).path("t", str(tmp_path))
    c4.save()
    c5 = H.StatCache(cache_path, c1.algo)
    assert sorted(os.path.basename(p) for p in c5._files_map()) == ["b.txt", "c.tmp"]


def test_racy_files_are_not_cached(tree: Path, tmp_path: Path) -> None:
    cache = H.StatCache(str(tmp_path / "sc"), "sha256")
    H.Hasher(cache).path("t", str(tmp_path))
    cache.save()
    again = H.StatCache(str(tmp_path / "sc"), "sha256")
    H.Hasher(again).path("t", str(tmp_path))
    assert again.stats["hashed"] == 3     # written just now: hashed again, never trusted


def test_cache_of_another_algorithm_is_ignored(tree: Path, tmp_path: Path, no_racy: None) -> None:
    c = H.StatCache(str(tmp_path / "sc"), "sha256")
    H.Hasher(c).path("t", str(tmp_path))
    c.save()
    other = H.StatCache(str(tmp_path / "sc"), "md5")
    H.Hasher(other).path("t", str(tmp_path))
    assert other.stats["hashed"] == 3


def test_corrupt_cache_is_rebuilt(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "sc").write_bytes(b"garbage")
    (tmp_path / "sc.trees").write_bytes(b"\x00\x01")
    c = H.StatCache(str(tmp_path / "sc"), "sha256")
    assert H.Hasher(c).path("t", str(tmp_path))["files"] == 3


def test_symlink_loop_and_broken_link(tree: Path, tmp_path: Path) -> None:
    os.symlink("..", tree / "d" / "loop")
    os.symlink("nowhere", tree / "broken")
    h = H.Hasher(H.StatCache(None, "sha256"))
    entry = h.path("t", str(tmp_path), want_manifest=True)
    assert "broken" in entry["manifest"] and entry["manifest"]["broken"].startswith("symlink:")
    assert not any("loop/" in k for k in entry["manifest"])
    os.unlink(tree / "broken")
    os.symlink("elsewhere", tree / "broken")
    assert h.path("t", str(tmp_path))["hash"] != entry["hash"]


def test_many_files_hashed_in_threads(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(300):
        (root / ("f%03d" % i)).write_bytes(b"%d" % i)
    cache = H.StatCache(None, "sha256")
    entry = H.Hasher(cache).path("many", str(tmp_path), want_manifest=True)
    assert cache.stats["hashed"] == 300
    assert entry["manifest"]["f007"] == hashlib.sha256(b"7").hexdigest()


# -- lock files -------------------------------------------------------------------------------
def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.lock.json"
    L.write_json_atomic(str(target), {"v": 1})

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(L.os, "replace", boom)
    with pytest.raises(OSError):
        L.write_json_atomic(str(target), {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.lock.json"]  # no temp file left


def test_lock_readers_never_see_a_torn_file(tmp_path: Path) -> None:
    target = str(tmp_path / "s.lock.json")
    L.write_json_atomic(target, {"n": 0, "pad": "x" * 200000})
    stop = time.monotonic() + 1.5
    errors = []

    def writer() -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            A.write_bytes_atomic(target, json.dumps({"n": n, "pad": "x" * 200000}).encode(), fsync=False)

    t = threading.Thread(target=writer)
    t.start()
    while time.monotonic() < stop:
        try:
            json.loads(Path(target).read_text())
        except ValueError as exc:
            errors.append(exc)
    t.join()
    assert not errors


def test_read_lock_reports_unreadable_and_unknown(tmp_path: Path) -> None:
    files = L.StageFiles(str(tmp_path), "s")
    assert files.read_lock() == (None, None)
    Path(files.lock).write_text("{not json")
    lock, problem = files.read_lock()
    assert lock is None and "unreadable" in problem
    Path(files.lock).write_text(json.dumps({"format": 99}))
    assert "unknown format" in files.read_lock()[1]


def test_file_lock_is_exclusive_and_names_the_holder(tmp_path: Path) -> None:
    path = str(tmp_path / "s.flock")
    with L.FileLock(path, "s", 0):
        with pytest.raises(L.StageBusyError) as info:
            L.FileLock(path, "s", 0.3).acquire()
        assert "pid %d" % os.getpid() in info.value.msg and "lock_timeout" in info.value.msg
    with L.FileLock(path, "s", 0):
        pass  # released: free again


# -- option validation (no side effects before it passes) --------------------------------------
def spec(tmp_path: Path, **over):
    (tmp_path / "data").mkdir(exist_ok=True)
    base = {"name": "s", "chdir": str(tmp_path), "cmd": ["true"], "deps": ["data"], "outs": ["o"]}
    base.update(over)
    return StageSpec(base)


def test_spec_normalises_and_validates(tmp_path: Path) -> None:
    s = spec(tmp_path, metrics_file="m.json", cmd=["true", 3])
    assert s.cmd == ["true", "3"] and s.outs == ["o", "m.json"]
    assert s.params_file is None and s.state_dir == str(tmp_path / ".ml_stage")
    s = spec(tmp_path, params={"a": 1})
    assert s.params_file == os.path.join(".ml_stage", "s.params.json")
    for over, option in [
        ({"cmd": "true"}, "cmd"), ({"cmd": [["x"]]}, "cmd"), ({"params": {"a": {1, 2}}}, "params"),
        ({"params": {1: "a"}}, "params"), ({"params": [1]}, "params"), ({"outs": ["/etc/x"]}, "outs"),
        ({"outs": ["."]}, "outs"), ({"outs": [".ml_stage/x"]}, "outs"), ({"outs": ["o*"]}, "outs"),
        ({"deps": [{"path": "data", "bogus": 1}]}, "deps"), ({"deps": [3]}, "deps"),
        ({"env": {"A": "1"}, "secret_env": {"A": "2"}}, "secret_env"), ({"env": {"1A": "x"}}, "env"),
        ({"timeout": -1}, "timeout"), ({"code": {"git": 5}}, "code.git"),
        ({"mlflow": {"tracking_uri": "file:///tmp/x"}}, "mlflow.tracking_uri"),
        ({"mlflow": {"tracking_uri": "http://h:5000"}, "env": {"MLFLOW_RUN_ID": "x"}}, "env"),
        ({"params": {"a": 1}, "params_file": "data/p.json"}, "params_file"),
        ({"hash_algorithm": "crc"}, "hash_algorithm"), ({"chdir": str(tmp_path / "nope")}, "chdir"),
    ]:
        with pytest.raises(InvalidInputError) as info:
            spec(tmp_path, **over)
        assert info.value.details["option"] == option, (over, info.value.msg)
