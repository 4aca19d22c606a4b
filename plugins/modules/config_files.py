#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: config_files
short_description: Directories and whole files (content, mode, owner, group) in one module run, each file checked before it replaces the old one
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
version_added: "0.3.0"
description:
  - Makes each directory of I(directories) exist with I(mode), I(owner) and I(group), then each file
    of I(files) hold exactly I(content) with its I(mode), I(owner) and I(group). A path whose content,
    mode, owner and group already match is left alone, untouched.
  - A new content goes to a temporary file beside the target. It gets its owner, group and mode
    there, then I(validate) runs on it, and only a file that passes is renamed over the target. A
    reader sees the old file or the new one, never half of one. A file that fails validation changes
    nothing, and the module fails naming it, after it has written the files before it
    (reported in C(changed_paths)).
  - One module run for many files, because each C(template) or C(copy) task that finds nothing to do
    still starts Python on the host twice (stat, then file). On a software-emulated guest that is
    8-9 seconds per file; a role's ten configuration files cost a minute and a half per play.
  - Renders nothing itself. Give the content from the controller, for example
    C(lookup('ansible.builtin.template', 'x.j2')) or C(lookup('ansible.builtin.file', 'x', rstrip=false)).
  - Handlers are notified per task, not per file. Give each file a I(tag) (for example the handler
    topic its change needs); C(changed_tags) says which tags had a change, for handlers' C(when).
options:
  directories:
    description:
      - Directories to create or correct first, in the order given (a parent before its children). An
        existing directory keeps its content; only its mode, owner and group are set.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path. Its parent must exist, or be an earlier entry.
        type: path
        required: true
      mode:
        description:
          - Permission bits, read as M(ansible.builtin.copy) reads its C(mode). Either a quoted string of
            octal digits (C("0750")), a symbolic mode (C("u=rwx,g=rx,o=")), or an unquoted YAML
            number, which YAML reads as an integer (C(0750) is 488, that is 0o750).
          - A symbolic mode applies to the directory's current mode (to 0777 less the umask for a new one).
        type: raw
        required: true
      owner:
        description: User name that owns the directory.
        type: str
        default: root
      group:
        description: Group name of the directory.
        type: str
        default: root
      tag:
        description: A label returned in C(changed_tags) when this directory is created or corrected.
        type: str
  files:
    description: The files, written after the directories.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file. Its directory must exist or be in I(directories) (in check mode, it may be predicted by an earlier task).
        type: path
        required: true
      content:
        description: The whole content (text, written as UTF-8).
        type: str
        required: true
      mode:
        description:
          - Permission bits, read as M(ansible.builtin.copy) reads its C(mode). Either a quoted string of
            octal digits (C("0644")), a symbolic mode (C("u=rw,g=r,o=")), or an unquoted YAML
            number, which YAML reads as an integer (C(0644) is 420, that is 0o644).
          - A symbolic mode applies to the file's current mode (to 0666 less the umask for a new one).
        type: raw
        required: true
      owner:
        description: User name that owns the file.
        type: str
        default: root
      group:
        description: Group name of the file.
        type: str
        default: root
      validate:
        description:
          - Command (an argv list, no shell) run on the new content before it replaces the file;
            one element must be C(%s), the temporary file's path. A non-zero exit fails the task
            and leaves the file as it was, and so does a command that does not exist or runs past
            I(command_timeout).
          - Skipped in check mode, like M(ansible.builtin.template)'s C(validate).
        type: list
        elements: str
      tag:
        description: A label returned in C(changed_tags) when this file changes (handler topics, service names).
        type: str
  command_timeout:
    description:
      - Seconds each I(validate) command may run. One that runs longer is killed (with its child
        processes) and the task fails naming it; the file is left as it was.
    type: int
    default: 300
notes:
  - Supports check mode and diff mode (one diff per changed file).
  - The content is a module argument, so set C(no_log) on a task that writes a secret.
seealso:
  - module: ansible.builtin.template
  - module: ansible.builtin.copy
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Prometheus configuration in one module run
  mlinfra.kvm.config_files:
    files:
      - path: /etc/prometheus/prometheus.yml
        content: "{{ lookup('ansible.builtin.template', 'prometheus.yml.j2') }}"
        mode: "0644"
        validate: [promtool, check, config, --syntax-only, "%s"]
        tag: prometheus reload
      - path: /etc/default/prometheus
        content: "{{ lookup('ansible.builtin.template', 'prometheus.default.j2') }}"
        mode: "0644"
        tag: prometheus restart
  register: prometheus_files
  notify: [prometheus reload, prometheus restart]

# In the handlers: act only for the files that changed.
- name: Restart Prometheus
  ansible.builtin.service:
    name: prometheus
    state: restarted
  listen: prometheus restart
  when: "'prometheus restart' in prometheus_files.changed_tags"
'''

RETURN = r'''
directories:
  description: One entry per directory, in the order given (C(changes) is C([created]) for a new one).
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/mlflow, changed: true, changes: [created], tag: null}]
files:
  description: One entry per file, in the order given.
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/default/prometheus, changed: true, changes: [content], tag: prometheus restart}]
changed_paths:
  description: Paths that changed (in check mode, that would change), directories first.
  returned: always
  type: list
  elements: str
changed_tags:
  description: The tags of the files that changed, each once, sorted.
  returned: always
  type: list
  elements: str
'''

import grp
import os
import pwd
import stat
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._atomic_file import write_bytes_atomic
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._command import (
    CommandNotFoundError, CommandTimeoutError, run_bounded)
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run

DIRECTORY_SPEC = dict(
    path=dict(type="path", required=True),
    mode=dict(type="raw", required=True),
    owner=dict(type="str", default="root"),
    group=dict(type="str", default="root"),
    tag=dict(type="str"),
)
# A file is a directory entry plus its content and an optional check.
FILE_SPEC = dict(DIRECTORY_SPEC, content=dict(type="str", required=True), validate=dict(type="list", elements="str"))


class ValidationFailedError(KvmError):
    """A file's validate command refused its new content; the file was left as it was."""


# What a file or directory created without an explicit mode gets: the base a symbolic mode
# applies to for a path that does not exist yet (as ansible.builtin.copy sees a new file).
NEW_FILE_BASE = 0o666
NEW_DIR_BASE = 0o777


class _StatLike:
    """The one field AnsibleModule._symbolic_mode_to_octal reads."""

    def __init__(self, st_mode: int) -> None:
        self.st_mode = st_mode


def parse_mode(option: str, value: Any) -> Union[int, str]:
    """The mode as ansible.builtin.copy reads it (AnsibleModule.set_mode_if_different): an
    integer is the value of the bits itself (YAML reads an unquoted 0644 as 420, which is
    0o644), a string is octal digits or else a symbolic mode. Returns the bits, or the checked
    symbolic string, which :func:`resolve_mode` applies to the path's current mode."""
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


def resolve_mode(mode: Union[int, str], current: Optional[int], is_dir: bool) -> int:
    """The bits a parsed mode asks for: a symbolic mode applies to the current bits, or to
    what a new file or directory gets from the umask."""
    if isinstance(mode, int):
        return mode
    if current is None:
        umask = os.umask(0)
        os.umask(umask)
        current = (NEW_DIR_BASE if is_dir else NEW_FILE_BASE) & ~umask
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
    """What one path (a directory or a whole file) holds now, and what must change."""

    def __init__(self, kind: str, index: int, entry: Dict[str, Any], mode: Union[int, str], check_mode: bool,
                 predicted_dirs: Set[str]) -> None:
        self.kind, self.index, self.entry = kind, index, entry
        self.option = "%s[%d]" % (kind, index)
        self.is_dir = kind == "directories"
        self.path: str = os.path.normpath(entry["path"])
        self.data: Optional[bytes] = None if self.is_dir else entry["content"].encode("utf-8")
        self.warnings: List[str] = []
        self.uid = self._lookup("owner", entry["owner"], pwd.getpwnam, check_mode)
        self.gid = self._lookup("group", entry["group"], grp.getgrnam, check_mode)
        self.before: Optional[bytes] = None
        self.before_stat: Optional[os.stat_result] = None
        try:
            self.before_stat = os.lstat(self.path)
        except FileNotFoundError:
            pass
        if self.before_stat is not None:
            wanted, what = (stat.S_ISDIR, "a directory") if self.is_dir else (stat.S_ISREG, "a regular file")
            if not wanted(self.before_stat.st_mode):
                raise InvalidInputError(self.option + ".path", self.path, "exists and is not %s" % what,
                                        "remove it or give another path")
            if not self.is_dir:
                with open(self.path, "rb") as handle:
                    self.before = handle.read()
        else:
            parent = os.path.dirname(self.path)
            if parent not in predicted_dirs and not os.path.isdir(parent):
                if not check_mode:
                    raise InvalidInputError(self.option + ".path", self.path, "is in a directory that does not exist",
                                            "create %s first (this module's directories, or ansible.builtin.file)" % parent)
                self.warnings.append("%s: its directory does not exist yet; predicted as created by an earlier task" % self.path)
        self.mode = resolve_mode(mode, None if self.before_stat is None else stat.S_IMODE(self.before_stat.st_mode),
                                 self.is_dir)
        self.changes = self._changes()

    def _lookup(self, what: str, name: str, getter: Any, check_mode: bool) -> Optional[int]:
        try:
            return getter(name)[2]
        except ValueError:  # a NUL byte: no user or group can carry it
            raise InvalidInputError("%s.%s" % (self.option, what), name, "holds a NUL byte",
                                    "give a user or group name without control characters") from None
        except KeyError:
            if check_mode:
                # An earlier task of the same run (a package's postinst) may create it.
                self.warnings.append("%s.%s: %r does not exist here yet; predicted as created by an earlier task"
                                     % (self.option, what, name))
                return None
            raise InvalidInputError("%s.%s" % (self.option, what), name, "does not exist on this host",
                                    "create it first or give an existing %s" % ("user" if what == "owner" else "group"))

    def _changes(self) -> List[str]:
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


class ConfigFilesRunner:
    """Read every target, then change only those that differ: the directories first, then the
    files, each list in the order given."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check_mode = module.check_mode

    def __call__(self) -> Dict[str, Any]:
        if self.module.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.module.params["command_timeout"], "is below 1",
                                    "give the seconds a validate command may run, for example 300")
        predicted: Set[str] = set()
        targets: List[Target] = []
        for kind, index, entry, mode in check_request(self.module.params["directories"], self.module.params["files"]):
            target = self._read(kind, index, entry, mode, predicted)
            if target.is_dir:
                predicted.add(target.path)
            targets.append(target)
        for target in targets:
            for warning in target.warnings:
                self.module.warn(warning)
        done: List[Target] = []
        for target in targets:
            if target.changes and not self.check_mode:
                try:
                    self._apply(target)
                except ValidationFailedError as err:
                    err.details.update(self._report(done), changed=bool(done))
                    raise
                except OSError as exc:
                    raise KvmError("%s: %s: cannot write it: %s. %s"
                                   % (target.option, target.path, exc.strerror or exc,
                                      "Paths before it were changed (changed_paths)" if done else "Nothing was changed"),
                                   path=target.path, changed=bool(done), **self._report(done))
            if target.changes:
                done.append(target)
        result = self._report(done)
        for kind in ("directories", "files"):
            result[kind] = [{"path": t.path, "changed": bool(t.changes), "changes": t.changes, "tag": t.entry["tag"]}
                            for t in targets if t.kind == kind]
        result["changed"] = bool(done)
        if self.module._diff and done:
            result["diff"] = [t.diff() for t in done]
        return result

    def _read(self, kind: str, index: int, entry: Dict[str, Any], mode: Union[int, str], predicted: Set[str]) -> Target:
        try:
            return Target(kind, index, entry, mode, self.check_mode, predicted)
        except OSError as exc:
            raise KvmError("%s[%d]: %s: cannot read it: %s. Nothing was changed; run the task with become"
                           % (kind, index, entry["path"], exc.strerror or exc), path=entry["path"])

    @staticmethod
    def _report(done: List[Target]) -> Dict[str, Any]:
        return {"changed_paths": [t.path for t in done],
                "changed_tags": sorted({t.entry["tag"] for t in done if t.entry["tag"]})}

    def _apply(self, target: Target) -> None:
        if target.uid is None or target.gid is None:  # only check mode leaves them unresolved
            raise KvmError("%s: %s: owner or group unresolved outside check mode (a bug)" % (target.option, target.path))
        if target.is_dir and "created" in target.changes:
            os.mkdir(target.path, 0o700)  # no wider than 0700 until its owner and mode are set
        if target.is_dir or "content" not in target.changes:
            # Same content (or a directory): the inode's metadata in place, no rename, no validation.
            os.chown(target.path, target.uid, target.gid)
            os.chmod(target.path, target.mode)
            return
        write_bytes_atomic(target.path, target.data or b"", mode=target.mode, owner=(target.uid, target.gid),
                           check=lambda tmp: self._validate(target, tmp))

    def _validate(self, target: Target, tmp: str) -> None:
        argv = target.entry["validate"]
        if not argv:
            return
        argv = [tmp if arg == "%s" else arg for arg in argv]
        option = target.option + ".validate"
        try:
            rc, out, err = run_bounded(argv, timeout_s=self.module.params["command_timeout"])
        except CommandNotFoundError as exc:
            raise ValidationFailedError(
                "%s: the command for %s cannot be run: %s: %s. The file was left as it was; install %s on the "
                "host or correct %s" % (option, target.path, argv[0], exc.msg.rsplit(": ", 1)[-1], argv[0], option),
                path=target.path, option=option, command=argv)
        except CommandTimeoutError as exc:
            raise ValidationFailedError(
                "%s: the command for %s did not finish within %s s (%s) and was killed; the file was left as it "
                "was. Fix the command or raise command_timeout"
                % (option, target.path, self.module.params["command_timeout"], " ".join(argv)),
                path=target.path, option=option, command=argv, timeout_s=exc.details.get("timeout_s"))
        if rc != 0:
            raise ValidationFailedError(
                "%s: %s: the new content failed validation (%s exited %d); the file was left as it was. "
                "Fix the content (its template or variables) and run again: %s"
                % (target.option, target.path, argv[0], rc, (err or out).strip()[-2000:]),
                path=target.path, rc=rc, stdout=out, stderr=err)


def main() -> None:
    module = new_module(
        AnsibleModule,
        argument_spec=dict(directories=dict(type="list", elements="dict", default=[], options=DIRECTORY_SPEC),
                           files=dict(type="list", elements="dict", default=[], options=FILE_SPEC),
                           command_timeout=dict(type="int", default=300)),
        supports_check_mode=True,
    )
    run(module, ConfigFilesRunner(module))


if __name__ == "__main__":
    main()
