#!/usr/bin/env bash
# The microvm backend's guest kernel: Debian's linux-image-amd64 (by package, from the
# Debian archive through apt), unpacked with dpkg -x into corral's cache. Nothing is
# installed into the host's /boot. corral derives vmlinux and the initramfs from it.
set -euo pipefail
CACHE="${CORRAL_CACHE:-/var/cache/corral}"
DEST="$CACHE/microvm/linux"
if ls "$DEST"/boot/vmlinuz-* >/dev/null 2>&1; then
  echo "microvm kernel: present in $DEST"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$pkg" ]; then
  $SUDO apt-get update -q
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp"
(cd "$tmp" && $SUDO apt-get download -q "$pkg")
$SUDO mkdir -p "$CACHE/microvm"
$SUDO rm -rf "$DEST.new"
$SUDO dpkg -x "$tmp"/"$pkg"_*.deb "$DEST.new"
$SUDO chmod -R go-w "$DEST.new"
$SUDO mv "$DEST.new" "$DEST"
echo "microvm kernel: $pkg unpacked into $DEST"
