#!/usr/bin/env python3
"""The same-host data path against TCP and memmove (docs/same-host.md, issue 30).

Starts mmc-server in its default configuration (but the port), and for each object size and
thread count measures, in the same run and in turn:
  memmove   -- ctypes.memmove of the same size between two NumPy buffers (the ceiling: the
               two stay in the CPU's cache, 1 MiB each fits in one core's L2)
  memmove out of cache -- the same copies into successive slots of a destination larger than
               the last-level cache (--window bytes over all threads), each written
               once per pass: memory that is not in cache, as the segment a put writes is
  kernel copy -- process_vm_readv of the same size between the same two buffers (this
               process's own memory): the kernel's copy from another process's memory, which
               a same-host put of arbitrary caller memory is made with (the server reads the
               caller's buffer), so its ceiling; it pins each page before copying it
  put_from  -- fresh keys from a NumPy buffer, over the same-host socket, then over TCP
  get_into  -- stored keys into a NumPy buffer, over the same-host socket (a mapped get: the
               client copies from its read-only mapping of the segment; MMC_SAME_HOST_MAP=0:
               the server copies), then over TCP
  shared    -- the same puts and gets over the same-host socket from and into buffers of
               alloc_shared_buffer (the server copies with memcpy: docs/same-host.md,
               *Shared buffers*)
  bounds    -- one thread only: 16-byte same-host gets and puts (a request without its
               copy), and process_vm_readv into memory out of cache in two halves on two
               threads at once (a put's copy as the server makes it); a request can be no
               faster than the first plus its copy alone, so the table of bounds says what
               the bars could be at best on this machine
Each figure is the median of --rounds rounds of --seconds each (the transports alternate
round by round, so a load that comes and goes hits both alike); every get's bytes are
checked at the end of its round. Prints a Markdown table: GB/s (object bytes, all threads
together) and the ratios the issue asks for.

    python3 perf/same_host_bench.py [--server target/release/mmc-server] [--seconds 1]
                                    [--rounds 3] [--sizes 64KiB,1MiB,16MiB] [--threads 1,4]

Needs numpy; imports mmc_client from clients/python of this checkout. Use a release server.
"""

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MMC_CLIENT_DIR: another checkout's clients/python, to compare clients.
sys.path.insert(0, os.environ.get("MMC_CLIENT_DIR") or os.path.join(ROOT, "clients", "python"))

from mmc_client import DistributedObjectStore, LocalConfig  # noqa: E402


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|K|M|G|B)?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError("bad size %r" % s)
    mult = {"K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
    return int(m.group(1)) * mult.get(m.group(2) or "B", 1)


def label(size):
    return "%d KiB" % (size >> 10) if size < (1 << 20) else "%d MiB" % (size >> 20)


def start_server(binary):
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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


def make_store(url, tcp):
    """A store over the same-host socket, or forced to TCP (MMC_TRANSPORT is read at init)."""
    saved = os.environ.pop("MMC_TRANSPORT", None)
    if tcp:
        os.environ["MMC_TRANSPORT"] = "tcp"
    try:
        cfg = LocalConfig()
        cfg.meta_service_url = url
        s = DistributedObjectStore()
        s.setup(cfg)
        if s.init(0) != 0:
            sys.exit("cannot reach " + url)
    finally:
        os.environ.pop("MMC_TRANSPORT", None)
        if saved is not None:
            os.environ["MMC_TRANSPORT"] = saved
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    assert (s._client.local_path(host, int(port)) is None) == tcp, "transport not as asked"
    return s


def split_counts(url):
    """The server's large same-host copies made in two halves so far, and the first halves
    its shards took back from their copy helpers (docs/same-host.md, *Watching it*)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {}
    for line in text.splitlines():
        for name in ("split_copies", "halves_taken_back"):
            if line.startswith("memcache_same_host_%s_total " % name):
                got[name] = int(float(line.split()[1]))
    return got.get("split_copies", 0), got.get("halves_taken_back", 0)


def timed(threads, seconds, work):
    """Runs work(t, stop) on `threads` threads for `seconds`; each returns (bytes it moved,
    seconds it spent moving them). The rate is the sum of the threads' own rates."""
    done = [(0, 1.0)] * threads
    stop = threading.Event()
    go = threading.Barrier(threads + 1)

    def body(t):
        go.wait()
        done[t] = work(t, stop)

    ts = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    go.wait()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(b / s for b, s in done if s > 0) / 1e9


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.process_vm_readv.restype = ctypes.c_ssize_t
_LIBC.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                   ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]


class Case:
    """One size and thread count: each thread's buffers and keys."""

    def __init__(self, size, threads, window):
        self.size, self.threads = size, threads
        self.src = [np.random.default_rng(size * 7 + t).integers(0, 256, size, dtype=np.uint8)
                    for t in range(threads)]
        self.dst = [np.zeros(size, dtype=np.uint8) for _ in range(threads)]
        # Each thread's part of the window (touched once, so no page is faulted while timed).
        self.far = [np.ones(max(window // threads, 2 * size), dtype=np.uint8)
                    for _ in range(threads)]
        # Puts go in batches of this many keys per thread, removed (untimed) before the next
        # batch: the live set stays within the runs a shard keeps committed, as in a cache in
        # its steady state, instead of faulting fresh pages in (~10 us each on a VM).
        self.batch = max(1, window // (size * threads))
        self.round = 0

    def memmove(self, t, stop):
        n, d, s = 0, self.dst[t].ctypes.data, self.src[t].ctypes.data
        t0 = time.perf_counter()
        while not stop.is_set():
            for _ in range(8):
                ctypes.memmove(d, s, self.size)
            n += 8
        return n * self.size, time.perf_counter() - t0

    def kernel_copy(self, t, stop):
        """process_vm_readv of this process's own buffer: the copy a same-host put makes."""
        local = _Iovec(self.dst[t].ctypes.data, self.size)
        remote = _Iovec(self.src[t].ctypes.data, self.size)
        pid, call, n = os.getpid(), _LIBC.process_vm_readv, 0
        t0 = time.perf_counter()
        while not stop.is_set():
            for _ in range(8):
                if call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != self.size:
                    raise OSError(ctypes.get_errno(), "process_vm_readv")
            n += 8
        return n * self.size, time.perf_counter() - t0

    def kernel_copy_far(self, t, stop, parts=2):
        """process_vm_readv into successive slots of the window, as a put's copy writes a
        segment out of cache; run on `parts` threads at once, each copying its share of every
        object (the server copies a large put in two halves, its shard's and a helper's)."""
        part = self.size // parts
        remote = _Iovec(self.src[0].ctypes.data + (t % parts) * part, part)
        far = self.far[0]
        base, slots = far.ctypes.data + (t % parts) * part, len(far) // self.size
        pid, call, n = os.getpid(), _LIBC.process_vm_readv, 0
        t0 = time.perf_counter()
        while not stop.is_set():
            for _ in range(8):
                local = _Iovec(base + (n % slots) * self.size, part)
                if call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != part:
                    raise OSError(ctypes.get_errno(), "process_vm_readv")
                n += 1
        return n * part, time.perf_counter() - t0

    def requests(self, store, op):
        """16-byte put_from (fresh keys) or get_into (one key) requests, one after another:
        what a request costs besides its copy. Returns (requests, seconds): `timed` then gives
        requests per ns."""
        buf = np.zeros(16, dtype=np.uint8)
        ptr = buf.ctypes.data
        tag = "rq/%d" % self.round
        store.put_from(tag, ptr, 16)

        def work(t, stop):
            n = 0
            t0 = time.perf_counter()
            while not stop.is_set():
                if op == "put":
                    assert store.put_from("%s/%d/%d" % (tag, t, n), ptr, 16) == 0
                else:
                    assert store.get_into(tag, ptr, 16) == 0
                n += 1
            return n, time.perf_counter() - t0
        return work

    def memmove_far(self, t, stop):
        n, s, base = 0, self.src[t].ctypes.data, self.far[t].ctypes.data
        slots = len(self.far[t]) // self.size
        t0 = time.perf_counter()
        while not stop.is_set():
            for _ in range(8):
                ctypes.memmove(base + (n % slots) * self.size, s, self.size)
                n += 1
        return n * self.size, time.perf_counter() - t0

    def share(self, store):
        """Each thread's source and destination again, in buffers shared with the server."""
        def shared(a):
            b = store.alloc_shared_buffer(a.nbytes)
            out = np.frombuffer(b.view, dtype=np.uint8)
            out[:] = a
            return out
        self.shared_src = [shared(a) for a in self.src]
        self.shared_dst = [shared(a) for a in self.dst]

    def puts(self, store, shared=False):
        self.round += 1
        tag = self.round
        srcs = self.shared_src if shared else self.src

        def work(t, stop):
            moved, busy, n, ptr = 0, 0.0, 0, srcs[t].ctypes.data
            while not stop.is_set():
                keys = ["sh/%d/%d/%d" % (tag, t, n + i) for i in range(self.batch)]
                n += self.batch
                t0 = time.perf_counter()
                for k in keys:
                    assert store.put_from(k, ptr, self.size) == 0
                busy += time.perf_counter() - t0
                moved += self.batch * self.size
                assert store.remove_batch(keys) == [0] * len(keys)
            return moved, busy
        return work

    def gets(self, store, tag, shared=False):
        dsts = self.shared_dst if shared else self.dst

        def work(t, stop):
            n, ptr = 0, dsts[t].ctypes.data
            t0 = time.perf_counter()
            while not stop.is_set():
                dsts[t][:1] = 0
                assert store.get_into("sh/%d/%d/%d" % (tag, t, n % 4), ptr, self.size) == 0
                n += 1
            busy = time.perf_counter() - t0
            assert np.array_equal(self.src[t], dsts[t]), "bytes differ"
            return n * self.size, busy
        return work

    def gets_bytes(self, store, tag):
        """get(): a new bytes object per call (same host: made straight from the mapped
        segment; with MMC_SAME_HOST_MAP=0 the server copies into the thread's shared buffer,
        and the bytes are made from there)."""
        def work(t, stop):
            n = 0
            t0 = time.perf_counter()
            last = b""
            while not stop.is_set():
                last = store.get("sh/%d/%d/%d" % (tag, t, n % 4))
                assert len(last) == self.size
                n += 1
            busy = time.perf_counter() - t0
            assert last == self.src[t].tobytes(), "bytes differ"
            return n * self.size, busy
        return work


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_bin = os.path.join(ROOT, "target", "release", "mmc-server")
    ap.add_argument("--server", default=os.environ.get("MMC_SERVER", default_bin))
    ap.add_argument("--url", help="use a running server (on this host) instead of starting one")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--window", type=parse_size, default=64 << 20,
                    help="bytes put (all threads) before they are removed (default 64MiB)")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    counts = [int(t) for t in args.threads.split(",")]

    proc = None
    if args.url:
        url = args.url
    else:
        if not os.path.exists(args.server):
            sys.exit("no server binary at %s (cargo build --release, or --server PATH)"
                     % args.server)
        proc, addr = start_server(args.server)
        url = "http://" + addr
    stores = {"same-host": make_store(url, False), "tcp": make_store(url, True)}
    rows = []
    try:
        # Warm-up, not timed: the pages of the runs the shards keep touched once, then emptied.
        warm = np.zeros(16 << 20, dtype=np.uint8)
        for i in range(2 * args.window // warm.nbytes):
            stores["tcp"].put_from("warm/%d" % i, warm.ctypes.data, warm.nbytes)
        stores["tcp"].remove_all()
        for size in sizes:
            for threads in counts:
                case = Case(size, threads, args.window)
                case.share(stores["same-host"])
                split0, back0 = split_counts(url)
                got = {k: [] for k in ("memmove", "memmove far", "kernel copy",
                                       "put same-host", "put tcp",
                                       "put shared", "get same-host", "get tcp", "get shared",
                                       "get() same-host", "get() tcp", "kernel copy far",
                                       "16 B get", "16 B put")}
                runs = [("same-host", False), ("tcp", False), ("shared", True)]
                for _ in range(args.rounds):
                    got["memmove"].append(timed(threads, args.seconds, case.memmove))
                    got["memmove far"].append(timed(threads, args.seconds, case.memmove_far))
                    got["kernel copy"].append(timed(threads, args.seconds, case.kernel_copy))
                    if threads == 1:
                        # GB/s of one object copied in halves on two threads at once.
                        got["kernel copy far"].append(
                            timed(2, args.seconds, case.kernel_copy_far))
                        for op in ("get", "put"):
                            # µs per request (timed gives requests per ns).
                            rate = timed(1, args.seconds, case.requests(stores["same-host"], op))
                            got["16 B " + op].append(1e-3 / rate)
                        stores["same-host"].remove_all()
                    for name, shared in runs:
                        store = stores["same-host" if shared else name]
                        got["put " + name].append(timed(threads, args.seconds,
                                                        case.puts(store, shared)))
                        tag = case.round
                        for t in range(threads):  # the keys the gets read, whatever the puts did
                            for n in range(4):
                                store.put_from("sh/%d/%d/%d" % (tag, t, n),
                                               case.src[t].ctypes.data, size)
                        got["get " + name].append(timed(threads, args.seconds,
                                                        case.gets(store, tag, shared)))
                        if not shared:
                            got["get() " + name].append(timed(threads, args.seconds,
                                                              case.gets_bytes(store, tag)))
                        store.remove_all()
                rows.append((size, threads,
                             {k: statistics.median(v) for k, v in got.items() if v}))
                r = rows[-1][2]
                split1, back1 = split_counts(url)
                print("# %s x%d: %s; copies split %d, first halves taken back %d" % (
                    label(size), threads, ", ".join("%s %.2f" % kv for kv in r.items()),
                    split1 - split0, back1 - back0), file=sys.stderr, flush=True)
    finally:
        for s in stores.values():
            s.close()
        if proc is not None:
            proc.terminate()
            proc.wait(15)

    print("| size | threads | memmove GB/s | memmove out of cache | put same-host | put TCP "
          "| get same-host | get TCP | put ×TCP | get ×TCP | put ×memmove | get ×memmove "
          "| put ×out of cache | get ×out of cache |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, threads, r in rows:
        m, far = r["memmove"], r["memmove far"]
        put, get = r["put same-host"], r["get same-host"]
        print("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f | %.2f "
              "| %.2f | %.2f |" % (
                  label(size), threads, m, far, put, r["put tcp"], get, r["get tcp"],
                  put / r["put tcp"], get / r["get tcp"], put / m, get / m, put / far,
                  get / far))
    print()
    print("Shared buffers (alloc_shared_buffer; the server copies with memcpy):")
    print()
    print("| size | threads | put shared | get shared | put ×TCP | get ×TCP | put ×memmove "
          "| get ×memmove | put ×out of cache | get ×out of cache |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, threads, r in rows:
        m, far = r["memmove"], r["memmove far"]
        put, get = r["put shared"], r["get shared"]
        print("| %s | %d | %.2f | %.2f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f |" % (
            label(size), threads, put, get, put / r["put tcp"], get / r["get tcp"], put / m,
            get / m, put / far, get / far))

    print()
    print("The kernel's copy (process_vm_readv of the same buffers, in cache), which a "
          "same-host put_from of the caller's memory is made with:")
    print()
    print("| size | threads | kernel copy GB/s | ×memmove | put same-host ×kernel copy |")
    print("|---|---:|---:|---:|---:|")
    for size, threads, r in rows:
        k = r["kernel copy"]
        print("| %s | %d | %.2f | %.2f | %.2f |" % (label(size), threads, k, k / r["memmove"],
                                                  r["put same-host"] / k))

    print()
    print("What bounds one thread's same-host request on this machine: a 16-byte request's "
          "time (everything but the copy) plus the copy alone; for a get the client's memmove "
          "(the bench's gets read four keys in turn, in cache), for a put the kernel's copy into "
          "memory out of cache in two halves at once, as the server makes it. The bound is what "
          "a request would reach if nothing else cost anything:")
    print()
    print("| size | 16 B get µs | 16 B put µs | get bound GB/s | ×TCP | ×memmove "
          "| put bound GB/s | ×TCP | ×memmove | kernel copy far GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, threads, r in rows:
        if threads != 1:
            continue
        m, kfar = r["memmove"], r["kernel copy far"]
        g_us, p_us = r["16 B get"], r["16 B put"]
        gb = size / (g_us * 1e3 + size / m)
        pb = size / (p_us * 1e3 + size / kfar)
        print("| %s | %.1f | %.1f | %.2f | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f |" % (
            label(size), g_us, p_us, gb, gb / r["get tcp"], gb / m, pb, pb / r["put tcp"],
            pb / m, kfar))

    print()
    print("get(): new bytes per call (same host: made from the mapped segment, or with "
          "MMC_SAME_HOST_MAP=0 from the thread's shared buffer the server copied into):")
    print()
    print("| size | threads | get() same-host | get() TCP | ×TCP | ×memmove |")
    print("|---|---:|---:|---:|---:|---:|")
    for size, threads, r in rows:
        g, gt = r["get() same-host"], r["get() tcp"]
        print("| %s | %d | %.2f | %.2f | %.1f | %.2f |" % (label(size), threads, g, gt, g / gt,
                                                          g / r["memmove"]))


if __name__ == "__main__":
    main()
