#!/usr/bin/env python3
"""A rejoined rank keeps what it is given (issue 25, defect 6), with real processes.

A pure meta service and two local services (64 MB DRAM each, no SSD); client threads put,
get and delete 64-256 KiB objects (a working set well under 10 MB); rank 1 is killed (-9)
and restarted at once, twice; then 120 objects of 200 KB are put preferring rank 1 and read
back a few seconds later. FAIL when one of those acknowledged objects is missing, or when
`memcache_evict_deleted_objects_total` moved while `/api/v1/capacity/usage` stays below the
high watermark (90 %).

Standard library only; shares scripts/cluster_soak.py's process handling.
    python3 scripts/rejoin_evict.py [--server target/release/mmc-server] [--runs N]
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cluster_soak import Cluster, NET_ERRORS  # noqa: E402
from soak import Conn  # noqa: E402

KIB = 1 << 10


def metric(conn, name):
    text = conn.request("GET", "/metrics").body.decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def usage(conn):
    return conn.request("GET", "/api/v1/capacity/usage").json()


def ratio(u):
    """The highest usage ratio of any device in a capacity answer."""
    return max([v["usage_ratio"] for v in u.values() if isinstance(v, dict)] or [0.0])


def follow(conns, meta, method, target, body=None):
    def exchange(addr, target):
        if addr not in conns:
            conns[addr] = Conn(addr, timeout=30)
        try:
            return conns[addr].request(method, target, body)
        except NET_ERRORS:
            conns[addr].close()
            raise

    r = exchange(meta, target)
    if r.status != 307:
        return r
    m = re.match(r"https?://([^/:]+):(\d+)(/.*)$", r.headers["location"])
    return exchange((m.group(1), int(m.group(2))), m.group(3))


def load(cid, meta, stop, counts, lock, pause=0.0):
    """Puts, gets and deletes of 64-256 KiB objects, at most ~2 MB live per thread; `pause`
    seconds between two operations."""
    rng = random.Random(cid)
    conns, live, seq = {}, [], 0
    while not stop.wait(pause):
        try:
            op = rng.random()
            if op < 0.45 and sum(n for _, n in live) < 2 << 20:
                seq += 1
                key, n = f"load-{cid}-{seq}", rng.randrange(64 * KIB, 256 * KIB)
                r = follow(conns, meta, "PUT", f"/api/v1/objects?key={key}", os.urandom(n))
                if r.status == 200 and r.error_message() is None:
                    live.append((key, n))
            elif op < 0.75 and live:
                follow(conns, meta, "GET", f"/api/v1/objects?key={rng.choice(live)[0]}")
            elif live:
                key, n = live.pop(rng.randrange(len(live)))
                follow(conns, meta, "DELETE", f"/api/v1/objects?key={key}")
            with lock:
                counts[0] += 1
        except NET_ERRORS:
            time.sleep(0.05)


def one_run(args, run):
    work = tempfile.mkdtemp(prefix="mmc-rejoin-evict-", dir=args.dir)
    ns = argparse.Namespace(
        server=args.server, shards=args.shards, io_driver=None, heartbeat_ms=200,
        heartbeat_timeout_ms=1500, set=[], ranks=2, dram_mb=64, ssd_mb=0)
    cluster = Cluster(ns, work)
    stop = threading.Event()
    counts, lock = [0], threading.Lock()
    threads = []
    verdict = {"run": run, "logs": work}
    try:
        cluster.start()
        meta = cluster.meta_addr
        threads = [threading.Thread(target=load, args=(i + 100 * run, meta, stop, counts, lock),
                                    daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(2)
        for _ in range(2):
            p = cluster.locals[1]
            p.proc.kill()
            p.proc.wait()
            t0 = time.monotonic()
            if not cluster.start_local(1):
                raise SystemExit(f"rank 1 did not join again; log {p.log_path}")
            if not cluster.wait_ready(30):
                raise SystemExit("rank 1 not listed OK within 30 s")
            verdict.setdefault("back_s", []).append(round(time.monotonic() - t0, 2))
            time.sleep(1)
        conn = Conn(meta, timeout=30)
        before = metric(conn, "memcache_evict_deleted_objects_total")
        acked, conns = [], {}
        for i in range(120):
            key = f"pref-{run}-{i}"
            r = follow(conns, meta, "PUT", f"/api/v1/objects?key={key}&prefer_rank=1",
                       os.urandom(200_000))
            if r.status == 200 and r.error_message() is None:
                acked.append(key)
        peak = 0.0
        for _ in range(12):
            time.sleep(0.5)
            peak = max(peak, ratio(usage(conn)))
        missing = []
        for key in acked:
            r = follow(conns, meta, "GET", f"/api/v1/objects?key={key}")
            if r.status != 200 or r.error_message() is not None or len(r.body) != 200_000:
                missing.append(key)
        after = metric(conn, "memcache_evict_deleted_objects_total")
        verdict.update({
            "acked": len(acked), "missing": len(missing),
            "evicted_deleted": after - before, "peak_usage": peak,
            "load_ops": counts[0],
            "lost_lines": sum(open(cluster.meta.log_path, errors="replace").read().count(x)
                              for x in ["lost: no heartbeat"]),
        })
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for lp in cluster.locals:
            if lp.alive():
                lp.stop(signal.SIGKILL, 10)
        if cluster.meta.alive():
            cluster.meta.stop(signal.SIGTERM, 30)
    verdict["verdict"] = "PASS" if verdict.get("missing") == 0 and \
        verdict.get("evicted_deleted") == 0 and verdict.get("acked") == 120 else "FAIL"
    if verdict["verdict"] == "PASS" and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return verdict


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.environ.get("MMC_SERVER", "target/release/mmc-server"))
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    failed = 0
    for run in range(args.runs):
        v = one_run(args, run)
        print(json.dumps(v), flush=True)
        failed += v["verdict"] != "PASS"
    print(f"rejoin_evict: {args.runs - failed} of {args.runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
