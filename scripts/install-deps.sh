#!/usr/bin/env bash
# Installs the system tools isolatord's tests, demo and benchmarks use, only when missing:
# ip/tc (iproute2), nsenter/unshare (util-linux), ss (iproute2). Debian packages.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v ss >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${need[*]} and not root; install them and retry" >&2
  exit 1
fi
mapfile -t pkgs < <(printf '%s\n' "${need[@]}" | sort -u)
echo "install-deps: installing ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
