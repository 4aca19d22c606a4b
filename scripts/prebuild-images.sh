#!/usr/bin/env bash
# Build the guest images the vm and lab tiers boot, one after the other, so that
# scripts/run-tests.sh can run this in the background while the unit and integration tiers
# (no guests) run. It is CPU work too (an idle debootstrap: 80 s wall, 64 s user + 23 s sys), so
# it slows those tiers by what it costs; there is one debootstrap per run for that reason
# (lab/image/build.sh: variants add their packages to a copy of the base tree).
#
#   scripts/prebuild-images.sh [vm] [gpu_host] [container] [lab]     # the images those tiers need
#
# Every build is cached by its recipe stamp and takes a lock, so a test that asks for the same
# image while this runs waits for it and then finds it up to date; a build that fails here is
# tried again (and reported) by the test that needs it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
status=0
START=$(date +%s)
step() {
  local what=$1 start rc; shift
  start=$(date +%s)
  echo "--- prebuild: $what ($(date -u +%H:%M:%S))"
  "$@"
  rc=$?
  echo "--- prebuild: $what rc=$rc in $(( $(date +%s) - start )) s"
  [ "$rc" = 0 ] || status=$rc
}
for tier in "$@"; do
  case "$tier" in
    vm|container)
      # Both boot (or import) the base image; build.sh does nothing the second time.
      step "base image" bash lab/image/build.sh
      ;;
    gpu_host)
      if [ "${MLKVM_GPU_HOST_PROOF:-}" != 0 ]; then
        step "GPU host image (GRUB)" bash lab/image/grub.sh
      fi
      ;;
    lab)
      [ "${MLKVM_LAB_TEST:-}" = 0 ] || step "lab image with the ML venvs" \
        .venv/bin/ansible-playbook playbooks/lab_image.yml -i inventories/lab -e mlinfra_worker_count=1
      ;;
  esac
done
# Its own row in the tier table (scripts/test-report.py): the time the builds really took, not
# the time until a tier waited for them.
if [ -n "${MLKVM_REPORT_DIR:-}" ]; then
  printf 'images (background)\t%s\t%s\n' "$(( $(date +%s) - START ))" "$status" >> "$MLKVM_REPORT_DIR/tiers.tsv"
fi
exit $status
