#!/usr/bin/env bash
# Run the named test tiers in order (fastest first), each as its own pytest run so a
# failure in a fast tier is reported before the slow ones start. pytest's exit status 5
# ("no tests collected") fails the run: every tier must hold tests.
#
# When guest tiers (vm, lab) follow the fast ones, their images are built in the background
# meanwhile (scripts/prebuild-images.sh; MLKVM_PREBUILD=0 turns that off). The lab tier starts
# only after that build is done, since it builds the same venv bundles.
#
# Each tier's wall time goes to $MLKVM_REPORT_DIR/tiers.tsv and its per-test times to
# junit-<tier>.xml there; scripts/test-report.py prints them as one table (.ci/run does).
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR="${MLKVM_REPORT_DIR:-.cache/test-report}"
mkdir -p "$REPORT_DIR"

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$REPORT_DIR/tiers.tsv"; }

prebuild_pid=""
prebuild_start=0
stop_prebuild() {
  if [ -n "$prebuild_pid" ] && kill -0 "$prebuild_pid" 2>/dev/null; then
    echo "=== stopping the background image build"
    kill -- "-$prebuild_pid" 2>/dev/null || true
    wait "$prebuild_pid" 2>/dev/null || true
  fi
}
trap stop_prebuild EXIT
wait_prebuild() {
  [ -n "$prebuild_pid" ] || return 0
  echo "=== waiting for the background image build ($REPORT_DIR/prebuild.log)"
  wait "$prebuild_pid"
  local rc=$?
  record "images (background)" "$(( $(date +%s) - prebuild_start ))" "$rc"
  echo "=== background image build finished rc=$rc; its log:"
  grep -- '^--- prebuild' "$REPORT_DIR/prebuild.log" || true
  prebuild_pid=""
}

guest_tiers=()
fast_first=0
case "${1:-}" in unit|integration) fast_first=1 ;; esac
for tier in "$@"; do case "$tier" in vm|lab) guest_tiers+=("$tier") ;; esac; done
if [ "${MLKVM_PREBUILD:-1}" != 0 ] && [ "$fast_first" = 1 ] && [ "${#guest_tiers[@]}" -gt 0 ] \
   && [ -z "${PYTEST_ARGS:-}" ]; then
  echo "=== building the ${guest_tiers[*]} tiers' images in the background ($REPORT_DIR/prebuild.log)"
  prebuild_start=$(date +%s)
  setsid scripts/prebuild-images.sh "${guest_tiers[@]}" > "$REPORT_DIR/prebuild.log" 2>&1 &
  prebuild_pid=$!
fi

status=0
for tier in "$@"; do
  [ "$tier" != lab ] || wait_prebuild
  echo "=== tier: $tier ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  .venv/bin/pytest -m "$tier" --junitxml="$REPORT_DIR/junit-$tier.xml" -o junit_family=xunit2 ${PYTEST_ARGS:-}
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  echo "=== tier: $tier finished rc=$rc in $elapsed s"
  record "$tier" "$elapsed" "$rc"
  if [ "$rc" -ne 0 ]; then status=$rc; [ -n "${KEEP_GOING:-}" ] || break; fi
done
wait_prebuild
exit $status
