#!/usr/bin/env python3
"""One Python thread's put/get throughput through mmc_client (clients/python), over loopback.

Starts mmc-server pinned to one CPU (default 0, one shard, DRAM objects), pins itself to another
(default 1), and for each object size runs, for --seconds each:
  put_from  -- fresh keys, bytes sent from a NumPy buffer by address (no Python copy)
  get_into  -- keys already stored, received straight into a NumPy buffer
  put / get -- the bytes API (get returns a new bytes object: one copy more)
It prints objects/s, GB/s (body bytes) and the client's CPU seconds per GB (process time of
this thread: what the Python client itself costs, whatever the server's speed).

    python3 perf/py_client_bench.py [--server target/release/mmc-server] [--seconds 3]
                                    [--sizes 64KiB,1MiB] [--server-cpu 0] [--client-cpu 1]

Needs numpy; imports mmc_client from clients/python of this checkout. Use a release build of
the server (the default path): a debug build measures the debug server.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from mmc_client import DistributedObjectStore, LocalConfig, ReplicateConfig  # noqa: E402


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|K|M|G|B)?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError("bad size %r" % s)
    mult = {"K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
    return int(m.group(1)) * mult.get(m.group(2) or "B", 1)


def start_server(binary, cpu, dram):
    cmd = ["taskset", "-c", str(cpu), binary, "--listen", "127.0.0.1:0", "--shards", "1",
           "--set", "ock.mmc.local_service.dram.size=%d" % dram]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    addr = []
    ready = threading.Event()

    def reader():
        for line in proc.stderr:
            m = re.search(r"listening on http://(\S+)", line)
            if m and not addr:
                addr.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ready.wait(30) or not addr:
        proc.kill()
        sys.exit("server did not start")
    return proc, addr[0]


def run(label, size, seconds, op):
    """Calls op(i) for `seconds`; returns a result row."""
    n = 0
    t0, c0 = time.perf_counter(), time.thread_time()
    deadline = t0 + seconds
    while True:
        op(n)
        n += 1
        if n % 8 == 0 and time.perf_counter() >= deadline:
            break
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    gb = n * size / 1e9
    return {"run": label, "size": size, "ops": n, "ops_s": n / wall, "gb_s": gb / wall,
            "cli_s_per_gb": cpu / gb}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_bin = os.path.join(ROOT, "target", "release", "mmc-server")
    ap.add_argument("--server", default=os.environ.get("MMC_SERVER", default_bin))
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64KiB,1MiB")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--dram", type=parse_size, default=512 << 20,
                    help="DRAM segment of the started server (default 512MiB)")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    proc = None
    if args.url:
        url = args.url
    else:
        if not os.path.exists(args.server):
            sys.exit("no server binary at %s (cargo build --release, or --server PATH)"
                     % args.server)
        proc, addr = start_server(args.server, args.server_cpu, args.dram)
        url = "http://" + addr
    try:
        os.sched_setaffinity(0, {args.client_cpu})
    except OSError as e:
        print("# could not pin the client to CPU %d: %s" % (args.client_cpu, e))
    cfg = LocalConfig()
    cfg.meta_service_url = url
    store = DistributedObjectStore()
    store.setup(cfg)
    if store.init(0) != 0:
        sys.exit("cannot reach " + url)
    rc = ReplicateConfig(medium="dram")
    rows = []
    try:
        for size in sizes:
            src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
            dst = np.zeros(size, dtype=np.uint8)
            payload = src.tobytes()
            ptr, dptr = src.ctypes.data, dst.ctypes.data
            # Gets read the last `keep` objects put (the segment evicts the oldest beyond 90 %).
            keep = max(8, (args.dram // 2) // size)
            # Warm-up, not timed: every page of the segment touched once (first touch of a
            # page costs ~10 us on a VM), then emptied.
            for i in range(args.dram // size):
                store.put_from("warm/%d" % i, ptr, size, replicateConfig=rc)
            store.remove_all()

            def put_from(i):
                assert store.put_from("pb/%d/%d" % (size, i), ptr, size, replicateConfig=rc) == 0

            rows.append(run("put_from", size, args.seconds, put_from))
            written = rows[-1]["ops"]
            live = list(range(max(0, written - keep), written))

            def get_into(i):
                assert store.get_into("pb/%d/%d" % (size, live[i % len(live)]), dptr, size) == 0

            rows.append(run("get_into", size, args.seconds, get_into))
            assert np.array_equal(src, dst)
            store.remove_all()

            def put(i):
                assert store.put("pbb/%d/%d" % (size, i), payload, rc) == 0

            rows.append(run("put", size, args.seconds, put))
            written = rows[-1]["ops"]
            live = list(range(max(0, written - keep), written))

            def get(i):
                assert len(store.get("pbb/%d/%d" % (size, live[i % len(live)]))) == size

            rows.append(run("get", size, args.seconds, get))
            store.remove_all()
    finally:
        store.close()
        if proc is not None:
            proc.terminate()
            proc.wait(15)

    print("| run | size | objects/s | GB/s | client CPU s/GB |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        size = "%d KiB" % (r["size"] // 1024) if r["size"] < (1 << 20) else \
            "%d MiB" % (r["size"] >> 20)
        print("| %s | %s | %.0f | %.3f | %.3f |" % (r["run"], size, r["ops_s"], r["gb_s"],
                                                   r["cli_s_per_gb"]))


if __name__ == "__main__":
    main()
