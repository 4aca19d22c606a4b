#!/usr/bin/env bash
# Run the named test tiers in order (fastest first), each as its own pytest run so a
# failure in a fast tier is reported before the slow ones start. pytest's exit status 5
# ("no tests collected") fails the run: every tier must hold tests.
#
#   scripts/run-tests.sh unit integration+container vm+gpu_host lab
#
# "a+b" runs tiers side by side (separate pytest sessions; test objects carry each session's
# pid, so neither cleans up the other's): the first streams its output, the others go to
# $MLKVM_REPORT_DIR/<tier>.log and are printed when they end.
#
# When guest tiers (vm, lab) follow the fast ones, their images are built in the background
# meanwhile (scripts/prebuild-images.sh; MLKVM_PREBUILD=0 turns that off). The lab tier starts
# only after that build is done, since it builds the same venv bundles.
#
# Each tier's wall time goes to $MLKVM_REPORT_DIR/tiers.tsv and its per-test times to
# junit-<tier>.xml there; scripts/test-report.py prints them as one table (.ci/run does).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPORT_DIR="$(realpath -m "${MLKVM_REPORT_DIR:-.cache/test-report}")"
mkdir -p "$REPORT_DIR"
export MLKVM_REPORT_DIR="$REPORT_DIR"   # the lab tier keeps its playbook logs there

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$REPORT_DIR/tiers.tsv"; }

# The machine's CPU time so far, busy and idle (/proc/stat jiffies, every core): how busy the
# machine was during a tier says whether running something beside it could save time.
cpu_sample() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest < /proc/stat
  echo "$(( user + nice + system + irq + softirq + steal )) $(( idle + iowait ))"
}
busy_percent() {  # busy_percent "BUSY0 IDLE0" "BUSY1 IDLE1"
  local b0 i0 b1 i1
  read -r b0 i0 <<<"$1"; read -r b1 i1 <<<"$2"
  local total=$(( (b1 - b0) + (i1 - i0) ))
  [ "$total" -gt 0 ] && echo $(( 100 * (b1 - b0) / total )) || echo ""
}

prebuild_pid=""
# shellcheck disable=SC2317,SC2329  # called through the EXIT trap (SC2329 is ShellCheck 0.11's name for it)
stop_prebuild() {
  if [ -n "$prebuild_pid" ] && kill -0 "$prebuild_pid" 2>/dev/null; then
    echo "=== stopping the background image build"
    kill -- "-$prebuild_pid" 2>/dev/null || true
    wait "$prebuild_pid" 2>/dev/null || true
  fi
}
trap stop_prebuild EXIT
wait_prebuild() {  # the build records its own wall time (prebuild-images.sh); here only its end
  [ -n "$prebuild_pid" ] || return 0
  echo "=== waiting for the background image build ($REPORT_DIR/prebuild.log)"
  wait "$prebuild_pid"
  local rc=$?
  echo "=== background image build finished rc=$rc; its log:"
  grep -- '^--- prebuild' "$REPORT_DIR/prebuild.log" || true
  prebuild_pid=""
}

guest_tiers=()
fast_first=0
case "${1:-}" in unit|unit+*|integration|integration[+-]*) fast_first=1 ;; esac
for group in "$@"; do
  IFS=+ read -r -a parts <<<"$group"
  for tier in "${parts[@]}"; do case "$tier" in vm|gpu_host|lab|container) guest_tiers+=("$tier") ;; esac; done
done
if [ "${MLKVM_PREBUILD:-1}" != 0 ] && [ "$fast_first" = 1 ] && [ "${#guest_tiers[@]}" -gt 0 ] \
   && [ -z "${PYTEST_ARGS:-}" ]; then
  echo "=== building the ${guest_tiers[*]} tiers' images in the background ($REPORT_DIR/prebuild.log)"
  setsid scripts/prebuild-images.sh "${guest_tiers[@]}" > "$REPORT_DIR/prebuild.log" 2>&1 &
  prebuild_pid=$!
fi

# A tier's marker expression. The integration tier can run as two sessions side by side, one
# per half (tests/conftest.py marks `libvirtd` every file that talks to libvirtd): the other
# half (MLflow, PostgreSQL, torchrun, the browser) waits on servers and leaves a core idle,
# and it never meets a libvirtd that a fault test of the first half restarts. Together the
# two halves select exactly what `-m integration` selects.
marker_expr() {
  case "$1" in
    integration-libvirtd) echo "integration and libvirtd" ;;
    integration-services) echo "integration and not libvirtd" ;;
    *) echo "$1" ;;
  esac
}

# Extra pytest options of a tier. The unit tier's tests are independent processes (each its own
# tmp_path, playbook and module runs): alone it kept one core busy (386 s, 49 % of the machine),
# with two pytest-xdist workers it took 208 s; beside the gates and the image build, 356-373 s
# instead of 470 s. Its failures come sooner; the whole run is not shorter by as much, since the
# image build it leaves less CPU to ends later (when it took twice the work: inside the integration
# tier, 573-667 s instead of 556 s; built from one cached debootstrap tree it ends in that tier's first minute).
tier_args() {
  case "$1" in
    unit) echo "-n 2" ;;
  esac
}

run_tier() {  # run_tier TIER: one pytest session; records its wall time; returns its status
  local tier=$1 start rc elapsed cpu0 busy
  echo "=== tier: $tier ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  cpu0=$(cpu_sample)
  # shellcheck disable=SC2046,SC2086  # tier_args and PYTEST_ARGS are split into words on purpose
  .venv/bin/pytest -m "$(marker_expr "$tier")" $(tier_args "$tier") --junitxml="$REPORT_DIR/junit-$tier.xml" \
    -o junit_family=xunit2 ${PYTEST_ARGS:-}
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  busy=$(busy_percent "$cpu0" "$(cpu_sample)")
  echo "=== tier: $tier finished rc=$rc in $elapsed s (machine CPU ${busy:-?}% busy meanwhile)"
  record "$tier" "$elapsed" "$rc" "$busy"
  return $rc
}

run_group() {  # run_group "a+b+...": the first in the foreground, the others beside it
  local group=$1 first rc=0 side
  local -a parts=() sides=() pids=()
  IFS=+ read -r -a parts <<<"$group"
  first=${parts[0]}
  for side in "${parts[@]:1}"; do
    echo "=== tier: $side runs beside $first; its output: $REPORT_DIR/$side.log"
    run_tier "$side" > "$REPORT_DIR/$side.log" 2>&1 &
    pids+=($!); sides+=("$side")
  done
  run_tier "$first" || rc=$?
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=$?
    echo "=== output of the ${sides[$i]} tier (beside $first):"
    cat "$REPORT_DIR/${sides[$i]}.log"
  done
  return $rc
}

status=0
for group in "$@"; do
  case "+$group+" in *+lab+*) wait_prebuild ;; esac
  rc=0
  run_group "$group" || rc=$?
  if [ "$rc" -ne 0 ]; then status=$rc; [ -n "${KEEP_GOING:-}" ] || break; fi
done
wait_prebuild
exit $status
