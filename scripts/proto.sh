#!/usr/bin/env bash
# Regenerates the gRPC code in api/isolatord/v1 (messages, from isolator.proto)
# and api/isolatord/v1/isolatordv1grpc (the service, from service.proto).
#
# Installs what it needs when missing:
#   protoc + the well-known .proto files   Debian: protobuf-compiler, libprotobuf-dev
#   protoc-gen-go, protoc-gen-go-grpc      go install, pinned, into .tools/bin
# The committed generated files were made with protoc 3.21.12 (Debian bookworm)
# and the plugin versions below; the same tools reproduce them byte for byte.
#
# Usage: scripts/proto.sh [--check]
#   --check  regenerate into a scratch copy and fail if it differs from the
#            committed files (changes nothing in the tree).
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
PROTOC_EXPECTED=3.21.12

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tools="$root/.tools/bin"

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: scripts/proto.sh [--check]" >&2; exit 2 ;;
esac

# --- protoc ---------------------------------------------------------------
apt_pkgs=()
command -v protoc >/dev/null 2>&1 || apt_pkgs+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/timestamp.proto ] || apt_pkgs+=(libprotobuf-dev)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "proto.sh: missing ${apt_pkgs[*]} and not root; install them and retry" >&2
    exit 1
  fi
  echo "proto.sh: installing ${apt_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}"
  fi
fi
protoc_version=$(protoc --version | awk '{print $2}')
if [ "$protoc_version" != "$PROTOC_EXPECTED" ]; then
  echo "proto.sh: warning: protoc $protoc_version, the committed files were made with $PROTOC_EXPECTED;" \
       "the version comment in the generated files will differ" >&2
fi

# --- Go plugins -------------------------------------------------------------
# install_plugin NAME MODULE_PATH VERSION: go install into .tools/bin unless
# the binary there already reports VERSION.
install_plugin() {
  local name=$1 pkg=$2 version=$3
  if [ -x "$tools/$name" ] && "$tools/$name" --version 2>/dev/null | grep -qw "${version#v}\|$version"; then
    return 0
  fi
  echo "proto.sh: installing $name $version"
  mkdir -p "$tools"
  GOBIN="$tools" go install "$pkg@$version"
}
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

# --- generate -----------------------------------------------------------------
# generate SRC_DIR OUT_DIR: compile every .proto under SRC_DIR/isolatord.
generate() {
  local src=$1 out=$2
  local files
  mapfile -t files < <(cd "$src" && find isolatord -name '*.proto' | sort)
  protoc -I "$src" \
    --plugin=protoc-gen-go="$tools/protoc-gen-go" \
    --plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
    --go_out="$out" --go_opt=paths=source_relative \
    --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
    "${files[@]}"
}

if [ "$check" -eq 1 ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/src" "$scratch/out"
  (cd api && find isolatord -name '*.proto' -exec cp --parents {} "$scratch/src/" \;)
  generate "$scratch/src" "$scratch/out"
  status=0
  while IFS= read -r f; do
    if ! cmp -s "$scratch/out/$f" "api/$f"; then
      echo "proto.sh: api/$f is out of date; run scripts/proto.sh" >&2
      status=1
    fi
  done < <(cd "$scratch/out" && find . -name '*.go' | sed 's|^\./||' | sort)
  exit "$status"
fi

generate api api
echo "proto.sh: regenerated $(cd api && find isolatord -name '*.pb.go' | sort | tr '\n' ' ')"
