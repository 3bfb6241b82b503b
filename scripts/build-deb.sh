#!/usr/bin/env bash
# Builds isolatord_<version>_<arch>.deb with go and dpkg-deb; prints the
# package's path.
#
#   scripts/build-deb.sh [OUTDIR]      (make deb: OUTDIR bin/)
#
# VERSION is the build's version stamp (make passes the one make build
# stamps, git describe's; the binaries report it with --version), mapped
# to a Debian version by debversion below. The layout and the maintainer
# scripts are described in docs/packaging.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bin}
MAINTAINER=${MAINTAINER:-isolatord maintainers <maintainers@isolatord.example>}

# debversion maps a version stamp to a Debian version (upstream-revision,
# revision 1): v1.2.3 -> 1.2.3-1; v1.2.3-4-gabc1234 -> 1.2.3+4.gabc1234-1
# (after 1.2.3, before 1.2.4); v2.0.0-rc1 -> 2.0.0~rc1-1; a bare commit abc1234 (no tag) ->
# 0.0~git<commit time>.abc1234-1, ordered by commit time; "-dirty" -> "+dirty";
# anything else is kept with the characters Debian refuses replaced by '.'.
debversion() {
	local v=$1 dirty="" when
	case $v in *-dirty) dirty="+dirty"; v=${v%-dirty} ;; esac
	v=${v#v}
	# A pre-release sorts before its release: 2.0.0-rc1 -> 2.0.0~rc1.
	if [[ $v =~ ^([0-9][0-9.]*)-((alpha|beta|rc|pre)[0-9.]*)(-[0-9]+-g[0-9a-f]+)?$ ]]; then
		v="${BASH_REMATCH[1]}~${BASH_REMATCH[2]}${BASH_REMATCH[4]}"
	fi
	if [[ $v =~ ^([0-9][0-9A-Za-z.+~]*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
		echo "${BASH_REMATCH[1]}+${BASH_REMATCH[2]}.g${BASH_REMATCH[3]}${dirty}-1"
	elif [[ $v =~ ^[0-9][0-9A-Za-z.+~]*$ && ! $v =~ ^[0-9a-f]{7,40}$ ]]; then
		echo "${v}${dirty}-1"
	elif [[ $v =~ ^[0-9a-f]{7,40}$ ]]; then
		when=$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S "$v" 2>/dev/null || echo 0)
		echo "0.0~git${when}.${v}${dirty}-1"
	else
		echo "0.0~${v//[^0-9A-Za-z.+~]/.}${dirty}-1"
	fi
}
[ "${1:-}" = "--debversion" ] && { debversion "$2"; exit 0; }

command -v dpkg-deb >/dev/null || { echo "build-deb: dpkg-deb missing (package dpkg)" >&2; exit 1; }
GO=${GO:-go}
STATIC_TAGS=${STATIC_TAGS:-grpcnotrace} # the Makefile's tags of the static binaries
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
debver=$(debversion "$VERSION")
arch=$(dpkg --print-architecture)
pkg="$OUT/isolatord_${debver}_${arch}.deb"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
umask 022
chmod 0755 "$root"

# Binaries: the daemon is an administrator's program (/usr/sbin); the CLI
# may be used by the uids --allow-uid names (/usr/bin); the CNI plugin where
# podman and CRI-O look (postinst links it into /opt/cni/bin for containerd
# and Nomad: Debian packages ship nothing under /opt).
# Built as make build builds them (same version stamp, the CLI and the
# plugin static without cgo), stripped (-s -w: Debian ships no symbols in
# binaries; Go's stack traces need none), the daemon as a PIE with full
# RELRO (hardening; the static ones start without the dynamic loader, which
# the plugin's exec per attachment pays for: lintian-overrides).
ldflags="-s -w -X main.version=$VERSION -X main.buildVersion=$VERSION"
install -d "$root/usr/sbin" "$root/usr/bin" "$root/usr/lib/cni"
"$GO" build -buildmode=pie -ldflags "$ldflags -linkmode=external -extldflags=-Wl,-z,relro,-z,now" -o "$root/usr/sbin/" ./cmd/isolatord
CGO_ENABLED=0 "$GO" build -tags "$STATIC_TAGS" -ldflags "$ldflags" -o "$root/usr/bin/" ./cmd/isolatorctl
CGO_ENABLED=0 "$GO" build -tags "$STATIC_TAGS" -ldflags "$ldflags" -o "$root/usr/lib/cni/" ./cmd/isolator-cni
chmod 0755 "$root/usr/sbin/isolatord" "$root/usr/bin/isolatorctl" "$root/usr/lib/cni/isolator-cni"
# Units: Debian 12's systemd directory for packages (lintian 2.116 wants
# /lib/systemd/system), ExecStart pointed at /usr/sbin.
install -d "$root/lib/systemd/system"
sed 's|/usr/local/bin/isolatord|/usr/sbin/isolatord|' packaging/isolatord.service >"$root/lib/systemd/system/isolatord.service"
install -m 0644 packaging/isolatord.socket "$root/lib/systemd/system/isolatord.socket"
chmod 0644 "$root/lib/systemd/system/isolatord.service"
install -D -m 0644 packaging/deb/lintian-overrides "$root/usr/share/lintian/overrides/isolatord"
# Configuration (conffiles).
install -D -m 0644 packaging/isolatord.default "$root/etc/default/isolatord"
install -D -m 0644 packaging/isolatord.conf "$root/etc/isolatord/isolatord.conf"
# Documentation.
doc="$root/usr/share/doc/isolatord"
install -d "$doc/examples/nomad"
install -m 0644 packaging/cni/10-isolator.conflist packaging/cni/shared-ports.conflist \
	packaging/cni/containerd-config.toml packaging/grafana-dashboard.json "$doc/examples/"
install -m 0644 packaging/cni/nomad/* "$doc/examples/nomad/"
install -m 0644 packaging/deb/copyright "$doc/copyright"
when=$(git log -1 --format=%cD 2>/dev/null || date -R)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
{
	echo "isolatord ($debver) unstable; urgency=medium"
	echo
	echo "  * Built from version stamp $VERSION (commit $commit)."
	echo
	echo " -- $MAINTAINER  $when"
} | gzip -9n >"$doc/changelog.Debian.gz"
for m in isolatord.8 isolatorctl.1 isolator-cni.8; do
	sec=${m##*.}
	install -d "$root/usr/share/man/man$sec"
	gzip -9n <"packaging/deb/$m" >"$root/usr/share/man/man$sec/$m.gz"
	chmod 0644 "$root/usr/share/man/man$sec/$m.gz"
done

# The daemon links libc when built with cgo: depend on the newest GLIBC_
# symbol version it names.
depends=""
glibc=$(grep -aoE 'GLIBC_2\.[0-9]+' "$root/usr/sbin/isolatord" | sort -uV | tail -n 1 || true)
[ -n "$glibc" ] && depends="libc6 (>= ${glibc#GLIBC_})"

install -d "$root/DEBIAN"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
printf '%s\n' /etc/default/isolatord /etc/isolatord/isolatord.conf >"$root/DEBIAN/conffiles"
{
	echo "Package: isolatord"
	echo "Version: $debver"
	echo "Architecture: $arch"
	echo "Maintainer: $MAINTAINER"
	echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
	[ -n "$depends" ] && echo "Depends: $depends"
	echo "Recommends: iproute2"
	echo "Section: net"
	echo "Priority: optional"
	echo "Homepage: https://github.com/isolatord/isolatord"
	echo "Description: network isolation for containers sharing the host's IP"
	echo " isolatord gives each container a set of ports on the host's IP address"
	echo " (an aligned block of ephemeral ports plus the static ports it asked for)"
	echo " and steers every packet for port P to the container owning P with tc u32"
	echo " filters, with a veth pair and a configured network namespace per"
	echo " container. It is driven over gRPC on a unix socket by isolatorctl and by"
	echo " the CNI plugin isolator-cni (podman, containerd, CRI-O, Nomad)."
} >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | LC_ALL=C sort | xargs md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

mkdir -p "$OUT"
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)} \
	dpkg-deb --root-owner-group -Zxz --build "$root" "$pkg" >/dev/null
echo "$pkg"
