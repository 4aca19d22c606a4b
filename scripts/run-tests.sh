#!/usr/bin/env bash
# Run the named test tiers in order (fastest first), each as its own pytest run so a
# failure in a fast tier is reported before the slow ones start. pytest's exit status 5
# ("no tests collected") fails the run: every tier must hold tests.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
for tier in "$@"; do
  echo "=== tier: $tier ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  .venv/bin/pytest -m "$tier" ${PYTEST_ARGS:-}
  rc=$?
  echo "=== tier: $tier finished rc=$rc in $(( $(date +%s) - start )) s"
  if [ "$rc" -ne 0 ]; then status=$rc; [ -n "${KEEP_GOING:-}" ] || break; fi
done
exit $status
