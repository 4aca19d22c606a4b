# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ml_stage's key is made of, as it is on disk now: the inputs (command, params, env,
deps, code) hashed, the outs as they are, the per-file manifests of the tree inputs, and the
lock a successful run records.

It only reads; hashing goes through the stage's stat cache, which the runner saves.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .._core._errors import InvalidInputError
from ._stage_hash import Hasher, IgnoreMatcher, SpecialFileError, hash_bytes, is_glob, public
from ._stage_lock import LOCK_FORMAT
from ._stage_spec import StageSpec, special_input


def base_env(spec: StageSpec) -> Dict[str, str]:
    """The environment the command starts from: the module's, then the stage's env and secrets."""
    env = dict(os.environ)
    env.update(spec.env)
    env.update(spec.secret_env)
    return env


class StageFingerprint:
    """The stage's inputs and outs read through one hasher (one algorithm, one stat cache)."""

    def __init__(self, spec: StageSpec, hasher: Hasher) -> None:
        self.spec = spec
        self.hasher = hasher

    def _code(self) -> Dict[str, Any]:
        spec = self.spec
        code: Dict[str, Any] = {}
        if spec.code_git or spec.code_python:
            from ._stage_code import git_fingerprint, python_fingerprint, resolve_interpreter
        if spec.code_paths:
            code["paths"] = {p: self._entry("code.paths", p, IgnoreMatcher(spec.ignore))
                             for p in spec.code_paths}
        if spec.code_git:
            exclude = [spec.state_dir] + [spec.abspath(o) for o in spec.outs]
            exclude += [spec.abspath(d.path) for d in spec.deps if not is_glob(d.path)]
            if spec.params_file:
                exclude.append(spec.abspath(spec.params_file))
            algo = self.hasher.algo

            def hash_files(paths: List[str]) -> str:
                items = []
                for path in paths:
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):  # a FIFO or device is never opened (it could hang)
                        items.append((path, st))
                digests = self.hasher.cache.file_hashes(items)
                lines = ["%s\0%s\n" % (os.path.relpath(p, spec.code_git), d)
                         for (p, _st), d in zip(items, digests)]
                return hash_bytes(algo, "".join(lines).encode("utf-8", "surrogateescape"))

            code["git"] = git_fingerprint(spec.code_git, exclude,
                                          lambda data: hash_bytes(algo, data), hash_files)
        if spec.code_python:
            env = base_env(spec)
            interp = resolve_interpreter(spec.code_python, spec.cmd, env.get("PATH"), spec.chdir,
                                         sys.executable)
            code["python"] = python_fingerprint(interp, env, spec.chdir)
        return code

    def _entry(self, option: str, path: str, ignore: IgnoreMatcher) -> Dict[str, Any]:
        try:
            entry = self.hasher.path(path, self.spec.chdir, ignore, refuse_special=True)
        except SpecialFileError as exc:
            raise special_input(option, path, self.spec.abspath(path), exc.path, exc.kind)
        except OSError as exc:
            raise InvalidInputError(option, path, "cannot be read (%s)" % exc,
                                    "fix its permissions for the user the task runs as")
        if entry["kind"] == "missing":
            raise InvalidInputError(option, path, "does not exist any more",
                                    "fix the path or produce it first")
        return public(entry)

    def read(self) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        """(inputs, git info kept out of the key, outs as they are now)."""
        spec = self.spec
        deps = {d.path: self._entry("deps", d.path, IgnoreMatcher(d.ignore)) for d in spec.deps}
        code = self._code()
        git_info = {}
        if "git" in code:
            git_info = {"commit": code["git"].pop("commit")}
        inputs = {
            "algorithm": self.hasher.algo,
            "cmd": spec.cmd,
            "env": spec.env,
            "params": spec.params,
            "params_file": spec.params_file,
            "salt": spec.salt,
            "deps": deps,
            "outs": sorted(spec.outs),
            "code": code,
        }
        try:
            outs = {o: public(self.hasher.path(o, spec.chdir)) for o in spec.outs}
        except SpecialFileError as exc:
            raise InvalidInputError("outs", os.path.relpath(exc.path, spec.chdir), "is a %s" % exc.kind,
                                    "declare the regular files or directories the command writes; "
                                    "remove the %s or fix the outs option" % exc.kind)
        return inputs, git_info, outs

    def input_manifests(self, inputs: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
        """Per-file hashes of the tree deps and code paths (for the reasons of the next run)."""
        spec = self.spec
        manifest: Dict[str, Dict[str, Any]] = {"deps": {}, "outs": {}, "code": {}}
        for dep in spec.deps:
            if inputs["deps"][dep.path]["kind"] in ("dir", "glob"):
                manifest["deps"][dep.path] = self.hasher.manifest(dep.path, spec.chdir, IgnoreMatcher(dep.ignore))
        for path in spec.code_paths:
            if inputs["code"]["paths"][path]["kind"] in ("dir", "glob"):
                manifest["code"][path] = self.hasher.manifest(path, spec.chdir, IgnoreMatcher(spec.ignore))
        return manifest

    def lock_doc(self, key: str, inputs: Dict[str, Any], git_info: Dict[str, Any],
                 manifest: Dict[str, Dict[str, Any]], mlflow: Optional[Dict[str, Any]],
                 metrics: Dict[str, float], reused_from: Optional[str] = None,
                 cmd_started: Optional[float] = None,
                 duration: Optional[float] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The lock of a successful run, and its manifest with the outs hashed as they are now."""
        spec = self.spec
        manifest = dict(manifest, outs={})
        outs = {}
        for out in spec.outs:
            entry = self.hasher.path(out, spec.chdir, want_manifest=True)
            outs[out] = public(entry)
            if "manifest" in entry:
                manifest["outs"][out] = entry["manifest"]
        run = {"host": socket.gethostname(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "duration": duration, "mlflow": mlflow, "reused_from": reused_from}
        if cmd_started is not None:
            run["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(cmd_started))
        if git_info.get("commit"):
            run["git_commit"] = git_info["commit"]
        if spec.mps and reused_from is None:  # how the run shared the GPU; not in the key
            run["mps"] = {k: v for k, v in spec.mps.summary().items() if k != "env"}
        if spec.runtime_env and reused_from is None:  # where it ran; not in the key
            run["runtime_env"] = dict(spec.runtime_env)
        if spec.launcher and reused_from is None:  # how it was started (srun); not in the key
            run["launcher"] = list(spec.launcher)
        doc = {"format": LOCK_FORMAT, "stage": spec.name, "key": key, "inputs": inputs,
               "outs": outs, "metrics": metrics, "run": run}
        return doc, manifest
