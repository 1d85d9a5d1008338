#!/usr/bin/env python3
"""Two or more server builds side by side on the same-host data path (docs/same-host.md).

Starts each build in its default configuration and, round after round (the order reversed
every other round, so a load that comes and goes hits all alike), runs on each for --window
seconds: get_into of 8 stored keys in turn, then put_from of fresh keys (16 at a time, removed
between batches). Prints the median microseconds per request of each, GB/s, and the CPU time
per request of the server (all its threads, from /proc/PID/task/*/schedstat) and of this
client process, over all rounds.

    python3 perf/same_host_ab.py OLD_BINARY NEW_BINARY[:tcp] ... [--size 1MiB] [--rounds 15]

A build named BINARY:tcp is driven over TCP instead (MMC_TRANSPORT=tcp), for the ratio;
BINARY:noroute sends every request to the server's shared same-host socket instead of the
socket of the key's owner shard (as against a server without per-shard sockets);
BINARY:spinN has the client poll N us for each answer before it sleeps (MMC_SAME_HOST_SPIN_US;
spin0: sleep at once); BINARY:shared has the requests' buffers come from
alloc_shared_buffer (copied with memcpy by the server). Each name must differ (BINARY and ./BINARY for the same build). Needs
numpy; imports mmc_client from clients/python of this checkout. Use release builds.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import same_host_bench as bench  # noqa: E402


def cpu_ns(pid):
    """CPU time of every thread of process ``pid`` so far, in ns (schedstat's run time)."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builds", nargs="+", help="server binaries (BINARY or BINARY:tcp)")
    ap.add_argument("--size", type=bench.parse_size, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--window", type=float, default=0.3, help="seconds per build per round")
    ap.add_argument("--buffers", type=int, default=4,
                    help="destination buffers the gets rotate through (default 4)")
    args = ap.parse_args()
    size = args.size
    procs, stores = [], {}
    try:
        pids = {}
        for build in args.builds:
            binary, _, mode = build.partition(":")
            proc, addr = bench.start_server(binary)
            procs.append(proc)
            pids[build] = proc.pid
            stores[build] = bench.make_store("http://" + addr, "tcp" in mode.split(":"))
        src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        dsts = [np.zeros(size, dtype=np.uint8) for _ in range(args.buffers)]
        # BINARY:shared: the buffers of that build's requests are shared buffers (the same
        # bytes, copied with memcpy by the server).
        bufs = {}
        for build, s in stores.items():
            if "shared" in build.split(":")[1:]:
                arrays = []
                for a in [src] + dsts:
                    b = s.alloc_shared_buffer(size)
                    arrays.append(np.frombuffer(b.view, dtype=np.uint8))
                    arrays[-1][:] = a
                bufs[build] = (arrays[0], arrays[1:])
            else:
                bufs[build] = (src, dsts)
        keys = ["ab/%d" % i for i in range(8)]
        for build, s in stores.items():
            if "noroute" in build.split(":")[1:]:
                # Every request on the shared socket, as a server without per-shard ones.
                s._client.owner_socket = lambda host, port, path, key: (path, None)
            for m in build.split(":")[1:]:
                if m.startswith("spin"):
                    s._client.spin_s = int(m[4:]) * 1e-6
            for k in keys:
                assert s.put_from(k, bufs[build][0].ctypes.data, size) == 0
        got = {b: {"get": [], "put": []} for b in args.builds}
        # (requests, server CPU ns, client CPU ns) per build and operation, over all rounds.
        cpu = {b: {"get": [0, 0, 0], "put": [0, 0, 0]} for b in args.builds}

        def account(build, op, n, s0, c0):
            c = cpu[build][op]
            c[0] += n
            c[1] += cpu_ns(pids[build]) - s0
            c[2] += time.process_time_ns() - c0

        for r in range(args.rounds):
            for build in args.builds if r % 2 == 0 else args.builds[::-1]:
                s = stores[build]
                src, dsts = bufs[build]
                s0, c0 = cpu_ns(pids[build]), time.process_time_ns()
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < args.window:
                    assert s.get_into(keys[n % 8], dsts[n % len(dsts)].ctypes.data, size) == 0
                    n += 1
                got[build]["get"].append((time.perf_counter() - t0) / n * 1e6)
                account(build, "get", n, s0, c0)
                s0, c0 = cpu_ns(pids[build]), time.process_time_ns()
                n, busy, t1 = 0, 0.0, time.perf_counter()
                while time.perf_counter() - t1 < args.window:
                    batch = ["ab/p/%d/%d" % (r, n + i) for i in range(16)]
                    t0 = time.perf_counter()
                    for k in batch:
                        assert s.put_from(k, src.ctypes.data, size) == 0
                    busy += time.perf_counter() - t0
                    n += len(batch)
                    s.remove_batch(batch)
                got[build]["put"].append(busy / n * 1e6)
                # (The removes between batches are in the CPU figures too: one per put.)
                account(build, "put", n, s0, c0)
        assert all(np.array_equal(src, d) for src, dsts in bufs.values() for d in dsts), \
            "bytes differ"
        print("# %s objects, %d rounds of %.1f s per build, medians" % (
            bench.label(size), args.rounds, args.window))
        for build in args.builds:
            g, p = (statistics.median(got[build][op]) for op in ("get", "put"))
            print("%-40s get %8.1f us (%5.2f GB/s)   put %8.1f us (%5.2f GB/s)" % (
                build, g, size / g / 1e3, p, size / p / 1e3))
        print("# CPU per request, server / client (us; puts include a remove each)")
        for build in args.builds:
            print("%-40s get %6.1f / %5.1f   put %6.1f / %5.1f" % ((build,) + tuple(
                c[i] / c[0] / 1e3 for c in (cpu[build]["get"], cpu[build]["put"])
                for i in (1, 2))))
    finally:
        for s in stores.values():
            s.close()
        for p in procs:
            p.kill()
            p.wait(15)


if __name__ == "__main__":
    main()
