#!/usr/bin/env bash
# Instructions the server executes per request on its request path, counted by callgrind: a
# figure that does not drift with the VM's load (CPU time per request does, by ±10 % from run
# to run here), so two builds can be told apart by a few percent.
#
#   perf/request_instructions.sh [BIN…]     # default target/release/mmc-server
#
# Each binary runs one shard on the epoll driver under `valgrind --tool=callgrind` (valgrind
# does not run io_uring), counting only inside the head parser and `dispatch::answer` (routing,
# the handler, the store, encoding, metrics; not the socket calls, nor the runtime around
# them). One keep-alive connection PUTs `bench` (16 bytes), then sends REQUESTS `GET
# /metadata?key=bench` (the request of compare.sh) in pipelined bursts of 32. Environment:
# REQUESTS (32000), PATH_Q (the request target, `/metadata?key=bench`), PUT_Q (where the 16
# bytes are put first, `/metadata?key=bench`; `PUT_Q=/api/v1/objects?key=bench
# PATH_Q=/api/v1/objects?key=bench` counts an object GET), KEEP=1 keeps the callgrind files
# (under the printed directory) for `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-32000}
PATH_Q=${PATH_Q:-/metadata?key=bench}
PUT_Q=${PUT_Q:-/metadata?key=bench}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=(target/release/mmc-server)
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }
work=$(mktemp -d)
[ "${KEEP:-}" = 1 ] || trap 'rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

drive() { # PORT: the PUT, then REQUESTS GETs in bursts of 32, each burst's answers read whole
  python3 - "$1" "$REQUESTS" "$PATH_Q" "$PUT_Q" <<'EOF'
import socket, sys
port, n, target, put = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port), timeout=120)
s.sendall(b"PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n" % put.encode() + b"v" * 16)
if not s.recv(65536).startswith(b"HTTP/1.1 200"):
    sys.exit("the PUT of %s failed" % put)
burst = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n" % target).encode() * 32
def answers(buf):
    """The number of whole answers at the start of buf (each head's Content-Length read)."""
    n, at = 0, 0
    while True:
        end = buf.find(b"\r\n\r\n", at)
        if end < 0:
            return n
        head = buf[at:end].lower()
        i = head.find(b"content-length: ")
        length = int(head[i + 16:].split(b"\r\n")[0]) if i >= 0 else 0
        if len(buf) < end + 4 + length:
            return n
        n, at = n + 1, end + 4 + length

for _ in range(n // 32):
    s.sendall(burst)
    got = b""
    while answers(got) < 32:
        chunk = s.recv(1 << 20)
        if not chunk:
            sys.exit("the server closed the connection")
        got += chunk
EOF
}

for bin in "${BINS[@]}"; do
  [ -x "$bin" ] || { echo "$bin: not an executable" >&2; exit 2; }
  port=$(free_port)
  out="$work/callgrind.$(basename "$bin").$port"
  log="$work/valgrind.$port.log"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    --toggle-collect='*dispatch::answer*' --toggle-collect='*parse::parse_head*' \
    "$bin" --listen "127.0.0.1:$port" --shards 1 --io-driver epoll >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  drive "$port"
  kill -INT "$pid"
  timeout 60 tail --pid="$pid" -f /dev/null || kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  total=$(grep -o 'Collected : [0-9]*' "$log" | awk '{print $3}')
  [ -n "$total" ] || { echo "$bin: callgrind reported nothing" >&2; cat "$log" >&2; exit 1; }
  echo "$bin: $total instructions for $((REQUESTS + 1)) requests, $((total / (REQUESTS + 1))) per request ($PATH_Q)"
done
[ "${KEEP:-}" = 1 ] && echo "callgrind files in $work"
true
