#!/usr/bin/env bash
# Run the named test tiers in order (fastest first), each as its own pytest run so a
# failure in a fast tier is reported before the slow ones start. pytest's exit status 5
# ("no tests collected") fails the run: every tier must hold tests.
#
# Each tier's wall time goes to $MLKVM_REPORT_DIR/tiers.tsv and its per-test times to
# junit-<tier>.xml there; scripts/test-report.py prints them as one table (.ci/run does).
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR="${MLKVM_REPORT_DIR:-.cache/test-report}"
mkdir -p "$REPORT_DIR"
status=0
for tier in "$@"; do
  echo "=== tier: $tier ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  .venv/bin/pytest -m "$tier" --junitxml="$REPORT_DIR/junit-$tier.xml" -o junit_family=xunit2 ${PYTEST_ARGS:-}
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  echo "=== tier: $tier finished rc=$rc in $elapsed s"
  printf '%s\t%s\t%s\n' "$tier" "$elapsed" "$rc" >> "$REPORT_DIR/tiers.tsv"
  if [ "$rc" -ne 0 ]; then status=$rc; [ -n "${KEEP_GOING:-}" ] || break; fi
done
exit $status
