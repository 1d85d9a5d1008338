#!/usr/bin/env bash
# Large GETs against a raw loopback TCP stream (issue 19): server CPU per GET of 1 MiB and
# 16 MiB objects, and per batch_get of 16 chunks of 64 KiB and 256 KiB, for one or more
# mmc-server binaries, run by run in turn, beside iperf3 (if installed) and
# perf/loopstream.py, each sender on CPU 0 and each receiver on CPU 1.
#
#   cargo build --release
#   perf/large_get.sh                                   # target/release/mmc-server, 4 rounds
#   RUNS=4 SECS=3 perf/large_get.sh /tmp/mmc-server-before target/release/mmc-server
#   DRIVERS="uring epoll ring" perf/large_get.sh        # each binary on each io driver
#
# Per run: a fresh `mmc-server --shards 1` pinned to CPU 0, KEYS objects preloaded (64 of
# 1 MiB, 8 of 16 MiB), then `mmc-perf` on CPU 1, 8 connections, closed loop, 1 s warm-up and
# SECS measured, GETs of random keys, the server's CPU from /proc/PID/stat. One JSON line per
# run, then the medians. Needs jq, curl, python3; every step is bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-4}
SECS=${SECS:-3}
PERF=${PERF:-target/release/mmc-perf}
DRIVERS=${DRIVERS:-auto}
bins=("$@")
[ ${#bins[@]} -eq 0 ] && bins=(target/release/mmc-server)
# A server is BINARY@DRIVER (--io-driver DRIVER).
servers=()
for b in "${bins[@]}"; do for d in $DRIVERS; do servers+=("$b@$d"); done; done
work=$(mktemp -d)
srv_pid=
cleanup() { [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

get_run() { # SERVER BYTES KEYS ROUND
  local port; port=$(free_port)
  cp "${1%@*}" "$work/mmc-server-$port"
  taskset -c 0 "$work/mmc-server-$port" --listen "127.0.0.1:$port" --shards 1 --io-driver "${1##*@}" > "$work/srv.log" 2>&1 &
  srv_pid=$!
  timeout 30 sh -c "until curl -sf http://127.0.0.1:$port/ready >/dev/null; do sleep 0.2; done"
  timeout 300 "$PERF" --target "127.0.0.1:$port" --connections 8 --duration "$SECS" --warmup 1 \
    --keys "$3" --preload --body-bytes "$2" --pin 1 --cpu-pid "$srv_pid" --json \
    --request "GET /api/v1/objects?key=g-{key}&medium=dram" |
    jq -c --arg s "$1" --argjson b "$2" --argjson r "$4" '{run: "get", server: $s, bytes: $b, round: $r,
      rps, gb_per_s: (.body_bytes_per_s.received / 1e9),
      cpu_us_per_mib: (.server_cpu_us_per_req / ($b / 1048576)), errors, business_failures}'
  kill "$srv_pid"; wait "$srv_pid" 2>/dev/null || true; srv_pid=
  rm -f "$work/mmc-server-$port"
}

batch_run() { # SERVER CHUNK_BYTES ROUND: batch_get of 16 chunks stored first
  local port keys=""; port=$(free_port)
  cp "${1%@*}" "$work/mmc-server-$port"
  taskset -c 0 "$work/mmc-server-$port" --listen "127.0.0.1:$port" --shards 1 --io-driver "${1##*@}" > "$work/srv.log" 2>&1 &
  srv_pid=$!
  timeout 30 sh -c "until curl -sf http://127.0.0.1:$port/ready >/dev/null; do sleep 0.2; done"
  head -c "$2" /dev/urandom > "$work/chunk"
  for i in $(seq 0 15); do
    timeout 10 curl -sf -X PUT --data-binary @"$work/chunk" \
      "http://127.0.0.1:$port/api/v1/objects?key=c$i&medium=dram" > /dev/null
    keys="$keys${keys:+,}c$i"
  done
  timeout 300 "$PERF" --target "127.0.0.1:$port" --connections 8 --duration "$SECS" --warmup 1 \
    --pin 1 --cpu-pid "$srv_pid" --json --request "GET /api/v1/objects/batch_get?keys=$keys" |
    jq -c --arg s "$1" --argjson b "$2" --argjson r "$3" '{run: "batch_get 16 x", server: $s, bytes: $b,
      round: $r, rps, gb_per_s: (.body_bytes_per_s.received / 1e9),
      cpu_us_per_mib: (.server_cpu_us_per_req / (16 * $b / 1048576)), errors, business_failures}'
  kill "$srv_pid"; wait "$srv_pid" 2>/dev/null || true; srv_pid=
  rm -f "$work/mmc-server-$port"
}

iperf_run() { # LEN ROUND
  command -v iperf3 > /dev/null || return 0
  local port sp; port=$(free_port)
  taskset -c 1 timeout $((SECS + 30)) iperf3 -s -p "$port" -1 > /dev/null 2>&1 &
  sp=$!
  sleep 0.3
  taskset -c 0 timeout $((SECS + 30)) iperf3 -c 127.0.0.1 -p "$port" -t "$SECS" -l "$1" -J > "$work/ip.json" || true
  wait "$sp" || true
  jq -c --arg l "$1" --argjson r "$2" '{run: ("iperf3 -l " + $l), round: $r,
    gb_per_s: (.end.sum_sent.bytes / .end.sum_sent.seconds / 1e9),
    cpu_us_per_mib: (.end.cpu_utilization_percent.host_total / 100 * .end.sum_sent.seconds * 1e6 / (.end.sum_sent.bytes / 1048576)),
    receiver_cpu_us_per_mib: (.end.cpu_utilization_percent.remote_total / 100 * .end.sum_sent.seconds * 1e6 / (.end.sum_sent.bytes / 1048576))}' "$work/ip.json"
}

raw_run() { # BYTES ROUND
  timeout $((SECS + 60)) python3 perf/loopstream.py 0 "$1" 256 "$SECS" |
    sed -E 's/.*GB\/s=([0-9.]+) sender_us_per_MiB=([0-9.]+).*/\1 \2/' |
    { read -r g c; jq -nc --argjson b "$1" --argjson r "$2" --argjson g "$g" --argjson c "$c" \
        '{run: "loopstream", bytes: $b, round: $r, gb_per_s: $g, cpu_us_per_mib: $c}'; }
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
{
  for r in $(seq "$RUNS"); do
    for s in "${servers[@]}"; do get_run "$s" $((1 << 20)) 64 "$r"; done
    iperf_run 128K "$r"
    iperf_run 1M "$r"
    raw_run $((1 << 20)) "$r"
  done
  for r in $(seq "$RUNS"); do
    for s in "${servers[@]}"; do get_run "$s" $((16 << 20)) 8 "$r"; done
    raw_run $((16 << 20)) "$r"
  done
  for r in $(seq "$RUNS"); do
    for c in $((64 << 10)) $((256 << 10)); do
      for s in "${servers[@]}"; do batch_run "$s" "$c" "$r"; done
    done
  done
} | tee "$work/runs.jsonl"
echo "# $(date -u +%FT%TZ) load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# medians: run, server, bytes: GB/s, CPU us per MiB (server / sender)"
jq -rs 'group_by([.run, .server, .bytes]) | .[] |
  def med: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
    else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  [.[0].run, (.[0].server // "-"), (.[0].bytes // "-"), length,
   ([.[].gb_per_s] | med | . * 1000 | round / 1000), ([.[].cpu_us_per_mib] | med | round)] | @tsv' "$work/runs.jsonl"
