#!/usr/bin/env bash
# Server CPU per request: mmc-server (io_uring and epoll) against nginx `return 200`, on this
# machine, the way perf/cpu_per_req.sh measures it.
#
# Usage: perf/compare_nginx.sh [RUNS] [SECS] [CONNS]      (defaults: 5 runs of 8 s, 64 connections)
# Environment: BASE_PORT (default 18480: nginx, +1 mmc io_uring, +2 mmc epoll), SERVER_CPU (0),
#   LOAD_CPU (1), VALUE_BYTES (16), PERF_RUNS (1: mmc-perf runs after the wrk rounds; 0 skips),
#   NGINX_KEEPALIVE_REQUESTS (default 1000000; nginx's own default, 1000, makes wrk reconnect
#   every 1000 requests, which charges nginx for connection setup that mmc-server never pays),
#   QUIET_PCT (5) and QUIET_WAIT (60): before each run, wait up to QUIET_WAIT s for a second in
#   which other processes keep the machine less than QUIET_PCT% busy (this VM is shared with
#   builds and tests of other sessions; each run also reports other_cpu_pct and steal_pct),
#   CLEAN_PCT (5) and RETRIES (2): a run during which other processes used CLEAN_PCT% of a CPU
#   or more is redone up to RETRIES times (the last attempt is kept), and a second table of
#   medians keeps only the runs below CLEAN_PCT.
#
# All three servers are pinned to SERVER_CPU with taskset; wrk (-t1) and mmc-perf to LOAD_CPU.
# Each round runs nginx, mmc io_uring and mmc epoll one after the other (single runs drift by
# ~10% on a VM, so the servers alternate and medians are compared). Per run, exactly as
# cpu_per_req.sh: a 2 s wrk warm-up, then utime+stime of the server process from
# /proc/PID/stat before and after a SECS-second `wrk --latency` run, divided by wrk's request
# count. Every step is bounded by `timeout`; the servers are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh

RUNS=${1:-5}
SECS=${2:-8}
CONNS=${3:-64}
BASE_PORT=${BASE_PORT:-18480}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
VALUE_BYTES=${VALUE_BYTES:-16}
PERF_RUNS=${PERF_RUNS:-1}
NGINX_KEEPALIVE_REQUESTS=${NGINX_KEEPALIVE_REQUESTS:-1000000}
QUIET_PCT=${QUIET_PCT:-5}
QUIET_WAIT=${QUIET_WAIT:-60}
CLEAN_PCT=${CLEAN_PCT:-5}
RETRIES=${RETRIES:-2}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
MMC=$TARGET_DIR/release/mmc-server
PERF=$TARGET_DIR/release/mmc-perf

for tool in wrk nginx taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y wrk nginx-light curl util-linux)" >&2; exit 2; }
done
if [ ! -x "$MMC" ] || [ ! -x "$PERF" ]; then
  echo "building $MMC and $PERF" >&2
  timeout 1200 cargo build --release --bin mmc-server --bin mmc-perf >&2
fi

work=$(mktemp -d /tmp/mmc-compare.XXXXXX)
pids=()
cleanup() {
  stop_pids "${pids[@]}"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_nginx=$BASE_PORT
port_uring=$((BASE_PORT + 1))
port_epoll=$((BASE_PORT + 2))
ports_free $port_nginx $port_uring $port_epoll

wait_up() { # URL: wait up to 5 s for an answer
  for _ in $(seq 50); do curl -s -m 1 -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "no answer from $1" >&2; return 1
}

# nginx: one worker, no access log, its own prefix and config (no system configuration).
nginx_conf "$work/nginx" 4096 "  keepalive_requests $NGINX_KEEPALIVE_REQUESTS;" \
  "  server { listen 127.0.0.1:$port_nginx; location / { return 200 'ok'; } }"
taskset -c "$SERVER_CPU" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
nginx_master=$!
pids+=("$nginx_master")
wait_up "http://127.0.0.1:$port_nginx/"
# The worker serves the requests; the master only supervises it. Measure the worker.
nginx_pid=$(pgrep -P "$nginx_master" | head -1)

# The server runs from a copy with another name: on a machine shared with other sessions, their
# clean-up by name (pkill/killall mmc-server) would otherwise stop it in the middle of a run.
cp "$MMC" "$work/mmcbench-server"
start_mmc() { # PORT DRIVER -> sets mmc_pid
  taskset -c "$SERVER_CPU" "$work/mmcbench-server" --listen "127.0.0.1:$1" --shards 1 --io-driver "$2" \
    > "$work/mmc-$2.log" 2>&1 &
  mmc_pid=$!
  pids+=("$mmc_pid")
  wait_up "http://127.0.0.1:$1/health"
  local value
  value=$(head -c "$VALUE_BYTES" /dev/zero | tr '\0' 'v')
  curl -s -m 5 -X PUT --data-binary "$value" "http://127.0.0.1:$1/metadata?key=bench" > /dev/null
  local got
  got=$(curl -s -m 5 "http://127.0.0.1:$1/metadata?key=bench")
  [ "$got" = "$value" ] || { echo "mmc-server ($2) did not store the value: $got" >&2; exit 1; }
}
start_mmc "$port_uring" uring; uring_pid=$mmc_pid
start_mmc "$port_epoll" epoll; epoll_pid=$mmc_pid
grep -h "listening" "$work"/mmc-*.log | sed 's/^/# /' >&2

url_nginx="http://127.0.0.1:$port_nginx/"
url_uring="http://127.0.0.1:$port_uring/metadata?key=bench"
url_epoll="http://127.0.0.1:$port_epoll/metadata?key=bench"

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
to_us() { # wrk latency (e.g. 450.00us, 1.20ms, 2.00s) -> microseconds
  awk -v v="$1" 'BEGIN{ n=v+0; if (v ~ /us$/) m=1; else if (v ~ /ms$/) m=1000; else if (v ~ /s$/) m=1000000; else m=1; printf "%.0f", n*m }'
}

results=$work/results.txt
: > "$results"
busy_cpu() { awk -v c="cpu$1" '$1==c{print $2+$3+$4+$7+$8}' /proc/stat; }
steal_all() { awk '$1=="cpu"{print $9}' /proc/stat; }
check_alive() { # NAME PID LOG
  kill -0 "$2" 2>/dev/null && return 0
  local st=0
  wait "$2" 2>/dev/null || st=$?
  echo "$1 (pid $2) is gone, exit status $st$( [ "$st" -gt 128 ] && echo " (signal $((st - 128)))"); last lines of its log:" >&2
  tail -20 "$3" >&2 2>/dev/null || true
  exit 1
}
measure() { # NAME PID URL LOG: one run; a noisy one is redone up to RETRIES times
  local attempt
  for attempt in $(seq 0 "$RETRIES"); do
    measure_once "$@"
    awk -v o="$last_other" -v m="$CLEAN_PCT" 'BEGIN{exit !(o+0 < m)}' && break
    [ "$attempt" -lt "$RETRIES" ] && echo "# $1: other processes used ${last_other}% of a CPU during the run: redoing it" >&2
  done
  echo "$last_row" >> "$results"
}
measure_once() { # NAME PID URL LOG: one cpu_per_req.sh run, plus how much else ran meanwhile
  local name=$1 pid=$2 url=$3 log=$4 c0 c1 out rps reqs p50 p99 us s0 s1 l0 l1 st0 st1 wrk_s other steal
  check_alive "$name" "$pid" "$log"
  wait_quiet
  timeout 30 taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d2s "$url" > /dev/null 2>&1 || true
  check_alive "$name" "$pid" "$log"
  c0=$(cpu "$pid"); s0=$(busy_cpu "$SERVER_CPU"); l0=$(busy_cpu "$LOAD_CPU"); st0=$(steal_all)
  { TIMEFORMAT='%3U %3S'; time timeout $((SECS + 30)) taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "$url" > "$work/wrk.out" 2>&1; } 2> "$work/wrk.time" || true
  check_alive "$name" "$pid" "$log"
  c1=$(cpu "$pid"); s1=$(busy_cpu "$SERVER_CPU"); l1=$(busy_cpu "$LOAD_CPU"); st1=$(steal_all)
  out=$(cat "$work/wrk.out")
  rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
  reqs=$(echo "$out" | awk '/requests in/{print $1}')
  p50=$(to_us "$(echo "$out" | awk '$1=="50%"{print $2}')")
  p99=$(to_us "$(echo "$out" | awk '$1=="99%"{print $2}')")
  us=$(awk -v a="$c0" -v b="$c1" -v t="$tck" -v n="$reqs" 'BEGIN{printf "%.2f", (b-a)/t*1e6/n}')
  # CPU time on the two CPUs not spent by the server or by wrk (other processes, idle-time
  # softirqs), and hypervisor steal, in % of one CPU over the run: a noisy run shows here.
  wrk_s=$(awk '{print $1+$2}' "$work/wrk.time")
  other=$(awk -v s="$((s1 - s0))" -v l="$((l1 - l0))" -v srv="$((c1 - c0))" -v w="$wrk_s" -v t="$tck" -v d="$SECS" \
    'BEGIN{o=(s-srv)/t + (l/t - w); if (o<0) o=0; printf "%.1f", o/d*100}')
  steal=$(awk -v a="$st0" -v b="$st1" -v t="$tck" -v d="$SECS" 'BEGIN{printf "%.1f", (b-a)/t/d*100}')
  if echo "$out" | grep -q "Non-2xx\|Socket errors"; then
    echo "# $name: $(echo "$out" | grep "Non-2xx\|Socket errors" | tr -s ' ')" >&2
  fi
  printf '%-10s rps=%s cpu_us_per_req=%s p50_us=%s p99_us=%s other_cpu_pct=%s steal_pct=%s\n' \
    "$name" "$rps" "$us" "$p50" "$p99" "$other" "$steal"
  last_other=$other
  last_row="$name $rps $us $p50 $p99 $other $steal"
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(uname -r), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
echo "# $RUNS rounds of wrk -t1 -c$CONNS -d${SECS}s on CPU $LOAD_CPU; servers on CPU $SERVER_CPU"
echo "# nginx $(nginx -v 2>&1 | sed 's/.*\///'), worker pid $nginx_pid; mmc io_uring pid $uring_pid; mmc epoll pid $epoll_pid"
for round in $(seq "$RUNS"); do
  echo "# round $round"
  measure nginx "$nginx_pid" "$url_nginx" "$work/nginx/logs/error.log"
  measure mmc-uring "$uring_pid" "$url_uring" "$work/mmc-uring.log"
  measure mmc-epoll "$epoll_pid" "$url_epoll" "$work/mmc-epoll.log"
done

col() { awk -v n="$1" -v c="$2" '$1==n{print $c}' "$results" | median %.2f; }
# The same over the runs during which other processes used less than CLEAN_PCT% of a CPU.
ccol() { awk -v n="$1" -v c="$2" -v m="$CLEAN_PCT" '$1==n && $6+0 < m {print $c}' "$results" | median %.2f; }
cnt() { awk -v n="$1" -v m="$CLEAN_PCT" '$1==n && $6+0 < m {k++} END{print k+0}' "$results"; }
table() { # col-function title
  local f=$1 n label
  echo
  echo "## $2"
  printf '| %-22s | %5s | %10s | %11s | %7s | %7s | %9s |\n' server runs "req/s" "CPU µs/req" "p50 µs" "p99 µs" "other %"
  printf '|%s|%s|%s|%s|%s|%s|%s|\n' "------------------------" "------:" "-----------:" "------------:" "--------:" "--------:" "----------:"
  for n in mmc-uring mmc-epoll nginx; do
    case $n in
      mmc-uring) label="mmc-server io_uring";; mmc-epoll) label="mmc-server epoll";; nginx) label="nginx return 200";;
    esac
    local runs=$RUNS
    [ "$f" = ccol ] && runs=$(cnt $n)
    printf '| %-22s | %5s | %10s | %11s | %7s | %7s | %9s |\n' "$label" "$runs" "$($f $n 2)" "$($f $n 3)" "$($f $n 4)" "$($f $n 5)" "$($f $n 6)"
  done
  local ng
  ng=$($f nginx 3)
  echo
  echo "ratio mmc io_uring / nginx (CPU µs per request): $(awk -v a="$($f mmc-uring 3)" -v b="$ng" 'BEGIN{ if (b+0 > 0) printf "%.2f", a/b; else print "n/a" }')"
  echo "ratio mmc epoll    / nginx (CPU µs per request): $(awk -v a="$($f mmc-epoll 3)" -v b="$ng" 'BEGIN{ if (b+0 > 0) printf "%.2f", a/b; else print "n/a" }')"
}
table col "medians of all $RUNS runs (wrk -t1 -c$CONNS -d${SECS}s)"
table ccol "medians of the runs with other_cpu_pct < $CLEAN_PCT"
echo "target: ratio <= 1.00"

if [ "$PERF_RUNS" -gt 0 ] && [ -x "$PERF" ]; then
  echo
  echo "## mmc-perf (1 load thread pinned to CPU $LOAD_CPU, $CONNS connections, ${SECS} s after 1 s warm-up)"
  for i in $(seq "$PERF_RUNS"); do
    for n in nginx mmc-uring mmc-epoll; do
      case $n in
        nginx) pid=$nginx_pid; port=$port_nginx; req="GET /";;
        mmc-uring) pid=$uring_pid; port=$port_uring; req="GET /metadata?key=bench";;
        mmc-epoll) pid=$epoll_pid; port=$port_epoll; req="GET /metadata?key=bench";;
      esac
      echo "$n: $(timeout $((SECS + 30)) "$PERF" --target "127.0.0.1:$port" --connections "$CONNS" \
        --duration "$SECS" --warmup 1 --pin "$LOAD_CPU" --cpu-pid "$pid" --request "$req" --json)"
    done
  done
fi
