#!/usr/bin/env bash
# Installs the system tools isolatord's tests, demo and benchmarks use, only when missing:
# ip/tc (iproute2), nsenter/unshare (util-linux), ss (iproute2), and the container runtimes
# the real-runtime tests drive (test/runtimes): podman, containerd (ctr), runc, a static
# busybox for the containers' rootfs and the standard CNI plugins (loopback), Docker Engine
# (docker.io, whose services are not started), and lintian for
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
  # Docker Engine 20.10 for the Docker driver tests (test/e2e/docker_test.go).
  [ -x /usr/sbin/dockerd ] || need+=(docker.io)
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
# docker.io's maintainer scripts would start the system's dockerd, which
# puts its bridge and iptables rules in the root namespace: the tests run
# dockerds of their own in sandboxes, so no service is started while
# installing (policy-rc.d, unless the machine has one of its own).
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  policy=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
