#!/usr/bin/env python3
"""get_batch (new bytes per key) over the same-host socket against TCP (docs/same-host.md).

Starts mmc-server in its default configuration (but the port), stores COUNT objects of SIZE
bytes for each case, then times get_batch of all of them over the same-host socket (each
object copied by the server into its slot of the thread's shared buffer, then into its bytes)
and over TCP (the batch route), alternating round by round; medians of --rounds rounds of
--seconds each; the bytes are checked every round.

    python3 perf/same_host_get_batch.py [--server target/release/mmc-server]
                                        [--cases 16x256KiB,64x64KiB,8x1MiB] [--rounds 7]

Needs numpy; imports mmc_client from clients/python of this checkout. Use a release server.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import same_host_bench as bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(bench.ROOT, "target", "release",
                                                     "mmc-server"))
    ap.add_argument("--cases", default="16x256KiB,64x64KiB,8x1MiB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    proc, addr = bench.start_server(args.server)
    stores = {"same-host": bench.make_store("http://" + addr, False),
              "tcp": bench.make_store("http://" + addr, True)}
    print("| batch | same-host µs | GB/s | TCP µs | GB/s | ×TCP |")
    print("|---|---:|---:|---:|---:|---:|")
    try:
        for case in args.cases.split(","):
            count, _, size = case.partition("x")
            n, size = int(count), bench.parse_size(size)
            keys = ["gb/%d/%d" % (size, i) for i in range(n)]
            vals = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()
                    for i in range(n)]
            assert stores["tcp"].put_batch(keys, vals) == 0
            took = {k: [] for k in stores}
            for _ in range(args.rounds):
                for name, s in stores.items():
                    assert s.get_batch(keys) == vals, name
                    t0, calls = time.perf_counter(), 0
                    while time.perf_counter() - t0 < args.seconds:
                        s.get_batch(keys)
                        calls += 1
                    took[name].append((time.perf_counter() - t0) / calls)
            sh, tcp = statistics.median(took["same-host"]), statistics.median(took["tcp"])
            print("| %d × %s | %.0f | %.2f | %.0f | %.2f | %.1f |" % (
                n, bench.label(size), sh * 1e6, n * size / sh / 1e9, tcp * 1e6,
                n * size / tcp / 1e9, tcp / sh), flush=True)
    finally:
        for s in stores.values():
            s.close()
        proc.terminate()
        proc.wait(15)


if __name__ == "__main__":
    main()
