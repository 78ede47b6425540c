#!/usr/bin/env bash
# Installs the Debian packages corral needs when they are missing (needs root or sudo).
set -euo pipefail
# ripgrep and socat: `corral verify --backend srt` (sandbox-runtime needs both)
pkgs=(bubblewrap libseccomp2 python3 curl git gcc make socat ripgrep iproute2 util-linux openssl runsc e2fsprogs)
# chromium: the dashboard's browser tests and `corral view`'s viewer sandbox (and its M11 probes).
pkgs+=(chromium)
# libc6-dev: libc.a, so the compiled sandbox init is linked statically (sandbox/initbin.py).
pkgs+=(libc6-dev)
# qemu-system-x86 and busybox-static: `--backend microvm` (its guest kernel: install-microvm-kernel.sh)
pkgs+=(qemu-system-x86 busybox-static)
# python3-venv: `make install` builds .venv (a stock Debian 12 lacks it); npm: the agent CLIs.
pkgs+=(python3-venv)
# strace: the kill -9 tests inject SIGKILL at counted system calls (tests/integration/sandbox)
pkgs+=(strace)
# postgresql: the server binaries the store tests start on a unix socket (tests/integration/store)
pkgs+=(postgresql)
# openssh: the `[[tcp]]` tests clone over ssh from an sshd they start on loopback ports
pkgs+=(openssh-server openssh-client)
# python3-pip: the no-egress test runs Debian's pip inside a sandbox (tests/integration/sandbox)
pkgs+=(python3-pip)
# Node.js and npm: Debian's packages only when no node/npm is installed (a NodeSource nodejs
# already ships npm, and Debian's npm would conflict with it).
if ! command -v npm >/dev/null 2>&1; then
  pkgs+=(nodejs npm)
fi
bash "$(dirname "$0")/install-microvm-kernel.sh"
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
