#!/usr/bin/env bash
# ml_stage vs DVC benchmark (issue 5). Entry point for `make bench`.
#
#   bench/stage/run.sh [--repeat N] [--scenarios a,b] [--workdir DIR] [--quick]
#
# Installs DVC (bench/stage/requirements.txt) into bench/results/.venv-dvc on first use,
# generates the data sets under /tmp/mlstage-bench (reused by later runs; about 1.3 GiB),
# and writes bench/results/stage/summary.json next to a table on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
DVC_VENV=${DVC_VENV:-$ROOT/bench/results/.venv-dvc}
if [ ! -x "$DVC_VENV/bin/dvc" ]; then
  echo "bench/stage: installing DVC into $DVC_VENV (bench only)" >&2
  "$PY" -m venv "$DVC_VENV"
  "$DVC_VENV/bin/pip" install -q -r "$ROOT/bench/stage/requirements.txt"
fi
exec "$PY" "$ROOT/bench/stage/bench.py" --dvc-venv "$DVC_VENV" "$@"
