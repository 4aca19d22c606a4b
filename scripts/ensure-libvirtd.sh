#!/usr/bin/env bash
# Start libvirtd and virtlogd when nothing runs them. Where PID 1 is systemd, use the units;
# elsewhere (containers, CI sandboxes) start the daemons directly.
set -euo pipefail
if [ "$(cat /proc/1/comm 2>/dev/null)" = "systemd" ]; then
  systemctl start virtlogd.socket libvirtd.socket libvirtd.service 2>/dev/null || systemctl start libvirtd
else
  pgrep -x virtlogd >/dev/null || virtlogd -d
  pgrep -x libvirtd >/dev/null || libvirtd -d
fi
for _ in $(seq 1 50); do
  if virsh -c qemu:///system version >/dev/null 2>&1; then
    echo "libvirtd: ready ($(virsh -c qemu:///system version --daemon 2>/dev/null | awk '/daemon/ {print $NF}'))"
    exit 0
  fi
  sleep 0.2
done
echo "libvirtd did not answer on qemu:///system within 10 s" >&2
exit 1
