# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage's options, validated before anything is read or written.

Every problem raises InvalidInputError naming the option, the value and the fix, so a bad
task fails with no run and the previous lock intact.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .._core._errors import InvalidInputError
from ._stage_hash import COLLISION_RESISTANT, SUPPORTED, is_glob, special_kind
from ._stage_lock import canonical_json
from ._stage_metrics import validate_labels
from ._stage_mps import MPS_ENV, MpsSpec
from ._stage_sign import MIN_KEY_LENGTH
from .._core._validate import ca_file, object_name

# The module's argument spec, declared once beside the checks that complete it (the module's
# DOCUMENTATION states the same options; test_ml_stage holds the two together).
ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    chdir=dict(type="path", required=True),
    cmd=dict(type="raw", required=True),
    env=dict(type="dict", default={}),
    secret_env=dict(type="dict", default={}, no_log=True),
    runtime_env=dict(type="dict", default={}),
    launcher=dict(type="list", elements="str", default=[]),
    deps=dict(type="list", elements="raw", default=[]),
    ignore=dict(type="list", elements="str", default=[]),
    params=dict(type="raw", default={}),
    params_file=dict(type="path"),
    outs=dict(type="list", elements="str", default=[]),
    allow_outs_outside_chdir=dict(type="bool", default=False),
    clean_outs=dict(type="bool", default=False),
    metrics_file=dict(type="path"),
    code=dict(type="dict", options=dict(
        paths=dict(type="list", elements="str"),
        git=dict(type="raw"),
        python=dict(type="raw"),
    )),
    force=dict(type="bool", default=False),
    frozen=dict(type="bool", default=False),
    salt=dict(type="str", default=""),
    timeout=dict(type="float", default=0),
    lock_timeout=dict(type="float", default=0),
    leftover_processes=dict(type="str", default="fail", choices=["fail", "wait", "kill"]),
    state_dir=dict(type="path", default=".ml_stage"),
    hash_algorithm=dict(type="str", default="auto",
                        choices=["auto", "xxh3_128", "blake3", "sha256", "md5"]),
    tail_lines=dict(type="int", default=40),
    metrics_textfile_dir=dict(type="path"),
    metrics_labels=dict(type="dict", default={}),
    mlflow=dict(type="dict", options=dict(
        tracking_uri=dict(type="str", required=True),
        experiment=dict(type="str", default="Default"),
        run_name=dict(type="str"),
        tags=dict(type="dict", default={}),
        # The password and token are no_log; the user name is not, on purpose: Ansible masks
        # a no_log value wherever it appears, and a short user name would garble every message.
        credentials=dict(type="dict", no_log=False, options=dict(
            username=dict(type="str", no_log=False),
            password=dict(type="str", no_log=True),
            token=dict(type="str", no_log=True),
        )),
        optional=dict(type="bool", default=False),
        reuse=dict(type="bool", default=False),
        upload_outs=dict(type="bool"),
        signing_key=dict(type="str", no_log=True),
        reuse_pins=dict(type="dict"),
        timeout=dict(type="float", default=30),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
    )),
    mps=dict(type="dict", options=dict(
        pipe_directory=dict(type="path", required=True),
        log_directory=dict(type="path"),
        active_thread_percentage=dict(type="int"),
        pinned_device_mem_limit=dict(type="str"),
    )),
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCALARS = (str, int, float, bool)
RESERVED_ENV = ("ML_STAGE_NAME", "ML_STAGE_KEY", "ML_STAGE_PARAMS", "ML_STAGE_RUN_TOKEN")
# What a run does with processes its command left behind (see _stage_tree); the first is the default.
LEFTOVER_POLICIES = ("fail", "wait", "kill")
MLFLOW_ENV = ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")
# How the mlflow client in the command verifies the server (requests' ``verify``); MLflow
# refuses a process that sets both.
MLFLOW_CERT_ENV = "MLFLOW_TRACKING_SERVER_CERT_PATH"
MLFLOW_INSECURE_ENV = "MLFLOW_TRACKING_INSECURE_TLS"
MLFLOW_TLS_ENV = (MLFLOW_CERT_ENV, MLFLOW_INSECURE_ENV)


def _norm(path: str) -> str:
    return os.path.normpath(path.strip())


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class DepSpec:
    def __init__(self, path: str, ignore: List[str]) -> None:
        self.path = path
        self.ignore = ignore


class MlflowSpec:
    def __init__(self, raw: Dict[str, Any], stage: str, chdir: Optional[str] = None) -> None:
        uri = raw.get("tracking_uri")
        if not isinstance(uri, str) or not re.match(r"^https?://[^/]+", uri or ""):
            raise InvalidInputError(
                "mlflow.tracking_uri", uri, "is not an http(s) URL of a tracking server",
                "give the server's URL, e.g. http://mlflow.lab:5000 (file: and databricks URIs "
                "are not supported: the module talks to the REST API)")
        self.tracking_uri = uri.rstrip("/")
        self.experiment = raw.get("experiment") or "Default"
        self.run_name = raw.get("run_name") or stage
        tags = raw.get("tags") or {}
        if not isinstance(tags, dict):
            raise InvalidInputError("mlflow.tags", tags, "is not a mapping", "give tag: value pairs")
        self.tags = {str(k): str(v) for k, v in tags.items()}
        creds = raw.get("credentials") or {}
        if not isinstance(creds, dict):
            raise InvalidInputError("mlflow.credentials", "(hidden)", "is not a mapping",
                                    "give username and password, or token")
        self.username = creds.get("username")
        self.password = creds.get("password")
        self.token = creds.get("token")
        if self.password is not None and self.username is None:
            raise InvalidInputError("mlflow.credentials", "(hidden)", "has a password but no username",
                                    "add mlflow.credentials.username")
        self.optional = bool(raw.get("optional"))
        self.reuse = bool(raw.get("reuse"))
        upload = raw.get("upload_outs")
        self.upload_outs = self.reuse if upload is None else bool(upload)
        self.timeout = float(raw.get("timeout") or 30)
        self.validate_certs = raw.get("validate_certs") is not False
        # Checked whatever the URL's scheme: an http:// server that a site later moves to
        # https must not find a broken ca_path only then.
        self.ca_path = ca_file("mlflow.ca_path", raw.get("ca_path"), chdir)
        self.signing_key = self._signing_key(raw.get("signing_key"))
        self.reuse_pins = self._pins(raw.get("reuse_pins"))
        if self.reuse and not self.signing_key and not self.reuse_pins:
            raise InvalidInputError(
                "mlflow.reuse", True, "would trust outputs that anyone who can write to the "
                "tracking server could have uploaded",
                "set mlflow.signing_key (a secret shared by this site's machines: only locks it "
                "signed are reused) or mlflow.reuse_pins (the hash of every out), or drop reuse")
        if self.reuse_pins and not self.reuse:
            raise InvalidInputError("mlflow.reuse_pins", sorted(self.reuse_pins), "is set but "
                                    "mlflow.reuse is not", "set mlflow.reuse: true, or drop the pins")

    @staticmethod
    def _signing_key(key: Any) -> Optional[str]:
        if key in (None, ""):
            return None
        if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH:
            raise InvalidInputError("mlflow.signing_key", "(hidden)", "is shorter than %d characters"
                                    % MIN_KEY_LENGTH, "give a random secret, e.g. "
                                    "lookup('ansible.builtin.password', '/dev/null length=32')")
        return key

    @staticmethod
    def _pins(raw: Any) -> Dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(v, str) and v for v in raw.values()):
            raise InvalidInputError("mlflow.reuse_pins", raw, "is not a mapping of out to hash",
                                    "give each out's hash as its lock records it (outs.<out>.hash)")
        return {_norm(str(k)): v for k, v in raw.items()}


class StageSpec:
    """The options of one task, checked and normalised."""

    def __init__(self, p: Dict[str, Any]) -> None:
        # In this order the options are checked: the first bad one is the one reported.
        self._read_workdir(p)
        self._read_environment(p)
        self._read_metrics_export(p)
        self._read_params(p)
        self._read_deps_and_outs(p)
        self._read_code(p)
        self._read_run_options(p)
        self._read_mlflow_and_mps(p)

    def _read_workdir(self, p: Dict[str, Any]) -> None:
        """The stage's name, working directory and state directory."""
        self.name = object_name("name", p.get("name"))
        chdir = p.get("chdir")
        if not isinstance(chdir, str) or not chdir:
            raise InvalidInputError("chdir", chdir, "is not set", "give the stage's working directory")
        self.chdir = os.path.abspath(os.path.expanduser(chdir))
        if not os.path.isdir(self.chdir):
            raise InvalidInputError("chdir", chdir, "is not an existing directory",
                                    "create it first or fix the path")
        state_dir = p.get("state_dir") or ".ml_stage"
        self.state_dir = os.path.normpath(os.path.join(self.chdir, os.path.expanduser(state_dir)))

    def _read_environment(self, p: Dict[str, Any]) -> None:
        """env, secret_env and runtime_env (each key in one of them) and the command."""
        self.env = self._env("env", p.get("env"))
        self.secret_env = self._env("secret_env", p.get("secret_env"), secret=True)
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise InvalidInputError("secret_env", both, "repeats keys of env",
                                    "put each variable in env (part of the key) or in "
                                    "secret_env (kept out of the key), not both")
        self.runtime_env = self._env("runtime_env", p.get("runtime_env"))
        both = sorted(set(self.runtime_env) & (set(self.env) | set(self.secret_env)))
        if both:
            raise InvalidInputError("runtime_env", both, "repeats keys of env or secret_env",
                                    "put each variable in one of env (what the command computes, "
                                    "part of the key), runtime_env (where it runs) or secret_env")
        self.cmd = self._cmd(p.get("cmd"))
        self.launcher = self._launcher(p.get("launcher"))

    def _read_metrics_export(self, p: Dict[str, Any]) -> None:
        """Where the stage's metrics go for node_exporter, and their labels."""
        textfile_dir = p.get("metrics_textfile_dir")
        if textfile_dir is not None and not isinstance(textfile_dir, str):
            raise InvalidInputError("metrics_textfile_dir", textfile_dir, "is not a path",
                                    "give node_exporter's textfile-collector directory, e.g. "
                                    "/var/lib/prometheus/node-exporter")
        self.metrics_textfile_dir: Optional[str] = (
            os.path.normpath(os.path.join(self.chdir, os.path.expanduser(textfile_dir)))
            if textfile_dir else None)
        self.metrics_labels = validate_labels(p.get("metrics_labels"))

    def _read_params(self, p: Dict[str, Any]) -> None:
        """The params and the file they are written to (part of the key)."""
        self.params = self._params(p.get("params"))
        params_file = p.get("params_file")
        if params_file:
            self.params_file: Optional[str] = self._own_params_file(params_file)
        elif self.params:
            self.params_file = os.path.relpath(os.path.join(self.state_dir, self.name + ".params.json"),
                                               self.chdir)
        else:
            self.params_file = None

    def _read_deps_and_outs(self, p: Dict[str, Any]) -> None:
        """What the stage reads and what it writes (the metrics file is an out)."""
        self.ignore = self._str_list("ignore", p.get("ignore"))
        self.deps = self._deps(p.get("deps"))
        self.allow_outside = bool(p.get("allow_outs_outside_chdir"))
        self.metrics_file = _norm(p["metrics_file"]) if p.get("metrics_file") else None
        outs = self._str_list("outs", p.get("outs"))
        declared = list(outs)
        # The metrics file is an output; one inside a declared out directory is already covered
        # (so the ranks of a distributed stage, only one of which writes metrics, declare the
        # same outs and share one key).
        if self.metrics_file and not any(_inside(self.abspath(self.metrics_file), self.abspath(_norm(o)))
                                         for o in outs):
            outs.append(self.metrics_file)
        self.outs = self._outs(outs, declared)
        self.clean_outs = bool(p.get("clean_outs"))
        self._check_params_file()

    def _read_code(self, p: Dict[str, Any]) -> None:
        """The code the key covers: paths, a git checkout, the Python interpreter."""
        code = p.get("code") or {}
        if not isinstance(code, dict):
            raise InvalidInputError("code", code, "is not a mapping", "give paths, git and/or python")
        self.code_paths = [self._existing("code.paths", _norm(c)) for c in
                           self._str_list("code.paths", code.get("paths"))]
        git = code.get("git")
        if git is True:
            self.code_git: Optional[str] = self.chdir
        elif isinstance(git, str) and git:
            self.code_git = os.path.normpath(os.path.join(self.chdir, os.path.expanduser(git)))
            if not os.path.isdir(self.code_git):
                raise InvalidInputError("code.git", git, "is not a directory",
                                        "give the path of a git checkout, or true for chdir")
        elif git in (None, False, ""):
            self.code_git = None
        else:
            raise InvalidInputError("code.git", git, "is neither a path nor a boolean",
                                    "give true (chdir is the checkout) or the checkout's path")
        python = code.get("python")
        if python is not None and not isinstance(python, (bool, str)):
            raise InvalidInputError("code.python", python, "is neither a path nor a boolean",
                                    "give true (the command's Python) or an interpreter path")
        self.code_python = python if python not in (False, "") else None

    def _read_run_options(self, p: Dict[str, Any]) -> None:
        """How the stage runs: force, frozen, salt, hash, timeouts."""
        self.force = bool(p.get("force"))
        self.frozen = bool(p.get("frozen"))
        salt = p.get("salt")
        self.salt = "" if salt is None else str(salt)
        algo = p.get("hash_algorithm") or "auto"
        if algo != "auto" and algo not in SUPPORTED:
            raise InvalidInputError("hash_algorithm", algo, "is not supported",
                                    "use auto or one of %s" % ", ".join(SUPPORTED))
        self.hash_algorithm = algo
        self.timeout = self._number("timeout", p.get("timeout"), 0)
        self.lock_timeout = self._number("lock_timeout", p.get("lock_timeout"), 0)
        self.tail_lines = int(self._number("tail_lines", p.get("tail_lines"), 40))
        leftover = p.get("leftover_processes") or "fail"
        if leftover not in LEFTOVER_POLICIES:
            raise InvalidInputError("leftover_processes", leftover, "is not a known policy",
                                    "use one of %s" % ", ".join(LEFTOVER_POLICIES))
        self.leftover_processes = leftover

    def _read_mlflow_and_mps(self, p: Dict[str, Any]) -> None:
        """The tracking server (and what reuse needs) and the MPS daemon."""
        raw_mlflow = p.get("mlflow")
        if raw_mlflow is not None and not isinstance(raw_mlflow, dict):
            raise InvalidInputError("mlflow", raw_mlflow, "is not a mapping",
                                    "give tracking_uri and optionally experiment, tags, credentials")
        self.mlflow = MlflowSpec(raw_mlflow, self.name, self.chdir) if raw_mlflow else None
        if self.mlflow and self.mlflow.reuse:
            self._check_reuse(self.mlflow)
        self.mps = self._mps(p.get("mps"))
        if self.mlflow:
            clash = sorted(k for k in MLFLOW_ENV if k in self._all_env())
            if clash:
                raise InvalidInputError("env", clash, "are set by ml_stage when mlflow is given",
                                        "drop them from env/secret_env/runtime_env; the module exports them")
            self._check_tls_env(self.mlflow)

    def _check_tls_env(self, m: MlflowSpec) -> None:
        """With mlflow.ca_path the module sets the command's TLS variables itself; one set by
        the task as well would contradict it (MLflow refuses both at once)."""
        if not (m.ca_path and m.validate_certs):
            return
        clash = sorted(k for k in MLFLOW_TLS_ENV if k in self._all_env())
        if clash:
            raise InvalidInputError("env", clash, "are set by ml_stage when mlflow.ca_path is given",
                                    "drop them from env/secret_env/runtime_env; the command gets "
                                    "MLFLOW_TRACKING_SERVER_CERT_PATH=<mlflow.ca_path>")

    def _check_reuse(self, m: MlflowSpec) -> None:
        """Reused outs are trusted by their hashes: those must resist crafted collisions, and
        pins, when they are what is trusted, must cover every out."""
        if self.hash_algorithm not in ("auto",) + COLLISION_RESISTANT:
            raise InvalidInputError("hash_algorithm", self.hash_algorithm, "is not collision resistant, "
                                    "and mlflow.reuse trusts outputs by their hashes",
                                    "use %s, or auto (which then picks one of them)"
                                    % " or ".join(COLLISION_RESISTANT))
        unknown = sorted(set(m.reuse_pins) - set(self.outs))
        if unknown:
            raise InvalidInputError("mlflow.reuse_pins", unknown, "are not outs of this stage",
                                    "pin the outs it declares: %s" % ", ".join(self.outs))
        unpinned = [o for o in self.outs if o not in m.reuse_pins]
        if m.reuse_pins and unpinned and not m.signing_key:
            raise InvalidInputError("mlflow.reuse_pins", sorted(m.reuse_pins), "leaves outs %s "
                                    "unpinned" % ", ".join(unpinned),
                                    "pin every out, or set mlflow.signing_key as well")

    def _mps(self, raw: Any) -> Optional[MpsSpec]:
        if raw is None:
            return None
        if not isinstance(raw, dict) or not raw:
            raise InvalidInputError("mps", raw, "is not a mapping with pipe_directory",
                                    "give e.g. {pipe_directory: /run/nvidia-mps}, or leave mps unset")
        # One source for each variable: the task's env would otherwise silently lose to mps.
        clash = sorted(k for k in MPS_ENV if k in self._all_env())
        if clash:
            raise InvalidInputError("env", clash, "are set by ml_stage when mps is given",
                                    "drop them from env/secret_env/runtime_env and set them through mps")
        return MpsSpec(raw, self.chdir)

    # -- helpers ----------------------------------------------------------------------
    def _all_env(self) -> Dict[str, str]:
        return dict(self.env, **self.secret_env, **self.runtime_env)

    def abspath(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.chdir, path))

    @staticmethod
    def _number(option: str, value: Any, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InvalidInputError(option, value, "is not a number of seconds >= 0",
                                    "give a number such as 0 or 3600")
        return value

    @staticmethod
    def _str_list(option: str, value: Any) -> List[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise InvalidInputError(option, value, "is not a list of non-empty strings",
                                    "give a YAML list of paths")
        return list(value)

    def _env(self, option: str, value: Any, secret: bool = False) -> Dict[str, str]:
        if value is None:
            return {}
        shown = "(hidden)" if secret else value
        if not isinstance(value, dict):
            raise InvalidInputError(option, shown, "is not a mapping", "give NAME: value pairs")
        out = {}
        for key, val in value.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise InvalidInputError(option, key, "is not a valid environment variable name",
                                        "use letters, digits and '_', not starting with a digit")
            if key in RESERVED_ENV:
                raise InvalidInputError(option, key, "is set by ml_stage itself",
                                        "drop it; the module exports it to the command")
            if isinstance(val, bool):
                val = "true" if val else "false"
            if not isinstance(val, _SCALARS):
                raise InvalidInputError(option, "%s=%s" % (key, "(hidden)" if secret else val),
                                        "is not a scalar", "give strings or numbers")
            out[key] = str(val)
        return out

    def _launcher(self, launcher: Any) -> List[str]:
        """The argv the command is started through (``srun --jobid ...``): where it runs, so
        not part of the key; its program must exist like the command's."""
        if not launcher:
            return []
        if not isinstance(launcher, list) or not all(isinstance(a, str) and a for a in launcher):
            raise InvalidInputError("launcher", launcher, "is not a list of non-empty strings",
                                    "give the launcher as argv, e.g. [srun, --jobid, '42', --overlap]")
        path_env = self.env.get("PATH", os.environ.get("PATH", os.defpath))
        if os.sep not in launcher[0] and shutil.which(launcher[0], path=path_env) is None:
            raise InvalidInputError("launcher", launcher, "names a program (%s) that is not on PATH" % launcher[0],
                                    "install it (srun: the slurm_node role) or give its full path")
        return list(launcher)

    def _cmd(self, cmd: Any) -> List[str]:
        if not isinstance(cmd, list) or not cmd:
            raise InvalidInputError("cmd", cmd, "is not a non-empty list (argv)",
                                    "write the command as a list, e.g. [python, train.py, --epochs, '3']; "
                                    "for a shell line use [sh, -c, '...']")
        argv = []
        for arg in cmd:
            if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
                raise InvalidInputError("cmd", cmd, "holds %r, which is not a string" % (arg,),
                                        "give every argument as a string")
            argv.append(str(arg))
        if not argv[0]:
            raise InvalidInputError("cmd", cmd, "starts with an empty program name",
                                    "put the program first, e.g. python")
        program = argv[0]
        if os.sep in program:
            found = os.path.join(self.chdir, os.path.expanduser(program))
            ok = os.path.isfile(found) and os.access(found, os.X_OK)
        else:
            path_env = self.env.get("PATH", os.environ.get("PATH", os.defpath))
            ok = shutil.which(program, path=path_env) is not None
        if not ok:
            raise InvalidInputError("cmd", cmd, "names a program (%s) that is not an executable "
                                    "file here (PATH or relative to chdir)" % program,
                                    "install it, give its full path, or fix the name")
        return argv

    @staticmethod
    def _params(params: Any) -> Dict[str, Any]:
        if params is None:
            return {}
        if not isinstance(params, dict):
            raise InvalidInputError("params", params, "is not a mapping",
                                    "give name: value pairs (nested mappings are fine)")
        try:
            canonical_json(params)
            _check_keys(params, "params")
        except (TypeError, ValueError) as exc:
            raise InvalidInputError("params", params, "is not JSON-serialisable (%s)" % exc,
                                    "use only strings, numbers, booleans, null, lists and mappings "
                                    "with string keys; no NaN or Infinity")
        return params

    def _existing(self, option: str, path: str) -> str:
        full = self.abspath(path)
        if is_glob(path):
            import glob
            if not glob.glob(full, recursive=True):
                raise InvalidInputError(option, path, "matches nothing (looked for %s)" % full,
                                        "fix the pattern or produce the files first (e.g. by an "
                                        "earlier stage)")
        elif not os.path.exists(full):
            raise InvalidInputError(option, path, "does not exist (looked for %s)" % full,
                                    "fix the path or produce it first (e.g. by an earlier stage)")
        else:
            kind = special_kind(os.stat(full).st_mode)  # stat, never open: a FIFO would block
            if kind:
                raise special_input(option, path, full, full, kind)
        return path

    def _deps(self, value: Any) -> List[DepSpec]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise InvalidInputError("deps", value, "is not a list",
                                    "give a list of paths, globs or {path, ignore} mappings")
        deps: List[DepSpec] = []
        seen = set()
        for item in value:
            if isinstance(item, str) and item.strip():
                path, ignore = item, []
            elif isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"].strip():
                path = item["path"]
                ignore = self._str_list("deps[].ignore", item.get("ignore"))
                unknown = sorted(set(item) - {"path", "ignore"})
                if unknown:
                    raise InvalidInputError("deps", item, "has unknown keys %s" % unknown,
                                            "use only path and ignore")
            else:
                raise InvalidInputError("deps", item, "is not a path or a {path, ignore} mapping",
                                        "give a string such as data/ or {path: data/, ignore: ['*.tmp']}")
            path = self._existing("deps", _norm(path))
            if path in seen:
                continue
            seen.add(path)
            deps.append(DepSpec(path, self.ignore + ignore))
        return deps

    def _outs(self, outs: List[str], declared: List[str]) -> List[str]:
        real_chdir = os.path.realpath(self.chdir)
        result: List[str] = []
        for raw in outs:
            # The metrics file joins the outs; a refusal of it names the option the user wrote.
            option = "outs" if raw in declared else "metrics_file"
            out = _norm(raw)
            if out in result:
                continue
            if is_glob(out):
                raise InvalidInputError(option, raw, "is a glob", "declare the files or directories "
                                        "the command writes (a directory covers its whole tree)")
            full = self.abspath(out)
            if full == self.chdir or full == os.path.realpath(self.chdir):
                raise InvalidInputError(option, raw, "is chdir itself",
                                        "declare the files or directories the command writes inside it")
            outside = not (_inside(full, self.chdir) and _inside(os.path.realpath(full), real_chdir))
            if outside and not self.allow_outside:
                raise InvalidInputError(option, raw, "is outside chdir (%s)" % self.chdir,
                                        "write outputs inside chdir, or set allow_outs_outside_chdir: true")
            if _inside(self.state_dir, full) or _inside(full, self.state_dir):
                raise InvalidInputError(option, raw, "overlaps the state directory %s" % self.state_dir,
                                        "choose another output path or state_dir")
            for dep in self.deps:
                dfull = self.abspath(dep.path)
                if not is_glob(dep.path) and (_inside(full, dfull) or _inside(dfull, full)):
                    raise InvalidInputError(option, raw, "overlaps the dep %s" % dep.path,
                                            "a path is either read (deps) or written (outs) by a stage")
            result.append(out)
        return result

    def _own_params_file(self, raw: Any) -> str:
        """A params_file the task names: a path inside chdir (symlinks resolved), outside the
        stage's state directory, since the module overwrites it before every run."""
        if not isinstance(raw, str) or not raw.strip():
            raise InvalidInputError("params_file", raw, "is not a path",
                                    "give a path relative to chdir, or leave it unset")
        path = _norm(raw)
        full = self.abspath(path)
        real_chdir = os.path.realpath(self.chdir)
        fix = ("give a path inside chdir (%s) such as params.json, or leave params_file unset "
               "(default STATE_DIR/NAME.params.json)" % self.chdir)
        if not (_inside(full, self.chdir) and _inside(os.path.realpath(full), real_chdir)):
            raise InvalidInputError("params_file", raw, "lies outside chdir (%s, symlinks resolved)"
                                    % os.path.realpath(full), fix)
        if full == self.chdir or os.path.isdir(full):
            raise InvalidInputError("params_file", raw, "is a directory", fix)
        default = os.path.join(self.state_dir, self.name + ".params.json")
        real = os.path.realpath(full)
        inside_state = _inside(full, self.state_dir) or _inside(real, os.path.realpath(self.state_dir))
        if inside_state and real != os.path.realpath(default):
            raise InvalidInputError("params_file", raw, "lies in the state directory %s, where "
                                    "ml_stage keeps the stage's lock, logs and caches" % self.state_dir, fix)
        if os.path.lexists(full) and not os.path.isfile(full):
            raise InvalidInputError("params_file", raw, "exists and is not a regular file", fix)
        return path

    def _check_params_file(self) -> None:
        if not self.params_file:
            return
        full = self.abspath(self.params_file)
        for dep in self.deps:
            if not is_glob(dep.path) and _inside(full, self.abspath(dep.path)):
                raise InvalidInputError("params_file", self.params_file, "lies in the dep %s" % dep.path,
                                        "params are part of the key already; put the file elsewhere")
        for out in self.outs:
            if _inside(full, self.abspath(out)):
                raise InvalidInputError("params_file", self.params_file, "lies in the out %s" % out,
                                        "put the params file elsewhere")


def special_input(option: str, path: str, full: str, special: str, kind: str) -> InvalidInputError:
    """The error for a dep or code path (``full`` once resolved) that is, or holds, the FIFO,
    device or socket ``special``."""
    where = "is" if os.path.normpath(special) == os.path.normpath(full) else "holds %s, which is" % special
    return InvalidInputError(option, path, "%s a %s; ml_stage hashes regular files only and never "
                             "opens anything else (reading it could hang)" % (where, kind),
                             "remove it, point %s at regular files, or leave it out with ignore "
                             "(e.g. ignore: ['%s'])" % (option, os.path.basename(special)))


def _check_keys(data: Any, where: str) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                raise TypeError("key %r in %s is not a string" % (key, where))
            _check_keys(value, "%s.%s" % (where, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _check_keys(value, "%s[%d]" % (where, i))


def flatten(data: Any, prefix: str = "") -> Iterable[Tuple[str, Any]]:
    """Nested mappings as dotted keys: {"opt": {"lr": 1}} -> ("opt.lr", 1)."""
    if isinstance(data, dict):
        for key in sorted(data, key=str):
            yield from flatten(data[key], "%s%s" % (prefix + "." if prefix else "", key))
    else:
        yield prefix, data
