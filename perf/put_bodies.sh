#!/usr/bin/env bash
# Large PUT bodies on each io driver: server CPU per request for 1 MiB PUTs (docs/io-uring.md,
# *Session 11*). For each round and each driver in turn: a fresh `mmc-server --shards 1` (default
# configuration: the emulated HBM tier, whose bodies are read through a 1 MiB staging buffer)
# pinned to SERVER_CPU, then `mmc-perf` on LOAD_CPU, CONNS connections, PUTs of BYTES bodies to
# 64 keys for SECS seconds (after the first round most keys exist and their bodies are read and
# dropped: the same receive path on every driver). One JSON line per run, then the medians.
#
# Usage: perf/put_bodies.sh [ROUNDS] [SECS]        (defaults: 5 rounds, 3 s)
# Environment: DRIVERS ("uring epoll ring"), BYTES (1048576), CONNS (8), SERVER_CPU (0),
#   LOAD_CPU (1), MMC (target/release/mmc-server), PERF (target/release/mmc-perf).
# Needs jq and curl; every step is bounded by timeout; the servers are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-3}
DRIVERS=${DRIVERS:-"uring epoll ring"}
BYTES=${BYTES:-1048576}
CONNS=${CONNS:-8}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
MMC=${MMC:-target/release/mmc-server}
PERF=${PERF:-target/release/mmc-perf}
for tool in jq curl taskset; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; true' EXIT
out=$(mktemp /tmp/put-bodies.XXXXXX)
for r in $(seq "$ROUNDS"); do
  for d in $DRIVERS; do
    port=$((19700 + RANDOM % 200))
    taskset -c "$SERVER_CPU" timeout $((SECS + 60)) "$MMC" --listen 127.0.0.1:$port --shards 1 \
      --io-driver "$d" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 50); do curl -s -m1 -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
    # (timeout's pid is the server's parent: the server is its only child.)
    spid=$(pgrep -P "$pid" || echo "$pid")
    timeout $((SECS + 30)) "$PERF" --target 127.0.0.1:$port --connections "$CONNS" --keys 64 \
      --body-bytes "$BYTES" --request "PUT /api/v1/objects?key=p-{key}" --duration "$SECS" \
      --warmup 1 --pin "$LOAD_CPU" --cpu-pid "$spid" --json \
      | jq -c --arg d "$d" --argjson r "$r" \
          '{round: $r, driver: $d, rps, cpu_us_per_req: .server_cpu_us_per_req, errors}' \
      | tee -a "$out"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    pid=
  done
done
echo "# medians: driver, server CPU µs per request"
for d in $DRIVERS; do
  jq -r --arg d "$d" 'select(.driver == $d) | .cpu_us_per_req' "$out" | sort -n \
    | awk -v d="$d" '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%s\t%.1f\n", d, m}'
done
rm -f "$out"
