#!/usr/bin/env bash
# Start virtlogd and libvirtd when nothing runs them, and make sure libvirtd's QEMU capability
# cache stays valid between calls.
#
#   scripts/ensure-libvirtd.sh             # start what is missing, check the cache, say "ready"
#   scripts/ensure-libvirtd.sh --restart   # stop libvirtd and start it again with the same set-up
#                                          # (tests and the fault-injection tier restart it this way)
#   scripts/ensure-libvirtd.sh --check     # change nothing; exit 1 and say why when the running
#                                          # libvirtd re-probes QEMU at every lookup
#
# Where PID 1 is systemd, the units start the daemons; elsewhere (containers, CI sandboxes) the
# daemons are started directly.
#
# Why the cache check: libvirt validates its cached QEMU capabilities at every lookup (every
# define, every start, every domcapabilities) by comparing "KVM was usable when QEMU was probed"
# with "the QEMU user can open /dev/kvm now". On machines whose KVM is advertised but unusable
# (nested, paravirtual KVM; no udev to set /dev/kvm's group) the two disagree, libvirt throws
# the cache away and probes QEMU again at every lookup: 4 s per lookup here, 79-105 s per define
# on another machine of this kind (../shared/notes/lab-facts.md). The fix, for daemons started
# here only: run libvirtd in its own mount namespace (a slave of the host's, so that it still
# sees the host's later mounts) with a private copy of the /dev/kvm node whose mode makes both
# views agree. The host's /dev/kvm is not touched. A hypervisor whose
# cache stays valid (real KVM, udev) is left exactly as it is; under systemd this script only
# reports the problem. Modules and roles never do any of this.
#
# Environment:
#   MLKVM_LIBVIRTD_CACHE_FIX=0   only report a re-probing cache, change nothing
set -euo pipefail

URI=qemu:///system
STATE_DIR=/run/mlinfra
KVM_VIEW_FILE=$STATE_DIR/libvirtd-kvm-view   # the view the running libvirtd was started with
KVM_NODE=$STATE_DIR/kvm-node                 # the private copy of /dev/kvm bound in its namespace
RESTART=0
CHECK=0

case "${1:-}" in
  "") ;;
  --restart) RESTART=1 ;;
  --check) CHECK=1 ;;
  -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "ensure-libvirtd.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

say() { echo "ensure-libvirtd: $*" >&2; }

under_systemd() { [ "$(cat /proc/1/comm 2>/dev/null)" = "systemd" ]; }

# The libvirtd processes that run, not the dead ones: a daemon killed with SIGKILL stays a zombie
# until PID 1 reaps it, and where PID 1 is not an init that may take a while; pgrep lists zombies too.
live_libvirtd_pids() {
  local pid
  for pid in $(pgrep -x libvirtd); do
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] || echo "$pid"
  done
}
libvirtd_alive() { [ -n "$(live_libvirtd_pids)" ]; }

wait_ready() {
  for _ in $(seq 1 100); do
    virsh -c "$URI" version >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  say "libvirtd did not answer on $URI within 20 s"
  return 1
}

stop_libvirtd() {
  libvirtd_alive || return 0
  pkill -x libvirtd 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    libvirtd_alive || return 0
    sleep 0.2
  done
  say "libvirtd did not stop within 20 s; killing it"
  pkill -9 -x libvirtd || true
  sleep 0.5
}

# Mounts made on the host after libvirtd started (a pool's file system mounted later, an NFS
# share) must reach libvirtd: a daemon that does not see them writes volumes into the directory
# under the mount point, and reports success. So its namespace is a slave of the host's: it
# receives the host's mounts and keeps its own /dev/kvm bind to itself. Receiving needs the
# host's mounts shared, which systemd makes them at boot; without systemd they stay private.
root_mount() { awk '$5 == "/"' "/proc/$1/mountinfo"; }  # PID (or self): its / line
root_mount_shared() { root_mount self | grep -q ' shared:'; }
# Whether the running libvirtd receives the host's mounts: its own namespace, or a slave of it.
libvirtd_sees_host_mounts() {
  local pid
  for pid in $(live_libvirtd_pids); do
    [ "$(readlink "/proc/$pid/ns/mnt")" = "$(readlink /proc/self/ns/mnt)" ] && return 0
    root_mount "$pid" | grep -q ' master:' && return 0
  done
  return 1
}

# start_libvirtd VIEW: host = the host's /dev/kvm as it is; qemu-group = a private node
# root:kvm 0660 (what udev sets on a normal Debian host); root-only = a private node root 0600.
start_libvirtd() {
  local view=$1 major minor group
  if [ "$view" = host ]; then
    libvirtd -d
    return
  fi
  mkdir -p "$STATE_DIR"
  major=$((16#$(stat -c %t /dev/kvm)))
  minor=$((16#$(stat -c %T /dev/kvm)))
  rm -f "$KVM_NODE"
  mknod "$KVM_NODE" c "$major" "$minor"
  if [ "$view" = qemu-group ]; then
    group=$(qemu_group)
    chgrp "$group" "$KVM_NODE"
    chmod 0660 "$KVM_NODE"
  else
    chmod 0600 "$KVM_NODE"
  fi
  if ! root_mount_shared; then
    say "making the host's mounts shared (mount --make-rshared /, as systemd does at boot) so that libvirtd's namespace sees mounts made after it started"
    mount --make-rshared /
  fi
  # shellcheck disable=SC2016  # $1 is the inner sh's argument, expanded there
  unshare --mount --propagation slave -- sh -c 'mount --bind "$1" /dev/kvm && exec libvirtd -d' sh "$KVM_NODE"
}

# The group QEMU runs as (qemu.conf "group", else Debian's default "kvm").
qemu_group() {
  local group
  group=$(sed -n 's/^[[:space:]]*group[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' /etc/libvirt/qemu.conf 2>/dev/null | tail -n1)
  echo "${group:-kvm}"
}

# Prints the reason libvirt gave when the cache is thrown away at a lookup; prints nothing
# when the cache stayed valid. Turns on libvirtd's capability-cache debug log for the second
# of two lookups only, then puts the daemon's log settings back.
cache_invalidation_reason() {
  local log outputs filters reason
  log=$(mktemp /tmp/mlkvm-libvirtd-caps.XXXXXX.log)
  outputs=$(virt-admin daemon-log-outputs 2>/dev/null | sed -n 's/^ *Logging outputs: *//p')
  filters=$(virt-admin daemon-log-filters 2>/dev/null | sed -n 's/^ *Logging filters: *//p')
  # The first lookup may probe once (a new daemon, a cache written under another view).
  virsh -c "$URI" domcapabilities --virttype qemu >/dev/null 2>&1 || true
  chmod 0666 "$log"
  virt-admin daemon-log-filters "1:qemu.qemu_capabilities 1:util.filecache" >/dev/null
  virt-admin daemon-log-outputs "${outputs:+$outputs }1:file:$log" >/dev/null
  virsh -c "$URI" domcapabilities --virttype qemu >/dev/null 2>&1 || true
  virt-admin daemon-log-filters "${filters}" >/dev/null || true
  virt-admin daemon-log-outputs "${outputs:-3:stderr}" >/dev/null || true
  if grep -q "Outdated cached capabilities" "$log"; then
    reason=$(grep -o "KVM was [^']*'[^']*', but [^\"]*" "$log" | head -n1)
    echo "${reason:-libvirt marked its cached QEMU capabilities outdated}"
  fi
  rm -f "$log"
}

# The view that makes libvirt's two answers agree, from the reason it gave.
view_for_reason() {
  case "$1" in
    "KVM was enabled when probing"*) echo qemu-group ;;   # the probe used KVM; the QEMU user cannot open it
    "KVM was not enabled when probing"*) echo root-only ;; # the probe could not use KVM; the QEMU user can open it
    *) echo qemu-group ;;
  esac
}

other_view() { [ "$1" = qemu-group ] && echo root-only || echo qemu-group; }

# What the private node of a view is, for the messages.
describe_view() { [ "$1" = qemu-group ] && echo "root:$(qemu_group) 0660" || echo "root 0600"; }

if [ "$CHECK" = 1 ]; then
  wait_ready
  reason=$(cache_invalidation_reason)
  if [ -n "$reason" ]; then
    say "the QEMU capability cache is re-probed at every lookup: $reason"
    exit 1
  fi
  echo "libvirtd: QEMU capability cache stays valid (/dev/kvm view: $(cat "$KVM_VIEW_FILE" 2>/dev/null || echo host))"
  exit 0
fi

# --- start the daemons ---------------------------------------------------------------------
if under_systemd; then
  if [ "$RESTART" = 1 ]; then systemctl restart libvirtd; fi
  systemctl start virtlogd.socket libvirtd.socket libvirtd.service 2>/dev/null || systemctl start libvirtd
else
  pgrep -x virtlogd >/dev/null || virtlogd -d
  view=$(cat "$KVM_VIEW_FILE" 2>/dev/null || echo host)
  if [ "$RESTART" = 1 ]; then
    say "restarting libvirtd (kept set-up: /dev/kvm view '$view')"
    stop_libvirtd
  elif libvirtd_alive && ! libvirtd_sees_host_mounts; then
    # Started by an earlier version of this script, in a private namespace.
    say "libvirtd runs in a mount namespace that does not see the host's later mounts; restarting it (view '$view')"
    stop_libvirtd
  fi
  if ! libvirtd_alive; then
    start_libvirtd "$view"
  fi
fi
wait_ready

# --- keep the capability cache valid -------------------------------------------------------
reason=$(cache_invalidation_reason)
if [ -n "$reason" ]; then
  say "libvirt re-probes QEMU at every lookup here (every define costs one probe): $reason"
  if under_systemd; then
    say "libvirtd runs under systemd: leaving it as it is (give the QEMU user the /dev/kvm access udev normally sets)"
  elif [ "${MLKVM_LIBVIRTD_CACHE_FIX:-1}" = 0 ]; then
    say "MLKVM_LIBVIRTD_CACHE_FIX=0: leaving it as it is"
  else
    first=$(view_for_reason "$reason")
    fixed=""
    for view in "$first" "$(other_view "$first")"; do
      say "restarting libvirtd in its own mount namespace with a private /dev/kvm node ($view: $(describe_view "$view")); the host's /dev/kvm is unchanged"
      stop_libvirtd
      start_libvirtd "$view"
      wait_ready
      if [ -z "$(cache_invalidation_reason)" ]; then
        mkdir -p "$STATE_DIR"
        echo "$view" > "$KVM_VIEW_FILE"
        fixed=$view
        break
      fi
    done
    if [ -n "$fixed" ]; then
      say "capability cache stays valid now (view '$fixed', recorded in $KVM_VIEW_FILE for restarts)"
    else
      say "the cache still re-probes with either view; starting libvirtd plainly again (slow but correct)"
      stop_libvirtd
      rm -f "$KVM_VIEW_FILE"
      start_libvirtd host
      wait_ready
    fi
  fi
fi

echo "libvirtd: ready ($(virsh -c "$URI" version --daemon 2>/dev/null | awk '/daemon/ {print $NF}'))"
