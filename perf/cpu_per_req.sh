#!/usr/bin/env bash
# Server CPU per request, measured with wrk.
#
#   perf/cpu_per_req.sh PID URL [CONNS] [SECS] [extra wrk args...]
#
# PID is the server to measure (start it pinned to another CPU, e.g. `taskset -c 0`); wrk runs
# on LOAD_CPU (default 1) with one thread: a 2 s warm-up, then SECS seconds (default 8) with
# CONNS connections (default 64). The server's CPU is utime+stime of the whole process (all
# threads) from /proc/PID/stat, read just before and just after the measured run. Prints one
# line: rps=… cpu_us_per_req=… p50=… p99=…
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
pid=$1 url=$2
conns=${3:-64}
secs=${4:-8}
shift $(($# < 4 ? $# : 4))
load_cpu=${LOAD_CPU:-1}
command -v wrk >/dev/null || { echo "cpu_per_req.sh: wrk is not installed (apt-get install wrk)" >&2; exit 2; }
[ -r "/proc/$pid/stat" ] || { echo "cpu_per_req.sh: no process $pid" >&2; exit 2; }

ticks=$(getconf CLK_TCK)
# Fields 14 and 15 of /proc/PID/stat (after the parenthesised command name, which may hold spaces).
server_ticks() { sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}'; }

timeout $((secs + 30)) taskset -c "$load_cpu" wrk -t1 -c"$conns" -d2s "$url" "$@" >/dev/null 2>&1
before=$(server_ticks)
report=$(timeout $((secs + 30)) taskset -c "$load_cpu" wrk -t1 -c"$conns" -d"${secs}s" --latency "$url" "$@" 2>&1)
after=$(server_ticks)

rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$report")
requests=$(awk '/ requests in / {print $1}' <<<"$report")
p50=$(awk '$1 == "50%" {print $2}' <<<"$report")
p99=$(awk '$1 == "99%" {print $2}' <<<"$report")
if [ -z "$requests" ] || [ "$requests" -eq 0 ]; then
  echo "cpu_per_req.sh: wrk answered no requests:" >&2
  echo "$report" >&2
  exit 1
fi
us=$(awk -v a="$before" -v b="$after" -v t="$ticks" -v n="$requests" \
  'BEGIN { printf "%.2f", (b - a) / t * 1e6 / n }')
echo "rps=$rps cpu_us_per_req=$us p50=$p50 p99=$p99"
