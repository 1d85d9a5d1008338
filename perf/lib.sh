# Shell helpers shared by the perf scripts (sourced, not run).
# Needs QUIET_WAIT and QUIET_PCT set by the caller.

tck=$(getconf CLK_TCK)
ncpu=$(nproc)

# Busy ticks of the whole machine (user, nice, system, irq, softirq).
busy_all() { awk '$1=="cpu"{print $2+$3+$4+$7+$8}' /proc/stat; }

wait_quiet() { # up to QUIET_WAIT s for a second with < QUIET_PCT% of the machine busy
  local i b0 b1 pct
  for i in $(seq "$QUIET_WAIT"); do
    b0=$(busy_all); sleep 1; b1=$(busy_all)
    pct=$(( (b1 - b0) * 100 / tck / ncpu ))
    [ "$pct" -lt "$QUIET_PCT" ] && return 0
    [ "$i" -eq 1 ] && echo "# other processes keep the machine $pct% busy: waiting (up to ${QUIET_WAIT} s)" >&2
  done
  echo "# machine still busy after ${QUIET_WAIT} s; measuring anyway" >&2
}

# The median of the numbers on stdin, one a line ("nan" for none); an even count's mean of the
# middle two is printed with FORMAT (default %.6g).
median() {
  sort -g | awk -v f="${1:-%.6g}" '{a[NR]=$1} END{ if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else printf f "\n", (a[NR/2]+a[NR/2+1])/2 }'
}

stop_pids() { # PID...: TERM each, up to 5 s for it to exit, then KILL
  local p
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
}

ports_free() { # PORT...: exit 2 when something answers on one of them
  local p
  for p in "$@"; do
    if curl -s -m 1 -o /dev/null "http://127.0.0.1:$p/"; then
      echo "port $p is already in use; set BASE_PORT" >&2; exit 2
    fi
  done
}

# DIR WORKER_CONNECTIONS HTTP_DIRECTIVES SERVER_BLOCK: writes DIR/nginx.conf for an nginx of one
# worker, no access log, its own prefix and temp paths (no system configuration), with the
# caller's `http` directives and `server` block.
nginx_conf() {
  local dir=$1
  mkdir -p "$dir/logs" "$dir/tmp"
  cat > "$dir/nginx.conf" <<NGX
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections $2; }
http {
  access_log off;
$3
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
$4
}
NGX
}
