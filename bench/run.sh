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
