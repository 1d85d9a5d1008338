#!/usr/bin/env bash
# Issue 33: server CPU per request of the io_uring prototypes (perf/uring_proto) beside nginx
# `return 200` and mmc-server (io_uring and epoll drivers), measured as perf/compare_nginx.sh
# does: every server pinned to SERVER_CPU, `wrk -t1 -cCONNS` pinned to LOAD_CPU, a 2 s warm-up,
# then the server's utime+stime (/proc/PID/stat) over a SECS-second run divided by wrk's
# request count. Servers alternate within each round; medians over the rounds. Each run also
# records /proc/loadavg and the CPU used by other processes (other_cpu_pct).
#
# Usage: perf/uring_proto/compare.sh [RUNS] [SECS] [CONNS] [DEPTH]
#   DEPTH > 1: wrk pipelines DEPTH requests per write (pipeline.lua beside this script).
# Environment: BASE_PORT (19520), SERVER_CPU (0), LOAD_CPU (1), QUIET_PCT (5), QUIET_WAIT (20),
#   SERVERS (default: all of nginx mmc-uring mmc-epoll ring ring-nofixed ring-nodefer ring-plain
#   monoio-uring monoio-uring-tuned monoio-epoll; tokio-uring too when the binary was built
#   with `--features tokio-uring`; mmc-ring, mmc-server's `--io-driver ring`, on request),
#   MMC (target/release/mmc-server), MMC_OLD (another build, for the servers old-uring,
#   old-epoll and old-ring: mmc-server's drivers on that build, to compare two builds side by side).
#   A server of mmc-server's written NAME@VAR=VALUE[,VAR=VALUE] (mmc-ring@MMC_X=1) runs with those
#   environment variables: one build, several settings, side by side.
# Each run's line also has wrk's latency percentiles (p50, p99).
# Everything started here is killed on exit; every step is bounded by timeout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
QUIET_WAIT=${QUIET_WAIT:-20}
QUIET_PCT=${QUIET_PCT:-5}
. perf/lib.sh

RUNS=${1:-5}
SECS=${2:-8}
CONNS=${3:-64}
DEPTH=${4:-1}
BASE_PORT=${BASE_PORT:-19520}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
MMC=${MMC:-target/release/mmc-server}
PROTO=$here/target/release/uring-proto
SERVERS=${SERVERS:-"nginx mmc-uring mmc-epoll ring ring-nofixed ring-nodefer ring-plain monoio-uring monoio-uring-tuned monoio-epoll"}
# Every server exits by itself after this long: room for each run's quiet wait, warm-up and run.
nservers=$(echo $SERVERS | wc -w)
MAX_SECS=$(( RUNS * nservers * (QUIET_WAIT + SECS + 15) + 300 ))

for tool in wrk nginx taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
if echo " $SERVERS " | grep -qE ' (ring|ring-[a-z]+|monoio-[a-z-]+|tokio-uring) '; then
  [ -x "$PROTO" ] || { echo "build $PROTO first (cargo build --release in perf/uring_proto)" >&2; exit 2; }
fi

work=$(mktemp -d /tmp/uring-proto.XXXXXX)
pids=()
cleanup() { stop_pids "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_up() { for _ in $(seq 50); do curl -s -m 1 -o /dev/null "$1" && return 0; sleep 0.1; done; echo "no answer from $1" >&2; return 1; }

declare -A PID URL LOG
port=$BASE_PORT
for s in $SERVERS; do
  port=$((port + 1))
  ports_free "$port"
  LOG[$s]=$work/$s.log
  case $s in
    nginx)
      nginx_conf "$work/nginx" 4096 "  keepalive_requests 1000000;" \
        "  server { listen 127.0.0.1:$port; location / { return 200 'ok'; } }"
      taskset -c "$SERVER_CPU" timeout "$MAX_SECS" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" > "${LOG[$s]}" 2>&1 &
      pids+=($!)
      URL[$s]="http://127.0.0.1:$port/"
      wait_up "${URL[$s]}"
      # timeout -> nginx master -> worker (the worker serves; measure it)
      master=$(pgrep -P $! | head -1); PID[$s]=$(pgrep -P "$master" | head -1)
      ;;
    mmc-uring|mmc-epoll|mmc-ring|old-uring|old-epoll|old-ring|mmc-*@*|old-*@*)
      bin=$work/mmcbench-server; src=$MMC
      case $s in old-*) bin=$work/mmcbench-old; src=${MMC_OLD:?old-* servers need MMC_OLD};; esac
      [ -f "$bin" ] || cp "$src" "$bin"
      # NAME@K=V,K=V: the same server with those environment variables.
      base=${s%%@*}; vars=(); [ "$base" != "$s" ] && IFS=, read -r -a vars <<< "${s#*@}"
      drv=${base#*-}
      taskset -c "$SERVER_CPU" timeout "$MAX_SECS" env "${vars[@]}" "$bin" --listen "127.0.0.1:$port" --shards 1 --io-driver "$drv" > "${LOG[$s]}" 2>&1 &
      pids+=($!)
      URL[$s]="http://127.0.0.1:$port/metadata?key=bench"
      wait_up "http://127.0.0.1:$port/health"
      curl -s -m 5 -X PUT --data-binary vvvvvvvvvvvvvvvv "http://127.0.0.1:$port/metadata?key=bench" > /dev/null
      PID[$s]=$(pgrep -P $! | head -1)
      ;;
    ring|ring-nofixed|ring-nodefer|ring-plain|monoio-uring|monoio-uring-tuned|monoio-epoll|tokio-uring)
      mode=$s; extra=()
      case $s in ring-nofixed) mode=ring; extra=(--no-fixed);; ring-nodefer) mode=ring; extra=(--no-defer);; ring-plain) mode=ring; extra=(--plain);; esac
      taskset -c "$SERVER_CPU" "$PROTO" "$mode" --port "$port" --max-secs "$MAX_SECS" "${extra[@]}" > "${LOG[$s]}" 2>&1 &
      pids+=($!); PID[$s]=$!
      URL[$s]="http://127.0.0.1:$port/metadata?key=bench"
      wait_up "${URL[$s]}"
      ;;
    *) echo "unknown server $s" >&2; exit 2;;
  esac
  pids+=("${PID[$s]}")
  echo "# $s: pid ${PID[$s]} ${URL[$s]} ($(sed -n 2,9p "${LOG[$s]}" | grep -v '^\s*$' | tr '\n' ';' | cut -c1-200))"
done

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
utime() { awk '{print $14}' "/proc/$1/stat"; }
# Context switches of all the server's threads (it sleeps in the kernel when it runs out of work).
csw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches/{n+=$2} END{print n+0}'; }
busy_cpu() { awk -v c="cpu$1" '$1==c{print $2+$3+$4+$7+$8}' /proc/stat; }
results=$work/results.txt
: > "$results"
wrk_args=()
[ "$DEPTH" -gt 1 ] && wrk_args=(-s "$here/pipeline.lua")
export WRK_DEPTH=$DEPTH

measure() { # NAME
  local name=$1 pid=${PID[$1]} url=${URL[$1]} x0 x1 u0 u1 user_us csw_k c0 c1 s0 s1 l0 l1 out rps reqs us other wrk_s load
  kill -0 "$pid" || { echo "$name is gone; log:" >&2; tail "${LOG[$name]}" >&2; exit 1; }
  wait_quiet
  timeout 30 taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d2s "${wrk_args[@]}" "$url" > /dev/null 2>&1 || true
  load=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')
  x0=$(csw "$pid"); u0=$(utime "$pid"); c0=$(cpu "$pid"); s0=$(busy_cpu "$SERVER_CPU"); l0=$(busy_cpu "$LOAD_CPU")
  { TIMEFORMAT='%3U %3S'; time timeout $((SECS + 30)) taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "${wrk_args[@]}" "$url" > "$work/wrk.out" 2>&1; } 2> "$work/wrk.time" || true
  c1=$(cpu "$pid"); u1=$(utime "$pid"); x1=$(csw "$pid"); s1=$(busy_cpu "$SERVER_CPU"); l1=$(busy_cpu "$LOAD_CPU")
  out=$(cat "$work/wrk.out")
  rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
  reqs=$(echo "$out" | awk '/requests in/{print $1}')
  us=$(awk -v a="$c0" -v b="$c1" -v t="$tck" -v n="$reqs" 'BEGIN{printf "%.2f", (b-a)/t*1e6/n}')
  wrk_s=$(awk '{print $1+$2}' "$work/wrk.time")
  user_us=$(awk -v a="$u0" -v b="$u1" -v t="$tck" -v n="$reqs" 'BEGIN{printf "%.2f", (b-a)/t*1e6/n}')
  csw_k=$(awk -v a="$x0" -v b="$x1" -v n="$reqs" 'BEGIN{printf "%.1f", (b-a)*1000/n}')
  other=$(awk -v s="$((s1 - s0))" -v l="$((l1 - l0))" -v srv="$((c1 - c0))" -v w="$wrk_s" -v t="$tck" -v d="$SECS" \
    'BEGIN{o=(s-srv)/t + (l/t - w); if (o<0) o=0; printf "%.1f", o/d*100}')
  if echo "$out" | grep -q "Non-2xx\|Socket errors"; then echo "# $name: $(echo "$out" | grep "Non-2xx\|Socket errors" | tr -s ' ')"; fi
  p50=$(echo "$out" | awk '$1=="50%"{print $2}'); p99=$(echo "$out" | awk '$1=="99%"{print $2}')
  printf '%-19s rps=%-10s cpu_us_per_req=%-6s user_us=%-5s other_cpu_pct=%-5s csw_per_1k_req=%-6s p50=%-8s p99=%-8s loadavg=%s\n' "$name" "$rps" "$us" "$user_us" "$other" "$csw_k" "$p50" "$p99" "$load"
  echo "$name $rps $us $other $csw_k $user_us" >> "$results"
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, kernel $(uname -r), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
echo "# $RUNS rounds of wrk -t1 -c$CONNS -d${SECS}s (pipeline depth $DEPTH) on CPU $LOAD_CPU; servers on CPU $SERVER_CPU"
for round in $(seq "$RUNS"); do
  echo "# round $round"
  for s in $SERVERS; do measure "$s"; done
done

CLEAN_PCT=${CLEAN_PCT:-20}
col() { awk -v n="$1" -v c="$2" '$1==n{print $c}' "$results" | median %.2f; }
# The same over the runs during which other processes used less than CLEAN_PCT% of a CPU.
ccol() { awk -v n="$1" -v c="$2" -v m="$CLEAN_PCT" '$1==n && $4+0 < m {print $c}' "$results" | median %.2f; }
cnt() { awk -v n="$1" -v m="$CLEAN_PCT" '$1==n && $4+0 < m {k++} END{print k+0}' "$results"; }
table() { # col-function title
  local f=$1 s u ng ep
  echo
  echo "## $2"
  printf '| %-19s | %4s | %10s | %10s | %7s | %10s | %7s | %10s | %10s |\n' server runs "req/s" "CPU µs/req" "/ nginx" "/ mmc-epoll" "other %" "csw/1k req" "user µs/req"
  printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' "---------------------" "-----:" "-----------:" "-----------:" "--------:" "-----------:" "--------:" "-----------:" "-----------:"
  ng=$($f nginx 3); ep=$($f mmc-epoll 3)
  for s in $SERVERS; do
    u=$($f "$s" 3)
    printf '| %-19s | %4s | %10s | %10s | %7s | %10s | %7s | %10s | %10s |\n' "$s" "$([ "$f" = ccol ] && cnt "$s" || echo "$RUNS")" "$($f "$s" 2)" "$u" \
      "$(awk -v a="$u" -v b="$ng" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "-" }')" \
      "$(awk -v a="$u" -v b="$ep" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "-" }')" "$($f "$s" 4)" "$($f "$s" 5)" "$($f "$s" 6)"
  done
}
table col "medians of $RUNS rounds (wrk -t1 -c$CONNS -d${SECS}s, pipeline depth $DEPTH)"
table ccol "medians of the runs with other_cpu_pct < $CLEAN_PCT"
