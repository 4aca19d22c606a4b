#!/usr/bin/env bash
# CUDA MPS on one real H200 (the device tool's machine: root, python3 with torch, gVisor sandbox):
# bf16 matmul throughput (N^3, default 8192^3) of one process alone, of two processes sharing the
# GPU by time-slicing (no MPS), and of two processes attached to an MPS control daemon started
# here in user space. nvidia-cuda-mps-control may be absent: that is detected and reported.
# Read-only towards the GPU's settings: no MIG, compute-mode, persistence, clock or power changes;
# the MPS daemon gets its own pipe and log directories under /tmp and is told to quit on every
# exit path (trap). While that daemon runs, one mlinfra.kvm.ml_stage task (through
# `ansible localhost -m`, when ansible is installed) runs a CUDA matmul with mps set: it must run,
# see its CUDA_MPS_* variables, skip on a second run and on a change of the thread share alone,
# and fail before running against a pipe directory without a daemon.
# About 2 minutes; never more than BUDGET (165 s) plus the clean-up.
#   run from the repo root:  OUT=/some/dir bash tests/device/h200_mps.sh
# Outputs in $OUT (at most 8 files): summary.json, run.log (this script's log), single.log,
# timeslice.log, mps.log (the workers' stdout/stderr), mps-daemon.log (control.log, server.log and
# the daemon's answers), nvidia-smi.txt, ml_stage.log (the ml_stage results, control.log's new lines).
# Knobs: PYTHON (an interpreter with torch), N, DURATION (s of matmuls per process), READY_TIMEOUT,
# BENCH_DEVICE=cpu (dry runs of the plumbing without a GPU), ANSIBLE (the ansible program).
set -euo pipefail
OUT="${OUT:?set OUT to the directory whose files come back}"
N="${N:-8192}"
DURATION="${DURATION:-10}"
READY_TIMEOUT="${READY_TIMEOUT:-40}"   # seconds for the workers to import torch and warm up
BUDGET="${BUDGET:-165}"                # seconds for the whole script; a phase that cannot finish in time is skipped
BENCH_DEVICE="${BENCH_DEVICE:-cuda}"
WORK="$(mktemp -d /tmp/h200-mps.XXXXXX)"
MPS_PIPE="$WORK/mps-pipe"
MPS_LOG="$WORK/mps-log"
NO_MPS_PIPE="$WORK/no-mps"             # an empty pipe directory: clients find no daemon there
MPS_CONTROL=""
MPS_STARTED=0
REPO="$PWD"                            # the repo root: collections/ansible_collections/mlinfra/kvm -> it
ANSIBLE_BIN="${ANSIBLE:-$(command -v ansible 2>/dev/null || true)}"
STAGE_STATUS="not_run"
WORKER_PIDS=()
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$MPS_PIPE" "$MPS_LOG" "$NO_MPS_PIPE"
exec > >(tee -a "$OUT/run.log") 2>&1
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }

mps_ctl() {  # mps_ctl COMMAND: one command to the daemon of $MPS_PIPE, its answer on stdout
  printf '%s\n' "$1" | CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" \
    timeout -k 5 20 "$MPS_CONTROL" 2>&1
}

cleanup() {
  local rc=$?
  set +e
  if [ "${#WORKER_PIDS[@]}" -gt 0 ]; then  # timeout passes TERM on to the worker it runs
    kill -TERM "${WORKER_PIDS[@]}" 2>/dev/null; sleep 2; kill -KILL "${WORKER_PIDS[@]}" 2>/dev/null
  fi
  if [ "$MPS_STARTED" = 1 ]; then
    log "quitting the MPS daemon"
    { echo "== quit"; mps_ctl quit; echo "rc=$?"; } >>"$WORK/daemon-answers.txt"
    sleep 1
  fi
  {
    for f in "$WORK/daemon-answers.txt" "$MPS_LOG/control.log" "$MPS_LOG/server.log"; do
      [ -f "$f" ] && { echo "== ${f#"$WORK"/}"; cat "$f"; }
    done
  } >"$OUT/mps-daemon.log" 2>/dev/null
  [ -s "$OUT/mps-daemon.log" ] || rm -f "$OUT/mps-daemon.log"
  rm -rf "$WORK"
  log "exit $rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

find_python() {
  local p
  for p in "${PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
    [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1 && { echo "$p"; return 0; }
  done
  return 1
}
PY="$(find_python)" || { log "FAIL: no python3 with torch (set PYTHON)"; exit 2; }
log "python: $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"

# -- the GPU, read only ------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,compute_mode,clocks.max.sm,power.limit \
    --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
  log "gpu: $(tail -n +2 "$OUT/nvidia-smi.txt" | head -1)"
else
  echo "no nvidia-smi on PATH" >"$OUT/nvidia-smi.txt"
fi

# -- is MPS there? ----------------------------------------------------------------------------------------
for candidate in "$(command -v nvidia-cuda-mps-control 2>/dev/null || true)" /usr/local/nvidia/bin/nvidia-cuda-mps-control \
  /usr/bin/nvidia-cuda-mps-control; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then MPS_CONTROL="$candidate"; break; fi
done
log "nvidia-cuda-mps-control: ${MPS_CONTROL:-NOT PRESENT}"
if [ -e /tmp/nvidia-mps/control ]; then
  log "note: a daemon's pipe exists at /tmp/nvidia-mps (the default); the non-MPS runs point elsewhere"
fi

cat >"$WORK/worker.py" <<'PY'
"""One benchmark process: warm up, say ready, wait for go, run bf16 matmuls for DURATION s."""
import json, os, sys, time, traceback
name, n, duration, work, result = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
out = {"name": name, "pid": os.getpid(), "n": n,
       "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}
try:
    import torch
    device = os.environ.get("BENCH_DEVICE", "cuda")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(0)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        c = a @ b
    sync()
    open(os.path.join(work, "ready-" + name), "w").close()
    go = os.path.join(work, "go")
    deadline = time.time() + 300
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.005)
    t0 = time.time()
    iters = 0
    while True:
        for _ in range(4):          # a few launches per check keeps the GPU's queue full
            c = a @ b
        iters += 4
        sync()
        if time.time() - t0 >= duration:
            break
    t1 = time.time()
    out.update(iters=iters, t0=t0, t1=t1, seconds=t1 - t0, tflops=2.0 * n ** 3 * iters / (t1 - t0) / 1e12,
               checksum=float(c[0, 0].float()))
    rc = 0
except Exception as exc:  # reported in the summary, never swallowed
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
    out["traceback"] = traceback.format_exc()[-2000:]
    rc = 1
with open(result, "w") as handle:
    json.dump(out, handle)
print(json.dumps({k: v for k, v in out.items() if k != "traceback"}))
sys.exit(rc)
PY

# run_phase NAME COUNT PIPE_DIR: COUNT workers at once, all clients of the daemon at PIPE_DIR (or of
# none); their output goes to $OUT/NAME.log, their results to $WORK/NAME-*.json.
run_phase() {
  local name=$1 count=$2 pipe=$3 i waited=0 rc=0 limit=$((READY_TIMEOUT + DURATION + 10)) left=$((BUDGET - SECONDS))
  if [ "$left" -lt $((DURATION + 20)) ]; then
    log "$name: skipped, only ${left}s of the ${BUDGET}s budget left"
    return 3
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  rm -f "$WORK"/ready-* "$WORK/go"
  WORKER_PIDS=()
  for i in $(seq 1 "$count"); do
    CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" BENCH_DEVICE="$BENCH_DEVICE" \
      timeout -k 5 "$limit" "$PY" "$WORK/worker.py" "$name-$i" "$N" "$DURATION" \
      "$WORK" "$WORK/$name-$i.json" >>"$OUT/$name.log" 2>&1 &
    WORKER_PIDS+=($!)
  done
  while [ "$(find "$WORK" -maxdepth 1 -name 'ready-*' | wc -l)" -lt "$count" ]; do
    if [ "$waited" -ge $((READY_TIMEOUT * 10)) ]; then log "$name: not every worker got ready in ${READY_TIMEOUT}s"; break; fi
    if ! kill -0 "${WORKER_PIDS[@]}" 2>/dev/null; then log "$name: a worker exited before it was ready"; break; fi
    sleep 0.1; waited=$((waited + 1))
  done
  touch "$WORK/go"
  if [ "$pipe" = "$MPS_PIPE" ]; then  # while they run: does the daemon serve them?
    sleep 2
    { echo "== get_server_list during $name"; mps_ctl get_server_list
      echo "== nvidia-smi compute apps during $name"
      nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1 || true; } >>"$WORK/daemon-answers.txt"
  fi
  for pid in "${WORKER_PIDS[@]}"; do wait "$pid" || rc=$?; done
  WORKER_PIDS=()
  log "$name: workers done (last non-zero rc: $rc)"
}

# stage_call TAG PIPE PERCENT SEED: one ml_stage task with mps (pipe directory PIPE, thread share
# PERCENT; SEED is a param, so a new one makes the stage due) through `ansible localhost -m`; its
# output (the default callback, results as one-line JSON: "localhost | CHANGED => {...}") goes to
# $WORK/stage-TAG.out. (ansible-core has no json stdout callback of its own.)
stage_call() {
  local args limit=$((BUDGET - SECONDS))
  if [ "$limit" -lt 10 ]; then echo "== $1: skipped, ${limit}s of the budget left" >>"$OUT/ml_stage.log"; return 0; fi
  args=$("$PY" - "$WORK/stage" "$2" "$MPS_LOG" "$3" "$4" "$(command -v "$PY")" "$BENCH_DEVICE" <<'PY'
import json, sys
chdir, pipe, log, percent, seed, python, device = sys.argv[1:8]
print(json.dumps({"name": "mps-matmul", "chdir": chdir, "cmd": [python, "see_mps.py"],
                  "outs": ["stage-out.json"], "params": {"seed": int(seed)}, "env": {"BENCH_DEVICE": device},
                  "code": {"paths": ["see_mps.py"]}, "timeout": 90,
                  "mps": {"pipe_directory": pipe, "log_directory": log,
                          "active_thread_percentage": int(percent), "pinned_device_mem_limit": "0=8G"}}))
PY
  ) || { echo "== $1: could not build the module arguments" >>"$OUT/ml_stage.log"; return 0; }
  ANSIBLE_CONFIG="$REPO/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$REPO/collections" ANSIBLE_NOCOLOR=1 \
    ANSIBLE_CALLBACK_RESULT_FORMAT=json ANSIBLE_CALLBACK_FORMAT_PRETTY=0 \
    ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0 \
    timeout -k 5 "$limit" "$ANSIBLE_BIN" localhost -i localhost, -c local -m mlinfra.kvm.ml_stage -a "$args" \
    -e "ansible_python_interpreter=$(command -v "$PY")" >"$WORK/stage-$1.out" 2>>"$OUT/ml_stage.log" || true
}

# run_stage_phase: the ml_stage checks against the running daemon (see the header); the verdict
# in $STAGE_STATUS, the details in $WORK/ml_stage.json and $OUT/ml_stage.log.
run_stage_phase() {
  local left=$((BUDGET - SECONDS)) before=0
  if [ -z "$ANSIBLE_BIN" ]; then STAGE_STATUS="skipped_no_ansible"; return 0; fi
  if [ "$left" -lt 60 ]; then STAGE_STATUS="skipped_time_budget"; log "ml_stage: skipped, ${left}s left"; return 0; fi
  mkdir -p "$WORK/stage"
  cat >"$WORK/stage/see_mps.py" <<'PY'
import json, os
out = {"pid": os.getpid(), "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")}}
if os.environ.get("BENCH_DEVICE", "cuda") == "cuda":   # the CUDA call that makes it an MPS client
    import torch
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    c = a @ a
    torch.cuda.synchronize()
    out["checksum"] = float(c[0, 0].float())
with open("stage-out.json", "w") as handle:
    json.dump(out, handle)
PY
  [ -f "$MPS_LOG/control.log" ] && before=$(wc -l <"$MPS_LOG/control.log")
  log "ml_stage: 4 tasks with mps through $ANSIBLE_BIN"
  stage_call first "$MPS_PIPE" 50 1
  { echo "== control.log lines written during the first ml_stage run"
    [ -f "$MPS_LOG/control.log" ] && tail -n +"$((before + 1))" "$MPS_LOG/control.log"; } >>"$OUT/ml_stage.log" || true
  stage_call second "$MPS_PIPE" 50 1
  stage_call percentage "$MPS_PIPE" 25 1
  stage_call no_daemon "$NO_MPS_PIPE" 50 2
  STAGE_STATUS=$("$PY" - "$WORK" "$OUT/ml_stage.log" "$MPS_PIPE" "$NO_MPS_PIPE" "$before" "$MPS_LOG/control.log" <<'PY'
import json, os, sys
work, log_path, pipe, no_pipe, before, control_log = sys.argv[1:7]

def result(tag):
    try:
        with open(os.path.join(work, "stage-%s.out" % tag)) as handle:
            lines = [l for l in handle.read().splitlines() if l.startswith("localhost | ") and " => {" in l]
        res = json.loads(lines[-1].split(" => ", 1)[1])
        res["failed"] = lines[-1].split(" => ", 1)[0].split(" | ")[1] != "SUCCESS" and \
            lines[-1].split(" => ", 1)[0].split(" | ")[1] != "CHANGED"   # the callback drops "failed"
        return res
    except (OSError, ValueError, IndexError) as exc:
        return {"failed": True, "msg": "no result (%s: %s)" % (type(exc).__name__, exc)}

res = {tag: result(tag) for tag in ("first", "second", "percentage", "no_daemon")}
try:
    with open(os.path.join(work, "stage", "stage-out.json")) as handle:
        seen = json.load(handle)
except (OSError, ValueError):
    seen = {}
try:
    with open(control_log) as handle:
        new_lines = handle.read().splitlines()[int(before):]
except OSError:
    new_lines = []
checks = {
    "first_ran": bool(res["first"].get("ran")) and not res["first"].get("failed"),
    "daemon_found": str((res["first"].get("mps") or {}).get("daemon", "")).startswith("ok"),
    "command_saw_pipe": seen.get("env", {}).get("CUDA_MPS_PIPE_DIRECTORY") == pipe,
    "command_saw_percentage": seen.get("env", {}).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50",
    "second_skipped": res["second"].get("changed") is False and not res["second"].get("failed"),
    "percentage_alone_skipped": res["percentage"].get("changed") is False and not res["percentage"].get("failed"),
    "no_daemon_refused": bool(res["no_daemon"].get("failed"))
    and "option mps.pipe_directory: value '%s'" % no_pipe in str(res["no_daemon"].get("msg")),
}
summary = {"status": "ok" if all(checks.values()) else "failed", "checks": checks,
           "command_pid": seen.get("pid"), "checksum": seen.get("checksum"),
           # evidence, not a check: the daemon logs its clients (the format is the driver's)
           "control_log_new_lines": len(new_lines),
           "control_log_mentions_command_pid": bool(seen.get("pid")) and any(str(seen["pid"]) in l for l in new_lines),
           "results": {tag: {k: r.get(k) for k in ("changed", "failed", "ran", "msg", "summary", "mps", "rc",
                                                   "stderr_tail")} for tag, r in res.items()}}
with open(os.path.join(work, "ml_stage.json"), "w") as handle:
    json.dump(summary, handle, indent=1)
with open(log_path, "a") as handle:
    handle.write("== ml_stage summary\n" + json.dumps(summary, indent=1) + "\n")
print(summary["status"])
PY
  ) || STAGE_STATUS="summary_failed"
  log "ml_stage: $STAGE_STATUS"
}

log "single: 1 process, ${N}^3 matmuls ($BENCH_DEVICE) for ${DURATION}s"
run_phase single 1 "$NO_MPS_PIPE" || true
BASELINE=0
[ -f "$WORK/single-1.json" ] && grep -q '"tflops"' "$WORK/single-1.json" && BASELINE=1
if [ "$BASELINE" = 1 ]; then
  log "timeslice: 2 processes at once, no MPS"
  run_phase timeslice 2 "$NO_MPS_PIPE" || true
else
  log "the single-process baseline failed: skipping the shared runs (see single.log)"
fi

MPS_STATUS="not_present"
if [ "$BASELINE" = 0 ]; then
  MPS_STATUS="skipped_baseline_failed"
elif [ -n "$MPS_CONTROL" ]; then
  log "starting the MPS control daemon (pipe $MPS_PIPE)"
  if CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" timeout -k 5 20 "$MPS_CONTROL" -d \
      >>"$WORK/daemon-answers.txt" 2>&1; then
    MPS_STARTED=1
    sleep 1
    if answer=$(mps_ctl get_server_list); then
      echo "== get_server_list before: [$answer]" >>"$WORK/daemon-answers.txt"
      log "mps: 2 processes at once through the daemon"
      if run_phase mps 2 "$MPS_PIPE"; then MPS_STATUS="ran"; else MPS_STATUS="skipped_time_budget"; fi
      { echo "== get_server_list after"; mps_ctl get_server_list; } >>"$WORK/daemon-answers.txt" || true
      run_stage_phase
    else
      echo "== get_server_list failed: $answer" >>"$WORK/daemon-answers.txt"
      MPS_STATUS="daemon_not_answering"
    fi
  else
    MPS_STATUS="daemon_failed_to_start"
  fi
fi
log "mps: $MPS_STATUS; ml_stage: $STAGE_STATUS"

# -- the summary -------------------------------------------------------------------------------------------
"$PY" - "$WORK" "$OUT/summary.json" "$MPS_STATUS" "${MPS_CONTROL:-}" "$N" "$DURATION" "$BENCH_DEVICE" "$BASELINE" \
  "$STAGE_STATUS" <<'PY'
import json, os, sys
work, dest, mps_status, control, n, duration, device, baseline, stage_status = sys.argv[1:10]

def phase(name, expected):
    runs, errors = [], []
    for i in range(1, expected + 1):
        path = os.path.join(work, "%s-%d.json" % (name, i))
        if not os.path.exists(path):
            errors.append("%s-%d: no result (timed out or crashed; see %s.log)" % (name, i, name))
            continue
        with open(path) as handle:
            runs.append(json.load(handle))
    ok = [r for r in runs if "tflops" in r]
    out = {"processes": expected, "succeeded": len(ok),
           "per_process_tflops": [round(r["tflops"], 1) for r in ok],
           "errors": errors + [r["name"] + ": " + r["error"] for r in runs if "error" in r]}
    if ok:
        span = max(r["t1"] for r in ok) - min(r["t0"] for r in ok)
        overlap = min(r["t1"] for r in ok) - max(r["t0"] for r in ok)
        out["combined_tflops"] = round(sum(2.0 * r["n"] ** 3 * r["iters"] for r in ok) / span / 1e12, 1)
        out["wall_s"] = round(span, 2)
        out["overlap_s"] = round(overlap, 2)
    return out

answers = ""
try:
    with open(os.path.join(work, "daemon-answers.txt")) as handle:
        answers = handle.read()
except OSError:
    pass
during = answers.split("== get_server_list during mps", 1)[1].split("==", 1)[0] if "during mps" in answers else ""
summary = {
    "n": int(n), "duration_s": float(duration), "device": device, "dtype": "bfloat16" if device == "cuda" else "float32",
    "single": phase("single", 1),
    "timeslice": phase("timeslice", 2) if baseline == "1" else {"skipped": True},
    "mps": dict(phase("mps", 2) if mps_status == "ran" else {}, status=mps_status, control=control or None,
                server_pids_during_run=[int(t) for t in during.split() if t.isdigit()]),
}
stage = {"status": stage_status}
if os.path.exists(os.path.join(work, "ml_stage.json")):
    with open(os.path.join(work, "ml_stage.json")) as handle:
        stage = dict(json.load(handle), status=stage_status)
    stage.pop("results", None)   # the full results are in ml_stage.log
summary["ml_stage"] = stage
single = summary["single"].get("combined_tflops")
for key in ("timeslice", "mps"):
    if single and summary[key].get("combined_tflops"):
        summary[key]["vs_single"] = round(summary[key]["combined_tflops"] / single, 3)
with open(dest, "w") as handle:
    json.dump(summary, handle, indent=1)
print(json.dumps(summary, indent=1))
PY

if [ "$BASELINE" != 1 ]; then
  log "FAIL: the single-process baseline did not run (see single.log)"
  exit 1
fi
case "$STAGE_STATUS" in
  failed|summary_failed) log "FAIL: ml_stage under MPS: $STAGE_STATUS (see ml_stage.log)"; exit 1 ;;
esac
log "done; MPS: $MPS_STATUS; ml_stage under MPS: $STAGE_STATUS"
