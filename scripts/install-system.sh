#!/usr/bin/env bash
# Installs the Debian packages corral needs when they are missing (needs root or sudo).
set -euo pipefail
# ripgrep and socat: `corral verify --backend srt` (sandbox-runtime needs both)
pkgs=(bubblewrap libseccomp2 python3 curl git gcc make socat ripgrep iproute2 util-linux openssl e2fsprogs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "system packages: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
