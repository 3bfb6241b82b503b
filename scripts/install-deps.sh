#!/usr/bin/env bash
# Installs the system tools isolatord's tests, demo and benchmarks use, only when missing:
# ip/tc (iproute2), nsenter/unshare (util-linux), ss (iproute2), and the container runtimes
# the real-runtime tests drive (test/runtimes): podman, containerd (ctr), runc, a static
# busybox for the containers' rootfs and the standard CNI plugins (loopback), and lintian for
# the package test. Debian packages (apt-get update first).
# With the argument "bpf" (make generate) it installs instead what regenerating the BPF objects
# (tcfilter/bpfprog) needs: clang, llvm (llvm-strip), libbpf-dev (<bpf/bpf_helpers.h>) and the
# kernel's UAPI headers. Building and testing do not need them: the objects are committed.
# Quick when everything is there: only `command -v` and a file test.
set -euo pipefail
need=()
bpf_toolchain() {
  command -v clang >/dev/null 2>&1 || need+=(clang)
  command -v llvm-strip >/dev/null 2>&1 || need+=(llvm)
  [ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
  [ -f /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)
}
test_tools() {
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
}
if [ "${1:-}" = "bpf" ]; then bpf_toolchain; else test_tools; fi
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
