#!/usr/bin/env python3
"""Holds N mostly idle keep-alive HTTP connections to 127.0.0.1:PORT for perf/idle_conns.sh.

Usage: idle_holder.py N PORT PATH MAX_SECS

Opens N connections, sends one `GET PATH` on each and reads its whole answer (so every
connection is established and has been served once), prints `ready N` and then waits, without
sending anything, until a line arrives on stdin, stdin closes, or MAX_SECS pass. Before it exits
it prints `alive K`: how many of the N connections the server still held open (a connection the
server closed reads as end-of-file).
"""

import resource
import select
import socket
import sys


def read_answer(s: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed before answering")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk


def main() -> None:
    n, port, path, max_secs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(req)
        read_answer(s)
        socks.append(s)
    print(f"ready {len(socks)}", flush=True)
    select.select([sys.stdin], [], [], max_secs)
    alive = 0
    for s in socks:
        s.setblocking(False)
        try:
            alive += 1 if s.recv(1) else 0
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    print(f"alive {alive}", flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
