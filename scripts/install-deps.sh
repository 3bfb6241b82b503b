#!/usr/bin/env bash
# Installs the system tools isolatord's tests, demo and benchmarks use, only when missing:
# ip/tc (iproute2), nsenter/unshare (util-linux), ss (iproute2), and the container runtimes
# the real-runtime tests drive (test/runtimes): podman, containerd (ctr), runc, a static
# busybox for the containers' rootfs and the standard CNI plugins (loopback), and lintian for
# the package test. Debian packages (apt-get update first).
# Quick when everything is there: only `command -v` and a file test.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v ss >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
# The package test (packaging/deb_test.go): dpkg-deb builds it, lintian checks it.
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
command -v lintian >/dev/null 2>&1 || need+=(lintian)
if [ "${ISOLATORD_NO_RUNTIMES:-}" = "" ]; then
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v containerd >/dev/null 2>&1 || need+=(containerd)
  command -v ctr >/dev/null 2>&1 || need+=(containerd)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  [ -x /bin/busybox ] || need+=(busybox-static)
  [ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
fi
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
