#!/usr/bin/env bash
# Build the Debian bookworm guest image the VM tests and the lab boot (direct kernel boot, TCG).
#
#   bash lab/image/build.sh                      # -> lab/build/base.qcow2, vmlinuz, initrd.img
#   bash lab/image/build.sh --extra-packages "qemu-system-x86 libvirt-daemon-system" [--name gpuhost]
#                                                # -> lab/build/<name>.qcow2, <name>.vmlinuz, ...
#   bash lab/image/build.sh --name ml --disk-size 8G \
#        --venv-bundle /opt/mlinfra/venv=B.tar   # a venv bundle (roles/venv_bundle) baked in:
#                                                # python3 -m venv in the chroot, then tar -x
#   bash lab/image/build.sh ... --disable-units "prometheus prometheus-alertmanager"
#                                                # installed but not started at boot (the
#                                                # roles enable them where they belong)
#   bash lab/image/build.sh --force              # rebuild even if the stamp matches
#   bash lab/image/build.sh --print-paths        # print the output paths (KEY=path), build nothing
#   bash lab/image/build.sh ... --progress-file F  # also append each step line to F as it
#                                                # happens (tail -f F while Ansible waits)
#
# Cached: each image has a stamp file holding the hash of its recipe (this script, packages.txt,
# files/*, the extra packages, the venv bundles' names and sizes). A run whose recipe hash equals the stamp does nothing. A rebuild
# happens in a temporary directory under lab/build/; the stamp is removed first and written
# last, after the outputs are renamed into place, so an interrupted build never looks done.
# A lock file serialises concurrent callers (several test sessions may ask at once).
#
# Needs root, debootstrap, e2fsprogs >= 1.43 (mkfs.ext4 -d), qemu-utils and the Debian mirror.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD_DIR="${MLKVM_IMAGE_BUILD_DIR:-$ROOT/lab/build}"
SUITE=bookworm
# The Debian mirror: MLKVM_DEBIAN_MIRROR, else the one this machine's apt already uses for the
# suite (no registry host is written into the repository), read by the collection's own parser.
MIRROR="${MLKVM_DEBIAN_MIRROR:-$(python3 "$ROOT/plugins/module_utils/_host/_apt_sources.py" "$SUITE")}"
DISK_SIZE="${MLKVM_IMAGE_DISK_SIZE:-3G}"

EXTRA_PACKAGES=""
VENV_BUNDLES=()
DISABLE_UNITS=""
NAME=""
FORCE=0
PRINT_PATHS=0
PROGRESS=""

usage() {
  sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
  case "$1" in
    --extra-packages) EXTRA_PACKAGES="${2:?--extra-packages needs a value}"; shift 2 ;;
    --extra-packages=*) EXTRA_PACKAGES="${1#*=}"; shift ;;
    --venv-bundle) VENV_BUNDLES+=("${2:?--venv-bundle needs VENV=TAR}"); shift 2 ;;
    --venv-bundle=*) VENV_BUNDLES+=("${1#*=}"); shift ;;
    --disable-units) DISABLE_UNITS="${2:?--disable-units needs unit names}"; shift 2 ;;
    --disable-units=*) DISABLE_UNITS="${1#*=}"; shift ;;
    --disk-size) DISK_SIZE="${2:?--disk-size needs a value such as 8G}"; shift 2 ;;
    --disk-size=*) DISK_SIZE="${1#*=}"; shift ;;
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --name=*) NAME="${1#*=}"; shift ;;
    --force) FORCE=1; shift ;;
    --print-paths) PRINT_PATHS=1; shift ;;
    --progress-file) PROGRESS="${2:?--progress-file needs a path}"; shift 2 ;;
    --progress-file=*) PROGRESS="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

START=$(date +%s)
if [ -n "$PROGRESS" ]; then  # on a fresh machine its directory (lab/build) does not exist yet
  { mkdir -p "$(dirname "$PROGRESS")" && : >"$PROGRESS"; } || { echo "build.sh: cannot write --progress-file $PROGRESS" >&2; exit 2; }
fi
# Ansible shows a command's output only when it ends: with --progress-file each step line is
# also appended to a file someone can follow while the build runs (the playbook names it).
step() {
  local line
  line="$(printf '[image %s +%ss] %s' "${NAME:-base}" "$(( $(date +%s) - START ))" "$*")"
  printf '%s\n' "$line"
  if [ -n "$PROGRESS" ]; then printf '%s\n' "$line" >>"$PROGRESS"; fi
}
die() { echo "build.sh: $*" >&2; exit 1; }

# Package list: packages.txt without comments, plus the extras (comma or space separated),
# sorted and unique so the same set always hashes the same.
base_packages() { sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/packages.txt" | grep -v '^$'; }
extra_packages() { tr ',' ' ' <<<"$EXTRA_PACKAGES" | tr ' ' '\n' | grep -v '^$' | sort -u || true; }
for pkg in $(extra_packages); do
  [[ "$pkg" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "--extra-packages: '$pkg' is not a Debian package name"
done
EXTRAS="$(extra_packages | paste -sd, -)"
PACKAGES="$( (base_packages; extra_packages) | sort -u | paste -sd, -)"

# Variant name: "base" without extras; otherwise --name or one derived from the extras' hash.
if [ -z "$NAME" ]; then
  if [ -z "$EXTRAS" ]; then
    NAME=base
  else
    NAME="base-x$(printf '%s' "$EXTRAS" | sha256sum | cut -c1-10)"
  fi
fi
[[ "$NAME" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "--name: '$NAME' must be letters, digits, '.', '_' or '-'"
[ -n "$EXTRAS" ] || [ "${#VENV_BUNDLES[@]}" -gt 0 ] || [ "$NAME" = base ] \
  || die "--name without --extra-packages or --venv-bundle would duplicate the base image"
[ "$NAME" != base ] || [ "${#VENV_BUNDLES[@]}" = 0 ] || die "--venv-bundle needs --name (the base image has no venvs)"
[[ "$DISK_SIZE" =~ ^[0-9]+[MG]$ ]] || die "--disk-size: '$DISK_SIZE' is not a size such as 3G or 8192M"
for spec in "${VENV_BUNDLES[@]}"; do
  venv="${spec%%=*}"; tarball="${spec#*=}"
  [[ "$spec" == *=* && "$venv" == /* ]] || die "--venv-bundle: '$spec' is not /absolute/venv=bundle.tar"
  [ -s "$tarball" ] || die "--venv-bundle: '$tarball' does not exist (build it with playbooks/lab_image.yml)"
done

# The base image keeps the historical names (vmlinuz, initrd.img); variants are prefixed.
IMAGE="$BUILD_DIR/$NAME.qcow2"
STAMP="$BUILD_DIR/$NAME.stamp"
LOCK="$BUILD_DIR/$NAME.lock"
if [ "$NAME" = base ]; then
  KERNEL="$BUILD_DIR/vmlinuz"; INITRD="$BUILD_DIR/initrd.img"
else
  KERNEL="$BUILD_DIR/$NAME.vmlinuz"; INITRD="$BUILD_DIR/$NAME.initrd.img"
fi

if [ "$PRINT_PATHS" = 1 ]; then
  printf 'IMAGE=%s\nKERNEL=%s\nINITRD=%s\nSTAMP=%s\n' "$IMAGE" "$KERNEL" "$INITRD" "$STAMP"
  exit 0
fi

# Recipe hash: everything that decides the image's content.
recipe_hash() {
  {
    printf 'suite=%s mirror=%s size=%s\n' "$SUITE" "$MIRROR" "$DISK_SIZE"
    printf 'packages=%s\n' "$PACKAGES"
    printf 'disabled units=%s\n' "$DISABLE_UNITS"
    sha256sum "$HERE/build.sh" "$HERE/packages.txt"
    # A bundle's file name carries the hash of its requirements; the size catches a rebuild.
    for spec in "${VENV_BUNDLES[@]}"; do
      printf 'venv=%s bundle=%s size=%s\n' "${spec%%=*}" "$(basename "${spec#*=}")" "$(stat -c %s "${spec#*=}")"
    done
    (cd "$HERE" && find files -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -d' ' -f1
}
RECIPE="$(recipe_hash)"

is_current() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] \
    && [ -s "$IMAGE" ] && [ -s "$KERNEL" ] && [ -s "$INITRD" ]
}

mkdir -p "$BUILD_DIR"
exec 9>"$LOCK"
if ! flock -n 9; then
  step "another build of '$NAME' is running; waiting for it"
  flock 9
fi

if [ "$FORCE" = 0 ] && is_current; then
  step "up to date ($IMAGE, recipe $RECIPE)"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
for tool in debootstrap chroot mkfs.ext4 qemu-img flock; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (apt-get install debootstrap e2fsprogs qemu-utils util-linux)"
done

[ -n "$MIRROR" ] || die "no Debian mirror for $SUITE in /etc/apt/sources.list{,.d}: set MLKVM_DEBIAN_MIRROR=http://<your mirror>/debian"
step "building '$NAME' (recipe $RECIPE)"
step "packages: $PACKAGES"
# From here on the old outputs are stale: the stamp goes first so no half state looks done.
rm -f "$STAMP"

# Under the lock, any .tmp-NAME.* is a leftover of a killed build (SIGKILL skips the trap).
rm -rf "$BUILD_DIR/.tmp-$NAME."*
TMP="$(mktemp -d "$BUILD_DIR/.tmp-$NAME.XXXXXX")"
ROOTFS="$TMP/rootfs"
cleanup() {
  # Anything still mounted inside the chroot must go before the directory can be removed.
  for m in "$ROOTFS/proc" "$ROOTFS/sys" "$ROOTFS/dev/pts" "$ROOTFS/dev"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Downloaded .debs survive between builds: a recipe change re-installs, it need not re-download.
CACHE="$BUILD_DIR/debs-cache"
mkdir -p "$CACHE" "$ROOTFS"

# Every image starts from one debootstrapped tree of the base packages (packages.txt), kept as a
# tar keyed by what debootstrap was given and written under its own lock. A variant's extra
# packages then go into a copy of that tree with apt-get in a chroot: the GPU host's 9 (97 with
# their dependencies) took 7 s there on an idle machine, where a debootstrap of its own took 184 s
# and the lab's ml image 232 s (a CI run from a fresh clone, beside the unit tier), most of it dpkg
# setting up the base packages once more.
BASE_PACKAGES="$(base_packages | sort -u | paste -sd, -)"
ROOTFS_KEY="$(printf 'suite=%s mirror=%s packages=%s debootstrap=%s\n' "$SUITE" "$MIRROR" "$BASE_PACKAGES" \
  "$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)" | sha256sum | cut -c1-16)"
ROOTFS_TAR="$BUILD_DIR/rootfs-cache/$ROOTFS_KEY.tar"
mkdir -p "$BUILD_DIR/rootfs-cache"
exec 8>"$BUILD_DIR/rootfs-cache/$ROOTFS_KEY.lock"
flock 8
if [ -s "$ROOTFS_TAR" ]; then
  step "debootstrapped base tree from the cache ($(basename "$ROOTFS_TAR"): same suite, mirror and packages)"
  tar -C "$ROOTFS" --numeric-owner --xattrs --xattrs-include='*' -xpf "$ROOTFS_TAR"
else
  step "debootstrap $SUITE (minbase + $(tr ',' '\n' <<<"$BASE_PACKAGES" | wc -l) packages; about 2 min; its log: $TMP/debootstrap.log)"
  if ! debootstrap --variant=minbase --cache-dir="$CACHE" --include="$BASE_PACKAGES" \
        "$SUITE" "$ROOTFS" "$MIRROR" >"$TMP/debootstrap.log" 2>&1; then
    tail -n 40 "$TMP/debootstrap.log" >&2
    [ -f "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 40 "$ROOTFS/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (log above)"
  fi
  # Trees no build asked for in a week go (each is about 1 GiB).
  find "$BUILD_DIR/rootfs-cache" -name '*.tar' -atime +7 -delete 2>/dev/null || true
  if ! mountpoint -q "$ROOTFS/proc"; then
    tar -C "$ROOTFS" --numeric-owner --xattrs --xattrs-include='*' -cpf "$ROOTFS_TAR.tmp" .
    mv -f "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  fi
fi
exec 8>&-

# The extra packages, as debootstrap would have added them: Depends only (no Recommends), from
# the package lists the tree already holds (the same versions), no service started in the chroot
# (policy-rc.d), units enabled as their packages ask (--disable-units turns some off below). The
# .deb cache is shared through hard links (same file system), not a bind mount that a failed
# unmount would leave for `rm -rf` to empty.
install_extra_packages() {
  local archives="$ROOTFS/var/cache/apt/archives" deb
  local -a packages
  read -r -a packages <<<"$(tr ',' ' ' <<<"$EXTRAS")"
  mkdir -p "$archives/partial"
  cp -l -n "$CACHE"/*.deb "$archives/" 2>/dev/null || true
  printf '#!/bin/sh\n# lab/image/build.sh: no service starts during the image build\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
  chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
  mount -t proc proc "$ROOTFS/proc"
  if ! chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get install -y -q --no-install-recommends \
        -o APT::Sandbox::User=root -- "${packages[@]}" >"$TMP/apt-get.log" 2>&1; then
    tail -n 40 "$TMP/apt-get.log" >&2
    die "apt-get install of the extra packages failed (log above)"
  fi
  umount "$ROOTFS/proc"
  rm -f "$ROOTFS/usr/sbin/policy-rc.d"
  for deb in "$archives"/*.deb; do  # what apt downloaded, for the next build
    [ -e "$deb" ] || continue
    [ -e "$CACHE/${deb##*/}" ] || ln "$deb" "$CACHE/" 2>/dev/null || cp "$deb" "$CACHE/"
  done
}
if [ -n "$EXTRAS" ]; then
  step "apt-get install in the chroot: ${EXTRAS//,/ } (its log: $TMP/apt-get.log)"
  install_extra_packages
fi

step "configuring: fstab, eth0 DHCP, cloud-init NoCloud, locale, ssh host keys, payload bytecode"
install -m 0644 "$HERE/files/fstab" "$ROOTFS/etc/fstab"
install -m 0644 "$HERE/files/interfaces" "$ROOTFS/etc/network/interfaces"
mkdir -p "$ROOTFS/etc/network/interfaces.d"
echo debian >"$ROOTFS/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tdebian\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"
install -d -m 0755 "$ROOTFS/etc/cloud/cloud.cfg.d"
for cfg in 90-mlkvm-datasource.cfg 91-mlkvm-network.cfg 92-mlkvm-locale.cfg; do
  install -m 0644 "$HERE/files/$cfg" "$ROOTFS/etc/cloud/cloud.cfg.d/$cfg"
done
printf 'LANG=C.UTF-8\n' >"$ROOTFS/etc/default/locale"
# Host keys made by the package's postinst would be shared by every guest: drop them; the
# guest (cloud-init, or the ssh.service drop-in when cloud-init is off) makes its own.
rm -f "$ROOTFS"/etc/ssh/ssh_host_*
install -d -m 0755 "$ROOTFS/etc/systemd/system/ssh.service.d"
install -m 0644 "$HERE/files/ssh-hostkeys.conf" "$ROOTFS/etc/systemd/system/ssh.service.d/10-mlkvm-hostkeys.conf"
# Ansible's module payloads compile once per guest, not at every module run (the file says why).
install -m 0644 "$HERE/files/mlkvm_payload_bytecode.py" "$ROOTFS/usr/lib/python3/dist-packages/mlkvm_payload_bytecode.py"
install -m 0644 "$HERE/files/mlkvm-payload-bytecode.pth" "$ROOTFS/usr/lib/python3/dist-packages/mlkvm-payload-bytecode.pth"
# A fresh machine-id per guest (systemd makes one at first boot when the file is empty).
: >"$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/var/lib/dbus/machine-id"

# Units no lab or test guest needs, each a cost at every boot under emulation or a risk to a run:
# e2scrub_reap took 5.7 s of each boot here and removes e2scrub's LVM snapshots (these guests have
# no LVM); apt's daily timers would run `apt-get update` and hold the dpkg lock that a role's apt
# task then waits for.
chroot "$ROOTFS" /usr/bin/systemctl disable --quiet e2scrub_reap.service apt-daily.timer apt-daily-upgrade.timer

for spec in "${VENV_BUNDLES[@]}"; do
  venv="${spec%%=*}"; tarball="${spec#*=}"
  step "venv $venv from $(basename "$tarball") ($(du -h "$tarball" | cut -f1))"
  chroot "$ROOTFS" /usr/bin/python3 -m venv "$venv"
  tar -C "$ROOTFS$venv" --no-same-owner -xf "$tarball"
done

for unit in $DISABLE_UNITS; do
  [[ "$unit" =~ ^[A-Za-z0-9@._-]+$ ]] || die "--disable-units: '$unit' is not a unit name"
  step "unit $unit: installed, not started at boot"
  chroot "$ROOTFS" /usr/bin/systemctl disable --quiet "$unit"
done

step "apt-get clean"
chroot "$ROOTFS" /usr/bin/apt-get clean
# The package lists stay: a guest's first `apt` task (cache_valid_time) then needs no
# `apt-get update`, which takes minutes under software emulation.
rm -rf "$ROOTFS/debootstrap" 2>/dev/null || true

step "copying kernel and initrd out"
KSRC="$(readlink -f "$ROOTFS/vmlinuz" 2>/dev/null || find "$ROOTFS/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n1)"
ISRC="$(readlink -f "$ROOTFS/initrd.img" 2>/dev/null || find "$ROOTFS/boot" -maxdepth 1 -name 'initrd.img-*' | sort | tail -n1)"
{ [ -s "$KSRC" ] && [ -s "$ISRC" ]; } || die "no kernel/initrd in the rootfs (is linux-image-amd64 installed?)"
cp "$KSRC" "$TMP/vmlinuz"
cp "$ISRC" "$TMP/initrd.img"

step "mkfs.ext4 -d ($DISK_SIZE) and qemu-img convert to qcow2"
truncate -s "$DISK_SIZE" "$TMP/root.raw"
mkfs.ext4 -q -F -L root -d "$ROOTFS" "$TMP/root.raw"
qemu-img convert -f raw -O qcow2 "$TMP/root.raw" "$TMP/image.qcow2"
rm -f "$TMP/root.raw"

step "installing outputs"
chmod 0644 "$TMP/image.qcow2" "$TMP/vmlinuz" "$TMP/initrd.img"
mv -f "$TMP/image.qcow2" "$IMAGE"
mv -f "$TMP/vmlinuz" "$KERNEL"
mv -f "$TMP/initrd.img" "$INITRD"
printf '%s\n' "$RECIPE" >"$STAMP.new"
mv -f "$STAMP.new" "$STAMP"
step "done: $IMAGE ($(du -h "$IMAGE" | cut -f1)), $KERNEL, $INITRD"
