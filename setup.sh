#!/usr/bin/env bash
# setup.sh — prepare this machine, build Deltafin, run the main job on the bundled model.
#
#   ./setup.sh              install what is missing, build ./deltafin, run the bundled model
#   ./setup.sh --deps-only  only make sure the build dependencies are installed
#
# Missing Debian packages are installed with apt-get when running as root; otherwise the exact
# command to run is printed and setup stops. Nothing is downloaded except Debian packages.
set -euo pipefail
cd "$(dirname "$0")"

# what the build links (jansson, PCRE2, liburing, xxhash, libcrypto, libcurl) and what the tests use
# (tar + xz for the bundled test data, python3 for the shared oracle checkers), libmicrohttpd for
# `deltafin serve`, and what the server's tests drive it with: node + npm (the official openai
# client, puppeteer-core) and chromium (the chat page in a real browser)
PKGS="gcc make python3 tar xz-utils libjansson-dev libpcre2-dev libxxhash-dev liburing-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev chromium"
# the NEON kernels' check under qemu, on x86-64 hosts (a cross compiler and user-mode qemu)
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
  PKGS="$PKGS gcc-aarch64-linux-gnu qemu-user"
fi
# node and npm from Debian, unless a node with its npm is already installed (nodesource's nodejs
# carries npm and conflicts with Debian's npm package)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PKGS="$PKGS nodejs npm"
fi

missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: missing packages:$missing (this is not a Debian system; install their equivalents)" >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || true
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: missing packages. Run:" >&2
    echo "  sudo apt-get install -y$missing" >&2
    exit 1
  fi
fi

[ "${1:-}" = "--deps-only" ] && exit 0

make -j"$(nproc)"
echo "setup: built ./deltafin; running the bundled default model (a 21.3M-parameter mini-K3, see README)"
./deltafin run --prompt "def fibonacci(n):" --max-new 48 --stats
echo "setup: to install Kimi K3 itself (1.56 TB from the Hugging Face hub): ./deltafin setup --full --dry-run, then without --dry-run; see docs/INSTALL.md"
