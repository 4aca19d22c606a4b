#!/usr/bin/env bash
# make bench: every benchmark, one after another (they share the 2 cores; never in parallel).
# Results: bench/results/*.json, plus a table each on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p bench/results
echo "== foundation: 50 networks, 50 pools, 200 volumes; no-op re-run vs community.libvirt"
.venv/bin/python bench/foundation/run.py "$@"
echo "== domains: 100 domains no-op re-run vs community.libvirt.virt; inventory of 500 domains"
bash bench/domains/run.sh
echo "== ml_stage: no-op check and hashing throughput vs DVC"
bash bench/stage/run.sh
if [ "${MLKVM_BENCH_LAB:-1}" != 0 ]; then
  echo "== lab: the first make lab and a make lab with nothing to change, per-host module executions (about 30 min; MLKVM_BENCH_LAB=0 leaves it out)"
  .venv/bin/python bench/lab/run.py
fi
