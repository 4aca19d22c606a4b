"""config_files on a temporary directory: the four ways, validation before the rename, a partial
change reported as changed, metadata-only changes, and input refused before any write."""
from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest


from ansible_collections.mlinfra.kvm.plugins.module_utils._core._config_files import ConfigFilesRunner, ConfigFilesService
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import KvmError
from conftest import four_ways, run_module_process  # noqa: E402
from fake_module import StandInModule  # noqa: E402

pytestmark = pytest.mark.unit

ME = os.getuid()


def entry(path: Path, content: str, mode: str = "0644", **extra: Any) -> Dict[str, Any]:
    # root:root needs root; the test's own user and group keep it runnable anywhere.
    import grp
    import pwd
    out = {"path": str(path), "content": content, "mode": mode,
           "owner": pwd.getpwuid(ME).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
    out.update(extra)
    return out


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def leftovers(directory: Path) -> List[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_four_ways_with_a_new_and_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "b.conf").write_text("old\n")
    files = [entry(tmp_path / "a.conf", "alpha\n", tag="a restart"),
             entry(tmp_path / "b.conf", "beta\n", "0600", tag="b reload")]
    results = four_ways("config_files", {"files": files})
    assert (tmp_path / "a.conf").read_text() == "alpha\n" and mode_of(tmp_path / "a.conf") == 0o644
    assert (tmp_path / "b.conf").read_text() == "beta\n" and mode_of(tmp_path / "b.conf") == 0o600
    for name in ("check", "apply"):
        got = results[name]
        assert got["changed_paths"] == [str(tmp_path / "a.conf"), str(tmp_path / "b.conf")], got
        assert got["changed_tags"] == ["a restart", "b reload"], got
        diffs = {d["after_header"]: d for d in got["diff"]}
        assert diffs[str(tmp_path / "b.conf")]["before"] == "old\n" and diffs[str(tmp_path / "b.conf")]["after"] == "beta\n"
        assert diffs[str(tmp_path / "a.conf")]["before"] == ""
    for name in ("check_again", "apply_again"):
        assert results[name]["changed_paths"] == [] and results[name]["changed_tags"] == []
        assert "diff" not in results[name]
    assert leftovers(tmp_path) == []


def test_only_the_file_that_differs_is_written(tmp_path: Path) -> None:
    files = [entry(tmp_path / "a.conf", "alpha\n", tag="a"), entry(tmp_path / "b.conf", "beta\n", tag="b")]
    assert run_module_process("config_files", {"files": files})["changed"] is True
    untouched = (tmp_path / "a.conf").stat().st_ino
    (tmp_path / "b.conf").write_text("edited by hand\n")
    got = run_module_process("config_files", {"files": files}, diff=True)
    assert got["changed_paths"] == [str(tmp_path / "b.conf")] and got["changed_tags"] == ["b"], got
    assert got["files"][0]["changed"] is False and got["files"][1]["changes"] == ["content"]
    assert (tmp_path / "a.conf").stat().st_ino == untouched, "an unchanged file is not rewritten"
    assert (tmp_path / "b.conf").read_text() == "beta\n"


def test_a_mode_change_alone_keeps_the_inode_and_shows_in_the_diff(tmp_path: Path) -> None:
    target = tmp_path / "a.conf"
    target.write_text("alpha\n")
    target.chmod(0o666)
    inode = target.stat().st_ino
    check = run_module_process("config_files", {"files": [entry(target, "alpha\n", "0640")]}, check=True, diff=True)
    assert check["changed"] is True and check["files"][0]["changes"] == ["mode"] and mode_of(target) == 0o666
    assert "mode 0666" in check["diff"][0]["before"] and "mode 0640" in check["diff"][0]["after"]
    got = run_module_process("config_files", {"files": [entry(target, "alpha\n", "0640")]})
    assert got["changed"] is True and mode_of(target) == 0o640 and target.stat().st_ino == inode


def test_validation_runs_on_the_new_content_before_the_rename(tmp_path: Path) -> None:
    seen = tmp_path / "validated"
    # The validator records what it was given and accepts only content that says "good".
    validator = [sys.executable, "-c",
                 "import sys, shutil; shutil.copy(sys.argv[1], %r); sys.exit(0 if 'good' in open(sys.argv[1]).read() else 3)"
                 % str(seen), "%s"]
    target = tmp_path / "app.yml"
    target.write_text("good: old\n")
    got = run_module_process("config_files", {"files": [entry(target, "good: new\n", validate=validator)]})
    assert got["changed"] is True and target.read_text() == "good: new\n" and seen.read_text() == "good: new\n"

    first = tmp_path / "first.conf"
    bad = [entry(first, "written first\n", tag="first"), entry(target, "broken\n", validate=validator)]
    got = run_module_process("config_files", {"files": bad})
    assert got["failed"] is True, got
    assert "files[1]" in got["msg"] and str(target) in got["msg"] and "exited 3" in got["msg"], got["msg"]
    assert target.read_text() == "good: new\n", "a file that fails validation keeps its content"
    # The file before it was written: that is a change, and the result says so.
    assert got["changed"] is True and got["changed_paths"] == [str(first)] and got["changed_tags"] == ["first"]
    assert first.read_text() == "written first\n"
    assert leftovers(tmp_path) == []


def test_check_mode_does_not_validate_or_write(tmp_path: Path) -> None:
    target = tmp_path / "app.yml"
    validator = [sys.executable, "-c", "import sys; sys.exit(3)", "%s"]
    got = run_module_process("config_files", {"files": [entry(target, "x\n", validate=validator)]}, check=True)
    assert got["changed"] is True and not got["failed"] and not target.exists()


def test_check_mode_predicts_a_file_in_a_directory_an_earlier_task_makes(tmp_path: Path) -> None:
    target = tmp_path / "not-yet" / "app.conf"
    got = run_module_process("config_files", {"files": [entry(target, "x\n")]}, check=True)
    assert got["changed"] is True and got["changed_paths"] == [str(target)]
    assert "does not exist yet" in str(got.get("warnings")), got  # 2.19: warnings are structured
    real = run_module_process("config_files", {"files": [entry(target, "x\n")]})
    assert real["failed"] is True and "files[0].path" in real["msg"] and "create %s first" % target.parent in real["msg"]
    assert real["changed"] is False


def test_check_mode_predicts_an_owner_a_package_creates_later(tmp_path: Path) -> None:
    target = tmp_path / "app.conf"
    args = {"files": [entry(target, "x\n", owner="mlinfra-no-such-user")]}
    got = run_module_process("config_files", args, check=True)
    assert got["changed"] is True and "mlinfra-no-such-user" in str(got.get("warnings")), got
    real = run_module_process("config_files", args)
    assert real["failed"] is True and "files[0].owner" in real["msg"] and "mlinfra-no-such-user" in real["msg"]
    assert not target.exists()


@pytest.mark.parametrize("change, needle", [
    ({"mode": "644x"}, "files[1].mode"),
    ({"mode": "17777"}, "outside 0000-7777"),
    ({"path": "relative.conf"}, "not an absolute path"),
    ({"validate": ["promtool", "check", "config"]}, "exactly one element '%s'"),
    ({"path": "SAME"}, "is given twice"),
])
def test_bad_input_names_the_option_and_changes_nothing(tmp_path: Path, change: Dict[str, Any], needle: str) -> None:
    first = entry(tmp_path / "first.conf", "a\n")
    second = entry(tmp_path / "second.conf", "b\n")
    second.update(change)
    if second["path"] == "SAME":
        second["path"] = first["path"]
    got = run_module_process("config_files", {"files": [first, second]})
    assert got["failed"] is True and needle in got["msg"], got
    assert "Traceback" not in got["msg"] and got["changed"] is False
    assert not (tmp_path / "first.conf").exists(), "nothing is written when any entry is wrong"


def test_a_directory_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "app.conf").mkdir()
    got = run_module_process("config_files", {"files": [entry(tmp_path / "app.conf", "x\n")]})
    assert got["failed"] is True and "not a regular file" in got["msg"] and got["changed"] is False


def directory(path: Path, mode: str = "0750", **extra: Any) -> Dict[str, Any]:
    out = entry(path, "", mode, **extra)
    del out["content"]
    return out


def test_directories_then_files_four_ways(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "app"
    files = [entry(conf / "app.ini", "[app]\n", "0640", tag="app restart")]
    args = {"directories": [directory(tmp_path / "etc", "0755"), directory(conf, tag="app dirs")], "files": files}
    results = four_ways("config_files", args)
    assert mode_of(tmp_path / "etc") == 0o755 and mode_of(conf) == 0o750
    assert (conf / "app.ini").read_text() == "[app]\n"
    check = results["check"]
    # The file's directory comes from an earlier entry: predicted without a warning.
    assert "does not exist yet" not in str(check.get("warnings")), check
    assert check["changed_paths"] == [str(tmp_path / "etc"), str(conf), str(conf / "app.ini")]
    assert check["changed_tags"] == ["app dirs", "app restart"]
    assert [d["changes"] for d in check["directories"]] == [["created"], ["created"]]
    assert results["apply_again"]["directories"][1] == {"path": str(conf), "changed": False, "changes": [], "tag": "app dirs"}


def test_an_existing_directory_keeps_its_content_and_gets_its_mode(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    (state / "data.db").write_text("keep\n")
    got = run_module_process("config_files", {"directories": [directory(state)]}, diff=True)
    assert got["changed"] is True and got["directories"][0]["changes"] == ["mode"], got
    assert mode_of(state) == 0o750 and (state / "data.db").read_text() == "keep\n"
    assert "mode 0777" in got["diff"][0]["before"]


def test_a_file_where_a_directory_is_asked_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("x\n")
    got = run_module_process("config_files", {"directories": [directory(tmp_path / "state")]})
    assert got["failed"] is True and "directories[0].path" in got["msg"] and "not a directory" in got["msg"]
    assert got["changed"] is False


# -- modes as ansible.builtin.copy reads them ----------------------------------------------------
def test_an_unquoted_yaml_mode_is_read_as_copy_reads_it(tmp_path: Path) -> None:
    """`mode: 0644` unquoted reaches the module as the integer 420, which is 0o644."""
    target = tmp_path / "app.conf"
    args = {"files": [entry(target, "x\n", mode=420)], "directories": [directory(tmp_path / "d", mode=0o750)]}
    results = four_ways("config_files", args)
    assert mode_of(target) == 0o644 and mode_of(tmp_path / "d") == 0o750
    assert results["apply_again"]["changed"] is False
    target.chmod(0o420)  # what the module used to make of it: found and corrected
    again = run_module_process("config_files", args)
    assert again["changed"] is True and again["files"][0]["changes"] == ["mode"] and mode_of(target) == 0o644


def test_a_symbolic_mode_applies_to_the_current_bits(tmp_path: Path) -> None:
    target = tmp_path / "run.sh"
    target.write_text("x\n")
    target.chmod(0o600)
    args = {"files": [entry(target, "x\n", mode="u+x,g=r,o=")]}
    got = run_module_process("config_files", args)
    assert got["changed"] is True and mode_of(target) == 0o740, got
    assert run_module_process("config_files", args)["changed"] is False


@pytest.mark.parametrize("mode, needle", [
    (True, "is not a mode"),
    (0o17777, "outside 0000-7777"),
    ("u=rwz", "neither an octal number nor a symbolic mode"),
])
def test_a_mode_that_is_no_mode_is_refused(tmp_path: Path, mode: Any, needle: str) -> None:
    target = tmp_path / "app.conf"
    got = run_module_process("config_files", {"files": [entry(target, "x\n", mode=mode)]})
    assert got["failed"] is True and "files[0].mode" in got["msg"] and needle in got["msg"], got
    assert got["changed"] is False and not target.exists()


# -- the validate command: named when it cannot run, bounded when it hangs ------------------------
def test_a_validate_binary_that_does_not_exist_is_named(tmp_path: Path) -> None:
    first, target = tmp_path / "first.conf", tmp_path / "app.yml"
    files = [entry(first, "a\n"), entry(target, "x\n", validate=["/nonexistent/promtool", "check", "%s"])]
    got = run_module_process("config_files", {"files": files})
    assert got["failed"] is True and "Error executing command" not in got["msg"], got
    for needle in ("files[1].validate", str(target), "/nonexistent/promtool"):
        assert needle in got["msg"], got["msg"]
    assert not target.exists() and leftovers(tmp_path) == []
    assert got["changed"] is True and got["changed_paths"] == [str(first)]


def test_a_validate_command_that_hangs_is_killed_and_named(tmp_path: Path) -> None:
    target = tmp_path / "app.yml"
    hang = [sys.executable, "-c", "import time; time.sleep(120)", "%s"]
    got = run_module_process("config_files", {"files": [entry(target, "x\n", validate=hang)], "command_timeout": 1},
                             timeout=60)
    assert got["failed"] is True and "files[0].validate" in got["msg"] and "within 1 s" in got["msg"], got
    assert "command_timeout" in got["msg"] and not target.exists() and got["changed"] is False


# -- the runner on its service: what a write that fails half-way reports, and check mode -------------
class FakeModule(StandInModule):
    def __init__(self, params: Dict[str, Any], check_mode: bool = False) -> None:
        params = dict({"directories": [], "files": [], "command_timeout": 300}, **params)
        # The suboptions' defaults, as AnsibleModule fills them in.
        params["directories"] = [dict({"tag": None}, **d) for d in params["directories"]]
        params["files"] = [dict({"tag": None, "validate": None}, **f) for f in params["files"]]
        super().__init__(params, check_mode=check_mode)


class RefusingWrites(ConfigFilesService):
    """The host's service, except that writing ``refused`` fails as a full disk or a read-only
    mount would, and that in check mode no change may be attempted at all."""

    def __init__(self, refused: str = "", check_mode: bool = False) -> None:
        super().__init__(300)
        self.refused, self.check_mode = refused, check_mode

    def write_file(self, option: str, path: str, *args: Any) -> None:
        assert not self.check_mode, "check mode wrote %s" % path
        if path == self.refused:
            raise OSError(errno.EACCES, "Permission denied", path)
        super().write_file(option, path, *args)

    def make_directory(self, path: str, *args: Any) -> None:
        assert not self.check_mode, "check mode made %s" % path
        super().make_directory(path, *args)

    def set_metadata(self, path: str, *args: Any) -> None:
        assert not self.check_mode, "check mode changed %s" % path
        super().set_metadata(path, *args)


def test_a_write_that_fails_half_way_names_the_paths_written_before_it(tmp_path: Path) -> None:
    first, second = tmp_path / "first.conf", tmp_path / "second.conf"
    module = FakeModule({"files": [entry(first, "1\n", tag="one"), entry(second, "2\n", tag="two")]})
    with pytest.raises(KvmError) as failed:
        ConfigFilesRunner(module, RefusingWrites(refused=str(second))).run()
    err = failed.value
    assert err.msg == ("files[1]: %s: cannot write it: Permission denied. Paths before it were changed (changed_paths)"
                       % second)
    # The module's documented words for a partial change, not the base runner's actions.
    assert err.details == {"path": str(second), "changed": True, "changed_paths": [str(first)], "changed_tags": ["one"]}
    assert first.read_text() == "1\n" and not second.exists() and leftovers(tmp_path) == []


def test_a_first_write_that_fails_says_nothing_was_changed(tmp_path: Path) -> None:
    target = tmp_path / "first.conf"
    module = FakeModule({"files": [entry(target, "1\n", tag="one")]})
    with pytest.raises(KvmError) as failed:
        ConfigFilesRunner(module, RefusingWrites(refused=str(target))).run()
    assert failed.value.msg == "files[0]: %s: cannot write it: Permission denied. Nothing was changed" % target
    assert failed.value.details == {"path": str(target), "changed": False, "changed_paths": [], "changed_tags": []}


def test_check_mode_asks_the_service_for_no_change(tmp_path: Path) -> None:
    (tmp_path / "meta.conf").write_text("same\n")
    (tmp_path / "meta.conf").chmod(0o600)
    files = [entry(tmp_path / "new" / "a.conf", "a\n"), entry(tmp_path / "meta.conf", "same\n")]
    module = FakeModule({"directories": [directory(tmp_path / "new")], "files": files}, check_mode=True)
    got = ConfigFilesRunner(module, RefusingWrites(check_mode=True)).run()
    assert got["changed"] is True and [f["changes"] for f in got["files"]] == [["content", "mode", "owner", "group"], ["mode"]]
    assert got["changed_paths"] == [str(tmp_path / "new"), str(tmp_path / "new" / "a.conf"), str(tmp_path / "meta.conf")]
    assert module.warnings == [] and not (tmp_path / "new").exists() and mode_of(tmp_path / "meta.conf") == 0o600
