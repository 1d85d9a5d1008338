#!/usr/bin/env python3
"""The same-host data path against TCP where the bench's loops flatter it (docs/same-host.md).

perf/same_host_bench.py measures a cache in its steady state: puts into runs whose pages are
committed (each batch removed before the next), gets of four keys in turn (their blobs in the
CPU's cache, and in the client's page tables). This one measures the two other cases a user
meets, each transport on a fresh server of its own (default configuration), one thread, the
transports alternating round by round:

  cold  -- --count fresh keys put (the server's first-touch page faults on every blob), then
           each read once (a mapped get's first read of a range faults the client's page
           tables in; the blobs are out of the CPU's cache); the bytes checked
  full  -- fresh keys put without removal until the cache has been full for a while (every
           put then drains a slice of HBM down to DRAM and evicts from DRAM); the mean and
           median of the last --tail puts and the server's CPU per put (all its threads)

Each round's client is a process of its own, as a user's would be: a client that outlived a
server unmaps that server's segments at its next mapping, and the kernel then frees their
pages in that call, which a later round would pay for. `memmove` (between two buffers in
cache) is measured in the same rounds. Prints medians over --rounds rounds.

    python3 perf/same_host_cold.py [--server target/release/mmc-server] [--mode cold|full]
                                   [--count 256] [--tail 1500] [--rounds 3]

Needs numpy; imports mmc_client from clients/python of this checkout. Use a release server.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import same_host_bench as bench  # noqa: E402
from same_host_ab import cpu_ns as server_cpu_ns  # noqa: E402

SIZE = 1 << 20


def memmove_gbs(src, dst, n):
    t0 = time.perf_counter()
    for _ in range(n):
        ctypes.memmove(dst.ctypes.data, src.ctypes.data, SIZE)
    return n * SIZE / (time.perf_counter() - t0) / 1e9


def cold(store, src, dst, count):
    t0 = time.perf_counter()
    for i in range(count):
        assert store.put_from("c%d" % i, src.ctypes.data, SIZE) == 0
    put = count * SIZE / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    for i in range(count):
        dst[:1] = 0
        assert store.get_into("c%d" % i, dst.ctypes.data, SIZE) == 0
        assert dst[0] == src[0]
    get = count * SIZE / (time.perf_counter() - t0) / 1e9
    assert (dst == src).all()
    return {"put GB/s": put, "get GB/s": get}


def full(store, src, pid, count, tail):
    lat = []
    for i in range(count + tail):
        if i == count:
            cpu0 = server_cpu_ns(pid)
        t0 = time.perf_counter()
        assert store.put_from("f%d" % i, src.ctypes.data, SIZE) == 0
        lat.append(time.perf_counter() - t0)
    cpu = (server_cpu_ns(pid) - cpu0) / tail / 1e3
    last = lat[-tail:]
    return {"put mean µs": statistics.mean(last) * 1e6,
            "put median µs": statistics.median(last) * 1e6,
            "server CPU µs/put": cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=os.path.join(bench.ROOT, "target/release/mmc-server"))
    ap.add_argument("--mode", choices=("cold", "full"), default="cold")
    ap.add_argument("--count", type=int, default=None,
                    help="keys put (cold: 256; full: puts before the timed tail, 2500)")
    ap.add_argument("--tail", type=int, default=1500, help="full: puts timed at the end")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=("local", "tcp"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    count = a.count or (256 if a.mode == "cold" else 2500)
    src = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    dst = np.zeros(SIZE, dtype=np.uint8)
    if a.child:
        proc, addr = bench.start_server(a.server)
        try:
            store = bench.make_store("http://" + addr, a.child == "tcp")
            if a.mode == "cold":
                res = cold(store, src, dst, count)
            else:
                res = full(store, src, proc.pid, count, a.tail)
            store.close()
        finally:
            proc.kill()
            proc.wait()
        print(json.dumps(res))
        return
    got = {"same-host": [], "TCP": []}
    moves = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for tcp in order:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", "tcp" if tcp else "local",
                 "--server", a.server, "--mode", a.mode, "--count", str(count),
                 "--tail", str(a.tail)], check=True, capture_output=True, text=True, timeout=600)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            got["TCP" if tcp else "same-host"].append(res)
            moves.append(memmove_gbs(src, dst, 256))
            print("round %d %-9s %s" % (r, "TCP" if tcp else "same-host",
                                        ", ".join("%s %.2f" % kv for kv in res.items())),
                  file=sys.stderr, flush=True)
    names = list(got["TCP"][0])
    med = {t: {n: statistics.median(x[n] for x in v) for n in names} for t, v in got.items()}
    print("| %s, 1 MiB, one thread | %s |" % (a.mode, " | ".join(names)))
    print("|---|%s" % ("---:|" * len(names)))
    for t in ("same-host", "TCP"):
        print("| %s | %s |" % (t, " | ".join("%.2f" % med[t][n] for n in names)))
    ratio = ["%.2f" % (med["same-host"][n] / med["TCP"][n]) for n in names]
    print("| same-host / TCP | %s |" % " | ".join(ratio))
    print("\nmemmove in cache, same rounds: %.2f GB/s (median)" % statistics.median(moves))


if __name__ == "__main__":
    main()
