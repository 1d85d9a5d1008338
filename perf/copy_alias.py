#!/usr/bin/env python3
"""Same-host gets into buffers that start 16 bytes into a page (as numpy's arrays and any
buffer glibc's malloc maps do), with and without the copies that keep clear of ``rep movsb``'s
slow case (docs/same-host.md, *A copy's alignment*; perf/copy_alias.c measures the case).

Part 1, mapped gets (the client copies): get_into of 32 stored keys in turn into a buffer
16 and 64 bytes into a page, the client's copy as shipped (glibc's SSE2 copy where the
destination is 1 to 31 bytes past the source modulo 4096) against plain ``memmove``
(``_mapped._plain`` unset), alternating round by round.

Part 2, with ``--servers OLD NEW``: gets into a buffer the client shares
(``alloc_shared_buffer``, a view 16 and 64 bytes in) with mapped gets off
(``MMC_SAME_HOST_MAP=0``), so the server copies with its ``memcpy``: two builds alternating.

Prints the median microseconds per get of each case over the rounds' medians.

    python3 perf/copy_alias.py [--server BIN] [--servers OLD NEW] [--sizes 64KiB,256KiB]
        [--rounds 5]

Needs numpy; imports mmc_client from clients/python of this checkout. Use release builds.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import same_host_bench as bench  # noqa: E402
from mmc_client import _mapped  # noqa: E402  (on the path same_host_bench sets)

GETS = 300


def keys_of(store, size):
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    keys = ["alias/%d/%d" % (size, i) for i in range(32)]
    for k in keys:
        assert store.put_from(k, src.ctypes.data, size) == 0
    return src, keys


def median_get_us(store, keys, dst, size):
    ts = []
    for i in range(GETS):
        t0 = time.perf_counter_ns()
        assert store.get_into(keys[i % len(keys)], dst, size) == 0
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1000


def at_page_offset(room, at):
    return room.ctypes.data + (at - room.ctypes.data) % 4096


def mapped(binary, sizes, rounds):
    os.environ["MMC_SAME_HOST_MAP"] = "1"
    proc, addr = bench.start_server(binary)
    plain = _mapped._plain
    res = {}
    try:
        store = bench.make_store("http://" + addr, False)
        for size in sizes:
            src, keys = keys_of(store, size)
            room = np.zeros(size + 8192, dtype=np.uint8)
            for r in range(rounds):
                modes = ("as shipped", "memmove") if r % 2 == 0 else ("memmove", "as shipped")
                for mode in modes:
                    _mapped._plain = plain if mode == "as shipped" else None
                    for at in (16, 64):
                        dst = at_page_offset(room, at)
                        us = median_get_us(store, keys, dst, size)
                        start = dst - room.ctypes.data
                        assert np.array_equal(room[start:start + size], src), "bytes differ"
                        res.setdefault((size, at, mode), []).append(us)
    finally:
        _mapped._plain = plain
        proc.kill()
        proc.wait()
    print("Mapped gets (the client copies), median us per get_into:")
    print("| size | buffer at | memmove | as shipped |")
    print("|---|---:|---:|---:|")
    for size in sizes:
        for at in (16, 64):
            m = statistics.median(res[(size, at, "memmove")])
            s = statistics.median(res[(size, at, "as shipped")])
            print("| %s | +%d | %.1f | %.1f |" % (bench.label(size), at, m, s))


def shared(builds, sizes, rounds):
    os.environ["MMC_SAME_HOST_MAP"] = "0"
    res = {}
    try:
        for r in range(rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for binary in order:
                proc, addr = bench.start_server(binary)
                try:
                    store = bench.make_store("http://" + addr, False)
                    for size in sizes:
                        src, keys = keys_of(store, size)
                        arr = np.frombuffer(store.alloc_shared_buffer(size + 4096).view,
                                            dtype=np.uint8)
                        for at in (16, 64):
                            us = median_get_us(store, keys, arr.ctypes.data + at, size)
                            assert np.array_equal(arr[at:at + size], src), "bytes differ"
                            res.setdefault((size, at, binary), []).append(us)
                finally:
                    proc.kill()
                    proc.wait()
    finally:
        os.environ["MMC_SAME_HOST_MAP"] = "1"
    print("\nGets into a shared buffer, mapped gets off (the server copies), median us per get:")
    print("| size | view at | %s |" % " | ".join(builds))
    print("|---|---:|%s" % ("---:|" * len(builds)))
    for size in sizes:
        for at in (16, 64):
            cells = ["%.1f" % statistics.median(res[(size, at, b)]) for b in builds]
            print("| %s | +%d | %s |" % (bench.label(size), at, " | ".join(cells)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(here, "..", "target", "release", "mmc-server"))
    ap.add_argument("--servers", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--sizes", default="64KiB,256KiB,448KiB,1MiB")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sizes = [bench.parse_size(s) for s in args.sizes.split(",")]
    if _mapped._plain is None:
        sys.exit("no SSE2 copy in this process (not x86_64 glibc): nothing to compare")
    mapped(args.server, sizes, args.rounds)
    if args.servers:
        shared(list(args.servers), sizes, args.rounds)


if __name__ == "__main__":
    main()
