#!/usr/bin/env bash
# Server CPU per scrape (issue 34): mmc-server answering GET /metrics (and the other scrape
# routes) side by side with nginx sending the very same bytes as a static file.
#
# Usage: perf/scrape_cost.sh [RUNS] [SECS]          (defaults: 7 rounds of 5 s per server and route)
# Environment: BASE_PORT (18560: nginx, +1 mmc-server), SERVER_CPU (0), LOAD_CPU (1),
#   KEYS (0: 0-byte objects stored before measuring, to check the cost stays flat in keys),
#   ROUTES ("metrics": any of metrics, proto (the protobuf /metrics, asked for with the Accept
#   header of a Prometheus with native histograms), summary, ptracer), NGINX_SENDFILE (on, as
#   Debian's stock nginx.conf has it; off: read + writev), MMC (the server binary; default
#   target/release/mmc-server), MMC_BEFORE (another mmc-server binary, e.g. main's, measured
#   in the same rounds: before/after side by side), MMC_ARGS (more server options), QUIET_PCT (5), QUIET_WAIT (60),
#   CLEAN_PCT (5) and RETRIES (2) as in compare_nginx.sh, OUT (a directory that keeps the raw
#   results, the scraped bodies and the logs).
#
# Both servers run on SERVER_CPU (taskset), one at a time in each round (which one goes first
# alternates), one shard for mmc-server and one worker for nginx; the scraper is mmc-perf, one
# keep-alive connection in a closed loop on LOAD_CPU. Before the rounds, a short mixed
# workload gives every histogram and counter figures (so the exposition has its real digits),
# then each route's body is saved and nginx serves that file. A run: 1 s warm-up, then
# utime+stime of the server process (nginx: its worker) from /proc/PID/stat before and after
# SECS seconds of scrapes, divided by the scrapes answered. The kernel's ksoftirqd CPU (loopback
# receive work that overflowed into it) is reported apart. Medians are compared; the ratio's
# target is <= 1.3 for `metrics`.
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh

RUNS=${1:-7}
SECS=${2:-5}
BASE_PORT=${BASE_PORT:-18560}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
KEYS=${KEYS:-0}
ROUTES=${ROUTES:-metrics}
NGINX_SENDFILE=${NGINX_SENDFILE:-on}
QUIET_PCT=${QUIET_PCT:-5}
QUIET_WAIT=${QUIET_WAIT:-60}
CLEAN_PCT=${CLEAN_PCT:-5}
RETRIES=${RETRIES:-2}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
MMC=${MMC:-$TARGET_DIR/release/mmc-server}
PERF=${PERF:-$TARGET_DIR/release/mmc-perf}
PROTO_ACCEPT='application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2'

for tool in nginx taskset curl awk jq; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y nginx-light curl jq util-linux)" >&2; exit 2; }
done
for r in $ROUTES; do
  case $r in metrics|proto|summary|ptracer) ;; *) echo "unknown route $r (metrics, proto, summary, ptracer)" >&2; exit 2;; esac
done
if [ ! -x "$MMC" ] || [ ! -x "$PERF" ]; then
  echo "building $MMC and $PERF" >&2
  timeout 1800 cargo build --release --bin mmc-server --bin mmc-perf >&2
fi

work=$(mktemp -d /tmp/mmc-scrape.XXXXXX)
chmod 755 "$work" # nginx's worker (user nobody when started as root) reads the bodies
pids=()
cleanup() {
  stop_pids "${pids[@]}"
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp -r "$work"/results.txt "$work"/*.log "$work"/www "$OUT"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_nginx=$BASE_PORT
port_mmc=$((BASE_PORT + 1))
port_before=$((BASE_PORT + 2))
ports_free $port_nginx $port_mmc $port_before
wait_up() { # URL: up to 10 s for a 200
  for _ in $(seq 100); do curl -sf -m 1 -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "no answer from $1" >&2; return 1
}

# mmc-server from a copy with another name (a clean-up by name elsewhere on a shared machine
# would stop it mid-run), one shard; the same for MMC_BEFORE.
start_mmc() { # NAME BINARY PORT -> sets srv_pid
  cp "$2" "$work/mmcscrape-$1"
  # shellcheck disable=SC2086
  taskset -c "$SERVER_CPU" "$work/mmcscrape-$1" --listen "127.0.0.1:$3" --shards 1 ${MMC_ARGS:-} \
    > "$work/$1.log" 2>&1 &
  srv_pid=$!
  pids+=("$srv_pid")
  wait_up "http://127.0.0.1:$3/ready"
  # Figures in every family: puts, gets, lookups, removals, metadata, listings and scrapes.
  timeout 60 "$PERF" --target "127.0.0.1:$3" --connections 4 --duration 1 --warmup 0 --pin "$LOAD_CPU" --json \
    --keys 2000 --body-bytes 4096 --request "PUT /api/v1/objects?key=w-{seq} 4" \
    --request "GET /api/v1/objects?key=w-{key} 8" --request "GET /api/v1/objects/exist?key=w-{key} 2" \
    --request "GET /query_key?key=w-{key} 2" --request "DELETE /api/v1/objects?key=w-{key} 1" \
    --request "PUT /metadata?key=m-{key} 1" --request "GET /metadata?key=m-{key} 2" \
    --request "GET /batch_query_keys?keys=w-1,w-2 1" --request "GET /health 1" \
    --request "GET /metrics/summary 1" --request "GET /api/v1/capacity/usage 1" > "$work/warmup-$1.json"
  if [ "$KEYS" -gt 0 ]; then
    timeout 1200 "$PERF" fill --target "127.0.0.1:$3" --keys "$KEYS" --value-bytes 0 > "$work/fill-$1.json"
  fi
}
start_mmc mmc "$MMC" "$port_mmc"; mmc_pid=$srv_pid
servers="nginx mmc"
if [ -n "${MMC_BEFORE:-}" ]; then
  start_mmc before "$MMC_BEFORE" "$port_before"; before_pid=$srv_pid
  servers="nginx before mmc"
fi
target=127.0.0.1:$port_mmc

accept_of() { [ "$1" = proto ] && echo "$PROTO_ACCEPT" || echo '*/*'; }
path_of() {
  case $1 in metrics|proto) echo /metrics;; summary) echo /metrics/summary;; ptracer) echo /metrics/ptracer;; esac
}
mkdir -p "$work/www"
for r in $ROUTES; do
  curl -sf -m 5 -H "Accept: $(accept_of "$r")" -D "$work/www/$r.head" -o "$work/www/$r" "http://$target$(path_of "$r")"
done

# nginx: one worker, no access log, its own prefix; each route's body as a static file.
nginx_conf "$work/nginx" 1024 "  sendfile $NGINX_SENDFILE;
  tcp_nopush on;
  keepalive_requests 1000000;
  default_type text/plain;" "  server { listen 127.0.0.1:$port_nginx; root $work/www; }"
taskset -c "$SERVER_CPU" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" > "$work/nginx.log" 2>&1 &
nginx_master=$!
pids+=("$nginx_master")
wait_up "http://127.0.0.1:$port_nginx/$(echo "$ROUTES" | awk '{print $1}')"
nginx_pid=$(pgrep -P "$nginx_master" | head -1)

cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
softirqd=$(pgrep '^ksoftirqd/' | tr '\n' ' ')
softirq_ticks() { local p t=0; for p in $softirqd; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
check_alive() { # NAME PID
  kill -0 "$2" 2>/dev/null && return 0
  echo "$1 (pid $2) is gone; last lines of its log:" >&2
  tail -20 "$work/$1.log" >&2 2>/dev/null || true
  exit 1
}

results=$work/results.txt
: > "$results"
# One measured run: mmc-perf scraping PATH on PORT, server PID. Prints and records
# "ROUTE SERVER scrapes/s µs/scrape ksoftirqd-µs/scrape other_cpu_pct"; a run during which
# other processes used CLEAN_PCT% of a CPU or more is redone up to RETRIES times.
measure() { # ROUTE SERVER PID PORT PATH
  local route=$1 server=$2 pid=$3 port=$4 path=$5 attempt b0 b1 s0 s1 q0 q1 t0 t1 other rps us soft hdr=()
  [ "$route" = proto ] && hdr=(--header "Accept: $PROTO_ACCEPT")
  for attempt in $(seq 0 "$RETRIES"); do
    check_alive "$server" "$pid"
    wait_quiet
    b0=$(busy_all); s0=$(cpu_ticks "$pid"); q0=$(softirq_ticks); t0=$(date +%s.%N)
    { TIMEFORMAT='%3U %3S'; time timeout 120 "$PERF" --target "127.0.0.1:$port" --connections 1 \
        --duration "$SECS" --warmup 1 --pin "$LOAD_CPU" --cpu-pid "$pid" --json "${hdr[@]}" \
        --request "GET $path" > "$work/perf.out" 2> "$work/perf.err"; } 2> "$work/perf.time" || true
    b1=$(busy_all); s1=$(cpu_ticks "$pid"); q1=$(softirq_ticks); t1=$(date +%s.%N)
    jq -e . "$work/perf.out" > /dev/null 2>&1 || { echo "# mmc-perf failed: $(cat "$work/perf.err")" >&2; exit 1; }
    rps=$(jq -r .rps "$work/perf.out"); us=$(jq -r .server_cpu_us_per_req "$work/perf.out")
    [ "$(jq '.errors' "$work/perf.out")" -eq 0 ] || echo "# $route $server: errors: $(jq -c . "$work/perf.out")" >&2
    # ksoftirqd's CPU over the run (warm-up included) per scrape of the run.
    soft=$(awk -v q="$((q1 - q0))" -v t="$tck" -v r="$rps" -v d="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" \
      'BEGIN{printf "%.2f", q/t*1e6/(r*d+0.001)}')
    # Busy time of the machine outside the server, mmc-perf and ksoftirqd, % of one CPU.
    other=$(awk -v b="$((b1 - b0))" -v s="$((s1 - s0))" -v q="$((q1 - q0))" -v t="$tck" -v t0="$t0" -v t1="$t1" \
      -v c="$(awk '{print $1+$2}' "$work/perf.time")" \
      'BEGIN{o=(b-s-q)/t - c; if (o<0) o=0; printf "%.1f", o/(t1-t0)*100}')
    awk -v o="$other" -v m="$CLEAN_PCT" 'BEGIN{exit !(o+0 < m)}' && break
    [ "$attempt" -lt "$RETRIES" ] && echo "# $route $server: other processes used ${other}% of a CPU during the run: redoing it" >&2
  done
  echo "$route $server $rps $us $soft $other" | tee -a "$results"
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(uname -r), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
echo "# mmc-server $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+changes') pid $mmc_pid${MMC_BEFORE:+; before: $MMC_BEFORE pid $before_pid}; nginx $(nginx -v 2>&1 | sed 's/.*\///') worker pid $nginx_pid, sendfile $NGINX_SENDFILE; $KEYS keys"
echo "# $RUNS rounds of $SECS s per server and route, one scraper connection on CPU $LOAD_CPU, servers on CPU $SERVER_CPU"
for r in $ROUTES; do
  echo "# $r: $(stat -c %s "$work/www/$r") bytes, $(grep -i '^content-type' "$work/www/$r.head" | tr -d '\r')"
done
echo "# route server scrapes/s server_us_per_scrape ksoftirqd_us_per_scrape other_cpu_pct"
# One run of SERVER on ROUTE.
run_one() { # SERVER ROUTE
  case $1 in
    nginx) measure "$2" nginx "$nginx_pid" "$port_nginx" "/$2" ;;
    mmc) measure "$2" mmc "$mmc_pid" "$port_mmc" "$(path_of "$2")" ;;
    before) measure "$2" before "$before_pid" "$port_before" "$(path_of "$2")" ;;
  esac
}
for round in $(seq "$RUNS"); do
  # The servers take turns, in an order that rotates from round to round.
  # shellcheck disable=SC2086
  set -- $servers
  order=("$@")
  n=${#order[@]}
  for r in $ROUTES; do
    for k in $(seq 0 $((n - 1))); do
      s=${order[$(((k + round) % n))]}
      # (A server from before the protobuf exposition would answer text.)
      [ "$s" = before ] && [ "$r" = proto ] && continue
      run_one "$s" "$r"
    done
  done
done

col() { awk -v r="$1" -v s="$2" -v c="$3" '$1==r && $2==s {print $c}' "$results" | median %.2f; }
echo
# Per route and server: medians of the runs, and the median of the per-round ratios to nginx.
ratio_median() { # ROUTE SERVER
  awk -v r="$1" -v s="$2" '$1==r && $2=="nginx" {n[++i]=$4} $1==r && $2==s {m[++j]=$4}
    END {for (k=1; k<=j && k<=i; k++) print m[k]/n[k]}' "$results" | median | awk '{printf "%.2f", $1}'
}
echo "| route | bytes | server | µs/scrape (median) | ÷ nginx (medians) | median of per-round ratios | scrapes/s | ksoftirqd µs/scrape |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
for r in $ROUTES; do
  n=$(col "$r" nginx 4)
  for s in $servers; do
    [ "$s" = before ] && [ "$r" = proto ] && continue
    m=$(col "$r" "$s" 4)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$r" "$(stat -c %s "$work/www/$r")" "$s" "$m" \
      "$(awk -v a="$m" -v b="$n" 'BEGIN{printf "%.2f", a/b}')" "$( [ "$s" = nginx ] && echo 1.00 || ratio_median "$r" "$s")" \
      "$(col "$r" "$s" 3)" "$(col "$r" "$s" 5)"
  done
done
