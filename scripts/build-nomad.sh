#!/usr/bin/env bash
# Builds a Nomad 1.6.0 agent (MPL-2.0) for `make test-nomad` (not part of `make test`: it takes
# minutes) and prints its path. Cached: a second run only prints the path.
#
# Licence: Nomad is under the Business Source License from 1.7.0 on, which is not an open-source
# licence; this project does not build or run it. The script refuses a version >= 1.7.0 before
# downloading anything, and refuses any module whose LICENSE is not the MPL 2.0 (in particular one
# naming the Business Source License) before building.
#
# `go install github.com/hashicorp/nomad@v1.6.0` cannot work: Nomad's go.mod replaces
# github.com/hashicorp/nomad/api with ./api, which the module zip lacks. So both modules are
# downloaded through the Go module proxy (the api module at the v1.6.0 tag's commit, 87d411f4e3a6),
# the api module is put where the replace points, and the agent is built from that tree.
set -euo pipefail
NOMAD_VERSION=${NOMAD_VERSION:-v1.6.0}
NOMAD_API_VERSION=${NOMAD_API_VERSION:-v0.0.0-20230718185111-87d411f4e3a6}

die() { echo "build-nomad: $*" >&2; exit 1; }

# The version check, before anything is fetched: vMAJOR.MINOR.PATCH, and below 1.7.0.
if ! [[ $NOMAD_VERSION =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  die "NOMAD_VERSION=$NOMAD_VERSION: want a release version vX.Y.Z (at most v1.6.x)"
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if (( major > 1 || (major == 1 && minor >= 7) )); then
  die "refusing Nomad $NOMAD_VERSION: Nomad 1.7.0 and later are under the Business Source License (BSL 1.1), not an open-source licence; this project builds only MPL-2.0 Nomad (v1.6.0)"
fi

# checklicense DIR WHAT: DIR/LICENSE must be the MPL 2.0 and must not name the BSL.
checklicense() {
  local f=$1/LICENSE
  [ -f "$f" ] || die "$2 has no LICENSE file; refusing to build it"
  if grep -qi 'Business Source License' "$f"; then
    die "refusing $2: its LICENSE is the Business Source License (BSL), not an open-source licence; this project builds only MPL-2.0 Nomad (v1.6.0)"
  fi
  grep -q 'Mozilla Public License, version 2.0' "$f" ||
    die "refusing $2: its LICENSE is not the Mozilla Public License 2.0"
}

cache=${NOMAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/isolatord-nomad}
out="$cache/nomad-$NOMAD_VERSION"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
export GONOSUMDB=github.com/hashicorp/nomad/api GOFLAGS=-mod=mod
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "build-nomad: downloading nomad $NOMAD_VERSION and its api module" >&2
(cd "$work" && go mod init tmp >/dev/null 2>&1 &&
  go mod download -json "github.com/hashicorp/nomad@$NOMAD_VERSION" "github.com/hashicorp/nomad/api@$NOMAD_API_VERSION") > "$work/dl.json"
src=$(go env GOMODCACHE)/github.com/hashicorp/nomad@$NOMAD_VERSION
api=$(go env GOMODCACHE)/github.com/hashicorp/nomad/api@$NOMAD_API_VERSION
checklicense "$src" "github.com/hashicorp/nomad@$NOMAD_VERSION"
checklicense "$api" "github.com/hashicorp/nomad/api@$NOMAD_API_VERSION"
grep -q "Version = \"${NOMAD_VERSION#v}\"" "$src/version/version.go" ||
  die "github.com/hashicorp/nomad@$NOMAD_VERSION: version/version.go does not say ${NOMAD_VERSION#v}"
cp -r "$src" "$work/nomad"
chmod -R u+w "$work/nomad"
rm -rf "$work/nomad/api"
cp -r "$api" "$work/nomad/api"
chmod -R u+w "$work/nomad/api"
echo "build-nomad: building nomad $NOMAD_VERSION (MPL-2.0; several minutes)" >&2
(cd "$work/nomad" && go build -trimpath -o "$out.tmp" .)
mv "$out.tmp" "$out"
echo "$out"
