#!/usr/bin/env bash
# Make a GRUB-bootable variant of a lab/image/build.sh image, for guests that must boot through a
# boot loader (SeaBIOS, no <kernel> element) so that kernel_cmdline + update-grub + reboot really
# change /proc/cmdline: the "GPU host" VM of tests/vm/test_gpu_host.py.
#
#   bash lab/image/grub.sh                        # -> lab/build/gpuhost-grub.qcow2 (+ .stamp)
#   bash lab/image/grub.sh --name NAME --extra-packages "pkg pkg"   # another variant
#   bash lab/image/grub.sh --force                # rebuild even if the stamp matches
#   bash lab/image/grub.sh --print-paths          # IMAGE=..., STAMP=..., build nothing
#
# build.sh makes the rootfs image (a bare ext4 file system, no partition table) with the extra
# packages plus grub-pc-bin and grub2-common (libpam-systemd: polkitd, which libvirt-daemon-system
# needs, depends on a logind that debootstrap does not pick by itself); this script then puts that file system into
# partition 1 (from 1 MiB) of an MBR disk, points fstab and GRUB at /dev/vda1, copies GRUB's
# i386-pc modules to /boot/grub, writes a first grub.cfg (serial console) and installs GRUB's
# boot code with grub-mkimage + grub-bios-setup and a device.map. Inside the booted guest
# update-grub then works normally and replaces that first grub.cfg.
#
# Why not losetup -P / kpartx / grub-install: this host's kernel has no MBR partition support
# and no device-mapper (see /work/shared/notes/lab-facts.md), so the partition is reached with
# an offset loop device, and grub-install cannot probe a file-backed disk.
#
# Cached like build.sh: the stamp holds the hash of build.sh's stamp (its recipe) and this
# script; a run whose hash matches does nothing. Needs root, parted, losetup, qemu-img.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD_DIR="${MLKVM_IMAGE_BUILD_DIR:-$ROOT/lab/build}"

NAME=gpuhost
EXTRA_PACKAGES="qemu-system-x86 libvirt-daemon-system libpam-systemd libvirt-clients qemu-utils python3-libvirt python3-lxml"
GRUB_PACKAGES="grub-pc-bin grub2-common"
FORCE=0
PRINT_PATHS=0

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --extra-packages) EXTRA_PACKAGES="${2?--extra-packages needs a value}"; shift 2 ;;
    --extra-packages=*) EXTRA_PACKAGES="${1#*=}"; shift ;;
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --name=*) NAME="${1#*=}"; shift ;;
    --force) FORCE=1; shift ;;
    --print-paths) PRINT_PATHS=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "grub.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

START=$(date +%s)
step() { printf '[grub %s +%ss] %s\n' "$NAME" "$(( $(date +%s) - START ))" "$*"; }
die() { echo "grub.sh: $*" >&2; exit 1; }

[[ "$NAME" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "--name: '$NAME' must be letters, digits, '.', '_' or '-'"
[ "$NAME" != base ] || die "--name base is build.sh's plain image; pick another name"

IMAGE="$BUILD_DIR/$NAME-grub.qcow2"
STAMP="$BUILD_DIR/$NAME-grub.stamp"
LOCK="$BUILD_DIR/$NAME-grub.lock"
if [ "$PRINT_PATHS" = 1 ]; then
  printf 'IMAGE=%s\nSTAMP=%s\n' "$IMAGE" "$STAMP"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (loop devices, mount, chroot)"
for tool in parted losetup mount chroot qemu-img flock; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (apt-get install parted util-linux qemu-utils)"
done

# 1. The rootfs image with the packages (build.sh is itself cached by its recipe stamp).
step "rootfs image: build.sh --name $NAME --extra-packages '$EXTRA_PACKAGES $GRUB_PACKAGES'"
bash "$HERE/build.sh" --name "$NAME" --extra-packages "$EXTRA_PACKAGES $GRUB_PACKAGES"
SRC_IMAGE=""; SRC_STAMP=""
while IFS='=' read -r key value; do
  case "$key" in IMAGE) SRC_IMAGE="$value" ;; STAMP) SRC_STAMP="$value" ;; esac
done < <(bash "$HERE/build.sh" --name "$NAME" --extra-packages "$EXTRA_PACKAGES $GRUB_PACKAGES" --print-paths)
{ [ -s "$SRC_IMAGE" ] && [ -s "$SRC_STAMP" ]; } || die "build.sh did not leave $SRC_IMAGE and its stamp"

RECIPE="$( { cat "$SRC_STAMP"; sha256sum "$HERE/grub.sh"; } | sha256sum | cut -d' ' -f1)"

mkdir -p "$BUILD_DIR"
exec 9>"$LOCK"
if ! flock -n 9; then
  step "another grub build of '$NAME' is running; waiting for it"
  flock 9
fi
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] && [ -s "$IMAGE" ]; then
  step "up to date ($IMAGE, recipe $RECIPE)"
  exit 0
fi

step "building $IMAGE (recipe $RECIPE)"
rm -f "$STAMP"
rm -rf "$BUILD_DIR/.tmp-$NAME-grub."*
TMP="$(mktemp -d "$BUILD_DIR/.tmp-$NAME-grub.XXXXXX")"
MNT="$TMP/mnt"
LOOP=""
cleanup() {
  for m in "$MNT/tmp/disk.raw" "$MNT/dev" "$MNT/proc" "$MNT/sys" "$MNT"; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; fi
  done
  if [ -n "$LOOP" ]; then losetup -d "$LOOP" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 2. An MBR disk: partition 1 from 1 MiB holds the file system unchanged; the gap before it is
#    GRUB's embedding area for core.img.
step "file system -> partition 1 of an MBR disk"
qemu-img convert -f qcow2 -O raw "$SRC_IMAGE" "$TMP/fs.raw"
FS_BYTES=$(stat -c %s "$TMP/fs.raw")
[ $((FS_BYTES % 1048576)) = 0 ] || die "the file system is not a whole number of MiB ($FS_BYTES bytes)"
FS_MIB=$((FS_BYTES / 1048576))
truncate -s $(( (FS_MIB + 2) * 1048576 )) "$TMP/disk.raw"
parted -s "$TMP/disk.raw" mklabel msdos mkpart primary ext4 1MiB "$((FS_MIB + 1))MiB" set 1 boot on
START_B=$(parted -s -m "$TMP/disk.raw" unit B print | awk -F: '$1 == "1" {sub("B", "", $2); print $2}')
[ "$START_B" = 1048576 ] || die "partition 1 starts at '$START_B', expected 1048576"
dd if="$TMP/fs.raw" of="$TMP/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
rm -f "$TMP/fs.raw"

# 3. The partition through an offset loop device (no partition nodes on this kernel).
LOOP="$(losetup -f --show -o 1048576 --sizelimit "$FS_BYTES" "$TMP/disk.raw")"
mkdir -p "$MNT"
mount -t ext4 "$LOOP" "$MNT"
KERNEL_REL="$(cd "$MNT" && find boot -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n1)"
INITRD_REL="$(cd "$MNT" && find boot -maxdepth 1 -name 'initrd.img-*' | sort -V | tail -n1)"
{ [ -n "$KERNEL_REL" ] && [ -n "$INITRD_REL" ]; } || die "no kernel/initrd under /boot of the rootfs"
[ -d "$MNT/usr/lib/grub/i386-pc" ] || die "the rootfs lacks grub-pc-bin (/usr/lib/grub/i386-pc)"

step "fstab, /etc/default/grub, first grub.cfg ($KERNEL_REL)"
cat >"$MNT/etc/fstab" <<'EOF'
# Guest root is partition 1 of the virtio disk (GRUB image variant, lab/image/grub.sh).
# pass 0: minbase ships no fsck.ext4.
/dev/vda1  /  ext4  defaults,errors=remount-ro  0  0
EOF
# update-grub (in the guest) builds its menu from this; kernel_cmdline's drop-ins under
# /etc/default/grub.d append to GRUB_CMDLINE_LINUX_DEFAULT.
cat >"$MNT/etc/default/grub" <<'EOF'
# lab/image/grub.sh: serial console (the test reads the console log), eth0 naming like the
# direct-kernel-boot image, no menu delay worth waiting for under TCG.
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0 net.ifnames=0"
GRUB_TERMINAL="serial console"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_OS_PROBER=true
GRUB_DISABLE_RECOVERY=true
EOF
# The stand-in GPU host's initramfs holds only what this VM boots with (plus what
# /etc/initramfs-tools/modules names: vfio_pci's entries). With Debian's MODULES=most,
# vfio_pci's update-initramfs ran over 6 minutes under TCG (thousands of modules, a fork per
# step); a real hypervisor keeps its own setting, the role does not touch it.
mkdir -p "$MNT/etc/initramfs-tools/conf.d"
cat >"$MNT/etc/initramfs-tools/conf.d/mlinfra-lab.conf" <<'EOF'
# lab/image/grub.sh: only the modules this VM needs to mount its root (faster under TCG).
MODULES=dep
EOF
mkdir -p "$MNT/boot/grub"
rm -rf "$MNT/boot/grub/i386-pc"
cp -a "$MNT/usr/lib/grub/i386-pc" "$MNT/boot/grub/i386-pc"
cat >"$MNT/boot/grub/grub.cfg" <<EOF
# First boot menu written by lab/image/grub.sh; update-grub in the guest replaces it.
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set timeout=1
menuentry 'Debian GNU/Linux (lab image)' {
  insmod part_msdos
  insmod ext2
  set root='(hd0,msdos1)'
  linux /$KERNEL_REL root=/dev/vda1 ro console=ttyS0 net.ifnames=0
  initrd /$INITRD_REL
}
EOF

# 4. GRUB's boot code: core.img (with the partition and ext2 drivers and its prefix) into the
#    embedding area and boot.img into the MBR. The rootfs's own GRUB tools run in a chroot;
#    the disk file is bind-mounted in and named (hd0) by a device.map.
step "grub-mkimage + grub-bios-setup"
mount -t proc proc "$MNT/proc"
mount --bind /dev "$MNT/dev"
: >"$MNT/tmp/disk.raw"
mount --bind "$TMP/disk.raw" "$MNT/tmp/disk.raw"
printf '(hd0) /tmp/disk.raw\n' >"$MNT/tmp/device.map"
chroot "$MNT" grub-mkimage -O i386-pc -d /usr/lib/grub/i386-pc -o /boot/grub/i386-pc/core.img \
  -p '(hd0,msdos1)/boot/grub' biosdisk part_msdos ext2
cp "$MNT/usr/lib/grub/i386-pc/boot.img" "$MNT/boot/grub/i386-pc/boot.img"
sync
chroot "$MNT" /usr/lib/grub/i386-pc/grub-bios-setup --skip-fs-probe -d /boot/grub/i386-pc -m /tmp/device.map /tmp/disk.raw \
  >"$TMP/grub-bios-setup.log" 2>&1 || { cat "$TMP/grub-bios-setup.log" >&2; die "grub-bios-setup failed"; }
umount "$MNT/tmp/disk.raw"
rm -f "$MNT/tmp/disk.raw" "$MNT/tmp/device.map"
umount "$MNT/dev" "$MNT/proc"
umount "$MNT"
losetup -d "$LOOP"; LOOP=""
# boot.img's signature in the MBR (bytes 510-511) and GRUB's core.img right after it.
[ "$(od -An -tx1 -j510 -N2 "$TMP/disk.raw" | tr -d ' ')" = 55aa ] || die "no boot signature in the MBR"
grep -qa GRUB <(head -c 1048576 "$TMP/disk.raw") || die "no GRUB code before partition 1"

step "qemu-img convert to qcow2"
qemu-img convert -f raw -O qcow2 "$TMP/disk.raw" "$TMP/image.qcow2"
chmod 0644 "$TMP/image.qcow2"
mv -f "$TMP/image.qcow2" "$IMAGE"
printf '%s\n' "$RECIPE" >"$STAMP.new"
mv -f "$STAMP.new" "$STAMP"
step "done: $IMAGE ($(du -h "$IMAGE" | cut -f1))"
