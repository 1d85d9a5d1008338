#!/usr/bin/env python3
"""Meta CPU against local-service CPU for 1 MiB puts and gets on a remote rank.

Starts a pure meta service (`ock.mmc.embedded.ranks=0`, pinned to CPU 0) and one local
service (pinned to CPU 1), then sends COUNT puts and COUNT gets of SIZE bytes to the meta the
way a well-behaved client does: `Expect: 100-continue` on puts, so the meta answers its 307
before any body byte is sent, and the body goes once, to the local service. CPU time of each
process is read from /proc/<pid>/task/*/schedstat (nanoseconds) before and after.

    python3 perf/cluster_cpu.py [--bin target/release/mmc-server] [--count 80] [--size 1048576]
        [--clients 1]

Prints one JSON line; the issue's bar is meta_cpu / local_cpu <= 0.15.
"""

import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import cluster_ready  # noqa: E402  (tests/python/cluster_ready.py: standard library only)


def cpu_ns(pid):
    total = 0
    for f in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def start(args, cpu=None):
    """Starts a server (pinned to `cpu` when given); returns it and the address it logs."""
    pin = [] if cpu is None else ["taskset", "-c", str(cpu)]
    p = subprocess.Popen(
        pin + args,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    addr = {}
    ready = threading.Event()

    def reader():
        for line in p.stderr:
            m = re.search(r"listening on http://(\S+)", line)
            if m and "a" not in addr:
                addr["a"] = m.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ready.wait(20) or "a" not in addr:
        p.kill()
        sys.exit("a server did not start: %s" % " ".join(args))
    host, port = addr["a"].rsplit(":", 1)
    return p, (host, int(port))


def read_response(sock):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, v = l.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("connection closed")
        rest += chunk
    return status, headers, rest[:n]


class Conns:
    """Keep-alive connections by address, as a client session keeps them (curl, requests)."""

    def __init__(self):
        self.socks = {}

    def request(self, addr, method, target, body=None):
        """One request; a PUT waits for 100 Continue (or a final answer) before its body."""
        s = self.socks.pop(addr, None) or socket.create_connection(addr)
        head = "%s %s HTTP/1.1\r\nHost: x\r\n" % (method, target)
        if body is not None:
            head += "Content-Length: %d\r\nExpect: 100-continue\r\n" % len(body)
        s.sendall((head + "\r\n").encode())
        status, headers, data = read_response(s)
        if body is not None and status == 100:
            s.sendall(body)
            status, headers, data = read_response(s)
        if headers.get("connection", "").lower() == "close":
            s.close()
        else:
            self.socks[addr] = s
        return status, headers, data


LOCAL = threading.local()


def request(addr, method, target, body=None):
    """On this thread's session."""
    if not hasattr(LOCAL, "conns"):
        LOCAL.conns = Conns()
    return LOCAL.conns.request(addr, method, target, body)


def follow(meta, method, target, body=None):
    status, headers, data = request(meta, method, target, body)
    if status != 307:
        return status, data
    loc = headers["location"][len("http://"):]
    hostport, path = loc.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    status, _, data = request((host, int(port)), method, "/" + path, body)
    return status, data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/mmc-server")
    ap.add_argument("--count", type=int, default=80)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--clients", type=int, default=1,
                    help="concurrent client sessions (1: one request at a time, where each"
                         " request also pays the servers' wake-ups)")
    a = ap.parse_args()
    meta, maddr = start(
        [a.bin, "--listen", "127.0.0.1:0", "--shards", "1", "--set", "ock.mmc.embedded.ranks=0"], 0
    )
    local, _ = start(
        [a.bin, "--role", "local", "--listen", "127.0.0.1:0", "--shards", "1",
         "--set", "ock.mmc.meta_service_url=http://%s:%d" % maddr,
         "--set", "ock.mmc.local_service.dram.size=%d" % max(256 << 20, 2 * a.count * a.size),
         "--set", "ock.mmc.local_service.hbm.size=0"], 1
    )
    try:
        deadline = time.time() + 10
        # Listed at once, OK (taking puts) from the local service's first heartbeat on.
        while not cluster_ready.ready_count(lambda p: request(maddr, "GET", p)[2]):
            if time.time() > deadline:
                sys.exit("the local service did not join")
            time.sleep(0.05)
        body = os.urandom(a.size)
        m0, l0 = cpu_ns(meta.pid), cpu_ns(local.pid)
        t0 = time.time()

        def worker(w):
            mine = range(w, a.count, a.clients)
            for i in mine:
                status, data = follow(maddr, "PUT", "/api/v1/objects?key=bench-%d" % i, body)
                assert status == 200 and b'"success":true' in data, data
            for i in mine:
                status, data = follow(maddr, "GET", "/api/v1/objects?key=bench-%d" % i)
                assert status == 200 and data == body

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.time() - t0
        m1, l1 = cpu_ns(meta.pid), cpu_ns(local.pid)
        meta_us = (m1 - m0) / 1000.0 / (2 * a.count)
        local_us = (l1 - l0) / 1000.0 / (2 * a.count)
        print(json.dumps({
            "count": a.count, "size": a.size, "clients": a.clients,
            "seconds": round(elapsed, 3),
            "meta_cpu_us_per_op": round(meta_us, 1), "local_cpu_us_per_op": round(local_us, 1),
            "ratio": round(meta_us / local_us, 3) if local_us else None,
        }))
    finally:
        for p in (local, meta):
            p.terminate()
            p.wait(20)


if __name__ == "__main__":
    main()
