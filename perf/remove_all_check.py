#!/usr/bin/env python3
"""Issue 12's remove_all check: N stored keys, then DELETE /all_keys while another connection
polls /health; prints the DELETE's time, the slowest /health meanwhile, and how long a
/get_all_keys?prefix= that matches nothing takes.

    python3 perf/remove_all_check.py [--bin target/release/mmc-server]
        [--perf target/release/mmc-perf] [--keys 1000000]
"""

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time


def start(binary, args):
    p = subprocess.Popen([binary] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    found, ready = {}, threading.Event()

    def reader():
        for line in p.stderr:
            m = re.search(r"listening on http://(\S+)", line)
            if m and not found:
                found["a"] = m.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ready.wait(30) or not found:
        p.kill()
        sys.exit("server did not start")
    return p, found["a"]


def request(addr, method, target, timeout=600):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (method, target)).encode())
        out = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return out
            out += chunk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/mmc-server")
    ap.add_argument("--perf", default="target/release/mmc-perf")
    ap.add_argument("--keys", type=int, default=1_000_000)
    a = ap.parse_args()
    # Objects are page-rounded: 4 KiB of DRAM each.
    dram = max(1 << 30, a.keys * 4096 * 5 // 4)
    srv, addr = start(a.bin, ["--listen", "127.0.0.1:0", "--shards", "2",
                              "--set", "ock.mmc.local_service.dram.size=%d" % dram,
                              "--set", "ock.mmc.local_service.hbm.size=0"])
    try:
        t = time.time()
        subprocess.run([a.perf, "fill", "--target", addr, "--keys", str(a.keys), "--json"],
                       check=True, stdout=subprocess.DEVNULL)
        filled = time.time() - t
        worst = [0.0]
        stop = threading.Event()

        def poll():
            host, port = addr.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as s:
                while not stop.is_set():
                    t0 = time.time()
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    buf = b""
                    while b"\r\n\r\n" not in buf or not buf.rstrip().endswith(b"}"):
                        buf += s.recv(65536)
                    worst[0] = max(worst[0], time.time() - t0)
                    time.sleep(0.001)

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)
        t = time.time()
        answer = request(addr, "DELETE", "/all_keys")
        delete_s = time.time() - t
        time.sleep(0.5)
        stop.set()
        poller.join()
        t = time.time()
        request(addr, "GET", "/get_all_keys?prefix=nothing-matches-")
        empty_list_s = time.time() - t
        print(json.dumps({
            "keys": a.keys, "fill_s": round(filled, 2), "delete_all_s": round(delete_s, 3),
            "worst_health_ms": round(worst[0] * 1000, 1),
            "empty_prefix_listing_s": round(empty_list_s, 3),
            "answer": answer.split(b"\r\n\r\n", 1)[-1][:120].decode("latin-1"),
        }))
    finally:
        srv.terminate()
        srv.wait(30)


if __name__ == "__main__":
    main()
