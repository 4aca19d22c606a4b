#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: ml_stage
short_description: Run an ML pipeline stage only when something that affects it changed
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
description:
  - Runs a command (a prepare, train or evaluate step) on the target host when, and only
    when, its inputs changed since its last successful run, says why in words, and records
    every real run in MLflow.
  - The cache key is a hash over the normalised O(cmd), the B(set) of dep and out paths
    (removing a dep re-runs), the content of every dep, O(params), the O(code) fingerprint,
    O(env) and O(salt). The stage runs when there is no lock, the key differs, an output
    is missing or was changed since the last run, or O(force) is set; otherwise it is
    skipped with C(changed=false).
  - Content is hashed with a per-file stat cache (size, mtime_ns, ctime_ns, inode, device),
    so an unchanged tree is not read again; an edit whose mtime was put back still changes
    the ctime and is seen. Files are hashed with xxh3_128 (python C(xxhash)) or blake3 when
    importable, sha256 otherwise; see O(hash_algorithm).
  - The lock (C(STATE_DIR/NAME.lock.json)) is written atomically (temp file, fsync, rename)
    and only after a successful run whose declared outputs all exist; a failed run keeps
    the previous lock and its outputs never count as done. A concurrent run of the same
    stage waits for, or fails on, an C(fcntl) lock (O(lock_timeout)); it re-evaluates once
    it holds the lock, so it skips when the first run already did the work.
  - With O(mlflow), a real run creates an MLflow run tagged C(mlinfra.stage.key), exports
    C(MLFLOW_TRACKING_URI) and C(MLFLOW_RUN_ID) so that C(mlflow.start_run()) inside the
    command attaches to it, logs O(params) in batches, the numbers of O(metrics_file) in
    one call, uploads the lock and the command's logs as artifacts and ends the run
    C(FINISHED) or C(FAILED). A skipped stage makes no MLflow call at all. Only the REST
    API is used (no C(mlflow) package on the target).
  - With O(mlflow), the command also gets C(MLFLOW_DISABLE_TELEMETRY=true) unless its
    environment (O(env), or the module's own) sets that variable. Where MLflow's telemetry
    endpoint cannot be reached, the client's telemetry thread removes a variable from the
    process environment while the command's HTTP calls read it, and a tracked command failed
    with C(KeyError) C('_MLFLOW_TELEMETRY_SESSION_ID').
version_added: 0.1.0
author:
  - mlinfra.kvm contributors (@mlinfra)
options:
  name:
    description: Stage name; names its files in O(state_dir) and tags its MLflow runs.
    type: str
    required: true
  chdir:
    description: Working directory of the command; relative paths are relative to it.
    type: path
    required: true
  cmd:
    description:
      - The command as an argv list (no shell). Use C([sh, -c, "..."]) for a shell line.
      - A string or an empty list is refused.
    type: raw
    required: true
  env:
    description: Environment variables for the command. Part of the cache key.
    type: dict
    default: {}
  secret_env:
    description:
      - Environment variables for the command that are B(not) part of the cache key and
        never returned or stored (tokens, passwords).
    type: dict
    default: {}
  launcher:
    description:
      - Argv the command is started through, e.g. a Slurm step of the job that holds the stage's
        nodes (C([srun, --jobid, '42', --overlap, --nodes, '1', --ntasks, '1', --nodelist, worker1])),
        see M(mlinfra.kvm.slurm_job).
      - B(Not part of the cache key) (where the command runs, not what it computes); recorded in the
        lock's run record. Its program must be on the command's PATH.
    type: list
    elements: str
    default: []
  runtime_env:
    description:
      - Environment variables that say where and how the command runs, not what it computes,
        e.g. a distributed job's rendezvous endpoint and id, or the network interface of its
        collective traffic (C(PET_RDZV_ENDPOINT), C(GLOO_SOCKET_IFNAME)).
      - B(Not part of the cache key), so a new rendezvous id or another interface name alone
        re-runs nothing. Recorded in the result (RV(runtime_env)) and in the lock's run record.
      - A variable may be in only one of O(env), O(secret_env) and O(runtime_env).
    type: dict
    default: {}
  deps:
    description:
      - Files, directories or globs (C(**) recurses) the stage reads, relative to O(chdir)
        or absolute. Each item is a path or a mapping C({path, ignore}).
      - A dep that does not exist (a glob that matches nothing) is an error.
      - Only regular files are read. A dep that is, or a directory or glob that holds, a FIFO,
        a character or block device or a socket is refused, naming the dep and the file (it
        is found with stat and never opened, since reading it could block while the stage is
        locked). Leave such a file out with O(ignore).
    type: list
    elements: raw
    default: []
  ignore:
    description:
      - Patterns left out of every directory dep, as in gitignore. C(*.tmp) matches a name at
        any depth, C(cache/) only directories, C(raw/*.csv) a path relative to the dep.
    type: list
    elements: str
    default: []
  params:
    description:
      - Parameters of the command, part of the key, written as JSON to O(params_file)
        (which is also valid YAML) before the command starts; its path is exported as
        C(ML_STAGE_PARAMS). Logged as MLflow params (nested keys dotted).
      - Must be JSON-serialisable (no NaN or Infinity).
    type: raw
    default: {}
  params_file:
    description:
      - Where to write O(params), relative to O(chdir). Default C(STATE_DIR/NAME.params.json).
      - Must lie inside O(chdir) once symlinks are resolved, must not be a directory, and must
        not lie in O(state_dir) unless it is that default, so it cannot overwrite the stage's
        lock, logs or caches.
    type: path
  outs:
    description:
      - Files or directories the command writes. Must lie inside O(chdir) unless
        O(allow_outs_outside_chdir). A command that exits 0 without producing all of them
        counts as failed.
    type: list
    elements: str
    default: []
  allow_outs_outside_chdir:
    description: Allow O(outs) outside O(chdir).
    type: bool
    default: false
  clean_outs:
    description:
      - Delete the declared O(outs) before running, so a stale output cannot pass for a new
        one.
    type: bool
    default: false
  metrics_file:
    description:
      - A JSON (or YAML) mapping the command writes; its numbers (nested keys dotted) are
        returned as C(metrics) and logged to MLflow in one batch. Implicitly an out, unless it
        lies inside a directory of O(outs), which covers it.
    type: path
  code:
    description: Fingerprint of the code the command runs; part of the key.
    type: dict
    suboptions:
      paths:
        description: Source files, directories or globs hashed like O(deps).
        type: list
        elements: str
      git:
        description:
          - A git checkout (C(true) for O(chdir), or a path). Its tree at HEAD, the hash of
            uncommitted changes and of untracked (not ignored) files are part of the key.
            The stage's own files (state dir, deps, outs, params file) are left out.
        type: raw
      python:
        description:
          - Fingerprint of a Python environment, the interpreter version and every installed
            distribution with its version. C(true) uses C(cmd[0]) when it is a python,
            else the module's interpreter; or give an interpreter path.
        type: raw
  force:
    description: Run even when nothing changed.
    type: bool
    default: false
  frozen:
    description: Never run; report (and warn) what would have made it run.
    type: bool
    default: false
  salt:
    description: Any string; changing it re-runs the stage (part of the key).
    type: str
    default: ''
  timeout:
    description: Seconds the command may run before it is killed (0 for no limit). A timeout is a failure.
    type: float
    default: 0
  lock_timeout:
    description:
      - Seconds to wait for another run of the same stage to finish; 0 fails at once,
        naming the process holding the lock.
      - Also how long to wait for processes left by an earlier run (one that was cut short,
        or processes that could not be stopped) before failing with their pids (see the notes).
    type: float
    default: 0
  leftover_processes:
    description:
      - What a run does with processes its command leaves running when it exits (a daemon,
        C(setsid sleep 600 &), a double fork, a job put in the background). They are found by
        the run token every process of the run inherits (see the notes).
      - C(fail) stops them (SIGTERM, SIGKILL after 10 s) and fails the stage naming their pids
        and command lines (C(changed=true), the previous lock is kept, the MLflow run ends
        C(FAILED)). A stage is done when its work is, and a daemon left behind would write the
        outputs beside the next run.
      - C(wait) waits for them as part of the command, within O(timeout) (without one, for as
        long as they run); past it they are stopped and the stage fails.
      - C(kill) stops them with a warning; the stage's result is the command's own.
    type: str
    choices: [fail, wait, kill]
    default: fail
  state_dir:
    description: Where the lock, stat cache and logs live, relative to O(chdir).
    type: path
    default: .ml_stage
  hash_algorithm:
    description:
      - C(auto) keeps the lock's algorithm while importable, else the fastest importable
        of xxh3_128, blake3, sha256 (measured by C(bench/stage)). xxh3_128 is sound for
        change detection but not against crafted collisions; choose blake3 (or sha256)
        when that matters; O(mlflow.reuse) requires one of them.
      - A change of algorithm re-runs the stage (hashes are not comparable).
    type: str
    choices: [auto, xxh3_128, blake3, sha256, md5]
    default: auto
  tail_lines:
    description: Lines of stdout and stderr returned in C(stdout_tail) and C(stderr_tail).
    type: int
    default: 40
  metrics_textfile_dir:
    description:
      - A node_exporter textfile-collector directory (Debian's prometheus-node-exporter reads
        C(/var/lib/prometheus/node-exporter)); relative paths are relative to O(chdir). Unset
        (the default), no metrics are kept or written.
      - After every run decision (ran and succeeded, ran and failed or timed out, or skipped
        because up to date or frozen) the module rewrites C(mlinfra_stage_NAME.prom) there
        (NAME with every character outside C([a-zA-Z0-9_]) turned into C(_), so names that
        differ only there share a file), atomically (a hidden C(.tmp) file in the same
        directory, renamed; mode 0644). Its series, all labelled C(stage) and O(metrics_labels)
        are C(mlinfra_stage_last_run_timestamp_seconds), C(mlinfra_stage_last_run_duration_seconds)
        and C(mlinfra_stage_last_run_success) (these three also C(mlflow_run_id), empty without
        MLflow), C(mlinfra_stage_last_success_timestamp_seconds) (kept across failures, absent
        until a success), and the counters C(mlinfra_stage_skipped_total) and
        C(mlinfra_stage_runs_total{result="success|failure"}).
      - The counters and the last run live in C(STATE_DIR/NAME.runstats.json), so the file can
        be rebuilt from it; a missing or corrupt one starts afresh (with a warning), seeded with
        the last success the lock records. Outputs reused from MLflow count as a successful run.
      - Writing this file is observability, like a log line, not managed state; a skipped
        stage still reports C(changed=false). A failed run writes it (success 0) and then fails
        as before. When the directory is missing or cannot be written, the stage runs anyway
        and the module warns; check mode writes nothing.
    type: path
  metrics_labels:
    description:
      - "Extra labels on every series of O(metrics_textfile_dir), e.g. C({pipeline: nightly})."
      - Names must match C([a-zA-Z_][a-zA-Z0-9_]*); C(stage), C(mlflow_run_id), C(result) and
        names starting with C(__) are reserved. Values are strings (numbers are converted).
    type: dict
    default: {}
  mlflow:
    description: Record real runs in an MLflow tracking server (REST API, no mlflow package needed).
    type: dict
    suboptions:
      tracking_uri:
        description: URL of the tracking server, e.g. C(http://mlflow.lab:5000).
        type: str
        required: true
      experiment:
        description: Experiment name; created when missing.
        type: str
        default: Default
      run_name:
        description: Run name; the stage name when unset.
        type: str
      tags:
        description: Extra tags for the run.
        type: dict
        default: {}
      credentials:
        description:
          - Basic-auth C(username)/C(password) or a bearer C(token). Exported to the command as
            C(MLFLOW_TRACKING_USERNAME)/C(MLFLOW_TRACKING_PASSWORD) or C(MLFLOW_TRACKING_TOKEN).
          - C(password) and C(token) are no_log; C(username) is not (Ansible would mask it in
            every message, e.g. a user C(ml) inside the word C(mlflow)).
        type: dict
        suboptions:
          username:
            type: str
            description: User name (basic auth).
          password:
            type: str
            description: Password (basic auth).
          token:
            type: str
            description: Bearer token.
      optional:
        description:
          - When the server is unreachable, run without tracking (with a warning) instead of
            failing before the command runs.
        type: bool
        default: false
      reuse:
        description:
          - Before running, search the experiment for a C(FINISHED) run with the same key whose
            outputs were uploaded and whose lock this task trusts; download them, verify every
            hash against that lock, and use them instead of running. Implies
            O(mlflow.upload_outs).
          - Anyone who can write to the tracking server could upload a run, so a lock is trusted
            only when it is signed under O(mlflow.signing_key), or when every out's hash equals
            O(mlflow.reuse_pins). One of the two is required.
          - The hashes are then what is trusted, so O(hash_algorithm) must be collision
            resistant (blake3 or sha256); C(auto) picks one of those.
        type: bool
        default: false
      signing_key:
        description:
          - A secret shared by this site's machines (at least 16 characters). The uploaded lock
            is signed with HMAC-SHA256 under it (artifact C(ml_stage/lock.json.sig), tag
            C(mlinfra.stage.signed_by) with the key's id, never the key), and O(mlflow.reuse)
            accepts only locks with a valid signature under this key.
          - The tracking server never sees the key, so its users cannot forge a lock.
        type: str
      reuse_pins:
        description:
          - Out -> the hash its lock must record (C(outs.<out>.hash) of a lock you trust). With
            O(mlflow.signing_key) unset, every out must be pinned; with it set, the pins are an
            extra condition.
        type: dict
      upload_outs:
        description: Upload the outs as artifacts under C(outs/) (default O(mlflow.reuse)).
        type: bool
      timeout:
        description: Seconds for each REST call.
        type: float
        default: 30
      validate_certs:
        description:
          - Verify the server's TLS certificate.
          - With V(false) the command also gets C(MLFLOW_TRACKING_INSECURE_TLS=true), unless its
            environment already sets that variable or C(MLFLOW_TRACKING_SERVER_CERT_PATH).
        type: bool
        default: true
      ca_path:
        description:
          - A PEM file of CA certificates on the target host, e.g. the private CA that signed
            an C(https://) tracking server's certificate. The server's certificate must chain to
            one of them; the system's CAs are not used then. Relative to O(chdir).
          - It must be a readable regular file holding at least one certificate. This is checked
            before anything is read or run, whatever the URL's scheme. With an C(http://)
            O(mlflow.tracking_uri) it is not used (a site may switch to https later).
          - The command gets C(MLFLOW_TRACKING_SERVER_CERT_PATH) set to its absolute path, so
            the C(mlflow) client in the command trusts the same CA. Setting that variable or
            C(MLFLOW_TRACKING_INSECURE_TLS) in O(env), O(secret_env) or O(runtime_env) as well
            is refused. Not part of the cache key.
          - Ignored when O(mlflow.validate_certs=false).
        type: path
        version_added: 0.3.0
  mps:
    description:
      - Run the command as a client of a CUDA MPS (Multi-Process Service) control daemon, so
        that it shares the GPU with other processes at the same time instead of in turns.
        The daemon is the role C(mlinfra.kvm.nvidia_mps) (or C(nvidia-cuda-mps-control -d));
        see docs/gpu-sharing.md.
      - The command gets C(CUDA_MPS_PIPE_DIRECTORY), and C(CUDA_MPS_LOG_DIRECTORY),
        C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and C(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) for the
        suboptions that are set; those that are not set are removed from the environment the
        module inherited, so the daemon's defaults apply. Setting any of these four in O(env)
        or O(secret_env) as well is refused.
      - B(Not part of the cache key.) These settings decide how the command shares the GPU, not
        what it computes, so adding, changing or removing O(mps) alone never re-runs a stage.
        They are recorded in the result (RV(mps)), in the lock's run record and, with O(mlflow),
        as the run's tags C(mlinfra.stage.mps.pipe_directory), C(mlinfra.stage.mps.log_directory),
        C(mlinfra.stage.mps.active_thread_percentage), C(mlinfra.stage.mps.pinned_device_mem_limit).
      - When the stage is due (never when it is skipped), before MLflow is contacted and before
        the command starts, the module checks that a daemon serves O(mps.pipe_directory), that is, the
        directory exists and holds the daemon's C(control) Unix socket. Without it a CUDA
        client silently runs without MPS, so the task fails instead, naming the directory and
        how to start the daemon. Check mode only reports it (C(daemon) in RV(mps), and a warning),
        because in a check run of a play the daemon started by an earlier role is only predicted.
        A socket left behind by a daemon that died also passes this check.
    type: dict
    suboptions:
      pipe_directory:
        description:
          - The daemon's pipe directory (its C(CUDA_MPS_PIPE_DIRECTORY); the nvidia_mps role's
            C(nvidia_mps_pipe_directory), default C(/run/nvidia-mps)). Relative paths are
            relative to O(chdir).
        type: path
        required: true
      log_directory:
        description: The daemon's log directory (C(CUDA_MPS_LOG_DIRECTORY)), e.g. C(/var/log/nvidia-mps).
        type: path
      active_thread_percentage:
        description:
          - Share of the GPU's SMs the command may use, 1-100 (C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)).
            Unset, the daemon's default applies.
        type: int
      pinned_device_mem_limit:
        description:
          - Device memory the command may allocate (C(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)) as
            C(DEVICE=SIZE) pairs separated by commas, sizes in C(M) or C(G) (as the nvidia_mps
            role takes them), e.g. C(0=16G) or C(0=16G,1=8192M). A bare size such as C(16G)
            means device 0, the first device the command sees. Unset, the daemon's default applies.
        type: str
notes:
  - Check mode reads only (files, and MLflow for reachability and the reuse search) and
    reports whether the stage would run and why; diff mode shows the old and new lock summaries.
  - The command gets C(ML_STAGE_NAME), C(ML_STAGE_KEY) and C(ML_STAGE_PARAMS) in its environment.
  - Its stdout and stderr go to C(STATE_DIR/NAME.stdout.log) and C(.stderr.log).
  - The lock, its manifest, the fcntl lock file, the run record and both logs are created with
    mode 0600 whatever the umask; a run makes an older log or fcntl lock file 0600 again.
  - The command ends with the module. It runs in its own process group under a small
    supervisor that stops the whole group (grandchildren too) when the module dies, SIGKILL
    included. SIGHUP (the SSH connection dropped), SIGTERM or SIGINT to the module stop the
    command (SIGTERM, SIGKILL after 10 s), end its MLflow run C(KILLED) and fail the task.
  - A run in progress is recorded in C(STATE_DIR/NAME.running.json) and every process of it
    carries C(ML_STAGE_RUN_TOKEN=NAME@DIGEST:RUN) in its environment (C(DIGEST) of the state
    directory, C(RUN) new for each run), readable from C(/proc/PID/environ). When the command
    exits, the processes with its token are handled as O(leftover_processes) says. Before any
    run, forced or not, processes of an earlier run of the stage that still run make it wait
    (O(lock_timeout)) and then fail naming their pids; check mode predicts that. A process
    started with a new environment (C(env -i)) does not carry the token and is not found. When a run was cut short, the next run
    finds processes that escaped the group (a daemon, C(setsid)) by that token and waits for
    them (O(lock_timeout)) or fails naming their pids, so two copies never write the same
    outputs; then it ends the MLflow run the dead run left C(RUNNING) as C(KILLED), says so in
    RV(interrupted_run) and a warning, and decides as usual (a cut-short run recorded no lock).
seealso:
  - name: ml_stage guide
    description: docs/ml_stage.md in the collection (design, lock format, benchmark).
    link: https://example.invalid/mlinfra/kvm/docs/ml_stage.md
'''

EXAMPLES = r'''
- name: Prepare the data set (re-runs when raw data, code or params change)
  mlinfra.kvm.ml_stage:
    name: prepare
    chdir: /srv/ml/project
    cmd: [/srv/ml/venv/bin/python, prepare.py]
    deps:
      - data/raw/
      - {path: data/extra/, ignore: ["*.tmp", "cache/"]}
    params: {val_split: 0.1, seed: 42}
    outs: [data/prepared/]
    code: {paths: [prepare.py], python: true}

- name: Train, tracked in MLflow (the script's mlflow.start_run() joins the same run)
  mlinfra.kvm.ml_stage:
    name: train
    chdir: /srv/ml/project
    cmd: [/srv/ml/venv/bin/python, train.py]
    deps: [data/prepared/]
    params: {lr: 0.02, epochs: 10, model: {depth: 12}}
    outs: [models/model.pt]
    metrics_file: metrics.json
    code: {git: true, python: true}
    env: {CUDA_VISIBLE_DEVICES: "0"}
    metrics_textfile_dir: /var/lib/prometheus/node-exporter
    metrics_labels: {pipeline: resnet}
    secret_env: {HF_TOKEN: "{{ vault_hf_token }}"}
    mps:                                   # share GPU 0 with other stages (role nvidia_mps)
      pipe_directory: /run/nvidia-mps
      log_directory: /var/log/nvidia-mps
      active_thread_percentage: 50
      pinned_device_mem_limit: 0=32G
    mlflow:
      tracking_uri: http://mlflow.lab:5000
      experiment: resnet
      credentials: {username: ml, password: "{{ vault_mlflow_password }}"}
  register: train

- ansible.builtin.debug:
    msg: "{{ train.reasons if train.changed else 'train is up to date' }}"

# The tracking server serves https with a certificate of the site's private CA: the module and
# the mlflow client in train.py both verify it against that CA.
- name: Train, tracked in MLflow over TLS
  mlinfra.kvm.ml_stage:
    name: train
    chdir: /srv/ml/project
    cmd: [/srv/ml/venv/bin/python, train.py]
    deps: [data/prepared/]
    outs: [models/model.pt]
    mlflow:
      tracking_uri: https://mlflow.lab:5443
      ca_path: /etc/mlinfra/mlflow-ca.pem
      experiment: resnet
      credentials: {username: ml, password: "{{ vault_mlflow_password }}"}

# Any worker of the site reuses the features another one already made (same key), but only
# from runs whose lock this site signed: the key is a vault secret the workers share, the
# tracking server sees only its signature.
- name: Features, made once per site
  mlinfra.kvm.ml_stage:
    name: features
    chdir: /srv/pipelines/resnet
    cmd: [python, features.py]
    deps: [data/raw/]
    outs: [data/features/]
    hash_algorithm: blake3
    mlflow:
      tracking_uri: http://mlflow.lab:5000
      experiment: resnet
      credentials: {username: ml, password: "{{ vault_mlflow_password }}"}
      reuse: true
      signing_key: "{{ vault_stage_signing_key }}"
'''

RETURN = r'''
interrupted_run:
  description:
    - What an earlier run of the stage that was cut short (the module killed) left, and what
      this run did about it; null when there was none.
    - C(mlflow) says what happened to its MLflow run (ended C(KILLED), already ended, or why
      it was left); C(still_running) (check mode only) lists processes a real run would wait for.
  returned: always
  type: dict
  sample: {started: "2026-11-30T19:52:01+0000", module_pid: 4242, pid: 4250, host: worker-0,
           cmd: [python, train.py], mlflow_run_id: 0f3a..., mlflow: "run 0f3a... was RUNNING; ended KILLED"}
interrupted_by:
  description: On failure, the signal that interrupted the module while its command ran.
  returned: when the module was interrupted
  type: str
  sample: SIGHUP
pids:
  description: On failure, processes of an earlier run of the stage that still run (nothing was started).
  returned: when such processes block the stage
  type: list
  elements: int
leftover_processes:
  description:
    - The processes the command left running when it exited, as found then (C(pid), C(cmd)),
      handled as O(leftover_processes) says; also, on a refusal, the earlier run's processes
      that block the stage.
  returned: when there were such processes
  type: list
  elements: dict
  sample: [{pid: 4321, cmd: "sleep 600"}]
changed:
  description: True when the command ran (or outputs were reused); in check mode, when it would.
  returned: always
  type: bool
ran:
  description: Whether the command was executed in this task.
  returned: always
  type: bool
would_run:
  description: Whether something made the stage due (also true for a frozen stage that was not run).
  returned: always
  type: bool
last_run:
  description: When the stage did not run, the run record of its lock (host, finished, duration,
    mlflow); empty without a lock.
  returned: when the stage did not run
  type: dict
last_mlflow_run_id:
  description: When the stage did not run, the MLflow run id of the run that made its outputs.
  returned: when the stage did not run
  type: str
summary:
  description: One sentence for logs and summaries; the reasons joined when the stage runs,
    otherwise why it does not (up to date with its key, or frozen).
  returned: always
  type: str
  sample: "up to date: key 3f9a0c1e22b4 matches the lock (command, 2 deps, params, code and 1 outs unchanged)"
reasons:
  description: Why the stage runs, in words; empty when it is up to date.
  returned: always
  type: list
  elements: str
  sample: ["param lr 0.01 -> 0.02", "dep data/: 3 modified, 1 added (data/a.csv, data/b.csv, data/c.csv, ...)", "out model.pt missing"]
key:
  description: The cache key of the current inputs.
  returned: always
  type: str
previous_key:
  description: The key of the last successful run (null without a lock).
  returned: always
  type: str
algorithm:
  description: The content hash algorithm used.
  returned: always
  type: str
frozen:
  description: The O(frozen) option as given (a frozen stage reports when it is due but never runs).
  returned: always
  type: bool
params_file:
  description:
    - The file the parameters are written to, relative to O(chdir) - O(params_file), or the file under
      the stage's state directory when only O(params) is given; null without parameters.
  returned: always
  type: str
rc:
  description: Exit status of the command.
  returned: when the command ran
  type: int
duration:
  description: Seconds the command ran.
  returned: when the command ran
  type: float
stdout_tail:
  description: The last O(tail_lines) lines of stdout.
  returned: when the command ran
  type: str
stderr_tail:
  description: The last O(tail_lines) lines of stderr.
  returned: when the command ran
  type: str
stdout_log:
  description: The file on the target host that holds the command's whole stdout (of its last run).
  returned: when the command ran
  type: str
stderr_log:
  description: The file on the target host that holds the command's whole stderr (of its last run).
  returned: when the command ran
  type: str
deps:
  description: Each dep's kind, hash, number of files and size.
  returned: always
  type: dict
outs:
  description: Each out's kind, hash, number of files and size (kind C(missing) when absent).
  returned: always
  type: dict
metrics:
  description: Numbers read from O(metrics_file) after a successful run.
  returned: when the command ran
  type: dict
mlflow:
  description: C(enabled), and C(run_id), C(experiment_id), C(run_url) of the run made.
  returned: always
  type: dict
mlflow_run_id:
  description: The MLflow run made by this task (null when none), same as C(mlflow.run_id).
  returned: always
  type: str
reused_from:
  description: MLflow run whose outputs were fetched instead of running.
  returned: when outputs were reused
  type: str
reuse_from:
  description: In check mode, the MLflow run whose outputs a real run would try to fetch.
  returned: check mode with O(mlflow.reuse), when such a run exists
  type: str
hashing:
  description: Files looked at, hashed and served from the stat cache, bytes hashed, seconds.
  returned: always
  type: dict
lock_file:
  description: Path of the lock.
  returned: always
  type: str
mps:
  description:
    - The O(mps) settings as the command gets them (paths absolute) and C(env), the
      CUDA_MPS_* variables set; null without O(mps).
    - C(daemon) is null when the stage did not come to run (up to date or frozen; nothing was
      checked), C(ok) and the socket's path when the daemon's control socket was found, else (check mode only;
      a real run fails) why no daemon seems to serve the pipe directory.
  returned: always
  type: dict
  sample: {pipe_directory: /run/nvidia-mps, log_directory: /var/log/nvidia-mps,
           active_thread_percentage: 50, pinned_device_mem_limit: "0=32G",
           env: {CUDA_MPS_PIPE_DIRECTORY: /run/nvidia-mps, CUDA_MPS_LOG_DIRECTORY: /var/log/nvidia-mps,
                 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "50", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "0=32G"},
           daemon: "ok: /run/nvidia-mps/control is a socket"}
runtime_env:
  description: The O(runtime_env) the command got (or would get).
  returned: always
  type: dict
inputs_digest:
  description:
    - One short digest per part of the cache key (C(cmd), C(env), C(params), C(outs),
      C(deps/PATH), C(code/paths/PATH), C(code/python), ...). Two hosts whose RV(key) differs
      compare these to name the input that differs.
  returned: always
  type: dict
  sample: {algorithm: 5d1c0e..., cmd: 9b2f..., "deps/work/prepared": 77aa..., "code/python": 0c41..., params: 1e0b...}
code_python:
  description:
    - With O(code.python), the interpreter's fingerprint that is part of the key (C(python)
      version, C(implementation) and C(dists), every installed distribution's version).
  returned: always
  type: dict
metrics_textfile:
  description:
    - The C(.prom) file written in O(metrics_textfile_dir) for this run decision (also on a
      failed run); null when the option is unset, in check mode, or when it could not be
      written (see the warning).
  returned: always
  type: str
  sample: /var/lib/prometheus/node-exporter/mlinfra_stage_train.prom
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_runner import StageRunner
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._stage_spec import ARGUMENT_SPEC


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module, lambda: StageRunner(module).run())


if __name__ == "__main__":
    main()
