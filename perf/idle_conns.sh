#!/usr/bin/env bash
# Issue 33: many mostly idle connections. For nginx `return 200` and mmc-server on each of its
# io drivers (`uring`: monoio's io_uring, `epoll`, `ring`: the front ring), one shard / worker
# pinned to SERVER_CPU:
#   1. IDLE keep-alive connections are opened and served once (perf/idle_holder.py on LOAD_CPU),
#      then left idle; the server's resident memory before and after gives KiB per connection;
#   2. the server's CPU over QUIET_SECS with only those idle connections open (housekeeping of
#      10 k connections, timers) in ms per second;
#   3. `wrk -t1 -cCONNS -dSECS` on LOAD_CPU beside them: server CPU per request, as
#      perf/uring_proto/compare.sh measures it (utime+stime from /proc/PID/stat / requests);
#   4. the holder then reports how many of its connections the server still held (all must be).
# Servers alternate within each round; medians over the rounds.
#
# Usage: perf/idle_conns.sh [RUNS] [SECS] [IDLE] [CONNS]     (defaults: 3 rounds, 6 s, 10000, 64)
# Environment: BASE_PORT (19620), SERVER_CPU (0), LOAD_CPU (1), QUIET_SECS (3), QUIET_PCT (5),
#   QUIET_WAIT (20), SERVERS ("nginx mmc-uring mmc-epoll mmc-ring"), MMC (target/release/mmc-server).
# Everything started here is killed on exit; every step is bounded by timeout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
QUIET_WAIT=${QUIET_WAIT:-20}
QUIET_PCT=${QUIET_PCT:-5}
. perf/lib.sh

RUNS=${1:-3}
SECS=${2:-6}
IDLE=${3:-10000}
CONNS=${4:-64}
BASE_PORT=${BASE_PORT:-19620}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
QUIET_SECS=${QUIET_SECS:-3}
MMC=${MMC:-target/release/mmc-server}
SERVERS=${SERVERS:-"nginx mmc-uring mmc-epoll mmc-ring"}
nservers=$(echo $SERVERS | wc -w)
MAX_SECS=$(( RUNS * nservers * (QUIET_WAIT + SECS + QUIET_SECS + 60) + 300 ))

for tool in wrk nginx taskset curl awk python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
ulimit -n $(( IDLE + CONNS + 1024 )) 2>/dev/null || { echo "cannot raise the descriptor limit to $(( IDLE + CONNS + 1024 ))" >&2; exit 2; }

work=$(mktemp -d /tmp/idle-conns.XXXXXX)
pids=()
cleanup() { stop_pids "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_up() { for _ in $(seq 50); do curl -s -m 1 -o /dev/null "$1" && return 0; sleep 0.1; done; echo "no answer from $1" >&2; return 1; }

declare -A PID URL LOG PORT PATHQ
port=$BASE_PORT
for s in $SERVERS; do
  port=$((port + 1))
  ports_free "$port"
  LOG[$s]=$work/$s.log
  PORT[$s]=$port
  case $s in
    nginx)
      nginx_conf "$work/nginx" $(( IDLE + CONNS + 512 )) \
        "  keepalive_requests 1000000; keepalive_timeout 600s;" \
        "  server { listen 127.0.0.1:$port backlog=16384; location / { return 200 'ok'; } }"
      sed -i "s/^worker_processes 1;/worker_processes 1;\nworker_rlimit_nofile $(( IDLE + CONNS + 1024 ));/" "$work/nginx/nginx.conf"
      taskset -c "$SERVER_CPU" timeout "$MAX_SECS" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" > "${LOG[$s]}" 2>&1 &
      pids+=($!)
      URL[$s]="http://127.0.0.1:$port/"
      PATHQ[$s]=/
      wait_up "${URL[$s]}"
      master=$(pgrep -P $! | head -1); PID[$s]=$(pgrep -P "$master" | head -1)
      ;;
    mmc-uring|mmc-epoll|mmc-ring)
      [ -f "$work/mmcbench-server" ] || cp "$MMC" "$work/mmcbench-server"
      drv=${s#mmc-}
      taskset -c "$SERVER_CPU" timeout "$MAX_SECS" "$work/mmcbench-server" --listen "127.0.0.1:$port" --shards 1 --io-driver "$drv" \
        --set ock.mmc.http.idle_timeout_ms=600000 > "${LOG[$s]}" 2>&1 &
      pids+=($!)
      URL[$s]="http://127.0.0.1:$port/metadata?key=bench"
      PATHQ[$s]="/metadata?key=bench"
      wait_up "http://127.0.0.1:$port/health"
      curl -s -m 5 -X PUT --data-binary vvvvvvvvvvvvvvvv "http://127.0.0.1:$port/metadata?key=bench" > /dev/null
      PID[$s]=$(pgrep -P $! | head -1)
      ;;
    *) echo "unknown server $s" >&2; exit 2;;
  esac
  pids+=("${PID[$s]}")
  echo "# $s: pid ${PID[$s]} ${URL[$s]}"
done

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
results=$work/results.txt
: > "$results"

measure() { # NAME
  local name=$1 pid=${PID[$1]} url=${URL[$1]} r0 r1 c0 c1 q0 q1 reqs rps us idle_ms kib alive ready
  kill -0 "$pid" || { echo "$name is gone; log:" >&2; tail "${LOG[$name]}" >&2; exit 1; }
  wait_quiet
  r0=$(rss_kib "$pid")
  mkfifo "$work/hold.in"
  taskset -c "$LOAD_CPU" timeout $(( SECS + QUIET_SECS + 240 )) python3 perf/idle_holder.py "$IDLE" "${PORT[$name]}" "${PATHQ[$name]}" $(( SECS + QUIET_SECS + 200 )) \
    < "$work/hold.in" > "$work/hold.out" 2>&1 &
  local holder=$!
  exec 7> "$work/hold.in"
  for _ in $(seq 1200); do grep -q '^ready\|Error' "$work/hold.out" && break; sleep 0.1; done
  ready=$(awk '/^ready/{print $2}' "$work/hold.out")
  [ "${ready:-0}" = "$IDLE" ] || { echo "$name: holder not ready: $(tail -3 "$work/hold.out")" >&2; exec 7>&-; rm -f "$work/hold.in"; return 1; }
  sleep 1
  r1=$(rss_kib "$pid")
  q0=$(cpu "$pid"); sleep "$QUIET_SECS"; q1=$(cpu "$pid")
  timeout 30 taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d2s "$url" > /dev/null 2>&1 || true
  c0=$(cpu "$pid")
  timeout $((SECS + 30)) taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" "$url" > "$work/wrk.out" 2>&1 || true
  c1=$(cpu "$pid")
  echo done >&7; exec 7>&-
  wait "$holder" || true
  rm -f "$work/hold.in"
  alive=$(awk '/^alive/{print $2}' "$work/hold.out")
  rps=$(awk '/Requests\/sec/{print $2}' "$work/wrk.out")
  reqs=$(awk '/requests in/{print $1}' "$work/wrk.out")
  us=$(awk -v a="$c0" -v b="$c1" -v t="$tck" -v n="$reqs" 'BEGIN{printf "%.2f", (b-a)/t*1e6/n}')
  idle_ms=$(awk -v a="$q0" -v b="$q1" -v t="$tck" -v s="$QUIET_SECS" 'BEGIN{printf "%.1f", (b-a)/t*1000/s}')
  kib=$(awk -v a="$r0" -v b="$r1" -v n="$IDLE" 'BEGIN{printf "%.2f", (b-a)/n}')
  if grep -q "Non-2xx\|Socket errors" "$work/wrk.out"; then echo "# $name: $(grep "Non-2xx\|Socket errors" "$work/wrk.out" | tr -s ' ')"; fi
  printf '%-10s idle=%-6s alive=%-6s rps=%-10s cpu_us_per_req=%-6s idle_cpu_ms_per_s=%-6s rss_kib_per_conn=%-6s\n' \
    "$name" "$IDLE" "$alive" "$rps" "$us" "$idle_ms" "$kib"
  echo "$name $rps $us $idle_ms $kib $alive" >> "$results"
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, kernel $(uname -r), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
echo "# $RUNS rounds: $IDLE idle connections, then wrk -t1 -c$CONNS -d${SECS}s on CPU $LOAD_CPU; servers on CPU $SERVER_CPU"
for round in $(seq "$RUNS"); do
  echo "# round $round"
  for s in $SERVERS; do measure "$s"; done
done

col() { awk -v n="$1" -v c="$2" '$1==n{print $c}' "$results" | median %.2f; }
echo
echo "## medians of $RUNS rounds ($IDLE idle connections; wrk -t1 -c$CONNS -d${SECS}s)"
printf '| %-10s | %10s | %10s | %7s | %11s | %11s | %11s |\n' server "req/s" "CPU µs/req" "/ nginx" "idle ms/s" "KiB/conn" "held open"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "------------" "-----------:" "-----------:" "--------:" "------------:" "------------:" "------------:"
ng=$(col nginx 3)
for s in $SERVERS; do
  u=$(col "$s" 3)
  printf '| %-10s | %10s | %10s | %7s | %11s | %11s | %11s |\n' "$s" "$(col "$s" 2)" "$u" \
    "$(awk -v a="$u" -v b="$ng" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "-" }')" \
    "$(col "$s" 4)" "$(col "$s" 5)" "$(awk -v n="$s" '$1==n{print $6}' "$results" | sort -n | head -1)/$IDLE"
done
