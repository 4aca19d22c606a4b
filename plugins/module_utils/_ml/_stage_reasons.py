# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's up-to-date judgement: the stage's key, and why it runs again (every difference
between its lock and the inputs now), in the words the task's result and summary use.

It only reads (the lock's manifest, the trees it names), so check mode and a real run judge
alike.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any, Callable, Dict, List, Optional

from ._stage_hash import Hasher, IgnoreMatcher
from ._stage_lock import canonical_json
from ._stage_spec import StageSpec, flatten


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dict_reasons(what: str, old: Dict[str, Any], new: Dict[str, Any],
                  show: Callable[[Any], str] = _short) -> List[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out.append("%s %s added (%s)" % (what, key, show(new[key])))
        elif key not in new:
            out.append("%s %s removed (was %s)" % (what, key, show(old[key])))
        elif old[key] != new[key]:
            out.append("%s %s %s -> %s" % (what, key, show(old[key]), show(new[key])))
    return out


def _tree_change(old: Dict[str, str], new: Dict[str, str]) -> str:
    modified = sorted(k for k in new if k in old and old[k] != new[k])
    added = sorted(k for k in new if k not in old)
    removed = sorted(k for k in old if k not in new)
    parts = []
    for count, label in ((modified, "modified"), (added, "added"), (removed, "removed")):
        if count:
            parts.append("%d %s" % (len(count), label))
    examples = (modified + added + removed)[:3]
    more = len(modified) + len(added) + len(removed) - len(examples)
    text = ", ".join(parts) or "changed"
    if examples:
        text += " (%s%s)" % (", ".join(examples), ", ..." if more > 0 else "")
    return text


def _shown(path: str, kind: str) -> str:
    """Directories are shown with a trailing slash, as people write them."""
    return path + "/" if kind == "dir" and not path.endswith("/") else path


class RunReasons:
    """Why a stage runs again: every difference between its lock and the inputs now, in a fixed
    order (what the task asks for, then what the stage reads, then its outputs as they are)."""

    def __init__(self, files: Any, spec: StageSpec, lock: Dict[str, Any], inputs: Dict[str, Any],
                 hasher: Hasher) -> None:
        self.files, self.spec, self.lock, self.inputs, self.hasher = files, spec, lock, inputs, hasher
        self.old = lock["inputs"]
        self.same_algo = self.old.get("algorithm") == inputs["algorithm"]
        self.reasons: List[str] = []
        self._manifest: Optional[Dict[str, Any]] = None

    def find(self, reasons: List[str], git_info: Dict[str, Any], outs: Dict[str, Any]) -> List[str]:
        self.reasons = reasons
        self.settings()
        self.compare("deps", "dep", self.old.get("deps") or {}, self.inputs["deps"],
                     {d.path: IgnoreMatcher(d.ignore) for d in self.spec.deps})
        self.declared_outs()
        old_code, new_code = self.old.get("code") or {}, self.inputs["code"]
        self.compare("code", "code", old_code.get("paths") or {}, new_code.get("paths") or {},
                     {p: IgnoreMatcher(self.spec.ignore) for p in self.spec.code_paths})
        self.git(old_code.get("git"), new_code.get("git"), git_info)
        self.python(old_code.get("python"), new_code.get("python"))
        self.outs_now(outs)
        if not self.reasons and self.lock.get("key") != stage_key(self.inputs):
            self.reasons.append("cache key changed (lock written by another version of ml_stage)")
        return self.reasons

    def settings(self) -> None:
        """The hash algorithm, the command, params, params file, env and salt."""
        old, inputs, reasons = self.old, self.inputs, self.reasons
        if not self.same_algo:
            reasons.append("hash algorithm %s -> %s (content hashes are not comparable)"
                           % (old.get("algorithm"), inputs["algorithm"]))
        if old.get("cmd") != inputs["cmd"]:
            reasons.append("cmd %s -> %s" % (shlex.join(old.get("cmd") or []), shlex.join(inputs["cmd"])))
        reasons += _dict_reasons("param", dict(flatten(old.get("params") or {})),
                                 dict(flatten(inputs["params"])))
        if old.get("params_file") != inputs["params_file"]:
            reasons.append("params_file %s -> %s" % (old.get("params_file"), inputs["params_file"]))
        reasons += _dict_reasons("env", old.get("env") or {}, inputs["env"])
        if old.get("salt") != inputs["salt"]:
            reasons.append("salt %r -> %r" % (old.get("salt"), inputs["salt"]))

    def old_manifest(self, section: str, path: str) -> Optional[Dict[str, str]]:
        """A directory's file list as the lock's run recorded it (read once, when first needed)."""
        if self._manifest is None:
            self._manifest = self.files.read_manifest(self.lock)
        return (self._manifest.get(section) or {}).get(path)

    def compare(self, section: str, label: str, old_entries: Dict[str, Any],
                new_entries: Dict[str, Any], ignores: Dict[str, IgnoreMatcher]) -> None:
        reasons = self.reasons
        for path in sorted(set(old_entries) - set(new_entries)):
            reasons.append("%s %s removed from %s" % (label, path, section))
        for path in sorted(set(new_entries) - set(old_entries)):
            reasons.append("%s %s added to %s" % (label, path, section))
        if not self.same_algo:
            return
        for path in sorted(set(old_entries) & set(new_entries)):
            before, now = old_entries[path], new_entries[path]
            if before.get("hash") == now.get("hash"):
                continue
            if now["kind"] == "missing":
                reasons.append("%s %s missing" % (label, path))
            elif before.get("kind") != now["kind"]:
                reasons.append("%s %s is now a %s (was a %s)" % (label, path, now["kind"], before.get("kind")))
            elif now["kind"] == "file":
                reasons.append("%s %s modified" % (label, path))
            else:
                prev = self.old_manifest(section, path)
                shown = _shown(path, now["kind"])
                if prev is None:
                    reasons.append("%s %s changed (%d files)" % (label, shown, now["files"]))
                else:
                    cur = self.hasher.manifest(path, self.spec.chdir, ignores.get(path, IgnoreMatcher(())))
                    reasons.append("%s %s: %s" % (label, shown, _tree_change(prev, cur)))

    def declared_outs(self) -> None:
        old_outs, new_outs = set(self.old.get("outs") or []), set(self.inputs["outs"])
        for path in sorted(old_outs - new_outs):
            self.reasons.append("out %s removed from outs" % path)
        for path in sorted(new_outs - old_outs):
            self.reasons.append("out %s added to outs" % path)

    def git(self, og: Optional[Dict[str, Any]], ng: Optional[Dict[str, Any]], git_info: Dict[str, Any]) -> None:
        if bool(og) != bool(ng):
            self.reasons.append("code.git %s" % ("added" if ng else "removed"))
        elif og and ng:
            if og.get("tree") != ng.get("tree"):
                self.reasons.append("git tree of %s changed (commit %s -> %s)" % (
                    self.spec.code_git, ((self.lock.get("run") or {}).get("git_commit") or "?")[:10],
                    git_info.get("commit", "?")[:10]))
            if og.get("diff") != ng.get("diff"):
                self.reasons.append("git: uncommitted changes to tracked files differ")
            if og.get("untracked") != ng.get("untracked"):
                self.reasons.append("git: untracked files differ (%d now)" % ng.get("untracked_files", 0))

    def python(self, op: Optional[Dict[str, Any]], np_: Optional[Dict[str, Any]]) -> None:
        if bool(op) != bool(np_):
            self.reasons.append("code.python %s" % ("added" if np_ else "removed"))
        elif op and np_:
            if op.get("python") != np_.get("python") or op.get("implementation") != np_.get("implementation"):
                self.reasons.append("python %s %s -> %s %s" % (op.get("implementation"), op.get("python"),
                                                               np_.get("implementation"), np_.get("python")))
            self.reasons += _dict_reasons("python package", op.get("dists") or {}, np_.get("dists") or {},
                                          show=str)

    def outs_now(self, outs: Dict[str, Any]) -> None:
        """The outputs as they are now against the outputs the lock recorded."""
        if not self.same_algo:
            return
        recorded = self.lock.get("outs") or {}
        for path in sorted(set(recorded) & set(outs)):
            before, now = recorded[path], outs[path]
            if now["kind"] == "missing":
                self.reasons.append("out %s missing" % path)
            elif before.get("hash") != now.get("hash"):
                if now["kind"] == "dir" and before.get("kind") == "dir":
                    prev = self.old_manifest("outs", path)
                    if prev is not None:
                        cur = self.hasher.manifest(path, self.spec.chdir)
                        self.reasons.append("out %s changed since the last run: %s"
                                            % (_shown(path, "dir"), _tree_change(prev, cur)))
                        continue
                self.reasons.append("out %s changed since the last run" % path)


def run_reasons(files: Any, spec: StageSpec, lock: Optional[Dict[str, Any]], problem: Optional[str],
                inputs: Dict[str, Any], git_info: Dict[str, Any], outs: Dict[str, Any],
                hasher: Hasher) -> List[str]:
    """Why the stage runs (force, no usable lock, each difference); [] when it is up to date."""
    reasons: List[str] = ["force: true"] if spec.force else []
    if lock is None:
        return reasons + [problem or "no lock: the stage has not run successfully here yet"]
    return RunReasons(files, spec, lock, inputs, hasher).find(reasons, git_info, outs)


def stage_key(inputs: Dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(inputs).encode("utf-8")).hexdigest()


def inputs_digest(inputs: Dict[str, Any]) -> Dict[str, str]:
    """One short digest per part of the key (``cmd``, ``params``, ``deps/PATH``, ``code/python``...).

    Two hosts whose keys differ compare these to say which input differs (the pipeline role's
    distributed train refuses a worker that would train on other data or code).
    """
    parts: Dict[str, Any] = {}
    for name, value in inputs.items():
        if name in ("deps", "code") and isinstance(value, dict):
            for sub, entry in value.items():
                if name == "code" and sub == "paths" and isinstance(entry, dict):
                    for path, item in entry.items():
                        parts["code/paths/%s" % path] = item
                else:
                    parts["%s/%s" % (name, sub)] = entry
        else:
            parts[name] = value
    return {name: hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:16]
            for name, value in sorted(parts.items())}


def lock_summary(lock: Dict[str, Any]) -> Dict[str, Any]:
    """The lock as diff mode shows it: what the key is made of, outputs by hash."""
    inputs = lock.get("inputs") or {}
    code = inputs.get("code") or {}
    outs = lock.get("outs")
    return {
        "key": lock.get("key"),
        "cmd": shlex.join(inputs.get("cmd") or []),
        "params": inputs.get("params"),
        "env": inputs.get("env"),
        "salt": inputs.get("salt"),
        "algorithm": inputs.get("algorithm"),
        "deps": {k: "%s (%s files)" % (v.get("hash"), v.get("files")) for k, v in (inputs.get("deps") or {}).items()},
        "code": {
            "paths": {k: v.get("hash") for k, v in (code.get("paths") or {}).items()},
            "git": code.get("git"),
            "python": ({"python": code["python"].get("python"), "dists": len(code["python"].get("dists") or {})}
                       if code.get("python") else None),
        },
        "outs": ({k: v.get("hash") for k, v in outs.items()} if outs is not None
                 else {k: "(after the run)" for k in inputs.get("outs") or []}),
    }


def summary_line(reasons: List[str], frozen: bool, key: str, inputs: Dict[str, Any], outs: Any) -> str:
    """One sentence for logs and play summaries: why the stage runs, or why it does not."""
    if reasons and frozen:
        return "frozen: not run although " + "; ".join(reasons)
    if reasons:
        return "; ".join(reasons)
    return ("up to date: key %s matches the lock (command, %d deps, params, code and %d outs unchanged)"
            % (key[:12], len(inputs.get("deps") or ()), len(outs or ())))
