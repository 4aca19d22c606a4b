# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""config_files' runner and service: directories and whole files made to hold what the request
says (content, mode, owner, group), each new content checked by its validate command before it
replaces the old one.

The service (:class:`ConfigFilesService`) is the only code that touches the host: user and group
look-ups, lstat, reads, the umask, writes and the validate command. The runner reads every path
before it writes any, so bad input or an unreadable path fails with nothing changed; then it
changes only the paths that differ, directories first, each through ``tracker.act`` (check mode
writes and validates nothing). A write that fails says which paths were changed before it
(``changed_paths``, ``changed_tags``), the module's documented words for a partial change.

It lives in ``_core``: it knows nothing of a particular host file (sysfs, grub, /etc/default), it
writes whatever paths it is given, like ``_atomic_file`` under it, and every layer may import
``_core``.
"""
from __future__ import annotations

import functools
import grp
import os
import pwd
import stat
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from ansible.module_utils.basic import AnsibleModule

from ._atomic_file import write_bytes_atomic
from ._command import CommandNotFoundError, CommandTimeoutError, run_bounded
from ._errors import InvalidInputError, KvmError, ValidationFailedError
from ._runner import ObjectRunner

DIRECTORY_SPEC = dict(
    path=dict(type="path", required=True),
    mode=dict(type="raw", required=True),
    owner=dict(type="str", default="root"),
    group=dict(type="str", default="root"),
    tag=dict(type="str"),
)
# A file is a directory entry plus its content and an optional check.
FILE_SPEC = dict(DIRECTORY_SPEC, content=dict(type="str", required=True), validate=dict(type="list", elements="str"))

# What a file or directory created without an explicit mode gets: the base a symbolic mode
# applies to for a path that does not exist yet (as ansible.builtin.copy sees a new file).
NEW_FILE_BASE = 0o666
NEW_DIR_BASE = 0o777


def config_files_spec() -> Dict[str, Any]:
    return dict(directories=dict(type="list", elements="dict", default=[], options=DIRECTORY_SPEC),
                files=dict(type="list", elements="dict", default=[], options=FILE_SPEC),
                command_timeout=dict(type="int", default=300))


class _StatLike:
    """The one field AnsibleModule._symbolic_mode_to_octal reads."""

    def __init__(self, st_mode: int) -> None:
        self.st_mode = st_mode


def parse_mode(option: str, value: Any) -> Union[int, str]:
    """The mode as ansible.builtin.copy reads it (AnsibleModule.set_mode_if_different): an
    integer is the value of the bits itself (YAML reads an unquoted 0644 as 420, which is
    0o644), a string is octal digits or else a symbolic mode. Returns the bits, or the checked
    symbolic string, which :meth:`ConfigFilesRunner.wanted_mode` applies to the path's current mode."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidInputError(option, value, "is not a mode", 'give octal digits as a string, for example "0644"')
    if isinstance(value, int):
        mode: Union[int, str] = value
    else:
        try:
            mode = int(value, 8)
        except ValueError:
            try:
                AnsibleModule._symbolic_mode_to_octal(_StatLike(0), value)
            except Exception:  # pylint: disable=broad-except  # ansible raises ValueError or others
                raise InvalidInputError(option, value, "is neither an octal number nor a symbolic mode",
                                        'quote it as a string of octal digits, for example "0644", or give a '
                                        'symbolic mode such as "u=rw,g=r,o="')
            return value
    if not 0 <= mode <= 0o7777:
        raise InvalidInputError(option, value, "is outside 0000-7777",
                                'give permission bits only, for example "0640" (an unquoted number is read as '
                                'YAML reads it: 0644 is 420; quote the mode to avoid surprises)')
    return mode


def apply_symbolic_mode(mode: str, current: int) -> int:
    """The bits a symbolic mode (``u+x,g=r,o=``) makes of ``current``."""
    return stat.S_IMODE(AnsibleModule._symbolic_mode_to_octal(_StatLike(current), mode))


def check_request(directories: List[Dict[str, Any]], files: List[Dict[str, Any]]) -> List[Tuple[str, int, Dict[str, Any], Union[int, str]]]:
    """Everything that is wrong on its face, before any path is read or written. Returns
    (kind, index, entry, mode) for the directories, then the files, in the order given."""
    request, seen = [], set()
    for kind, entries in (("directories", directories), ("files", files)):
        for index, entry in enumerate(entries):
            path = entry["path"]
            if not os.path.isabs(path):
                raise InvalidInputError("%s[%d].path" % (kind, index), path, "is not an absolute path", "give the full path from /")
            if os.path.normpath(path) in seen:
                raise InvalidInputError("%s[%d].path" % (kind, index), path, "is given twice", "give each path once")
            seen.add(os.path.normpath(path))
            validate = entry.get("validate")
            if validate is not None and validate.count("%s") != 1:
                raise InvalidInputError("%s[%d].validate" % (kind, index), validate, "needs exactly one element '%s' (the new file's path)",
                                        "write the command as an argv list, for example [promtool, check, config, '%s']")
            request.append((kind, index, entry, parse_mode("%s[%d].mode" % (kind, index), entry["mode"])))
    return request


class Target:
    """What one path (a directory or a whole file) holds now, as the service read it, and what
    must change. No I/O: the runner fills in what it read."""

    def __init__(self, kind: str, index: int, entry: Dict[str, Any]) -> None:
        self.kind, self.index, self.entry = kind, index, entry
        self.option = "%s[%d]" % (kind, index)
        self.is_dir = kind == "directories"
        self.path: str = os.path.normpath(entry["path"])
        self.data: Optional[bytes] = None if self.is_dir else entry["content"].encode("utf-8")
        self.warnings: List[str] = []
        self.uid: Optional[int] = None
        self.gid: Optional[int] = None
        self.before: Optional[bytes] = None
        self.before_stat: Optional[os.stat_result] = None
        self.mode = 0
        self.changes: List[str] = []

    def compare(self) -> List[str]:
        current = self.before_stat
        if current is None:
            return ["created"] if self.is_dir else ["content", "mode", "owner", "group"]
        changes = []
        if not self.is_dir and self.before != self.data:
            changes.append("content")
        if stat.S_IMODE(current.st_mode) != self.mode:
            changes.append("mode")
        if self.uid is None or current.st_uid != self.uid:
            changes.append("owner")
        if self.gid is None or current.st_gid != self.gid:
            changes.append("group")
        return changes

    def diff(self) -> Dict[str, Any]:
        after_meta = "mode %04o owner %s group %s\n" % (self.mode, self.entry["owner"], self.entry["group"])
        if "content" in self.changes:
            return {"before_header": self.path if self.before is not None else "%s (absent)" % self.path,
                    "after_header": self.path,
                    "before": (self.before or b"").decode("utf-8", "replace"),
                    "after": self.entry["content"]}
        current = self.before_stat
        if current is None:  # a new directory
            return {"before_header": "%s (absent)" % self.path, "after_header": self.path + "/",
                    "before": "", "after": "directory " + after_meta}
        return {"before_header": self.path, "after_header": self.path,
                "before": "mode %04o owner %d group %d\n" % (stat.S_IMODE(current.st_mode), current.st_uid, current.st_gid),
                "after": after_meta}


class ConfigFilesService:
    """The only code that touches the host: look-ups, reads, writes and the validate command."""

    def __init__(self, command_timeout: int) -> None:
        self.command_timeout = command_timeout

    @staticmethod
    def uid_of(name: str) -> int:
        """Raises KeyError for an unknown user, ValueError for a name with a NUL byte."""
        return pwd.getpwnam(name)[2]

    @staticmethod
    def gid_of(name: str) -> int:
        return grp.getgrnam(name)[2]

    @staticmethod
    def lstat(path: str) -> Optional[os.stat_result]:
        try:
            return os.lstat(path)
        except FileNotFoundError:
            return None

    @staticmethod
    def read_bytes(path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    @staticmethod
    def is_dir(path: str) -> bool:
        return os.path.isdir(path)

    @staticmethod
    def umask() -> int:
        # The only way to read the umask is to set it: put it straight back.
        umask = os.umask(0)
        os.umask(umask)
        return umask

    def make_directory(self, path: str, uid: int, gid: int, mode: int) -> None:
        os.mkdir(path, 0o700)  # no wider than 0700 until its owner and mode are set
        self.set_metadata(path, uid, gid, mode)

    @staticmethod
    def set_metadata(path: str, uid: int, gid: int, mode: int) -> None:
        """Owner, group and mode of the inode in place: no rename, no validation."""
        os.chown(path, uid, gid)
        os.chmod(path, mode)

    def write_file(self, option: str, path: str, data: bytes, mode: int, owner: Tuple[int, int],
                   validate: Optional[List[str]]) -> None:
        """Replace ``path`` through a temporary file that ``validate`` must accept first."""
        check = functools.partial(self.validate, option, path, validate) if validate else None
        write_bytes_atomic(path, data, mode=mode, owner=owner, check=check)

    def validate(self, entry_option: str, path: str, command: List[str], tmp: str) -> None:
        """Run the validate ``command`` on ``tmp`` (the new content of ``path``); raises
        ValidationFailedError when it refuses the content or cannot run."""
        argv = [tmp if arg == "%s" else arg for arg in command]
        option = entry_option + ".validate"
        try:
            rc, out, err = run_bounded(argv, timeout_s=self.command_timeout)
        except CommandNotFoundError as exc:
            raise ValidationFailedError(
                "%s: the command for %s cannot be run: %s: %s. The file was left as it was; install %s on the "
                "host or correct %s" % (option, path, argv[0], exc.msg.rsplit(": ", 1)[-1], argv[0], option),
                path=path, option=option, command=argv)
        except CommandTimeoutError as exc:
            raise ValidationFailedError(
                "%s: the command for %s did not finish within %s s (%s) and was killed; the file was left as it "
                "was. Fix the command or raise command_timeout"
                % (option, path, self.command_timeout, " ".join(argv)),
                path=path, option=option, command=argv, timeout_s=exc.details.get("timeout_s"))
        if rc != 0:
            raise ValidationFailedError(
                "%s: %s: the new content failed validation (%s exited %d); the file was left as it was. "
                "Fix the content (its template or variables) and run again: %s"
                % (entry_option, path, argv[0], rc, (err or out).strip()[-2000:]),
                path=path, rc=rc, stdout=out, stderr=err)


class ConfigFilesRunner(ObjectRunner):
    """Read every target, then change only those that differ: the directories first, then the
    files, each list in the order given."""

    def __init__(self, module: Any, service: ConfigFilesService) -> None:
        super().__init__(module, service)
        self.request: List[Tuple[str, int, Dict[str, Any], Union[int, str]]] = []
        self.done: List[Target] = []  # changed (or, in check mode, to be changed), in order

    def validate(self) -> None:
        if self.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.params["command_timeout"], "is below 1",
                                    "give the seconds a validate command may run, for example 300")
        self.request = check_request(self.params["directories"], self.params["files"])

    def converge(self) -> Dict[str, Any]:
        predicted: Set[str] = set()
        targets: List[Target] = []
        for kind, index, entry, mode in self.request:
            target = self.read(kind, index, entry, mode, predicted)
            if target.is_dir:
                predicted.add(target.path)
            targets.append(target)
        for target in targets:
            for warning in target.warnings:
                self.module.warn(warning)
        for target in targets:
            if target.changes:
                self.apply(target)
                self.done.append(target)
        result = self.report()
        for kind in ("directories", "files"):
            result[kind] = [{"path": t.path, "changed": bool(t.changes), "changes": t.changes, "tag": t.entry["tag"]}
                            for t in targets if t.kind == kind]
        result["changed"] = bool(self.done)
        if self.module._diff and self.done:
            result["diff"] = [t.diff() for t in self.done]
        return result

    # -- reading ------------------------------------------------------------------------------
    def read(self, kind: str, index: int, entry: Dict[str, Any], mode: Union[int, str], predicted: Set[str]) -> Target:
        try:
            return self.read_target(Target(kind, index, entry), mode, predicted)
        except OSError as exc:
            raise KvmError("%s[%d]: %s: cannot read it: %s. Nothing was changed; run the task with become"
                           % (kind, index, entry["path"], exc.strerror or exc), path=entry["path"])

    def read_target(self, target: Target, mode: Union[int, str], predicted_dirs: Set[str]) -> Target:
        """What ``target`` holds now (through the service) and what must change."""
        target.uid = self.lookup(target, "owner", self.service.uid_of)
        target.gid = self.lookup(target, "group", self.service.gid_of)
        target.before_stat = self.service.lstat(target.path)
        if target.before_stat is not None:
            wanted, what = (stat.S_ISDIR, "a directory") if target.is_dir else (stat.S_ISREG, "a regular file")
            if not wanted(target.before_stat.st_mode):
                raise InvalidInputError(target.option + ".path", target.path, "exists and is not %s" % what,
                                        "remove it or give another path")
            if not target.is_dir:
                target.before = self.service.read_bytes(target.path)
        else:
            parent = os.path.dirname(target.path)
            if parent not in predicted_dirs and not self.service.is_dir(parent):
                if not self.check:
                    raise InvalidInputError(target.option + ".path", target.path, "is in a directory that does not exist",
                                            "create %s first (this module's directories, or ansible.builtin.file)" % parent)
                target.warnings.append("%s: its directory does not exist yet; predicted as created by an earlier task" % target.path)
        current = None if target.before_stat is None else stat.S_IMODE(target.before_stat.st_mode)
        target.mode = self.wanted_mode(mode, current, target.is_dir)
        target.changes = target.compare()
        return target

    def lookup(self, target: Target, what: str, getter: Callable[[str], int]) -> Optional[int]:
        name = target.entry[what]
        try:
            return getter(name)
        except ValueError:  # a NUL byte: no user or group can carry it
            raise InvalidInputError("%s.%s" % (target.option, what), name, "holds a NUL byte",
                                    "give a user or group name without control characters") from None
        except KeyError:
            if self.check:
                # An earlier task of the same run (a package's postinst) may create it.
                target.warnings.append("%s.%s: %r does not exist here yet; predicted as created by an earlier task"
                                       % (target.option, what, name))
                return None
            raise InvalidInputError("%s.%s" % (target.option, what), name, "does not exist on this host",
                                    "create it first or give an existing %s" % ("user" if what == "owner" else "group"))

    def wanted_mode(self, mode: Union[int, str], current: Optional[int], is_dir: bool) -> int:
        """The bits a parsed mode asks for: a symbolic mode applies to the current bits, or to
        what a new file or directory gets from the umask."""
        if isinstance(mode, int):
            return mode
        if current is None:
            current = (NEW_DIR_BASE if is_dir else NEW_FILE_BASE) & ~self.service.umask()
        return apply_symbolic_mode(mode, current)

    # -- changing -----------------------------------------------------------------------------
    def apply(self, target: Target) -> None:
        if not self.check and (target.uid is None or target.gid is None):  # only check mode leaves them unresolved
            raise KvmError("%s: %s: owner or group unresolved outside check mode (a bug)" % (target.option, target.path))
        try:
            if target.is_dir and "created" in target.changes:
                self.tracker.act("create directory %s" % target.path, self.service.make_directory,
                                 target.path, target.uid, target.gid, target.mode)
            elif target.is_dir or "content" not in target.changes:
                # Same content (or a directory): the inode's metadata in place, no rename, no validation.
                self.tracker.act("set mode, owner and group of %s" % target.path, self.service.set_metadata,
                                 target.path, target.uid, target.gid, target.mode)
            else:
                self.tracker.act("write %s" % target.path, self.service.write_file, target.option, target.path,
                                 target.data or b"", target.mode, (target.uid, target.gid), target.entry["validate"])
        except OSError as exc:
            raise KvmError("%s: %s: cannot write it: %s. %s"
                           % (target.option, target.path, exc.strerror or exc,
                              "Paths before it were changed (changed_paths)" if self.done else "Nothing was changed"),
                           path=target.path)

    # -- the report ---------------------------------------------------------------------------
    def report(self) -> Dict[str, Any]:
        return {"changed_paths": [t.path for t in self.done],
                "changed_tags": sorted({t.entry["tag"] for t in self.done if t.entry["tag"]})}

    def report_partial(self, err: KvmError) -> None:
        """A write that failed says what this run had changed before it in config_files' own
        words, the paths and tags of its documented result, rather than the base's actions."""
        if self.tracker.failed_action is None:
            return  # failed before any write: the error stands as it is
        err.details.update(self.report(), changed=bool(self.done))


def run_config_files(module: Any) -> Dict[str, Any]:
    return ConfigFilesRunner(module, ConfigFilesService(module.params["command_timeout"])).run()
