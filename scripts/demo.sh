#!/usr/bin/env bash
# make demo: shows isolatord working end to end in a throw-away sandbox of
# network namespaces (never the machine's real eth0). Needs root; `make demo`
# runs `make build` first, so bin/isolatord and bin/isolatorctl exist.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  cat >&2 <<'MSG'
make demo must run as root: it creates network namespaces, a veth "cable"
between them and tc filters, all inside its own sandbox (your real eth0 and lo
are never touched), and starts isolatord there. Run it again as root, e.g.:

    sudo make demo
MSG
  exit 1
fi
for b in isolatord isolatorctl; do
  if [ ! -x "bin/$b" ]; then
    echo "demo: bin/$b is missing; run 'make build' (or 'make demo', which builds)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d /tmp/isodemo-bin.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The demo program and the small traffic tool its "containers" run.
go build -o "$tmp/" ./test/cmd/isodemo ./test/cmd/isotraffic
# isodemo handles SIGINT/SIGTERM/SIGHUP itself: it stops, cleans up and exits.
# It runs in the background so that a signal sent to this script alone is
# passed on to it (by pid) instead of leaving it running without us.
set +e
"$tmp/isodemo" --bin bin --isotraffic "$tmp/isotraffic" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM HUP
wait "$pid"
rc=$?
while kill -0 "$pid" 2>/dev/null; do # wait was interrupted by a signal
  wait "$pid"
  rc=$?
done
exit $rc
