"""mlinfra.kvm.ml_stage: every rule of issue 5, through the real module process.

Each test builds a tiny project in tmp_path whose command (make.py) concatenates its data
into out.txt and appends a line to runs.log, so "did it run" is a file, not a guess.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import four_ways, run_module_process

pytestmark = pytest.mark.unit

MAKE = r'''
import json, os, pathlib, sys, time
p = pathlib.Path
params = json.loads(p(os.environ["ML_STAGE_PARAMS"]).read_text()) if os.environ.get("ML_STAGE_PARAMS") else {}
with open("runs.log", "a") as f:
    f.write("%s %s\n" % (os.getpid(), os.environ.get("ML_STAGE_KEY")))
time.sleep(float(os.environ.get("SLEEP", "0")))
if os.environ.get("PARTIAL"):
    p("out.txt").write_text("partial")
if params.get("fail") or os.environ.get("FAIL"):
    print("about to fail", flush=True)
    print("boom: bad things", file=sys.stderr)
    sys.exit(3)
if os.environ.get("SKIP_OUT"):
    sys.exit(0)
data = b"".join(x.read_bytes() for x in sorted(p("data").rglob("*")) if x.is_file()) if p("data").exists() else b""
p("out.txt").write_bytes(data + json.dumps(params, sort_keys=True).encode())
for extra in os.environ.get("EXTRA_OUTS", "").split():
    p(extra).write_text("extra")
if os.environ.get("METRICS"):
    p("metrics.json").write_text(json.dumps({"acc": 0.5, "loss": {"train": 1.25}, "note": "text"}))
print("made out.txt")
'''


def _project(tmp: Path) -> Path:
    proj = tmp / "proj"
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "a.txt").write_text("alpha\n")
    (proj / "data" / "b.txt").write_text("bravo\n")
    (proj / "data" / "sub" / "c.txt").write_text("charlie\n")
    (proj / "make.py").write_text(MAKE)
    return proj


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return _project(tmp_path)


def args(proj: Path, **over: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = {
        "name": "prep", "chdir": str(proj), "cmd": [sys.executable, "make.py"],
        "deps": ["data/"], "outs": ["out.txt"], "params": {"lr": 0.01, "epochs": 2},
    }
    base.update(over)
    return base


def ml(a: Dict[str, Any], check: bool = False, diff: bool = False) -> Dict[str, Any]:
    return run_module_process("ml_stage", a, check=check, diff=diff)


def ok(a: Dict[str, Any], **kw: Any) -> Dict[str, Any]:
    res = ml(a, **kw)
    assert not res["failed"], res
    return res


def warnings(res: Dict[str, Any]) -> list:
    """Warning texts (ansible-core 2.19 returns them as structured summaries)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in res.get("warnings", [])]


def runs(proj: Path) -> int:
    log = proj / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def lock_bytes(proj: Path, name: str = "prep") -> bytes:
    return (proj / ".ml_stage" / ("%s.lock.json" % name)).read_bytes()


def assert_reruns(a: Dict[str, Any], proj: Path, *expected: str) -> Dict[str, Any]:
    """Check mode predicts the run with the reasons, the real run runs, then nothing."""
    before = runs(proj)
    predicted = ok(a, check=True)
    assert predicted["changed"] is True and predicted["would_run"] is True, predicted
    res = ok(a)
    assert res["changed"] is True and res["ran"] is True, res
    assert runs(proj) == before + 1
    assert res["reasons"] == predicted["reasons"]
    for text in expected:
        assert any(text in r for r in res["reasons"]), (text, res["reasons"])
    again = ok(a)
    assert again["changed"] is False and again["reasons"] == [], again
    assert again["summary"].startswith("up to date: key %s matches the lock" % again["key"][:12]), again
    assert res["summary"] == "; ".join(res["reasons"])
    # A skipped stage reports what its last run recorded.
    assert again["metrics"] == res.get("metrics", {}) and again["last_run"]["host"], again
    return res


def assert_noop(a: Dict[str, Any], proj: Path) -> Dict[str, Any]:
    before = runs(proj)
    assert ok(a, check=True)["changed"] is False
    res = ok(a)
    assert res["changed"] is False and res["reasons"] == [] and res["ran"] is False, res
    assert runs(proj) == before
    return res


def age(proj: Path) -> None:
    """Let files written just now leave the stat cache's racy window (2 s)."""
    time.sleep(2.1)


# -- the standard proof: check, apply, check again, apply again ---------------------------
def test_first_run_four_ways(proj: Path) -> None:
    results = four_ways("ml_stage", args(proj))
    first = results["apply"]
    assert first["reasons"] == ["no lock: the stage has not run successfully here yet"]
    assert results["check"]["reasons"] == first["reasons"]
    assert first["rc"] == 0 and "made out.txt" in first["stdout_tail"]
    assert first["previous_key"] is None and first["key"] == results["check"]["key"]
    assert results["apply_again"]["previous_key"] == first["key"]
    assert runs(proj) == 1
    lock = json.loads(lock_bytes(proj))
    assert lock["key"] == first["key"] and lock["outs"]["out.txt"]["kind"] == "file"
    assert json.loads((proj / ".ml_stage" / "prep.params.json").read_text()) == {"lr": 0.01, "epochs": 2}


def test_diff_mode_shows_old_and_new_lock_summary(proj: Path) -> None:
    ok(args(proj))
    res = ok(args(proj, params={"lr": 0.02, "epochs": 2}), check=True, diff=True)
    assert res["diff"]["before"]["params"] == {"lr": 0.01, "epochs": 2}
    assert res["diff"]["after"]["params"] == {"lr": 0.02, "epochs": 2}
    assert res["diff"]["before"]["key"] == res["previous_key"]
    assert res["diff"]["after"]["key"] == res["key"]
    assert res["diff"]["after"]["outs"] == {"out.txt": "(after the run)"}


# -- each kind of change runs, with the right reason --------------------------------------
def test_param_changed_added_removed(proj: Path) -> None:
    ok(args(proj))
    assert_reruns(args(proj, params={"lr": 0.02, "epochs": 2}), proj, "param lr 0.01 -> 0.02")
    assert_reruns(args(proj, params={"lr": 0.02, "epochs": 2, "model": {"depth": 3}}), proj,
                  "param model.depth added (3)")
    assert_reruns(args(proj, params={"lr": 0.02, "model": {"depth": 3}}), proj,
                  "param epochs removed (was 2)")


def test_dep_directory_modified_added_removed(proj: Path) -> None:
    ok(args(proj))
    (proj / "data" / "a.txt").write_text("ALPHA\n")
    (proj / "data" / "new.txt").write_text("new\n")
    (proj / "data" / "sub" / "c.txt").unlink()
    assert_reruns(args(proj), proj,
                  "dep data/: 1 modified, 1 added, 1 removed (a.txt, new.txt, sub/c.txt)")


def test_dep_file_modified(proj: Path) -> None:
    (proj / "extra.csv").write_text("1,2\n")
    a = args(proj, deps=["data/", "extra.csv"])
    ok(a)
    (proj / "extra.csv").write_text("1,3\n")
    assert_reruns(a, proj, "dep extra.csv modified")


def test_removed_dep_reruns_and_added_dep_reruns(proj: Path) -> None:
    (proj / "extra.csv").write_text("1,2\n")
    ok(args(proj, deps=["data/", "extra.csv"]))
    assert_reruns(args(proj, deps=["data/"]), proj, "dep extra.csv removed from deps")
    assert_reruns(args(proj, deps=["data/", "extra.csv"]), proj, "dep extra.csv added to deps")


def test_content_edit_with_restored_mtime_reruns(proj: Path) -> None:
    target = proj / "data" / "b.txt"
    ok(args(proj))
    age(proj)
    ok(args(proj))  # the files are old enough now: this no-op fills the stat cache
    warm = assert_noop(args(proj), proj)
    # the no-op was served by the stat cache: nothing was read again
    assert warm["hashing"]["hashed"] == 0 and warm["hashing"]["cached"] >= 3, warm["hashing"]
    st = target.stat()
    target.write_text("BRAVO\n")  # same size, new content
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_mtime_ns == st.st_mtime_ns and target.stat().st_size == st.st_size
    assert_reruns(args(proj), proj, "dep data/: 1 modified (b.txt)")


def test_cmd_env_salt_changes(proj: Path) -> None:
    ok(args(proj, env={"MODE": "a"}))
    assert_reruns(args(proj, env={"MODE": "b"}), proj, "env MODE a -> b")
    res = assert_reruns(args(proj, env={"MODE": "b"}, cmd=[sys.executable, "-B", "make.py"]), proj)
    assert res["reasons"][0].startswith("cmd ") and "-B make.py" in res["reasons"][0]
    assert_reruns(args(proj, env={"MODE": "b"}, cmd=[sys.executable, "-B", "make.py"], salt="v2"),
                  proj, "salt '' -> 'v2'")


def test_out_missing_or_changed_reruns(proj: Path) -> None:
    ok(args(proj))
    (proj / "out.txt").unlink()
    assert_reruns(args(proj), proj, "out out.txt missing")
    (proj / "out.txt").write_text("tampered")
    assert_reruns(args(proj), proj, "out out.txt changed since the last run")


def test_outs_set_change_reruns(proj: Path) -> None:
    ok(args(proj))
    a = args(proj, outs=["out.txt", "extra.txt"], env={"EXTRA_OUTS": "extra.txt"})
    res = assert_reruns(a, proj, "out extra.txt added to outs")
    assert res["outs"]["extra.txt"]["kind"] == "file"


def test_force_runs_and_says_so(proj: Path) -> None:
    ok(args(proj))
    res = ok(args(proj, force=True))
    assert res["changed"] is True and res["reasons"] == ["force: true"] and runs(proj) == 2


def test_frozen_never_runs(proj: Path) -> None:
    ok(args(proj))
    res = ok(args(proj, frozen=True, params={"lr": 9}))
    assert res["changed"] is False and res["ran"] is False and res["would_run"] is True
    assert "param lr 0.01 -> 9" in res["reasons"]
    assert any("stage prep is frozen: not running" in w for w in warnings(res)), res
    assert runs(proj) == 1


def test_code_paths_fingerprint(proj: Path) -> None:
    a = args(proj, code={"paths": ["make.py"]})
    ok(a)
    (proj / "make.py").write_text(MAKE + "\n# tweak\n")
    assert_reruns(a, proj, "code make.py modified")


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
                   + list(argv), check=True, capture_output=True)


def test_code_git_commit_diff_untracked(proj: Path) -> None:
    _git(proj, "init", "-q")
    (proj / "train.py").write_text("print('v1')\n")
    _git(proj, "add", "train.py", "make.py")
    _git(proj, "commit", "-q", "-m", "v1")
    a = args(proj, code={"git": True})
    ok(a)
    # the stage's own files (state dir, out.txt, runs.log is not ours...) do not count
    (proj / ".gitignore").write_text("runs.log\n")
    _git(proj, "add", ".gitignore")
    _git(proj, "commit", "-q", "-m", "ignore")
    assert_reruns(a, proj, "git tree of %s changed" % proj)  # a commit that changed the tree
    (proj / "train.py").write_text("print('v2')\n")
    assert_reruns(a, proj, "git: uncommitted changes to tracked files differ")
    (proj / "notes.py").write_text("x = 1\n")
    assert_reruns(a, proj, "git: untracked files differ (1 now)")
    assert_noop(a, proj)


def test_code_python_distributions(proj: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "foo_lib-1.0.dist-info").mkdir(parents=True)
    a = args(proj, env={"PYTHONPATH": str(site)}, code={"python": True})
    first = ok(a)
    assert first["changed"] is True
    (site / "foo_lib-1.0.dist-info").rename(site / "foo_lib-2.0.dist-info")
    assert_reruns(a, proj, "python package foo-lib 1.0 -> 2.0")
    (site / "bar-0.1.dist-info").mkdir()
    assert_reruns(a, proj, "python package bar added (0.1)")


def test_hash_algorithm_change_and_auto_keeps_the_lock_algorithm(proj: Path) -> None:
    first = ok(args(proj, hash_algorithm="sha256"))
    assert first["algorithm"] == "sha256"
    assert_noop(args(proj), proj)  # auto keeps sha256 while it is importable
    res = assert_reruns(args(proj, hash_algorithm="blake3"), proj)
    assert res["reasons"] == ["hash algorithm sha256 -> blake3 (content hashes are not comparable)"]
    assert ok(args(proj))["algorithm"] == "blake3"


def test_falls_back_to_hashlib_without_xxhash_and_blake3(proj: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for mod in ("xxhash", "blake3"):
        (shadow / (mod + ".py")).write_text("raise ImportError('not installed on this guest')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    res = ok(args(proj))
    assert res["algorithm"] == "sha256"
    assert json.loads(lock_bytes(proj))["inputs"]["algorithm"] == "sha256"
    monkeypatch.delenv("PYTHONPATH")
    assert ok(args(proj))["algorithm"] == "sha256"  # the lock's algorithm is kept: no re-run
    assert runs(proj) == 1
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    bad = ml(args(proj, hash_algorithm="xxh3_128"))
    assert bad["failed"] and "hash_algorithm" in bad["msg"] and "xxhash" in bad["msg"]


# -- things that must NOT re-run ----------------------------------------------------------
def test_no_rerun_for_touch_reorder_secret_or_ignored(proj: Path) -> None:
    (proj / "extra.csv").write_text("1,2\n")
    a = args(proj, deps=[{"path": "data/", "ignore": ["*.tmp", "cache/"]}, "extra.csv"],
             secret_env={"TOKEN": "s3cret-one"}, params={"b": 1, "a": {"y": 2, "x": 1}})
    ok(a)
    os.utime(proj / "data" / "a.txt")                      # mtime only, same content
    (proj / "data" / "junk.tmp").write_text("x")            # ignored by name
    (proj / "data" / "cache").mkdir()
    (proj / "data" / "cache" / "blob").write_text("y")      # ignored directory
    reordered = dict(a, deps=["extra.csv", a["deps"][0]], secret_env={"TOKEN": "s3cret-two"},
                     params={"a": {"x": 1, "y": 2}, "b": 1})
    res = assert_noop(reordered, proj)
    assert res["hashing"]["hashed"] >= 1  # the touched file was re-read, and found unchanged
    text = json.dumps(res) + lock_bytes(proj).decode()
    assert "s3cret" not in text


def test_global_ignore_and_glob_deps(proj: Path) -> None:
    a = args(proj, deps=["data/**/*.txt"], ignore=["b.txt"])
    ok(a)
    (proj / "data" / "b.txt").write_text("changed but ignored\n")
    (proj / "data" / "x.csv").write_text("not matched\n")
    assert_noop(a, proj)
    (proj / "data" / "sub" / "d.txt").write_text("delta\n")
    assert_reruns(a, proj, "dep data/**/*.txt: 1 added (data/sub/d.txt)")


# -- failures -------------------------------------------------------------------------------
def test_failure_keeps_previous_lock_and_partial_outputs_never_count(proj: Path) -> None:
    ok(args(proj))
    before = lock_bytes(proj)
    res = ml(args(proj, params={"lr": 0.5, "epochs": 2}, secret_env={"FAIL": "yes-fail", "PARTIAL": "yes-partial"}))
    assert res["failed"] and res["rc"] == 3 and res["ran"] is True
    assert "previous lock is kept" in res["msg"]
    assert "boom: bad things" in res["stderr_tail"] and "about to fail" in res["stdout_tail"]
    assert res["reasons"] == ["param lr 0.01 -> 0.5"]
    assert lock_bytes(proj) == before
    # the inputs of the good run are back, but the failed run touched out.txt: re-run
    assert_reruns(args(proj), proj, "out out.txt changed since the last run")


def test_exit_zero_without_declared_out_is_a_failure(proj: Path) -> None:
    res = ml(args(proj, env={"SKIP_OUT": "1"}))
    assert res["failed"] and res["rc"] == 0
    assert "did not produce the declared out(s) out.txt" in res["msg"]
    assert not (proj / ".ml_stage" / "prep.lock.json").exists()
    assert ml(args(proj, env={"SKIP_OUT": "1"}), check=True)["changed"] is True


def test_timeout_is_a_failure(proj: Path) -> None:
    ok(args(proj))
    before = lock_bytes(proj)
    t = time.monotonic()
    res = ml(args(proj, env={"SLEEP": "30"}, timeout=1))
    assert res["failed"] and "timed out after 1" in res["msg"], res
    assert time.monotonic() - t < 20
    assert lock_bytes(proj) == before


def test_metrics_file_is_read_and_is_an_out(proj: Path) -> None:
    res = ok(args(proj, metrics_file="metrics.json", env={"METRICS": "1"}))
    assert res["metrics"] == {"acc": 0.5, "loss.train": 1.25}
    assert "metrics.json" in res["outs"]
    (proj / "metrics.json").unlink()
    assert "out metrics.json missing" in ok(args(proj, metrics_file="metrics.json",
                                                 env={"METRICS": "1"}), check=True)["reasons"]


# -- bad input: a clear error, no run, the previous lock intact ------------------------------
BAD = [
    ("cmd", {"cmd": "python make.py"}, "option cmd: value 'python make.py' is not a non-empty list"),
    ("cmd", {"cmd": []}, "option cmd: value [] is not a non-empty list"),
    ("cmd", {"cmd": ["no-such-program-xyz"]}, "names a program (no-such-program-xyz) that is not"),
    ("deps", {"deps": ["data/", "missing.csv"]}, "option deps: value 'missing.csv' does not exist"),
    ("deps", {"deps": ["nothing/*.csv"]}, "matches nothing"),
    ("params", {"params": {"lr": float("nan")}}, "option params: value"),
    ("outs", {"outs": ["../escape.txt"]}, "is outside chdir"),
    ("outs", {"outs": ["data/gen.txt"]}, "overlaps the dep data"),
    ("name", {"name": "bad/name"}, "option name:"),
    ("env", {"env": {"ML_STAGE_KEY": "x"}}, "is set by ml_stage itself"),
]


@pytest.mark.parametrize("option,over,message", BAD, ids=["%s-%d" % (b[0], i) for i, b in enumerate(BAD)])
def test_bad_input_fails_clearly_without_running(proj: Path, option: str, over: Dict[str, Any],
                                                 message: str) -> None:
    ok(args(proj))
    before = lock_bytes(proj)
    for check in (True, False):
        res = ml(args(proj, **over), check=check)
        assert res["failed"] and message in res["msg"], res
        assert ("option %s" % option) in res["msg"] and ";" in res["msg"]  # names the fix too
    assert runs(proj) == 1 and lock_bytes(proj) == before


def test_params_nan_message_names_the_fix(proj: Path) -> None:
    res = ml(args(proj, params={"lr": float("inf")}))
    assert res["failed"] and "not JSON-serialisable" in res["msg"] and "no NaN or Infinity" in res["msg"]


def test_outs_outside_chdir_allowed_on_request(proj: Path, tmp_path: Path) -> None:
    a = args(proj, outs=["../elsewhere.txt"], allow_outs_outside_chdir=True,
             cmd=[sys.executable, "-c", "open('../elsewhere.txt', 'w').write('x')"])
    assert ok(a)["changed"] is True and (tmp_path / "elsewhere.txt").exists()


def test_unreachable_mlflow_fails_before_running_unless_optional(proj: Path) -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    mlflow = {"tracking_uri": "http://127.0.0.1:%d" % port, "timeout": 3}
    for check in (True, False):
        res = ml(args(proj, mlflow=mlflow), check=check)
        assert res["failed"] and "option mlflow.tracking_uri" in res["msg"], res
        assert "unreachable" in res["msg"] and "mlflow.optional" in res["msg"]
    assert runs(proj) == 0 and not (proj / ".ml_stage" / "prep.lock.json").exists()
    res = ok(args(proj, mlflow=dict(mlflow, optional=True)))
    assert res["ran"] is True and res["mlflow"]["run_id"] is None
    assert any("running without MLflow tracking" in w for w in warnings(res))
    assert_noop(args(proj, mlflow=mlflow), proj)  # a skip makes no MLflow call at all


# -- check mode reads only ------------------------------------------------------------------
def snapshot(root: Path) -> Dict[str, Any]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size, st.st_ino, digest)
    return out


def test_check_mode_writes_nothing(proj: Path) -> None:
    before = snapshot(proj)
    res = ok(args(proj), check=True, diff=True)
    assert res["changed"] is True and snapshot(proj) == before
    assert not (proj / ".ml_stage").exists()
    ok(args(proj))
    age(proj)
    (proj / "data" / "a.txt").write_text("changed\n")
    (proj / "out.txt").unlink()
    before = snapshot(proj)
    res = ok(args(proj, params={"lr": 1}), check=True, diff=True)
    assert res["changed"] is True and len(res["reasons"]) == 4, res["reasons"]
    assert snapshot(proj) == before


# -- concurrency ------------------------------------------------------------------------------
def _parallel(a: Dict[str, Any], n: int = 2):
    results: list = [None] * n

    def one(i: int) -> None:
        results[i] = ml(a)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join()
    return results


def test_concurrent_run_fails_clearly_and_never_corrupts_the_lock(proj: Path) -> None:
    results = _parallel(args(proj, env={"SLEEP": "3"}))
    good = [r for r in results if not r["failed"]]
    busy = [r for r in results if r["failed"]]
    assert len(good) == 1 and len(busy) == 1, results
    assert "is being run by pid" in busy[0]["msg"] and "lock_timeout" in busy[0]["msg"]
    assert runs(proj) == 1
    lock = json.loads(lock_bytes(proj))
    assert lock["key"] == good[0]["key"]


def test_concurrent_run_waits_then_skips(proj: Path) -> None:
    results = _parallel(args(proj, env={"SLEEP": "2"}, lock_timeout=60))
    assert all(not r["failed"] for r in results), results
    assert sorted(r["changed"] for r in results) == [False, True]
    assert runs(proj) == 1


def test_lock_and_manifest_layout(proj: Path) -> None:
    ok(args(proj))
    ok(args(proj, params={"lr": 3}))
    state = proj / ".ml_stage"
    manifests = sorted(p.name for p in state.glob("prep.manifest.*.json"))
    assert len(manifests) == 1  # the superseded manifest was dropped
    lock = json.loads(lock_bytes(proj))
    assert lock["manifest"] == manifests[0]
    manifest = json.loads((state / manifests[0]).read_text())
    assert sorted(manifest["deps"]["data"]) == ["a.txt", "b.txt", "sub/c.txt"]
    assert not list(state.glob(".*.tmp"))
    assert (state / "prep.stdout.log").read_text().strip() == "made out.txt"


def test_ansible_doc_matches_the_argument_spec() -> None:
    from conftest import COLLECTIONS
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-doc")), "--json",
                           "mlinfra.kvm.ml_stage"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["mlinfra.kvm.ml_stage"]
    sys.path.insert(0, str(COLLECTIONS))
    from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_spec import ARGUMENT_SPEC

    def check(options: Dict[str, Any], spec: Dict[str, Any], where: str) -> None:
        assert set(options) == set(spec), where
        for name, opt in options.items():
            assert opt.get("type", "str") == spec[name].get("type", "str"), (where, name)
            assert opt.get("default") == spec[name].get("default"), (where, name)
            if "suboptions" in opt or "options" in spec[name]:
                check(opt["suboptions"], spec[name]["options"], where + "." + name)

    check(doc["doc"]["options"], ARGUMENT_SPEC, "ml_stage")
    assert doc["examples"] and doc["return"]["reasons"]


# -- runtime_env and the key's parts ------------------------------------------------------
def test_runtime_env_reaches_the_command_but_not_the_key(proj: Path) -> None:
    a = args(proj, runtime_env={"EXTRA_OUTS": "where-1.txt"})
    first = ok(a)
    assert first["ran"] and (proj / "where-1.txt").read_text() == "extra"
    assert first["runtime_env"] == {"EXTRA_OUTS": "where-1.txt"}
    lock = json.loads(lock_bytes(proj))
    assert lock["run"]["runtime_env"] == {"EXTRA_OUTS": "where-1.txt"}
    assert "EXTRA_OUTS" not in json.dumps(lock["inputs"])
    # Another rendezvous id or interface alone re-runs nothing, and the key stays the same.
    moved = assert_noop(args(proj, runtime_env={"EXTRA_OUTS": "where-2.txt"}), proj)
    assert moved["key"] == first["key"] and not (proj / "where-2.txt").exists()
    # The same variable in env (part of the key) is a different thing: refused, nothing runs.
    bad = ml(args(proj, env={"EXTRA_OUTS": "a"}, runtime_env={"EXTRA_OUTS": "b"}))
    assert bad["failed"] and "runtime_env" in bad["msg"] and "EXTRA_OUTS" in bad["msg"], bad
    assert runs(proj) == 1


def test_inputs_digest_names_the_part_that_differs(proj: Path) -> None:
    one = ok(args(proj), check=True)
    other = ok(args(proj, params={"lr": 0.02, "epochs": 2}), check=True)
    assert one["key"] != other["key"]
    differ = sorted(k for k in one["inputs_digest"] if one["inputs_digest"][k] != other["inputs_digest"][k])
    assert differ == ["params"], (one["inputs_digest"], other["inputs_digest"])
    (proj / "data" / "a.txt").write_text("changed\n")
    third = ok(args(proj), check=True)
    differ = sorted(k for k in one["inputs_digest"] if one["inputs_digest"][k] != third["inputs_digest"][k])
    assert differ == ["deps/data"], differ
    assert {"cmd", "env", "outs", "algorithm", "salt"} <= set(one["inputs_digest"])


def test_metrics_file_inside_an_out_directory_adds_no_out(proj: Path) -> None:
    """Ranks of a distributed stage declare the same outs whether or not they write metrics."""
    script = proj / "ranked.py"
    script.write_text("import json, os, pathlib\n"
                      "d = pathlib.Path('res'); d.mkdir(exist_ok=True)\n"
                      "(d / 'rank.json').write_text('{}')\n"
                      "if os.environ.get('WRITE_METRICS'):\n"
                      "    (d / 'metrics.json').write_text(json.dumps({'loss': 0.5}))\n")
    base = dict(name="ranked", chdir=str(proj), cmd=[sys.executable, "ranked.py"], outs=["res"])
    with_metrics = ok(dict(base, metrics_file="res/metrics.json", env={"WRITE_METRICS": "1"},
                           state_dir=".rank0"))
    without = ok(dict(base, env={"WRITE_METRICS": "1"}, state_dir=".rank1"))
    assert with_metrics["metrics"] == {"loss": 0.5}
    assert with_metrics["inputs_digest"]["outs"] == without["inputs_digest"]["outs"]
    assert with_metrics["key"] == without["key"]


# ml_stage with its running record's write followed at once by SIGHUP to itself: the signal
# lands after the command started and before the module could act on it, the window in which
# a dropped SSH connection used to end the module with no result.
SIGHUP_AFTER_RECORD = r'''
import os, runpy, signal
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_proc
write = _stage_proc.RunRecord.write
def write_then_hangup(self, *args, **kwargs):
    write(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGHUP)
_stage_proc.RunRecord.write = write_then_hangup
runpy.run_module("ansible_collections.mlinfra.kvm.plugins.modules.ml_stage", run_name="__main__")
'''


def test_a_signal_before_the_module_waits_on_its_command_still_stops_it_and_reports(proj: Path) -> None:
    from conftest import module_env
    payload = dict(args(proj), _ansible_check_mode=False, _ansible_diff=False)
    env = dict(module_env(), SLEEP="60")
    proc = subprocess.run([sys.executable, "-c", SIGHUP_AFTER_RECORD], capture_output=True, text=True,
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": payload}), env=env, timeout=120, check=False)
    assert "{" in proc.stdout, ("the module ended with no result", proc.returncode, proc.stderr[-2000:])
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert result["failed"] is True and result["interrupted_by"] == "SIGHUP", result
    assert result["changed"] is True and result["still_running"] == [], result
    assert not (proj / "out.txt").exists()
    assert not (proj / ".ml_stage" / "prep.lock").exists()
