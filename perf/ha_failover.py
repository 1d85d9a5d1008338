#!/usr/bin/env python3
"""Failover time of the HA meta service: leader killed -> new leader serving -> every object
readable (issue 14).

Starts a single-member etcd (loopback ports, a temporary data directory), two pure metas
(`ock.mmc.embedded.ranks=0`, HA on) and one local service that knows both metas, stores COUNT
objects of SIZE bytes on the local service through the leader, checks they read back, then
kill -9s the leader and records, from the kill:

- `killed_to_serving_s`: until the other meta's /health says leader/serving;
- `killed_to_adopted_s`: until its `cpu.used_bytes` (`/api/v1/capacity/usage`) is what the old
  leader's was: the local service's catalog handed over and adopted;
- `killed_to_all_readable_s`: until every object reads back (same bytes) through it (this
  includes the client reading them all, one at a time through the 307s: ~0.5 ms each);
- the lease TTL in force: the configured `lease_ttl_ms` and the TTL etcd granted the election
  key's lease (whole seconds, read with /v3/lease/timetolive).

Objects are read back in passes over those not yet readable; the time is taken when the last
one reads. Without the catalog hand-over (a new leader adopting what live local services hold)
the objects never come back: the run then stops at --timeout and reports how many did
(`readable_at_timeout`) with `killed_to_all_readable_s` null.

    python3 perf/ha_failover.py [--bin target/release/mmc-server] [--etcd etcd] [--count 1000]
        [--size 4096] [--ttl-ms 2000] [--timeout 60]

Prints one JSON line. Run it on a quiet machine for figures (perf/RESULTS.md).
"""

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import cluster_ready  # noqa: E402  (tests/python/cluster_ready.py: standard library only)
from cluster_cpu import start  # noqa: E402  (this folder: a server started, its address read)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Http:
    """Keep-alive connections by (host, port); one retry on a fresh connection."""

    def __init__(self, timeout=5.0):
        self.conns = {}
        self.timeout = timeout

    def request(self, addr, method, target, body=None):
        for attempt in (0, 1):
            c = self.conns.get(addr)
            if c is None:
                c = http.client.HTTPConnection(addr[0], addr[1], timeout=self.timeout)
                self.conns[addr] = c
            try:
                c.request(method, target, body=body)
                r = c.getresponse()
                data = r.read()
                if r.getheader("connection", "").lower() == "close":
                    c.close()
                    self.conns.pop(addr, None)
                return r.status, r, data
            except (OSError, http.client.HTTPException):
                c.close()
                self.conns.pop(addr, None)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def follow(self, addr, method, target, body=None):
        """One request, following one 307 (standby -> leader, meta -> local service)."""
        status, r, data = self.request(addr, method, target, body)
        if status != 307:
            return status, data
        loc = r.getheader("location")[len("http://"):]
        hostport, path = loc.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        status, _, data = self.request((host, int(port)), method, "/" + path, body)
        return status, data

    def json(self, addr, target):
        status, _, data = self.request(addr, "GET", target)
        return status, json.loads(data) if data else None


def etcd_call(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        c.request("POST", path, body=json.dumps(body))
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def start_etcd(binary, tmp):
    client, peer = free_port(), free_port()
    curl, purl = "http://127.0.0.1:%d" % client, "http://127.0.0.1:%d" % peer
    p = subprocess.Popen(
        [binary, "--name", "perf", "--data-dir", os.path.join(tmp, "etcd"),
         "--listen-client-urls", curl, "--advertise-client-urls", curl,
         "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
         "--initial-cluster", "perf=" + purl],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 15
    while True:
        try:
            etcd_call(client, "/v3/kv/range", {"key": "AA=="})
            return p, client
        except (OSError, ValueError, http.client.HTTPException):
            if time.time() > deadline:
                p.kill()
                sys.exit("etcd did not start")
            time.sleep(0.05)


def wait(what, limit, probe, step=0.01):
    deadline = time.monotonic() + limit
    while True:
        try:
            v = probe()
        except (OSError, ValueError, http.client.HTTPException):
            v = None
        if v:
            return v
        if time.monotonic() > deadline:
            sys.exit("timed out waiting for " + what)
        time.sleep(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/mmc-server")
    ap.add_argument("--etcd", default="etcd")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--ttl-ms", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds after the kill to wait for every object")
    a = ap.parse_args()
    if shutil.which(a.etcd) is None and not os.path.exists(a.etcd):
        sys.exit("etcd not found (apt-get install etcd-server, or --etcd PATH)")

    tmp = tempfile.mkdtemp(prefix="mmc-ha-failover-")
    procs = []
    try:
        etcd, etcd_port = start_etcd(a.etcd, tmp)
        procs.append(etcd)
        metas = []
        for _ in range(2):
            port = free_port()
            p, addr = start([
                a.bin, "--listen", "127.0.0.1:%d" % port, "--shards", "1",
                "--set", "ock.mmc.embedded.ranks=0",
                "--set", "ock.mmc.meta.ha.enable=true",
                "--set", "ock.mmc.meta.ha.etcd_endpoints=http://127.0.0.1:%d" % etcd_port,
                "--set", "ock.mmc.meta.ha.advertise_url=http://127.0.0.1:%d" % port,
                "--set", "ock.mmc.meta.ha.lease_ttl_ms=%d" % a.ttl_ms,
            ])
            procs.append(p)
            metas.append((p, addr))
        h = Http()

        def settled():
            roles = []
            for _, addr in metas:
                status, j = h.json(addr, "/health")
                if status != 200:
                    return None
                roles.append((j["role"], j["ha_state"], j["leader_address"]))
            leaders = [i for i, r in enumerate(roles) if r[:2] == ("leader", "serving")]
            standbys = [i for i, r in enumerate(roles) if r[0] == "standby" and r[2] != "unknown"]
            return (leaders[0], standbys[0]) if len(leaders) == 1 and len(standbys) == 1 else None

        li, si = wait("one leader and one standby", 20, settled, 0.05)
        (leader, laddr), (_, saddr) = metas[li], metas[si]
        local, _ = start([
            a.bin, "--role", "local", "--listen", "127.0.0.1:0", "--shards", "1",
            "--set", "ock.mmc.meta_service_url=http://%s:%d,http://%s:%d" % (saddr + laddr),
            "--set", "ock.mmc.local_service.dram.size=%d" % max(64 << 20, 2 * a.count * a.size),
            "--set", "ock.mmc.local_service.hbm.size=0",
            "--set", "ock.mmc.cluster.heartbeat_interval_ms=200",
            "--set", "ock.mmc.cluster.heartbeat_timeout_ms=1000",
        ])
        procs.append(local)
        wait("the local service to join", 20,
             lambda: cluster_ready.ready_count(lambda p: h.request(laddr, "GET", p)[2]), 0.05)

        bodies = {}
        for i in range(a.count):
            key = "failover-%d" % i
            body = (b"%08d" % i) * (a.size // 8) + b"x" * (a.size % 8)
            status, data = h.follow(laddr, "PUT", "/api/v1/objects?key=%s" % key, body)
            if status != 200 or b'"success":true' not in data:
                sys.exit("put %s: %d %r" % (key, status, data[:200]))
            bodies[key] = body
        for key, body in bodies.items():
            status, data = h.follow(laddr, "GET", "/api/v1/objects?key=%s" % key)
            if status != 200 or data != body:
                sys.exit("get %s before the failover: %d" % (key, status))
        before = h.json(laddr, "/health")[1]["view_version"]
        used_before = h.json(laddr, "/api/v1/capacity/usage")[1]["cpu"]["used_bytes"]
        lease = etcd_call(etcd_port, "/v3/kv/range",
                          {"key": base64.b64encode(b"/mmc/leader").decode()})["kvs"][0]["lease"]
        granted = int(etcd_call(etcd_port, "/v3/lease/timetolive", {"ID": lease})["grantedTTL"])

        h = Http(timeout=2.0)
        leader.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        leader.wait()

        def serving():
            status, j = h.json(saddr, "/health")
            return status == 200 and j["role"] == "leader" and j["ha_state"] == "serving" and j
        j = wait("the standby to serve", 30, serving, 0.005)
        t_serving = time.monotonic() - killed

        def adopted():
            status, u = h.json(saddr, "/api/v1/capacity/usage")
            return status == 200 and u["cpu"]["used_bytes"] == used_before
        try:
            wait("the catalog to be adopted", a.timeout, adopted, 0.005)
            t_adopted = time.monotonic() - killed
        except SystemExit:
            t_adopted = None

        left = dict(bodies)
        t_all = None
        deadline = killed + a.timeout
        while left and time.monotonic() < deadline:
            for key in list(left):
                try:
                    status, data = h.follow(saddr, "GET", "/api/v1/objects?key=%s" % key)
                except (OSError, http.client.HTTPException):
                    continue
                if status == 200 and data == left[key]:
                    del left[key]
            if left:
                time.sleep(0.01)
        if not left:
            t_all = time.monotonic() - killed
        print(json.dumps({
            "objects": a.count, "size": a.size,
            "lease_ttl_ms": a.ttl_ms, "lease_granted_ttl_s": granted,
            "view_version_before": before, "view_version_after": j["view_version"],
            "killed_to_serving_s": round(t_serving, 3),
            "killed_to_adopted_s": None if t_adopted is None else round(t_adopted, 3),
            "killed_to_all_readable_s": None if t_all is None else round(t_all, 3),
            "readable_at_timeout": None if t_all is not None else a.count - len(left),
        }))
        return 0 if t_all is not None else 1
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
