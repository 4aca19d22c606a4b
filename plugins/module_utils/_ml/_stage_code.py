# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Code fingerprints for ml_stage: a git checkout and a Python environment.

git: the tree object of the checkout's directory at HEAD (so a commit that touches only
other directories does not count), the hash of ``git diff HEAD`` (staged and unstaged
edits of tracked files) and the hashes of untracked, not ignored files. The stage's own
files (state dir, outs, params and metrics files, deps) are left out: they change with
every run and are tracked elsewhere.

Python: the interpreter's version and every installed distribution (name and version) on
its ``sys.path``, read from the ``*.dist-info``/``*.egg-info`` directory names, so it
costs one interpreter start and no metadata parsing.
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._core._command import CommandTimeoutError, kill_group
from .._core._errors import InvalidInputError, KvmError

# Seconds the interpreter probe and each git command may take: an interpreter on a hung network
# file system, or git on a huge untracked tree, must fail the task, not hold it.
PYTHON_PROBE_TIMEOUT_S = 120
GIT_TIMEOUT_S = 300

_PY_SCRIPT = r"""
import json, os, re, sys
d = {}
for p in sys.path:
    try:
        names = os.listdir(p or '.')
    except OSError:
        continue
    for n in sorted(names):
        if n.endswith('.dist-info') or n.endswith('.egg-info'):
            parts = n.rsplit('.', 1)[0].split('-')
            d.setdefault(re.sub(r'[-_.]+', '-', parts[0]).lower(), parts[1] if len(parts) > 1 else '')
print(json.dumps({'python': '%d.%d.%d' % tuple(sys.version_info[:3]),
                  'implementation': sys.implementation.name, 'dists': d}))
"""


def run_bytes(argv: List[str], timeout_s: float, cwd: Optional[str] = None,
              env: Optional[Dict[str, str]] = None) -> Tuple[int, bytes, bytes]:
    """``(rc, stdout, stderr)`` as bytes (a git diff is hashed as it is, not decoded), in a
    process group of its own that is killed whole past ``timeout_s`` (CommandTimeoutError);
    OSError when the program cannot be started. _core's run_bounded, for binary output."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise CommandTimeoutError(argv, timeout_s) from None
    return proc.returncode, out, err


def python_fingerprint(interpreter: str, env: Dict[str, str], cwd: str) -> Dict[str, Any]:
    try:
        rc, out, err = run_bytes([interpreter, "-c", _PY_SCRIPT], PYTHON_PROBE_TIMEOUT_S, cwd=cwd, env=env)
    except OSError as exc:
        raise InvalidInputError("code.python", interpreter, "could not be run (%s)" % exc,
                                "give the path of the Python interpreter the command uses")
    except CommandTimeoutError:
        raise InvalidInputError("code.python", interpreter,
                                "did not list its distributions within %s s and was killed"
                                % PYTHON_PROBE_TIMEOUT_S,
                                "give the path of a working Python 3 interpreter (one whose "
                                "sys.path is not on a hung file system)")
    if rc != 0:
        raise InvalidInputError("code.python", interpreter,
                                "failed to list its distributions (rc %s: %s)"
                                % (rc, err.decode("utf-8", "replace")[-500:]),
                                "give the path of a working Python 3 interpreter")
    try:
        data = json.loads(out.decode("utf-8"))
    except ValueError:
        raise KvmError("code.python: %s printed no fingerprint: %r" % (interpreter, out[-300:]))
    return {"python": data["python"], "implementation": data["implementation"],
            "dists": dict(sorted(data["dists"].items()))}


def _git(repo: str, args: List[str], check: bool = True) -> bytes:
    try:
        rc, out, err = run_bytes(["git", "-C", repo] + args, GIT_TIMEOUT_S)
    except OSError as exc:
        raise InvalidInputError("code.git", repo, "cannot be read: git is not runnable (%s)" % exc,
                                "install git on the target host or drop code.git")
    except CommandTimeoutError as exc:
        raise InvalidInputError("code.git", repo, "cannot be read: %s" % exc,
                                "check the checkout (a hung file system, a huge untracked tree) "
                                "or drop code.git")
    if check and rc != 0:
        raise InvalidInputError(
            "code.git", repo, "is not a usable git checkout (git %s: %s)"
            % (" ".join(args[:2]), err.decode("utf-8", "replace").strip()[-300:]),
            "point code.git at a directory inside a git repository with at least one commit")
    return out


def git_fingerprint(repo: str, exclude: Iterable[str], hash_data: Callable[[bytes], str],
                    hash_files: Callable[[List[str]], str]) -> Dict[str, Any]:
    """{tree, diff, untracked, untracked_files, commit}; ``exclude`` holds absolute paths.
    ``hash_data`` digests bytes, ``hash_files`` a list of files (through the stat cache)."""
    commit = _git(repo, ["rev-parse", "--verify", "HEAD"]).decode().strip()
    tree = _git(repo, ["rev-parse", "HEAD:./"], check=False).decode().strip() or None
    specs = ["--", "."]
    real_repo = os.path.realpath(repo)
    for path in sorted(set(exclude)):
        rel = os.path.relpath(os.path.realpath(path), real_repo)
        if rel != "." and not rel.startswith(".." + os.sep) and rel != "..":
            specs.append(":(exclude,literal)" + rel)
    diff = _git(repo, ["diff", "HEAD", "--no-ext-diff", "--no-textconv", "--binary"] + specs)
    untracked = [n for n in _git(repo, ["ls-files", "--others", "--exclude-standard", "-z"]
                                 + specs).decode("utf-8", "surrogateescape").split("\0") if n]
    untracked.sort()
    return {
        "tree": tree,
        "diff": hash_data(diff) if diff else None,
        "untracked": hash_files([os.path.join(repo, n) for n in untracked]) if untracked else None,
        "untracked_files": len(untracked),
        "commit": commit,
    }


def resolve_interpreter(value: Any, cmd: List[str], path_env: Optional[str], cwd: str,
                        default: str) -> str:
    """``code.python: true`` means the command's own Python when cmd[0] is one."""
    import shutil
    if isinstance(value, str):
        found = shutil.which(value, path=path_env) if os.sep not in value else \
            os.path.join(cwd, value)
        if not found or not os.access(found, os.X_OK):
            raise InvalidInputError("code.python", value, "is not an executable interpreter",
                                    "give the path of the Python interpreter the command uses, or true")
        return found
    first = os.path.basename(cmd[0])
    if first.startswith("python"):
        found = shutil.which(cmd[0], path=path_env) if os.sep not in cmd[0] else os.path.join(cwd, cmd[0])
        if found:
            return found
    return default
