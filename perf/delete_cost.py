#!/usr/bin/env python3
"""What a delete of an object on a local service costs now that it is answered only once the
local service dropped it from its catalog (docs/cluster-protocol.md, "Removals").

A pure meta and one local service on loopback (release builds), the meta pinned to one CPU and
the local service and this client to the other. N objects of SIZE bytes are put through the
meta's redirects, then deleted one at a time on one keep-alive connection; the script prints
the median and p99 latency of a DELETE and the meta's and the local service's CPU time per
delete (from /proc/<pid>/stat), and the same for the N puts for scale.

Compare two builds by running it against each, alternating (the figures of one run vary):

    python3 perf/delete_cost.py --bin target/release/mmc-server --count 2000
    python3 perf/delete_cost.py --bin /path/to/other/mmc-server --count 2000

Standard library only.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from soak import free_port  # noqa: E402  (scripts/soak.py)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system CPU seconds of a process."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start(cmd, cpus, log):
    return subprocess.Popen(
        ["taskset", "-c", cpus] + cmd, stdout=log, stderr=subprocess.STDOUT
    )


def wait_ok(port, path, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            if r.status == 200 and (path != "/get_all_segments" or body.strip()):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("the server on %d did not get ready" % port)


def put(meta, key, body):
    meta.request("PUT", "/api/v1/objects?key=%s" % key, body=body)
    r = meta.getresponse()
    text = r.read()
    if r.status != 307:
        raise SystemExit("put %s: %d %s" % (key, r.status, text[:200]))
    loc = r.getheader("Location")
    rest = loc.split("://", 1)[1]
    hostport, target = rest.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request("PUT", "/" + target, body=body)
    r2 = c.getresponse()
    answer = json.loads(r2.read())
    c.close()
    if not answer.get("success"):
        raise SystemExit("put %s: %s" % (key, answer))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "target", "release", "mmc-server"))
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    mport, lport = free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="mmc-delete-cost-")
    mlog = open(os.path.join(tmp, "meta.log"), "w")
    llog = open(os.path.join(tmp, "local.log"), "w")
    meta = start(
        [args.bin, "--listen", "127.0.0.1:%d" % mport, "--set", "ock.mmc.embedded.ranks=0"],
        "0", mlog,
    )
    local = start(
        [args.bin, "--role", "local", "--listen", "127.0.0.1:%d" % lport, "--shards", "1",
         "--set", "ock.mmc.meta_service_url=http://127.0.0.1:%d" % mport,
         "--set", "ock.mmc.local_service.dram.size=256MB",
         "--set", "ock.mmc.local_service.hbm.size=0"],
        "1", llog,
    )
    try:
        wait_ok(mport, "/get_all_segments")
        time.sleep(0.5)
        body = os.urandom(args.size)
        conn = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
        m0, l0, t0 = cpu_s(meta.pid), cpu_s(local.pid), time.perf_counter()
        for i in range(args.count):
            put(conn, "d-%d" % i, body)
        put_wall = time.perf_counter() - t0
        m1, l1 = cpu_s(meta.pid), cpu_s(local.pid)
        lat = []
        for i in range(args.count):
            s = time.perf_counter()
            conn.request("DELETE", "/api/v1/objects?key=d-%d" % i)
            r = conn.getresponse()
            answer = json.loads(r.read())
            lat.append(time.perf_counter() - s)
            if not answer.get("success"):
                raise SystemExit("delete d-%d: %s" % (i, answer))
        m2, l2 = cpu_s(meta.pid), cpu_s(local.pid)
        lat.sort()
        n = args.count
        print(json.dumps({
            "bin": args.bin,
            "count": n,
            "size": args.size,
            "put_us_wall": round(put_wall / n * 1e6, 1),
            "put_meta_cpu_us": round((m1 - m0) / n * 1e6, 1),
            "put_local_cpu_us": round((l1 - l0) / n * 1e6, 1),
            "delete_p50_us": round(statistics.median(lat) * 1e6, 1),
            "delete_p99_us": round(lat[int(n * 0.99) - 1] * 1e6, 1),
            "delete_meta_cpu_us": round((m2 - m1) / n * 1e6, 1),
            "delete_local_cpu_us": round((l2 - l1) / n * 1e6, 1),
        }))
    finally:
        for p in (local, meta):
            p.terminate()
        for p in (local, meta):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
