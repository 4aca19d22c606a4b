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
from typing import Any, Callable, Dict, Iterable, List, Optional

from .._core._errors import InvalidInputError, KvmError

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


def python_fingerprint(interpreter: str, env: Dict[str, str], cwd: str) -> Dict[str, Any]:
    try:
        proc = subprocess.run([interpreter, "-c", _PY_SCRIPT], cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InvalidInputError("code.python", interpreter, "could not be run (%s)" % exc,
                                "give the path of the Python interpreter the command uses")
    if proc.returncode != 0:
        raise InvalidInputError("code.python", interpreter,
                                "failed to list its distributions (rc %s: %s)"
                                % (proc.returncode, proc.stderr.decode("utf-8", "replace")[-500:]),
                                "give the path of a working Python 3 interpreter")
    try:
        data = json.loads(proc.stdout.decode("utf-8"))
    except ValueError:
        raise KvmError("code.python: %s printed no fingerprint: %r" % (interpreter, proc.stdout[-300:]))
    return {"python": data["python"], "implementation": data["implementation"],
            "dists": dict(sorted(data["dists"].items()))}


def _git(repo: str, args: List[str], check: bool = True) -> bytes:
    try:
        proc = subprocess.run(["git", "-C", repo] + args, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=300, check=False)
    except OSError as exc:
        raise InvalidInputError("code.git", repo, "cannot be read: git is not runnable (%s)" % exc,
                                "install git on the target host or drop code.git")
    if check and proc.returncode != 0:
        raise InvalidInputError(
            "code.git", repo, "is not a usable git checkout (git %s: %s)"
            % (" ".join(args[:2]), proc.stderr.decode("utf-8", "replace").strip()[-300:]),
            "point code.git at a directory inside a git repository with at least one commit")
    return proc.stdout


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
