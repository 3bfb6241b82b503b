#!/usr/bin/env bash
# Builds a Nomad 1.10 agent for `make test-nomad` (not part of `make test`: it takes minutes)
# and prints its path. Cached: a second run only prints the path.
#
# `go install github.com/hashicorp/nomad@v1.10.0` cannot work: Nomad's go.mod replaces
# github.com/hashicorp/nomad/api with ./api, which the module zip lacks. So both modules are
# downloaded through the Go module proxy, the api module is put where the replace points, and
# the agent is built from that tree.
set -euo pipefail
NOMAD_VERSION=${NOMAD_VERSION:-v1.10.0}
NOMAD_API_VERSION=${NOMAD_API_VERSION:-v0.0.0-20250425125325-3e688cf9282f}
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
cp -r "$src" "$work/nomad"
chmod -R u+w "$work/nomad"
rm -rf "$work/nomad/api"
cp -r "$api" "$work/nomad/api"
chmod -R u+w "$work/nomad/api"
echo "build-nomad: building (several minutes)" >&2
(cd "$work/nomad" && go build -trimpath -o "$out.tmp" .)
mv "$out.tmp" "$out"
echo "$out"
