#!/usr/bin/env bash
# make bench: one run, one report.
#  1. the Go micro-benchmarks of the packages (go test -bench), bounded in time;
#  2. isobench (test/cmd/isobench): the system benchmark of the control plane
#     through the real API and of the data plane with real TCP traffic, all in
#     sandboxes of network namespaces (the machine's real eth0 is never
#     touched). It prints markdown tables (every figure PASS/MISS against its
#     target) and writes bench/results/<time>.json and bench/results/latest.json.
# Arguments go to isobench, e.g. `scripts/bench.sh --quick` (N=100, short runs)
# or `SKIP_MICRO=1 scripts/bench.sh --only control` (the control phase alone).
# Environment: MICRO_BENCHTIME (default 300ms), MICRO_TIMEOUT (default 180s, the
# bound on step 1), SKIP_MICRO=1 skips step 1 and the Docker benchmark;
# SKIP_DOCKER=1 skips the Docker benchmark alone, DOCKER_BENCH_PRESENT and
# DOCKER_TIMEOUT (default 900s) tune it. CNI_BEFORE=<rev> builds that
# commit's isolator-cni and isolatorctl (git archive into a temporary
# directory, removed afterwards) and isobench measures them beside the
# current ones against the same daemon, e.g.
# `CNI_BEFORE=HEAD~1 SKIP_MICRO=1 scripts/bench.sh --only cni`.
# Exit status: 0 when every figure was measured (missing a target is a
# result, not an error), 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  cat >&2 <<'MSG'
make bench must run as root: it creates network namespaces, veths and tc
filters (all inside its own sandboxes; the real eth0 and lo are never touched)
and starts isolatord there. Run it again as root, e.g.: sudo make bench
MSG
  exit 1
fi
if [ ! -x bin/isolatord ]; then
  echo "bench: bin/isolatord is missing; run 'make build' (or 'make bench', which builds)" >&2
  exit 1
fi

started=$(date +%s)
tmp=$(mktemp -d /tmp/isobench-bin.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/" ./test/cmd/isobench ./test/cmd/isotraffic

before_args=()
if [ -n "${CNI_BEFORE:-}" ]; then
  rev=$(git rev-parse --short "${CNI_BEFORE}^{commit}")
  echo "== building isolator-cni and isolatorctl of $rev (CNI_BEFORE) for the before/after comparison" >&2
  mkdir -p "$tmp/before-src" "$tmp/before"
  git archive "$rev" | tar -x -C "$tmp/before-src"
  # As make build builds them: static, with the version stamped.
  (cd "$tmp/before-src" && CGO_ENABLED=0 go build -tags grpcnotrace -ldflags "-X main.version=$rev -X main.buildVersion=$rev" \
    -o "$tmp/before/" ./cmd/isolator-cni ./cmd/isolatorctl)
  rm -rf "$tmp/before-src"
  before_args=(--cni-before "$tmp/before" --cni-before-rev "$rev")
fi

micro_rc=0
: > "$tmp/micro.txt"
if [ "${SKIP_MICRO:-0}" != 1 ]; then
  pkgs=()
  for p in ephemeral tcfilter dataplane netns/hostports; do
    if [ -d "$p" ] && grep -qs '^func Benchmark' "$p"/*_test.go; then
      pkgs+=("./$p/")
    else
      echo "bench: ./$p/ has no benchmarks yet; skipped" >&2
    fi
  done
  if [ ${#pkgs[@]} -gt 0 ]; then
    limit=${MICRO_TIMEOUT:-180}
    echo "== micro-benchmarks: go test -bench . -benchtime ${MICRO_BENCHTIME:-300ms} ${pkgs[*]} (at most ${limit}s)" >&2
    set +e
    # -p 1: the kernel benchmarks of different packages must not compete for the CPUs.
    timeout --kill-after=10 "$limit" go test -p 1 -run '^$' -bench . -benchtime "${MICRO_BENCHTIME:-300ms}" \
      -count 1 -timeout "$((limit + 30))s" "${pkgs[@]}" 2>&1 | tee "$tmp/micro.txt" >&2
    micro_rc=${PIPESTATUS[0]}
    set -e
    if [ "$micro_rc" -eq 124 ] || [ "$micro_rc" -eq 137 ]; then
      echo "bench: micro-benchmarks stopped after ${limit}s; the results so far are kept" >&2
    elif [ "$micro_rc" -ne 0 ]; then
      echo "bench: micro-benchmarks failed (exit $micro_rc); the results so far are kept" >&2
    fi
  fi
fi

# Docker (test/e2e/docker_bench_test.go): docker run to first answer through the isolator
# driver vs --network none, and with DOCKER_BENCH_PRESENT (default 100) containers present; a
# dockerd of its own in a sandbox. Skipped without Debian's docker.io or with SKIP_DOCKER=1.
if [ "${SKIP_DOCKER:-0}" != 1 ] && [ "${SKIP_MICRO:-0}" != 1 ] && [ -x /usr/sbin/dockerd ]; then
  echo "== Docker: go test -bench BenchmarkDockerRun ./test/e2e/ (present: ${DOCKER_BENCH_PRESENT:-100})" >&2
  set +e
  timeout --kill-after=10 "${DOCKER_TIMEOUT:-900}" go test -p 1 -run '^$' -bench '^BenchmarkDockerRun$' \
    -benchtime 1x -count 1 -timeout "$(( ${DOCKER_TIMEOUT:-900} + 30 ))s" ./test/e2e/ 2>&1 | tee -a "$tmp/micro.txt" >&2
  docker_rc=${PIPESTATUS[0]}
  set -e
  if [ "$docker_rc" -ne 0 ]; then
    echo "bench: the Docker benchmark failed (exit $docker_rc)" >&2
    micro_rc=1
  fi
fi

echo "== system benchmark: isobench $*" >&2
set +e
# In the background so that a signal sent to this script alone reaches
# isobench (by pid), which then cleans up its sandboxes before exiting.
"$tmp/isobench" --bin bin --isotraffic "$tmp/isotraffic" --micro "$tmp/micro.txt" "${before_args[@]}" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM HUP
wait "$pid"
rc=$?
while kill -0 "$pid" 2>/dev/null; do # wait was interrupted by a signal
  wait "$pid"
  rc=$?
done
trap - INT TERM HUP
set -e
echo "bench: total $(( $(date +%s) - started ))s" >&2
if [ "$rc" -eq 0 ] && [ "$micro_rc" -ne 0 ]; then
  rc=1
fi
exit "$rc"
