#!/usr/bin/env bash
# Loopback scenarios of the issues 3, 4 and 6, on this machine, the way compare_nginx.sh
# measures: mmc-server pinned to SERVER_CPU, every client (mmc-perf) pinned to LOAD_CPU, runs
# alternating and summarised by medians, each run after a quiet second.
#
# Usage: perf/scenarios.sh [SCENARIO...]        (default: all five, about 25 minutes)
#   dataplane  PUT and GET /api/v1/objects of 64 KiB, 1 MiB and 16 MiB objects on DRAM and
#              (emulated) HBM: bytes/s, as a ratio of this machine's memcpy bandwidth, server
#              CPU per GB                                                     (issue 3)
#   listing    GET /get_all_keys of 1 M keys: keys/s, and the server's RSS growth during the
#              stream, read at full speed and by a slow reader                (issue 3)
#   scrape     GET /metrics at 0, 100 k and 1 M stored keys: server CPU and latency per
#              scrape, response bytes                                         (issue 6)
#   scraper    GET /metadata p99 with and without a scraper every 100 ms, at a fixed offered
#              rate (MD_RATE)                                                 (issue 6)
#   kvevents   PUT p99 with the KV-event publisher on (a subscriber connected) and off, at a
#              fixed offered rate (KV_RATE)                                   (issue 4)
# Latency comparisons run at a fixed rate below saturation: at saturation p99 is queueing, and
# run-to-run drift of the throughput (10-30 % here) swamps the effect being measured.
# (`listing` reuses the server that `scrape` filled when both run; alone it fills its own.)
#
# Environment: RUNS (3) rounds per comparison, SECS (5) measured seconds per run, BASE_PORT
#   (18500; this script uses BASE_PORT..BASE_PORT+9), SERVER_CPU (0), LOAD_CPU (1), KEYS
#   (1000000) for listing/scrape/scraper, DP_SIZES ("64KiB 1MiB 16MiB"), DP_MEDIA ("dram
#   hbm"), DP_CONNS (8), KV_BODY (64KiB), KV_CONNS (16), KV_RATE (20000 puts/s), MD_CONNS (16),
#   MD_RATE (60000 gets/s; both rates about half of what one server core answers), SLOW_RATE (4MiB: the
#   slow reader's bytes/s), QUIET_PCT (5) and QUIET_WAIT (60) as in compare_nginx.sh,
#   CLEAN_PCT (5) and RETRIES (2): a run during which other processes used CLEAN_PCT% of a CPU
#   or more is redone up to RETRIES times, MAX_SECS (5400): no run starts after this long (the
#   tables are printed with what was measured), OUT (a directory to keep the raw results and
#   server logs in; default: not kept).
#
# Every step is bounded by `timeout`; the servers are killed on exit, also on Ctrl-C. The raw
# result of every run is printed as it ends (one JSON line per run), then a table per scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh

RUNS=${RUNS:-3}
SECS=${SECS:-5}
BASE_PORT=${BASE_PORT:-18500}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
KEYS=${KEYS:-1000000}
DP_SIZES=${DP_SIZES:-"64KiB 1MiB 16MiB"}
DP_MEDIA=${DP_MEDIA:-"dram hbm"}
DP_CONNS=${DP_CONNS:-8}
KV_BODY=${KV_BODY:-64KiB}
KV_CONNS=${KV_CONNS:-16}
KV_RATE=${KV_RATE:-20000}
MD_RATE=${MD_RATE:-60000}
MD_CONNS=${MD_CONNS:-16}
SLOW_RATE=${SLOW_RATE:-4MiB}
QUIET_PCT=${QUIET_PCT:-5}
QUIET_WAIT=${QUIET_WAIT:-60}
CLEAN_PCT=${CLEAN_PCT:-5}
RETRIES=${RETRIES:-2}
MAX_SECS=${MAX_SECS:-5400}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
MMC=${MMC:-$TARGET_DIR/release/mmc-server}
PERF=$TARGET_DIR/release/mmc-perf

scenarios=("$@")
[ ${#scenarios[@]} -eq 0 ] && scenarios=(dataplane scrape listing scraper kvevents)
for s in "${scenarios[@]}"; do
  case $s in dataplane|listing|scrape|scraper|kvevents) ;; *) echo "unknown scenario $s" >&2; exit 2;; esac
done
wants() { local s; for s in "${scenarios[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

for tool in taskset curl awk jq; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y curl jq util-linux)" >&2; exit 2; }
done
if [ ! -x "$MMC" ] || [ ! -x "$PERF" ]; then
  echo "building $MMC and $PERF" >&2
  timeout 1200 cargo build --release --bin mmc-server --bin mmc-perf >&2
fi

work=$(mktemp -d /tmp/mmc-scenarios.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$work"/results.txt "$work"/*.log "$OUT"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
started=$SECONDS
out_of_time() { [ $((SECONDS - started)) -ge "$MAX_SECS" ]; }

for i in $(seq 0 9); do
  if curl -s -m 1 -o /dev/null "http://127.0.0.1:$((BASE_PORT + i))/"; then
    echo "port $((BASE_PORT + i)) is already in use; set BASE_PORT" >&2; exit 2
  fi
done

# The server runs from a copy with another name: on a machine shared with other sessions, their
# clean-up by name (pkill/killall mmc-server) would otherwise stop it in the middle of a run.
cp "$MMC" "$work/mmcbench-server"

wait_up() { # URL: wait up to 10 s for a 200
  for _ in $(seq 100); do curl -sf -m 1 -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "no answer from $1" >&2; return 1
}
start_server() { # NAME PORT [--set K=V ...] -> sets srv_pid; log in $work/NAME.log
  local name=$1 port=$2; shift 2
  taskset -c "$SERVER_CPU" "$work/mmcbench-server" --listen "127.0.0.1:$port" "$@" > "$work/$name.log" 2>&1 &
  srv_pid=$!
  pids+=("$srv_pid")
  wait_up "http://127.0.0.1:$port/ready"
}
stop_server() { # PID
  kill "$1" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
}
check_alive() { # NAME PID
  kill -0 "$2" 2>/dev/null && return 0
  echo "$1 (pid $2) is gone; last lines of its log:" >&2
  tail -20 "$work/$1.log" >&2 2>/dev/null || true
  exit 1
}

cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# The kernel's softirq threads: big loopback transfers overflow network receive work into them.
# That is part of the transfer's cost, not another process: it is reported apart.
softirqd=$(pgrep '^ksoftirqd/' | tr '\n' ' ')
softirq_ticks() { local p t=0; for p in $softirqd; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }

results=$work/results.txt
: > "$results"
record() { # SCENARIO LABEL JSON: one result line
  echo "$1 $2 $3" >> "$results"
  echo "$1 $2 $3"
}
# The median of a jq expression over the results of one label.
med() { # SCENARIO LABEL JQ
  awk -v s="$1" -v l="$2" '$1==s && $2==l { $1=""; $2=""; print }' "$results" | jq -r "$3" | median
}
count() { awk -v s="$1" -v l="$2" '$1==s && $2==l' "$results" | wc -l; }

# One measured mmc-perf run against the server PID: waits for a quiet machine, runs mmc-perf
# with --json and --cpu-pid, adds how much CPU other processes used meanwhile (other_cpu_pct,
# % of one CPU; the kernel's ksoftirqd threads apart, ksoftirqd_cpu_pct) and the share of a CPU
# the server and mmc-perf kept busy in the measured window (server_busy_pct, client_busy_pct),
# and redoes a disturbed run up to RETRIES times. Prints the JSON object. The
# functions named by $BEFORE_RUN and $AFTER_RUN (if set) run around every attempt (e.g. to
# start and collect a scraper or a subscriber that must overlap the measured run).
perf_run() { # NAME PID MMC-PERF-ARGS...
  local name=$1 pid=$2 attempt out b0 b1 s0 s1 q0 q1 t0 t1 other softirq
  shift 2
  for attempt in $(seq 0 "$RETRIES"); do
    check_alive "$name" "$pid"
    wait_quiet
    [ -n "${BEFORE_RUN:-}" ] && "$BEFORE_RUN"
    b0=$(busy_all); s0=$(cpu_ticks "$pid"); q0=$(softirq_ticks); t0=$(date +%s.%N)
    { TIMEFORMAT='%3U %3S'; time timeout 300 "$PERF" --pin "$LOAD_CPU" --cpu-pid "$pid" --json "$@" > "$work/perf.out" 2> "$work/perf.err"; } 2> "$work/perf.time" || true
    b1=$(busy_all); s1=$(cpu_ticks "$pid"); q1=$(softirq_ticks); t1=$(date +%s.%N)
    [ -n "${AFTER_RUN:-}" ] && "$AFTER_RUN"
    check_alive "$name" "$pid"
    if ! jq -e . "$work/perf.out" > /dev/null 2>&1; then
      echo "# mmc-perf failed: $(cat "$work/perf.err")" >&2; exit 1
    fi
    # Busy time of the machine not spent by the server, mmc-perf or ksoftirqd, over the run.
    softirq=$(awk -v q="$((q1 - q0))" -v t="$tck" -v t0="$t0" -v t1="$t1" 'BEGIN{printf "%.1f", q/t/(t1-t0)*100}')
    other=$(awk -v b="$((b1 - b0))" -v s="$((s1 - s0))" -v q="$((q1 - q0))" -v t="$tck" -v t0="$t0" -v t1="$t1" \
      -v c="$(awk '{print $1+$2}' "$work/perf.time")" \
      'BEGIN{o=(b-s-q)/t - c; if (o<0) o=0; printf "%.1f", o/(t1-t0)*100}')
    out=$(jq -c --argjson o "$other" --argjson q "$softirq" '. + {other_cpu_pct: $o, ksoftirqd_cpu_pct: $q,
      server_busy_pct: ((.rps * (.server_cpu_us_per_req // 0) / 1e4) | round),
      client_busy_pct: ((.rps * (.client_cpu_us_per_req // 0) / 1e4) | round)}' "$work/perf.out")
    awk -v o="$other" -v m="$CLEAN_PCT" 'BEGIN{exit !(o+0 < m)}' && break
    [ "$attempt" -lt "$RETRIES" ] && echo "# $name: other processes used ${other}% of a CPU during the run: redoing it" >&2
  done
  [ "$(jq '.errors + .business_failures' <<< "$out")" -eq 0 ] || echo "# $name: errors or business failures: $out" >&2
  echo "$out"
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(uname -r), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
echo "# mmc-server $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+changes'); server on CPU $SERVER_CPU, clients on CPU $LOAD_CPU; $RUNS rounds of $SECS s"

port_dram=$BASE_PORT
port_hbm=$((BASE_PORT + 1))
port_keys=$((BASE_PORT + 2))
port_md=$((BASE_PORT + 3))
port_kv_on=$((BASE_PORT + 4))
port_kv_off=$((BASE_PORT + 5))
port_zmq=$((BASE_PORT + 6))

# ---------------------------------------------------------------------------------------------
# 1. Data plane throughput
# ---------------------------------------------------------------------------------------------
bytes_of() { case $1 in *KiB) echo $(( ${1%KiB} << 10 ));; *MiB) echo $(( ${1%MiB} << 20 ));; *) echo "$1";; esac; }
if wants dataplane; then
  echo
  echo "## 1. data plane: PUT and GET /api/v1/objects, $DP_CONNS connections, ${SECS} s per run"
  declare -A dp_pid dp_port
  for m in $DP_MEDIA; do
    case $m in dram) dp_port[$m]=$port_dram;; hbm) dp_port[$m]=$port_hbm;; *) echo "DP_MEDIA: dram or hbm" >&2; exit 2;; esac
    start_server "dp-$m" "${dp_port[$m]}"
    dp_pid[$m]=$srv_pid
    # Fill the segments first (3 s of 1 MiB puts, several GB), so that every measured run,
    # the first one too, finds them full and evicting rather than faulting fresh pages in.
    timeout 60 "$PERF" --target "127.0.0.1:${dp_port[$m]}" --connections 8 --duration 3 --warmup 0 \
      --pin "$LOAD_CPU" --body-bytes $((1 << 20)) --request "PUT /api/v1/objects?key=fill-{seq}&medium=$m" --json \
      | jq -c '{prefill: .target, requests, business_failures, errors}'
  done
  sizes_csv=$(echo "$DP_SIZES" | tr ' ' ',')
  for round in $(seq "$RUNS"); do
    out_of_time && break
    echo "# round $round"
    wait_quiet
    record dataplane memcpy "$(timeout 120 "$PERF" memcpy --sizes "$sizes_csv" --secs 1 --pin "$LOAD_CPU" --json)"
    for m in $DP_MEDIA; do
      for size in $DP_SIZES; do
        b=$(bytes_of "$size")
        # GET: 256 MiB of distinct objects stored first (--preload), then random reads.
        n=$(( (256 << 20) / b ))
        record dataplane "get-$m-$size" "$(perf_run "dp-$m" "${dp_pid[$m]}" --target "127.0.0.1:${dp_port[$m]}" \
          --connections "$DP_CONNS" --duration "$SECS" --warmup 1 --keys "$n" --preload --body-bytes "$b" \
          --request "GET /api/v1/objects?key=g$round-$size-{key}&medium=$m")"
        # PUT: a new key every time; after the warm-up the segment is at its watermarks and
        # every put evicts (DRAM: deletes; HBM: moves the victims to DRAM, which deletes).
        record dataplane "put-$m-$size" "$(perf_run "dp-$m" "${dp_pid[$m]}" --target "127.0.0.1:${dp_port[$m]}" \
          --connections "$DP_CONNS" --duration "$SECS" --warmup 2 --body-bytes "$b" \
          --request "PUT /api/v1/objects?key=p$round-$size-{seq}&medium=$m")"
      done
    done
  done
  for m in $DP_MEDIA; do stop_server "${dp_pid[$m]}"; done
fi

# ---------------------------------------------------------------------------------------------
# Servers with many keys (scrape, listing, scraper): 1 M objects of 0 bytes on DRAM. Blobs are
# page-granular, so each takes 4 KiB of segment space (no RSS: a 0-byte blob is never
# written): the DRAM segment is 8 GB (reserved address space, committed as written).
# ---------------------------------------------------------------------------------------------
fill_to() { # PORT FROM TO
  if [ "$3" -le "$2" ]; then echo '{"keys":0}'; return 0; fi
  timeout 600 "$PERF" fill --target "127.0.0.1:$1" --first "$2" --keys $(( $3 - $2 )) --value-bytes 0 --medium dram --json
}
stored_keys() { curl -s -m 10 "http://127.0.0.1:$1/metrics" | awk '$1=="memcache_stored_keys"{print $2}'; }
keys_pid=
start_keys_server() {
  start_server keys "$port_keys" --set ock.mmc.local_service.dram.size=8GB
  keys_pid=$srv_pid
}

# ---------------------------------------------------------------------------------------------
# 3. Scrape cost at 0, 100 k, 1 M keys
# ---------------------------------------------------------------------------------------------
if wants scrape; then
  echo
  echo "## 3. scrape: GET /metrics vs GET /health, 1 connection, ${SECS} s per run"
  start_keys_server
  have=0
  stages="0 100000 $KEYS"
  [ "$KEYS" -le 100000 ] && stages="0 $KEYS"
  for stage in $stages; do
    record scrape "fill-$stage" "$(fill_to "$port_keys" "$have" "$stage")"
    have=$stage
    got=$(stored_keys "$port_keys")
    [ "$got" = "$stage" ] || { echo "expected $stage stored keys, the server has $got" >&2; exit 1; }
    bytes=$(curl -s -m 10 "http://127.0.0.1:$port_keys/metrics" | wc -c)
    record scrape "bytes-$stage" "{\"bytes\":$bytes,\"rss_kib\":$(rss_kib "$keys_pid")}"
    for round in $(seq "$RUNS"); do
      out_of_time && break
      for req in metrics health; do
        record scrape "$req-$stage" "$(perf_run keys "$keys_pid" --target "127.0.0.1:$port_keys" \
          --connections 1 --duration "$SECS" --warmup 1 --request "GET /$req")"
      done
    done
  done
fi

# ---------------------------------------------------------------------------------------------
# 2. /get_all_keys of 1 M keys
# ---------------------------------------------------------------------------------------------
if wants listing; then
  echo
  echo "## 2. listing: GET /get_all_keys of $KEYS keys, server RSS sampled every ms"
  if [ -z "$keys_pid" ]; then
    start_keys_server
    record listing "fill-$KEYS" "$(fill_to "$port_keys" 0 "$KEYS")"
  fi
  got=$(stored_keys "$port_keys")
  [ "$got" = "$KEYS" ] || { echo "expected $KEYS stored keys, the server has $got" >&2; exit 1; }
  drain() { # LABEL [drain args]: one listing, with the server's CPU time over it
    local label=$1 c0 c1 out
    shift
    check_alive keys "$keys_pid"
    wait_quiet
    c0=$(cpu_ticks "$keys_pid")
    out=$(timeout 300 taskset -c "$LOAD_CPU" "$PERF" drain --target "127.0.0.1:$port_keys" \
      --rss-pid "$keys_pid" --rss-interval-ms 1 --json "$@")
    c1=$(cpu_ticks "$keys_pid")
    record listing "$label" "$(jq -c --argjson c "$(( (c1 - c0) * 1000 / tck ))" '. + {server_cpu_ms: $c}' <<< "$out")"
  }
  for round in $(seq "$RUNS"); do
    out_of_time && break
    drain fast
    drain "slow" --rate-bytes "$SLOW_RATE"
  done
  stop_server "$keys_pid"
  keys_pid=
fi
[ -n "$keys_pid" ] && stop_server "$keys_pid"

# ---------------------------------------------------------------------------------------------
# 4. GET /metadata p99 with and without a scraper every 100 ms
# ---------------------------------------------------------------------------------------------
if wants scraper; then
  echo
  echo "## 4. scraper: GET /metadata?key=bench, $MD_CONNS connections, with and without GET /metrics every 100 ms"
  start_server md "$port_md" --set ock.mmc.local_service.dram.size=8GB
  md_pid=$srv_pid
  record scraper "fill-$KEYS" "$(fill_to "$port_md" 0 "$KEYS")"
  curl -s -m 5 -X PUT --data-binary 0123456789abcdef "http://127.0.0.1:$port_md/metadata?key=bench" > /dev/null
  [ "$(curl -s -m 5 "http://127.0.0.1:$port_md/metadata?key=bench")" = 0123456789abcdef ] || { echo "metadata PUT failed" >&2; exit 1; }
  load=(--target "127.0.0.1:$port_md" --connections "$MD_CONNS" --duration "$SECS" --warmup 1 --rate "$MD_RATE" --request "GET /metadata?key=bench")
  # The scraper: its own mmc-perf, one connection, 10 requests per second, on the load CPU,
  # from before the warm-up of the load to after its end.
  start_scraper() {
    timeout 120 "$PERF" --target "127.0.0.1:$port_md" --connections 1 --rate 10 --warmup 0 \
      --duration "$(awk -v s="$SECS" 'BEGIN{print s + 2}')" --pin "$LOAD_CPU" --request "GET /metrics" --json \
      > "$work/scraper.json" 2> "$work/scraper.err" &
    scraper=$!
    sleep 0.5
  }
  end_scraper() { wait "$scraper" || true; }
  for round in $(seq "$RUNS"); do
    out_of_time && break
    record scraper alone "$(perf_run md "$md_pid" "${load[@]}")"
    record scraper scraped "$(BEFORE_RUN=start_scraper AFTER_RUN=end_scraper perf_run md "$md_pid" "${load[@]}")"
    record scraper scraper "$(cat "$work/scraper.json")"
  done
  stop_server "$md_pid"
fi

# ---------------------------------------------------------------------------------------------
# 5. PUT p99 with the KV-event publisher on and off
# ---------------------------------------------------------------------------------------------
if wants kvevents; then
  echo
  echo "## 5. kvevents: PUT /api/v1/objects ($KV_BODY, LMCache keys, DRAM), $KV_CONNS connections, publisher on (subscriber connected) vs off"
  start_server kv-on "$port_kv_on" --set ock.mmc.kv_events.enable=true \
    --set "ock.mmc.kv_events.endpoint=tcp://127.0.0.1:$port_zmq"
  on_pid=$srv_pid
  start_server kv-off "$port_kv_off"
  off_pid=$srv_pid
  kv_b=$(bytes_of "$KV_BODY")
  put=(--connections "$KV_CONNS" --duration "$SECS" --warmup 2 --rate "$KV_RATE" --body-bytes "$kv_b"
       --request "PUT /api/v1/objects?key=llama3-8b@1@0@{seq}@bfloat16&medium=dram")
  status() { curl -s -m 5 "http://127.0.0.1:$port_kv_on/kv_events/status"; }
  # The subscriber listens from before the run to after it (ZMQ's slow joiner: it connects
  # first), on the load CPU; the publisher's counters are read around the run.
  start_sub() {
    timeout 120 taskset -c "$LOAD_CPU" "$PERF" kv-sub --endpoint "tcp://127.0.0.1:$port_zmq" \
      --secs "$(awk -v s="$SECS" 'BEGIN{print s + 4}')" --json > "$work/kvsub.json" 2> "$work/kvsub.err" &
    sub=$!
    sleep 1
    status > "$work/kv-before.json"
  }
  end_sub() {
    sleep 0.2
    status > "$work/kv-after.json"
    wait "$sub" || true
  }
  for round in $(seq "$RUNS"); do
    out_of_time && break
    seq0=$(( round * 1000000000 ))
    record kvevents off "$(perf_run kv-off "$off_pid" --target "127.0.0.1:$port_kv_off" --seq-start "$seq0" "${put[@]}")"
    record kvevents on "$(BEFORE_RUN=start_sub AFTER_RUN=end_sub perf_run kv-on "$on_pid" --target "127.0.0.1:$port_kv_on" --seq-start "$seq0" "${put[@]}")"
    record kvevents events "$(jq -c --slurpfile b "$work/kv-before.json" --slurpfile a "$work/kv-after.json" --slurpfile s "$work/kvsub.json" -n \
      '$b[0] as $b | $a[0] as $a |
       {published: ($a.published_events - $b.published_events), stored: ($a.published_by_type.stored - $b.published_by_type.stored),
        removed: ($a.published_by_type.removed - $b.published_by_type.removed), dropped: ($a.dropped_events - $b.dropped_events),
        skipped_unparsed_keys: ($a.skipped_unparsed_keys - $b.skipped_unparsed_keys), received: $s[0].events,
        received_batches: $s[0].batches, missing: $s[0].missing}')"
  done
  stop_server "$on_pid"
  stop_server "$off_pid"
fi

# ---------------------------------------------------------------------------------------------
# Tables (medians over the rounds)
# ---------------------------------------------------------------------------------------------
echo
if wants dataplane; then
  echo "## 1. data plane (medians of $RUNS runs; GB = 10^9 bytes; memcpy: one thread, see mmc-perf memcpy)"
  printf '| %-14s | %9s | %9s | %14s | %16s | %9s | %9s | %6s | %6s | %8s | %8s | %7s |\n' run "req/s" "GB/s" "÷ memcpy hot" "÷ memcpy pool" "srv s/GB" "cli s/GB" "srv %" "cli %" "p50 µs" "p99 µs" "softirqd %"
  echo "|----------------|----------:|----------:|---------------:|-----------------:|----------:|----------:|-------:|-------:|---------:|---------:|--------:|"
  for m in $DP_MEDIA; do
    for op in put get; do
      for size in $DP_SIZES; do
        b=$(bytes_of "$size")
        l="$op-$m-$size"
        [ "$(count dataplane "$l")" -gt 0 ] || continue
        if [ "$op" = put ]; then bps=$(med dataplane "$l" '.body_bytes_per_s.sent'); pool=to_pool; else bps=$(med dataplane "$l" '.body_bytes_per_s.received'); pool=from_pool; fi
        hot=$(med dataplane memcpy ".sizes[] | select(.bytes == $b) | .hot_bytes_per_s")
        pl=$(med dataplane memcpy ".sizes[] | select(.bytes == $b) | .${pool}_bytes_per_s")
        printf '| %-14s | %9.0f | %9.2f | %14.3f | %10.3f %5s | %9.3f | %9.3f | %6.0f | %6.0f | %8.0f | %8.0f | %7s |\n' "$l" \
          "$(med dataplane "$l" .rps)" "$(awk -v v="$bps" 'BEGIN{print v/1e9}')" \
          "$(awk -v a="$bps" -v b="$hot" 'BEGIN{print a/b}')" "$(awk -v a="$bps" -v b="$pl" 'BEGIN{print a/b}')" "$pool" \
          "$(awk -v us="$(med dataplane "$l" .server_cpu_us_per_req)" -v b="$b" 'BEGIN{print us*1000/b}')" \
          "$(awk -v us="$(med dataplane "$l" .client_cpu_us_per_req)" -v b="$b" 'BEGIN{print us*1000/b}')" \
          "$(med dataplane "$l" .server_busy_pct)" "$(med dataplane "$l" .client_busy_pct)" \
          "$(med dataplane "$l" .latency_us.p50)" "$(med dataplane "$l" .latency_us.p99)" "$(med dataplane "$l" .ksoftirqd_cpu_pct)"
      done
    done
  done
  echo
  echo "memcpy GB/s (medians):"
  for size in $DP_SIZES; do
    b=$(bytes_of "$size")
    printf '  %-6s hot %6.2f  to_pool %6.2f  from_pool %6.2f\n' "$size" \
      "$(awk -v v="$(med dataplane memcpy ".sizes[] | select(.bytes == $b) | .hot_bytes_per_s")" 'BEGIN{print v/1e9}')" \
      "$(awk -v v="$(med dataplane memcpy ".sizes[] | select(.bytes == $b) | .to_pool_bytes_per_s")" 'BEGIN{print v/1e9}')" \
      "$(awk -v v="$(med dataplane memcpy ".sizes[] | select(.bytes == $b) | .from_pool_bytes_per_s")" 'BEGIN{print v/1e9}')"
  done
  echo
fi
if wants scrape; then
  echo "## 3. scrape (medians of $RUNS runs, 1 connection)"
  printf '| %-9s | %9s | %11s | %13s | %13s | %15s | %9s | %9s |\n' keys bytes "scrapes/s" "srv µs/scrape" "srv µs/health" "render µs (diff)" "p50 µs" "p99 µs"
  echo "|-----------|----------:|------------:|--------------:|--------------:|----------------:|----------:|----------:|"
  for stage in $stages; do
    sm=$(med scrape "metrics-$stage" .server_cpu_us_per_req); sh=$(med scrape "health-$stage" .server_cpu_us_per_req)
    printf '| %-9s | %9s | %11.0f | %13.1f | %13.1f | %15.1f | %9.0f | %9.0f |\n' "$stage" "$(med scrape "bytes-$stage" .bytes)" \
      "$(med scrape "metrics-$stage" .rps)" "$sm" "$sh" "$(awk -v a="$sm" -v b="$sh" 'BEGIN{print a-b}')" \
      "$(med scrape "metrics-$stage" .latency_us.p50)" "$(med scrape "metrics-$stage" .latency_us.p99)"
  done
  echo "target: flat in keys, <= 1000 µs per scrape"
  echo
fi
if wants listing; then
  echo "## 2. listing (medians of $RUNS runs)"
  printf '| %-6s | %9s | %11s | %8s | %9s | %13s | %12s | %12s | %10s |\n' reader keys "keys/s" "MB/s" "total s" "srv CPU ms" "RSS before MiB" "RSS max MiB" "growth MiB"
  echo "|--------|----------:|------------:|---------:|----------:|--------------:|---------------:|-------------:|-----------:|"
  for r in fast slow; do
    printf '| %-6s | %9s | %11.0f | %8.1f | %9.2f | %13.0f | %14.1f | %12.1f | %10.2f |\n' "$r" "$(med listing "$r" .lines)" \
      "$(med listing "$r" .lines_per_s)" "$(awk -v v="$(med listing "$r" .body_bytes_per_s)" 'BEGIN{print v/1e6}')" \
      "$(med listing "$r" .total_s)" "$(med listing "$r" .server_cpu_ms)" \
      "$(awk -v v="$(med listing "$r" .rss_before_bytes)" 'BEGIN{print v/1048576}')" \
      "$(awk -v v="$(med listing "$r" .rss_max_bytes)" 'BEGIN{print v/1048576}')" \
      "$(awk -v v="$(med listing "$r" .rss_growth_max_bytes)" 'BEGIN{print v/1048576}')"
  done
  echo "largest growth of any run: $(awk '$1=="listing" && ($2=="fast" || $2=="slow") { $1=""; $2=""; print }' "$results" | jq -r .rss_growth_max_bytes | sort -g | tail -1 | awk '{printf "%.2f MiB", $1/1048576}'); target: <= 16 MiB"
  echo
fi
# A latency comparison of two labels of one scenario: medians, and the p99 ratio of B to A.
latency_table() { # SCENARIO COLUMN A B TARGET
  local sc=$1 col=$2 a=$3 b=$4 l
  printf '| %-8s | %9s | %11s | %8s | %8s | %8s | %7s |\n' "$col" "req/s" "srv µs/req" "p50 µs" "p99 µs" "p999 µs" "other %"
  echo "|----------|----------:|------------:|---------:|---------:|---------:|--------:|"
  for l in "$a" "$b"; do
    printf '| %-8s | %9.0f | %11.2f | %8.0f | %8.0f | %8.0f | %7s |\n' "$l" "$(med "$sc" "$l" .rps)" "$(med "$sc" "$l" .server_cpu_us_per_req)" \
      "$(med "$sc" "$l" .latency_us.p50)" "$(med "$sc" "$l" .latency_us.p99)" "$(med "$sc" "$l" .latency_us.p999)" "$(med "$sc" "$l" .other_cpu_pct)"
  done
  echo "p99 $b / $a: $(awk -v x="$(med "$sc" "$b" .latency_us.p99)" -v y="$(med "$sc" "$a" .latency_us.p99)" 'BEGIN{printf "%.3f", x/y}') (target <= $5)"
}
if wants scraper; then
  echo "## 4. GET /metadata with and without a scraper (medians of $RUNS runs)"
  latency_table scraper load alone scraped 1.10
  echo "scraper: $(med scraper scraper .requests) scrapes per run, latency p50 $(med scraper scraper .latency_us.p50) µs, p99 $(med scraper scraper .latency_us.p99) µs, max $(med scraper scraper .latency_us.max) µs (medians)"
  echo
fi
if wants kvevents; then
  echo "## 5. PUT with the KV-event publisher on and off (medians of $RUNS runs)"
  latency_table kvevents kv off on 1.05
  echo "events per run (medians): published $(med kvevents events .published) (stored $(med kvevents events .stored), removed $(med kvevents events .removed)), received by the subscriber $(med kvevents events .received), dropped $(med kvevents events .dropped), missing sequences $(med kvevents events .missing), keys not parsed $(med kvevents events .skipped_unparsed_keys)"
fi
