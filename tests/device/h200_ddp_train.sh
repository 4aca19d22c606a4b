#!/usr/bin/env bash
# The pipeline's train stage (roles/pipeline/files/train.py) on one real H200 (the device tool's
# machine: python3 with torch and numpy, no mlflow, no network): a reference dataset of
# 4,000,000 x 64 float32 training rows, trained 30 full-batch epochs at precision auto, once by
# plain python3 and once as a one-rank torchrun job (NCCL) that also writes the rank report.
# Issue 12's target: rows_per_s >= 250 M rows/s (the naive fp32 loop did 93.6 M rows/s).
# Read-only towards the GPU's settings (no MIG, clock, power or persistence changes).
#   run from the repo root:  OUT=/some/dir bash tests/device/h200_ddp_train.sh
# With COMPILED=1 (the default) both run again with compile: true (torch.compile), as
# plain-compiled and ddp-compiled.
# Outputs in $OUT (at most 8 files): plain.log, ddp.log, ... (stdout and stderr of each run),
# rank-0.json (the NCCL rank report, shard_indices summarised), nvidia-smi.txt, summary.json.
# Smaller dry runs (CPU is fine): ROWS=20000 TEST_ROWS=2000 EPOCHS=5 PYTHON=.../python OUT=...
set -euo pipefail
OUT="${OUT:?set OUT to the directory whose files come back}"
PYTHON="${PYTHON:-python3}"
ROWS="${ROWS:-4000000}"
TEST_ROWS="${TEST_ROWS:-500000}"
FEATURES="${FEATURES:-64}"
EPOCHS="${EPOCHS:-30}"
RUN_TIMEOUT="${RUN_TIMEOUT:-60}"   # per training run (seconds): all steps together stay under 3.5 min
WORK="$(mktemp -d /tmp/h200-ddp-train.XXXXXX)"
TRAIN=roles/pipeline/files/train.py
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
trap 'rm -rf "$WORK"' EXIT
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,clocks.max.sm,power.limit \
    --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
else
  echo "no nvidia-smi" >"$OUT/nvidia-smi.txt"
fi
log "gpu: $(tail -n +2 "$OUT/nvidia-smi.txt" | head -1)"

# Reference data, written as train.py's prepared directory: y = x.w + 0.25 + N(0, 0.1^2).
log "data: $ROWS train + $TEST_ROWS test rows x $FEATURES features"
timeout -k 5 45 "$PYTHON" - "$WORK/prepared" "$ROWS" "$TEST_ROWS" "$FEATURES" <<'PY'
import os, sys
import numpy as np
out, rows, test_rows, features = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(20261130)
w = (rng.standard_normal(features) / np.sqrt(features)).astype(np.float32)
os.makedirs(out)
for name, n in (("train", rows), ("test", test_rows)):
    x = rng.standard_normal((n, features), dtype=np.float32)
    y = (x @ w + np.float32(0.25) + rng.normal(0.0, 0.1, n).astype(np.float32)).astype(np.float32)
    np.save(os.path.join(out, "x_%s.npy" % name), x)
    np.save(os.path.join(out, "y_%s.npy" % name), y)
PY
for compile in false true; do  # params.json: the pipeline's default; params-compiled.json: compile: true
  suffix=$([ "$compile" = true ] && echo -compiled || true)
  cat >"$WORK/params$suffix.json" <<EOF
{"epochs": $EPOCHS, "lr": 0.003, "hidden": [256, 128], "dropout": 0.1, "batch_size": 0,
 "seed": 7, "precision": "auto", "dist_timeout_s": 120, "compile": $compile}
EOF
done

# train NAME LAUNCHER...: runs train.py, leaves $OUT/NAME.log and the rc in $WORK/NAME.rc
train() {
  local name=$1 rc=0 start end; shift
  start=$(date +%s.%N)
  ML_STAGE_PARAMS="$WORK/${PARAMS:-params.json}" timeout -k 10 "$RUN_TIMEOUT" "$@" "$TRAIN" "$WORK/prepared" \
    "$WORK/$name.pt" "$WORK/$name.metrics.json" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  end=$(date +%s.%N)
  echo "$rc" >"$WORK/$name.rc"
  echo "$start $end" >"$WORK/$name.time"
  { echo "== $* $TRAIN (rc $rc)"; echo "== stdout"; cat "$WORK/$name.out"; echo "== stderr";
    cat "$WORK/$name.err"; } >"$OUT/$name.log"
  log "$name: rc $rc, $(grep '^{' "$WORK/$name.out" | tail -1 || true)"
}

train plain "$PYTHON"
ML_TRAIN_RANK_REPORT_DIR="$WORK/reports" \
  train ddp "$PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=1
NAMES=(plain ddp)
if [ "${COMPILED:-1}" = 1 ]; then  # the same two with torch.compile (the first, untimed epoch compiles)
  PARAMS=params-compiled.json train plain-compiled "$PYTHON"
  PARAMS=params-compiled.json train ddp-compiled "$PYTHON" -m torch.distributed.run --standalone --nnodes=1 \
    --nproc-per-node=1
  NAMES+=(plain-compiled ddp-compiled)
fi

timeout -k 5 30 "$PYTHON" - "$WORK" "$OUT" "${NAMES[@]}" <<'PY'
import hashlib, json, os, sys
work, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
summary = {"target_rows_per_s": 250e6, "naive_rows_per_s": 93.6e6, "runs": {}}
for name in names:
    lines = [l for l in open(os.path.join(work, name + ".out")) if l.startswith("{")]
    start, end = map(float, open(os.path.join(work, name + ".time")).read().split())
    run = {"rc": int(open(os.path.join(work, name + ".rc")).read()), "wall_s": round(end - start, 1)}
    if lines:
        result = json.loads(lines[-1])
        run.update({k: result.get(k) for k in ("rows_per_s", "device", "precision", "world_size", "backend",
                                                 "epochs", "final_train_loss", "test_rmse")})
        run["target_met"] = bool(result.get("rows_per_s") and result["rows_per_s"] >= 250e6)
    summary["runs"][name] = run
report_path = os.path.join(work, "reports", "rank-0.json")
if os.path.exists(report_path):
    report = json.load(open(report_path))
    indices = report.pop("shard_indices")
    report["shard_indices_summary"] = {
        "count": len(indices), "distinct": len(set(indices)), "min": min(indices), "max": max(indices),
        "sha256": hashlib.sha256(json.dumps(indices).encode()).hexdigest(), "head": indices[:10]}
    json.dump(report, open(os.path.join(out, "rank-0.json"), "w"), indent=1)
    summary["rank_report"] = {k: report[k] for k in ("rank", "world_size", "backend", "device", "shard_rows")}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
fmt = lambda name, r: "%s rc=%s %s/%s world=%s backend=%s rows_per_s=%s wall=%ss" % (
    name, r["rc"], r.get("device"), r.get("precision"), r.get("world_size"), r.get("backend"),
    "%.4gM" % (r["rows_per_s"] / 1e6) if r.get("rows_per_s") else None, r["wall_s"])
print("SUMMARY " + " | ".join(fmt(name, r) for name, r in summary["runs"].items())
      + " | target 250M rows/s: " + ("met" if all(r.get("target_met") for r in summary["runs"].values())
                                     else "NOT met"))
PY
for name in "${NAMES[@]}"; do [ "$(cat "$WORK/$name.rc")" = 0 ] || exit 1; done
