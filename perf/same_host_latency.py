#!/usr/bin/env python3
"""One same-host request at a time, and where its client thread runs (docs/same-host.md).

Starts mmc-server in its default configuration (but the port; one shard per CPU, each pinned
to its CPU), stores --keys objects of --size bytes, and times single `get_into` and
`put_from` calls of one client thread, with the thread left where the scheduler puts it
(`any`) and pinned to each CPU in turn (`cpu N`, as `taskset` would); the gets go round
--keys keys, one shard's after another's (one key: shard 0). A mapped get is one
round trip to the key's shard and the client's copy from the segment: when the thread shares
its CPU with that shard, the two take turns on it; on a CPU of its own the shard answers
while it waits. Placements alternate round by round; prints each one's median and 10th/90th
percentile in microseconds, and GB/s at the median.

    python3 perf/same_host_latency.py [--server target/release/mmc-server] [--size 1MiB]
                                      [--keys 1] [--rounds 5] [--seconds 1]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from same_host_bench import ROOT, label, make_store, parse_size, start_server  # noqa: E402
from mmc_client._http import shard_for  # noqa: E402


def timed_calls(call, seconds, after=None):
    """Latencies (seconds) of call(n) repeated for `seconds`, after(n) following each one
    untimed."""
    lat = []
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        call(len(lat))
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if after is not None:
            after(len(lat))
        if t1 > end:
            return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(ROOT, "target", "release", "mmc-server"))
    ap.add_argument("--size", type=parse_size, default=1 << 20)
    ap.add_argument("--keys", type=int, default=1,
                    help="keys the gets go round, key i on shard i mod shards")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    if not os.path.exists(args.server):
        sys.exit("no server binary at %s (cargo build --release, or --server PATH)" % args.server)
    proc, addr = start_server(args.server)
    store = make_store("http://" + addr, False)
    cpus = sorted(os.sched_getaffinity(0))
    placements = [("any", set(cpus))] + [("cpu %d" % c, {c}) for c in cpus]
    src = np.random.default_rng(7).integers(0, 256, args.size, dtype=np.uint8)
    dst = np.zeros(args.size, dtype=np.uint8)
    # Key i is one of shard i % shards (the server's default: one shard per CPU), so the gets
    # go round the shards.
    keys, n = [], 0
    while len(keys) < args.keys:
        name = "lat/%d" % n
        if shard_for(name.encode(), len(cpus)) == len(keys) % len(cpus):
            keys.append(name)
        n += 1
    got = {(op, name): [] for op in ("get_into", "put_from") for name, _ in placements}

    def get(n):
        assert store.get_into(keys[n % len(keys)], dst.ctypes.data, args.size) == 0

    def put(n):
        assert store.put_from("lat/put/%d" % n, src.ctypes.data, args.size) == 0

    def remove(n):
        # Each put's key goes before the next put (untimed): the live set stays one object,
        # within the memory a shard keeps committed, as in a cache in its steady state.
        assert store.remove_batch(["lat/put/%d" % (n - 1)]) == [0]

    try:
        for k in keys:
            assert store.put_from(k, src.ctypes.data, args.size) == 0
        for _ in range(args.rounds):
            for name, mask in placements:
                os.sched_setaffinity(0, mask)
                got[("get_into", name)].extend(timed_calls(get, args.seconds))
                assert np.array_equal(src, dst), "bytes differ"
                got[("put_from", name)].extend(timed_calls(put, args.seconds, remove))
    finally:
        os.sched_setaffinity(0, set(cpus))
        store.close()
        proc.terminate()
        proc.wait(15)
    print("| %s, %d key(s) | client thread | median µs | p10 | p90 | GB/s at the median |"
          % (label(args.size), args.keys))
    print("|---|---|---:|---:|---:|---:|")
    for (op, name), lat in got.items():
        lat.sort()
        med = statistics.median(lat)
        print("| %s | %s | %.1f | %.1f | %.1f | %.2f |" % (
            op, name, med * 1e6, lat[len(lat) // 10] * 1e6, lat[len(lat) * 9 // 10] * 1e6,
            args.size / med / 1e9))


if __name__ == "__main__":
    main()
