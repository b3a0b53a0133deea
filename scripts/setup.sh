#!/usr/bin/env bash
# Install what Parley needs to build and test on Debian, if it is missing.
# Idempotent: a machine that has everything runs no apt-get at all.
set -euo pipefail

PACKAGES=(build-essential cmake pkg-config libjansson-dev libcurl4-openssl-dev libsqlite3-dev
          libmicrohttpd-dev libhiredis-dev redis-server python3 clang valgrind openssl
          prometheus)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# libFuzzer and the sanitizer runtimes for clang ship in libclang-rt-<ver>-dev.
if command -v clang >/dev/null; then
  ver=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
  if [ -n "$ver" ]; then
    dpkg-query -W -f='${Status}' "libclang-rt-$ver-dev" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("libclang-rt-$ver-dev")
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if ! command -v clang >/dev/null; then :; else
    ver=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
    dpkg-query -W -f='${Status}' "libclang-rt-$ver-dev" 2>/dev/null | grep -q "install ok installed" \
      || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "libclang-rt-$ver-dev" >/dev/null
  fi
fi
