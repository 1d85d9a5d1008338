#!/usr/bin/env python3
"""Cluster chaos soak of mmc-server: a pure meta service (or, with `--ha`, two metas electing a
leader on a real etcd) and N local services (`--role local`, fixed ranks and ports), client
threads putting, reading, deleting, rewriting, batch-reading, replaying grants and retrying
puts through the meta (following its 307s to the local services), while a chaos thread
injects one fault at a time. See scripts/cluster_soak.sh.

The faults (each counted in the report):
- `kill`: kill -9 of a local service, restarted on the same rank and port at once or after up
  to twice the heartbeat timeout (before or after the meta declares it lost);
- `term`: SIGTERM of a local service (it drains its objects to the others and must exit 0
  within 20 s), then restarted;
- `freeze-short`: SIGSTOP of a local service for 10-50 % of the heartbeat timeout, then
  SIGCONT: nothing may be lost;
- `freeze-long`: SIGSTOP for 1.5-3 times the heartbeat timeout (the rank is declared lost:
  its copies dropped), then SIGCONT: it joins again with its catalog void;
- with `--ha`, `leader-kill`: kill -9 of the leading meta (the standby must lead within 15 s;
  the killed one is restarted and must come back as a standby), and `leader-freeze`: SIGSTOP
  of the leader until the standby leads, and a little longer, then SIGCONT (it must come
  back as a standby);
- `none`.
After a restart or a resume past the heartbeat timeout, the rank must serve again (a put with
its `prefer_rank` redirected to it) within the heartbeat timeout + 1 s, measured from the
restart (or the SIGCONT): slower is a failure. The next fault waits until every segment is
listed OK again.

What the clients do, each on keys only it touches (so what every key may hold is exact):
puts (1 KiB - 1 MiB, `replicas` 1 or 2, mostly with `prefer_rank`, half with `Expect:
100-continue`), gets through the meta's 307 (a few follow it late), deletes, rewrites (delete,
then a put of new bytes to the same key), puts of deleted keys again, batch gets and batch
exists, and:
- **grant replays**: a client keeps the Location of some of its acknowledged puts' redirects and
  sends the same grant again later (within the grant TTL, sometimes after the key was deleted
  and its range given to another key; plain, with `Expect: 100-continue`, or the chain's second
  hop alone) with other bytes: every replay must be refused (403), the key must still read its
  acknowledged bytes, and no key may ever read a replay's bytes. Read grants are replayed too:
  a 200 must be bytes of that key;
- **retried puts**: the body is sent to the local service and the connection closed before the
  answer is read; then the put is retried through the meta, or to the same Location.

Verdict (scripts/cluster_soak_judge.py has the exact rules), counted:
- corrupt reads (a 200 with bytes no put of that key sent), resurrected deletes (a key whose
  delete was acknowledged read or listed afterwards, no later put of it sent), stale overwrites
  (an older value read after a newer put was acknowledged), losses not allowed by a documented
  rule (an acknowledged object missing although no rank holding its copies could have been
  lost since its put was sent: no kill -9 or freeze past the heartbeat timeout, or fewer lost
  or drained ranks than its replicas, and no failover right after tier moves), keys answered
  missing and readable later, replays accepted or not refused, ranks slower than the heartbeat
  timeout + 1 s to serve again: each must be 0;
- FAIL too when a meta dies (but by the chaos), any process panics, a SIGTERMed local service
  does not exit 0 within 20 s, a restarted one does not come back, the ranks are not all listed
  OK within 30 s of a fault, no leader serves within 15 s of a leader's death, a restarted or
  resumed leader does not come back as a standby, or a process does not exit 0 on the final
  SIGTERM;
- a put or delete whose answer never came or was an error (a delete answered 503 "The removal
  was applied but a local service holding a copy did not confirm it" included) may or may not
  have taken effect; a delete answered "Key not found" removed the key all the same (the meta
  keeps a tombstone); a connection error on a rank being killed is counted (a read is
  retried), not a failure; objects lost by a documented rule are counted by cause and replica
  count;
- a miss between a leader's death and the ranks listed OK on the next leader is counted, not
  judged: a new leader serves before the local services joined it and handed their catalogs
  over (the key is judged when read again later);
- a meta not answering /health for half the heartbeat timeout (but frozen by the chaos) is
  reported as a stall (`--stall-dump`: its threads dumped with gdb into the logs).

At the end the chaos stops, every rank must be listed OK again, every key is read back, and
all processes are stopped with SIGTERM (locals one by one, then the standby, then the leader)
and must exit 0. The last line is the verdict as JSON. Exit status 0 = PASS, 1 = FAIL. Every
wait is bounded; every process (etcd included) is on 127.0.0.1 and stopped on exit.

Standard library only (shares scripts/soak.py's HTTP connection and
tests/python/cluster_ready.py).
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from urllib.parse import quote, unquote

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import cluster_ready  # noqa: E402  (tests/python/cluster_ready.py)
import cluster_soak_judge as judge  # noqa: E402  (scripts/cluster_soak_judge.py)
from cluster_soak_judge import DELETE, LOST, OK, PUT, Key, Op, checksum, wall  # noqa: E402
from soak import Conn, free_port  # noqa: E402  (scripts/soak.py)

KIB, MIB = 1 << 10, 1 << 20
NOT_FOUND = "Key not found"
NET_ERRORS = (OSError, ConnectionError, ValueError)
LOSS_NOT_ALLOWED = "loss not allowed by a documented rule"
REPLAY_ACCEPTED = "grant replay accepted"
REPLAY_NOT_REFUSED = "grant replay not refused with 403"
SLOW_SERVING = "rank not serving within the heartbeat timeout + 1 s"
# The verdict's counts: every one must be 0.
COUNTED = {
    judge.CORRUPT: "corrupt_reads",
    judge.RESURRECTED: "resurrected_deletes",
    judge.STALE: "stale_overwrites",
    LOSS_NOT_ALLOWED: "losses_not_allowed",
    judge.LOST_BACK: "lost_then_readable",
    REPLAY_ACCEPTED: "replays_accepted",
    REPLAY_NOT_REFUSED: "replays_not_refused",
    SLOW_SERVING: "slow_to_serve",
}
# 503s of a meta that did nothing: the request is asked again.
NO_LEADER = ("No leader", "Leader starting")


# The chaos's faults and how often each is chosen.
FAULTS = {"kill": 3, "term": 2, "freeze-short": 2, "freeze-long": 2, "none": 1,
          "leader-kill": 2, "leader-freeze": 2}
LEADER_FAULTS = ("leader-kill", "leader-freeze")


def split_location(loc):
    m = re.match(r"https?://([^/:]+):(\d+)(/.*)$", loc)
    if m is None:
        raise ValueError(f"unexpected Location {loc!r}")
    return (m.group(1), int(m.group(2))), m.group(3)


class Proc:
    """One server process (restartable on the same command line), its output in a log file."""

    def __init__(self, name, cmd, log_path):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.proc = None
        self.starts = 0
        self.frozen = False

    def start(self, want, timeout=30.0):
        """Starts it and waits for the log line matching `want` (a regex) from this start on;
        answers the match, or None (the process is then killed). Without `want`, answers
        at once."""
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        log.write(f"---- soak {wall()}: start {self.starts + 1}: {' '.join(self.cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        self.starts += 1
        self.frozen = False
        if want is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                m = re.search(want, f.read().decode("utf-8", "replace"))
            if m:
                return m
            if self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def note(self, text):
        """A line in its log (the soak's actions next to what the process logged)."""
        with open(self.log_path, "ab") as f:
            f.write(f"---- soak {wall()}: {text}\n".encode())

    def signal(self, sig):
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.frozen = False

    def stop(self, sig, timeout):
        """Sends `sig` and waits: the exit status, or None when it did not exit in time (it is
        then killed)."""
        if self.frozen:
            self.signal(signal.SIGCONT)
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def panicked(self):
        with open(self.log_path, "rb") as f:
            return b"panicked" in f.read()


def etcd_answers(port):
    """etcd's v3 JSON gateway answers a range request."""
    body = b'{"key":"AA=="}'
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            c.sendall(b"POST /v3/kv/range HTTP/1.1\r\nHost: etcd\r\nContent-Length: %d\r\n"
                      b"Connection: close\r\n\r\n%s" % (len(body), body))
            return c.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


class Etcd(Proc):
    """A single-member etcd on loopback ports, its data in the soak's directory."""

    def __init__(self, work):
        self.client_port, peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        super().__init__("etcd", [
            "etcd", "--name", "mmc-soak", "--data-dir", os.path.join(work, "etcd"),
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", "mmc-soak=" + peer,
        ], os.path.join(work, "etcd.log"))

    def launch(self):
        self.start(None)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if etcd_answers(self.client_port):
                return True
            if not self.alive():
                return False
            time.sleep(0.05)
        return False


class Cluster:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.ha = getattr(args, "ha", False)
        beat = [
            "--set", f"ock.mmc.cluster.heartbeat_interval_ms={args.heartbeat_ms}",
            "--set", f"ock.mmc.cluster.heartbeat_timeout_ms={args.heartbeat_timeout_ms}",
        ]
        common = ["--shards", str(args.shards)]
        if args.io_driver:
            common += ["--io-driver", args.io_driver]
        self.etcd = Etcd(work) if self.ha else None
        self.metas = []
        self.meta_addrs = []
        for i in range(2 if self.ha else 1):
            port = free_port()
            cmd = [args.server, "--listen", f"127.0.0.1:{port}", *common,
                   "--set", "ock.mmc.embedded.ranks=0", *beat,
                   *sum((["--set", kv] for kv in args.set), [])]
            if self.ha:
                cmd += ["--set", "ock.mmc.meta.ha.enable=true",
                        "--set", f"ock.mmc.meta.ha.etcd_endpoints={self.etcd.endpoint}",
                        "--set", f"ock.mmc.meta.ha.advertise_url=http://127.0.0.1:{port}",
                        "--set", f"ock.mmc.meta.ha.lease_ttl_ms={args.lease_ttl_ms}"]
            name = "meta" if not self.ha else f"meta {'ab'[i]}"
            self.metas.append(Proc(name, cmd, os.path.join(work, f"meta-{'ab'[i]}.log")))
            self.meta_addrs.append(("127.0.0.1", port))
        urls = ",".join("http://%s:%d" % a for a in self.meta_addrs)
        self.locals = []
        self.local_ports = []
        self.segments_per_rank = 1 + (args.ssd_mb > 0)
        for rank in range(args.ranks):
            port = free_port()
            cmd = [
                args.server, "--role", "local", "--listen", f"127.0.0.1:{port}", *common,
                "--set", f"ock.mmc.local_service.rank={rank}",
                "--set", f"ock.mmc.local_service.dram.size={args.dram_mb}MB",
                "--set", "ock.mmc.local_service.hbm.size=0", *beat,
                "--set", f"ock.mmc.meta_service_url={urls}",
            ]
            if args.ssd_mb > 0:
                ssd = os.path.join(work, f"ssd-{rank}")
                os.mkdir(ssd)
                cmd += ["--set", "ock.mmc.ssd.enable=true", "--set", f"ock.mmc.ssd.path={ssd}",
                        "--set", f"ock.mmc.ssd.size={args.ssd_mb}MB"]
            self.locals.append(Proc(f"rank {rank}", cmd, os.path.join(work, f"local-{rank}.log")))
            self.local_ports.append(port)
        self.lock = threading.Lock()
        self.leader = 0
        self.probes = 0

    @property
    def meta(self):
        """The first meta (the only one without HA; scripts/rejoin_evict.py uses it)."""
        return self.metas[0]

    @property
    def meta_addr(self):
        return self.meta_addrs[0]

    def procs(self):
        return ([self.etcd] if self.etcd else []) + self.metas + self.locals

    def start(self):
        if self.etcd and not self.etcd.launch():
            raise SystemExit("etcd did not start; log " + self.etcd.log_path)
        for i, m in enumerate(self.metas):
            if not self.start_meta(i):
                raise SystemExit(f"{m.name} did not start; log {m.log_path}")
        if self.leader_index(20) is None or (self.ha and not self.settled(20)):
            raise SystemExit("no meta leads within 20 s")
        for rank in range(len(self.locals)):
            if not self.start_local(rank):
                raise SystemExit(f"rank {rank} did not join; log {self.locals[rank].log_path}")
        if not self.wait_ready(30):
            raise SystemExit("the ranks are not listed OK within 30 s")

    def start_local(self, rank, timeout=30.0):
        """Starts a local service and waits until it has joined (answers False if not); a
        port still held by the old process is retried."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.locals[rank].start(r"joined the meta service at \S+ as rank", timeout=15):
                return True
            time.sleep(0.5)
        return False

    def start_meta(self, i, timeout=30.0):
        """Starts a meta (again) on its port; a port still held is retried."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metas[i].start(r"listening on http://\S+", timeout=15):
                return True
            time.sleep(0.5)
        return False

    # -- the metas --

    def health(self, i, timeout=2.0):
        """A meta's /health, or None (dead, frozen, not answering)."""
        c = Conn(self.meta_addrs[i], timeout=timeout)
        try:
            r = c.request("GET", "/health")
            return r.json() if r.status == 200 else None
        except NET_ERRORS:
            return None
        finally:
            c.close()

    def leader_index(self, timeout):
        """The index of the serving leader (waited for, bounded), or None."""
        if not self.ha:
            return 0 if self.metas[0].alive() else None
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.metas):
                if not m.alive() or m.frozen:
                    continue
                h = self.health(i)
                if h and h.get("role") == "leader" and h.get("ha_state") == "serving":
                    with self.lock:
                        self.leader = i
                    return i
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def standby_of(self, i, leader, timeout):
        """Whether meta `i` reports being a standby of meta `leader` within `timeout`."""
        want = "http://%s:%d" % self.meta_addrs[leader]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health(i)
            if h and h.get("role") == "standby" and h.get("leader_address") == want:
                return True
            time.sleep(0.1)
        return False

    def settled(self, timeout):
        li = self.leader_index(timeout)
        return li is not None and self.standby_of(1 - li, li, timeout)

    def get(self, path, timeout=5.0):
        """The body of a GET on the leader (b"" on any error)."""
        li = self.leader_index(5)
        if li is None:
            return b""
        c = Conn(self.meta_addrs[li], timeout=timeout)
        try:
            return c.request("GET", path).body
        except NET_ERRORS:
            return b""
        finally:
            c.close()

    def wait_ready(self, timeout):
        want = len(self.locals) * self.segments_per_rank
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cluster_ready.ready_count(self.get) == want:
                return True
            if not any(m.alive() for m in self.metas):
                return False
            time.sleep(0.1)
        return False

    def counters(self, names):
        """The sum of the leader's /metrics series of these families (all labels)."""
        text = self.get("/metrics").decode("utf-8", "replace")
        total = 0.0
        for line in text.splitlines():
            name = re.split(r"[{ ]", line, 1)[0]
            if name in names:
                try:
                    total += float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    pass
        return total

    def serving(self, rank, since, limit):
        """Seconds from `since` until a put with `prefer_rank=rank` lands on that rank (its
        307 names the rank's port) and is acknowledged; None if not within 3 x `limit`."""
        deadline = since + max(3 * limit, 10.0)
        want_port = self.local_ports[rank]
        conns = {}
        try:
            while time.monotonic() < deadline:
                with self.lock:
                    self.probes += 1
                    key = f"probe-{rank}-{self.probes}"
                    li = self.leader
                try:
                    addr = self.meta_addrs[li]
                    c = conns[addr] = conns.get(addr) or Conn(addr, timeout=5)
                    r = c.request("PUT", f"/api/v1/objects?key={key}&prefer_rank={rank}",
                                  b"probe " + key.encode())
                    if r.status == 307:
                        to, target = split_location(r.headers["location"])
                        lc = conns[to] = conns.get(to) or Conn(to, timeout=5)
                        r2 = lc.request("PUT", target, b"probe " + key.encode())
                        if (to[1] == want_port and r2.status == 200
                                and r2.error_message() is None):
                            return time.monotonic() - since
                    elif r.status >= 500:
                        self.leader_index(1)
                except NET_ERRORS:
                    for c in conns.values():
                        c.close()
                    conns.clear()
                    self.leader_index(1)
                time.sleep(0.02)
            return None
        finally:
            for c in conns.values():
                c.close()


class Shared:
    """What the threads share: counters, failures, the faults, the stored bytes."""

    def __init__(self, budget):
        self.lock = threading.Lock()
        self.events = judge.Events()
        self.answers = Counter()
        self.failures = []  # (what, key, detail)
        self.lost_allowed = Counter()
        self.stored = 0  # bytes times replicas the keys may hold
        self.budget = budget
        self.stop = threading.Event()
        # [start, end]: a leader's death until the ranks are listed OK on the next one. A new
        # leader serves before the local services joined it and handed their catalogs over:
        # a miss then is not judged (the key is read again later).
        self.windows = []

    def open_window(self):
        with self.lock:
            self.windows.append([time.monotonic(), None])
            return self.windows[-1]

    def close_window(self, w):
        with self.lock:
            if w[1] is None:
                w[1] = time.monotonic()

    def unsettled(self, since):
        """Whether a failover settled (or still settles) after `since`."""
        with self.lock:
            return any(w[1] is None or w[1] > since for w in self.windows)

    def count(self, what):
        what = re.sub(r"\d+", "N", str(what))
        with self.lock:
            self.answers[what] += 1

    def fail(self, what, key, detail):
        detail = f"{detail} (at {wall()})"
        with self.lock:
            self.failures.append((what, key, detail))
            self.answers["FAIL: " + what] += 1

    def add_stored(self, n):
        with self.lock:
            self.stored += n

    def over_budget(self):
        with self.lock:
            return self.stored > self.budget


class Pool:
    """A set with a random pick in O(1)."""

    def __init__(self):
        self.items = []
        self.index = {}

    def __len__(self):
        return len(self.items)

    def add(self, x):
        if x not in self.index:
            self.index[x] = len(self.items)
            self.items.append(x)

    def discard(self, x):
        i = self.index.pop(x, None)
        if i is not None:
            last = self.items.pop()
            if i < len(self.items):
                self.items[i] = last
                self.index[last] = i

    def pick(self, rng):
        return rng.choice(self.items) if self.items else None


class Client(threading.Thread):
    def __init__(self, cid, args, cluster, shared, deadline):
        super().__init__(name=f"client-{cid}", daemon=True)
        self.cid = cid
        self.args = args
        self.metas = list(cluster.meta_addrs)
        self.ports = {port: rank for rank, port in enumerate(cluster.local_ports)}
        self.cur = 0
        self.shared = shared
        self.deadline = deadline
        self.rng = random.Random(args.seed * 1000 + cid)
        self.conns = {}
        self.keys = {}  # key -> judge.Key
        self.pools = {"live": Pool(), "gone": Pool(), "unsure": Pool()}
        self.where = {}  # key -> its pool's name
        self.footprint = {}
        self.saved = []  # (when, Location, key, size): acknowledged puts' grants
        self.read_saved = []  # (when, Location, key): read grants that answered 200
        self.seq = 0
        self.error = None

    # -- requests --

    def conn(self, addr):
        if addr not in self.conns:
            self.conns[addr] = Conn(addr, timeout=30)
        return self.conns[addr]

    def exchange(self, addr, method, target, body=None, expect=False, headers=()):
        """One request on the keep-alive connection to `addr`. With `expect`, the body is sent
        only after 100 Continue; a redirect or another final answer comes instead of it. A
        connection that was reused and broke before any answer is retried once, fresh."""
        for attempt in (0, 1):
            c = self.conn(addr)
            reused = c.sock is not None
            try:
                if not expect:
                    return c.request(method, target, body, headers)
                s = c.open()
                hs = list(headers) + [("Expect", "100-continue")]
                s.sendall(Conn.head(method, target, len(body), hs))
                r = c.read_reply(interim=True)
                if r.status == 100:
                    s.sendall(body)
                    r = c.read_reply()
                return r
            except NET_ERRORS as e:
                c.close()
                if attempt == 0 and reused and isinstance(e, ConnectionError):
                    continue
                raise

    def to_meta(self, method, target, body=None, expect=False, headers=()):
        """A request to the leading meta. Asked again (for up to 15 s) where the meta did
        nothing with it: a refused connection, a standby's 307 to the leader, a 503 without a
        leader. Any other connection error is raised (the request may have been applied)."""
        deadline = time.monotonic() + 15
        while True:
            addr = self.metas[self.cur]
            try:
                r = self.exchange(addr, method, target, body, expect, headers)
            except ConnectionRefusedError:
                if len(self.metas) == 1 or time.monotonic() > deadline:
                    raise
                self.cur = (self.cur + 1) % len(self.metas)
                time.sleep(0.1)
                continue
            except NET_ERRORS:
                if len(self.metas) > 1:
                    self.cur = (self.cur + 1) % len(self.metas)
                raise
            if r.status == 307 and len(self.metas) > 1:
                to, _ = split_location(r.headers.get("location", ""))
                if to in self.metas:
                    self.cur = self.metas.index(to)
                    if time.monotonic() > deadline:
                        return r
                    continue
            msg = r.error_message() or ""
            if r.status == 503 and msg.startswith(NO_LEADER) and time.monotonic() < deadline:
                if len(self.metas) > 1:
                    self.cur = (self.cur + 1) % len(self.metas)
                time.sleep(0.2)
                continue
            return r

    def follow(self, method, target, body=None, expect=False, slow=False):
        """A request to the meta, following a 307 to the local service (once): (the answer,
        the Location followed or None)."""
        r = self.to_meta(method, target, body, expect)
        if r.status != 307:
            return r, None
        loc = r.headers["location"]
        addr, path = split_location(loc)
        if slow:
            time.sleep(self.rng.uniform(0.2, 2.0))
        return self.exchange(addr, method, path, body), loc

    def run(self):
        ops = [(self.put, 30), (self.get, 25), (self.delete, 8), (self.rewrite, 4),
               (self.reput, 3), (self.batch_get, 8), (self.batch_exist, 8),
               (self.replay, self.args.replay_weight), (self.retry_put, 4)]
        funcs, weights = [f for f, _ in ops], [w for _, w in ops]
        growing = (self.put, self.rewrite, self.reput, self.retry_put)
        try:
            while time.monotonic() < self.deadline and not self.shared.stop.is_set():
                op = self.rng.choices(funcs, weights)[0]
                if op in growing and self.shared.over_budget():
                    op = self.delete
                try:
                    op()
                except NET_ERRORS as e:
                    self.shared.count(f"{op.__name__}: connection error ({type(e).__name__})")
                    time.sleep(0.05)
        except Exception as e:  # a bug in the soak itself: report it
            self.error = repr(e)
            raise

    def rank_of(self, loc):
        """'rank R' of a Location on a local service (and its chain's next hop)."""
        if loc is None:
            return ""
        ranks = [f"rank {self.ports[int(p)]}" for p in re.findall(r"127\.0\.0\.1(?::|%3A)(\d+)", loc)
                 if int(p) in self.ports]
        return " then ".join(ranks)

    # -- the keys --

    def key(self, key):
        if key not in self.keys:
            self.keys[key] = Key()
        return self.keys[key]

    def settle(self, key):
        """Files the key under its state; its footprint counts against the budget."""
        k = self.keys[key]
        state = k.state()
        if self.where.get(key) != state:
            if key in self.where:
                self.pools[self.where[key]].discard(key)
            self.pools[state].add(key)
            self.where[key] = state
        f = k.footprint()
        self.shared.add_stored(f - self.footprint.get(key, 0))
        self.footprint[key] = f

    def pick(self, *weighted):
        """A key from the first pool of (name, weight) pairs chosen that has one."""
        names = [n for n, w in weighted if len(self.pools[n])]
        if not names:
            return None
        ws = [w for n, w in weighted if len(self.pools[n])]
        return self.pools[self.rng.choices(names, ws)[0]].pick(self.rng)

    # -- judging answers --

    def seen_value(self, what, key, body):
        """Bytes answered 200 for `key`."""
        verdict, detail = self.keys[key].judge_value(checksum(body))
        if verdict == OK:
            self.shared.count(f"{what}: ok")
        else:
            self.shared.fail(verdict, key, f"{what}: {detail}; the bytes are {judge.origin(body)}")

    def seen_present(self, what, key):
        verdict, detail = self.keys[key].judge_present()
        if verdict == OK:
            self.shared.count(f"{what}: exists")
        else:
            self.shared.fail(verdict, key, f"{what}: {detail}")

    def seen_absent(self, what, key, since):
        """The meta says `key` does not exist (asked at `since`)."""
        k = self.keys[key]
        verdict, put = k.judge_absent()
        if verdict == OK:
            self.shared.count(f"{what}: absent")
            return
        if self.shared.unsettled(since):
            self.shared.count(f"{what}: missing while a failover settles (not judged)")
            return
        lost = k.add(Op(LOST))
        lost.ack()
        self.settle(key)
        cause = self.shared.events.loss_cause(put.sent, put.replicas)
        if cause:
            with self.shared.lock:
                self.shared.lost_allowed[f"{cause}, replicas={put.replicas}"] += 1
            self.shared.count(f"{what}: lost ({cause}, replicas={put.replicas})")
        else:
            since = self.shared.events.describe_since(put.sent)
            self.shared.fail(
                LOSS_NOT_ALLOWED, key,
                f"{what}: version {put.version}, replicas={put.replicas}, put sent at "
                f"{wall(put.wall)} (to {put.where or '?'}) and acknowledged at "
                f"{wall(put.acked_wall)}; faults since: {since or 'none'}")

    # -- operations --

    def put(self):
        self.seq += 1
        self.put_version(f"cs-{self.cid}-{self.seq}")

    def new_put(self, key):
        """A new put of `key` in its history (not acknowledged yet): (the op, its bytes)."""
        k = self.key(key)
        version = 1 + sum(op.kind == PUT for op in k.ops)
        data = judge.payload(self.rng, key, version, self.rng.randrange(KIB, MIB + 1))
        op = k.add(Op(PUT, checksum(data), self.rng.choice([1, 1, 2]), version))
        self.settle(key)
        target = f"/api/v1/objects?key={quote(key)}&replicas={op.replicas}"
        if self.rng.random() < 0.8:
            target += f"&prefer_rank={self.rng.randrange(self.args.ranks)}"
        return op, data, target

    @staticmethod
    def acked_put(r, data):
        return r.status == 200 and r.error_message() is None and r.json().get("size") == len(data)

    def put_version(self, key):
        op, data, target = self.new_put(key)
        try:
            r, loc = self.follow("PUT", target, data, expect=self.rng.random() < 0.5)
        finally:
            self.settle(key)
        op.where = self.rank_of(loc)
        if self.acked_put(r, data):
            op.ack()
            self.settle(key)
            self.shared.count("put: acknowledged")
            if loc is not None and self.rng.random() < 0.3:
                self.saved.append((time.monotonic(), loc, key, len(data)))
        else:
            self.shared.count(f"put: {r.status} {r.error_message()}")

    def get(self):
        key = self.pick(("live", 75), ("gone", 15), ("unsure", 10))
        if key is not None:
            self.read_key("get", key, slow=self.rng.random() < 0.05)

    def read_key(self, what, key, slow=False, tries=3):
        """A GET through the meta (and its 307), judged; a refusal or a connection error on
        the local service is asked again. False when no try got an answer to judge."""
        for _ in range(tries):
            since = time.monotonic()
            try:
                r, loc = self.follow("GET", f"/api/v1/objects?key={quote(key)}", slow=slow)
            except NET_ERRORS as e:
                self.shared.count(f"{what}: connection error ({type(e).__name__}), retried")
                time.sleep(0.2)
                continue
            msg = r.error_message()
            if r.status == 200 and msg is None:
                self.seen_value(what, key, r.body)
                if loc is not None and self.rng.random() < 0.05:
                    self.read_saved.append((time.monotonic(), loc, key))
                return True
            if loc is None and msg == NOT_FOUND:
                self.seen_absent(what, key, since)
                return True
            # A local service's refusal (a stale grant, a rank being replaced): ask again.
            self.shared.count(f"{what}: {'local' if loc else 'meta'} answered {r.status} {msg}")
            time.sleep(0.2)
        return False

    def delete(self):
        key = self.pick(("live", 85), ("unsure", 15))
        if key is not None:
            self.delete_key(key)

    def delete_key(self, key):
        """A DELETE through the meta; whether it was acknowledged."""
        k = self.keys[key]
        op = k.add(Op(DELETE))
        self.settle(key)
        since = time.monotonic()
        try:
            r = self.to_meta("DELETE", f"/api/v1/objects?key={quote(key)}")
        finally:
            self.settle(key)
        msg = r.error_message()
        if r.status == 200 and msg is None:
            op.ack()
            self.settle(key)
            self.shared.count("delete: deleted")
            return True
        if r.status == 200 and msg == NOT_FOUND:
            # A read that found nothing; and a removal all the same: the meta keeps a
            # tombstone, so a copy on a rank that has not handed its catalog over yet (a new
            # leader) is refused when it does. Absent from now on.
            self.seen_absent("delete", key, since)
            op.ack()
            self.settle(key)
            return True
        else:
            # "The removal was applied but a local service holding a copy did not confirm
            # it" (503) among others: it may come back.
            self.shared.count(f"delete: {r.status} {msg}")
        return False

    def rewrite(self):
        """Delete a live key and put new bytes to it at once."""
        key = self.pick(("live", 1))
        if key is not None and self.delete_key(key):
            self.put_version(key)

    def reput(self):
        key = self.pick(("gone", 1))
        if key is not None:
            self.put_version(key)

    def some_keys(self):
        keys = [self.pick(("live", 1)) for _ in range(self.rng.randrange(1, 9))]
        keys += [self.pick(("gone", 1), ("unsure", 1)) for _ in range(self.rng.randrange(0, 3))]
        return [x for x in dict.fromkeys(keys) if x is not None]

    def batch_get(self):
        keys = self.some_keys()
        if not keys:
            return
        body = json.dumps({"keys": keys}).encode()
        since = time.monotonic()
        r = self.to_meta("POST", "/api/v1/objects/batch_get", body,
                         headers=[("Content-Type", "application/json")])
        msg = r.error_message()
        if r.status != 200 or msg is not None:
            self.shared.count(f"batch_get: {r.status} {msg}")
            return
        pos, b = 0, r.body
        for key in keys:
            if pos + 8 > len(b):
                self.shared.fail("malformed batch_get answer", key, "short frame")
                return
            n = int.from_bytes(b[pos:pos + 8], "big")
            pos += 8
            if n == (1 << 64) - 1:
                if self.keys[key].judge_absent()[0] != OK:
                    # The meta also answers a copy it could not fetch (its rank just died or
                    # left) as missing: a get says whether the key is gone.
                    self.shared.count("batch_get item: missing, checked with a get")
                    self.read_key("batch_get item (checked)", key)
                else:
                    self.seen_absent("batch_get item", key, since)
                continue
            self.seen_value("batch_get item", key, b[pos:pos + n])
            pos += n
        if pos != len(b):
            self.shared.fail("malformed batch_get answer", keys[-1], "trailing bytes")

    def batch_exist(self):
        keys = self.some_keys()
        if not keys:
            return
        since = time.monotonic()
        r = self.to_meta("GET", "/api/v1/objects/batch_exist?keys="
                         + ",".join(quote(x, safe="") for x in keys))
        msg = r.error_message()
        if r.status != 200 or msg is not None:
            self.shared.count(f"batch_exist: {r.status} {msg}")
            return
        for key, exists in zip(keys, r.json()["exists"]):
            if exists:
                self.seen_present("batch_exist", key)
            else:
                self.seen_absent("batch_exist", key, since)

    def replay(self):
        """A grant used before, sent again: a put's with other bytes (refused: 403), or a
        read's (a 200 must be bytes of that key)."""
        now = time.monotonic()
        ttl = self.args.grant_ttl_s
        self.saved = [s for s in self.saved if now - s[0] < ttl + 2]
        self.read_saved = [s for s in self.read_saved if now - s[0] < ttl + 2]
        if self.read_saved and self.rng.random() < 0.25:
            _, loc, key = self.read_saved.pop(self.rng.randrange(len(self.read_saved)))
            addr, target = split_location(loc)
            r = self.exchange(addr, "GET", target)
            if r.status == 200 and r.error_message() is None:
                ck = checksum(r.body)
                if not any(op.kind == PUT and op.ck == ck for op in self.keys[key].ops):
                    self.shared.fail(judge.CORRUPT, key, "a replayed read grant answered "
                                     f"bytes no put of this key sent: {judge.origin(r.body)}")
                else:
                    self.shared.count("read replay: 200, this key's bytes")
            else:
                self.shared.count(f"read replay: {r.status} {r.error_message()}")
            return
        if not self.saved:
            return
        _, loc, key, size = self.saved.pop(self.rng.randrange(len(self.saved)))
        how = self.rng.choice(["plain", "expect", "next"])
        addr, target = split_location(loc)
        if how == "next":
            m = re.search(r"[?&]next=([^&]+)", target)
            if m is None:
                how = "plain"
            else:
                addr, target = split_location(unquote(m.group(1)))
        data = f"REPLAY|{key}|{how}|".encode()
        data += self.rng.randbytes(size - len(data))
        try:
            r = self.exchange(addr, "PUT", target, data, expect=how == "expect")
        except NET_ERRORS as e:
            self.shared.count(f"replay ({how}): no answer ({type(e).__name__})")
            return
        msg = r.error_message()
        if r.status == 403:
            self.shared.count(f"replay ({how}): refused, {msg}")
        elif 200 <= r.status < 300:
            self.shared.fail(REPLAY_ACCEPTED, key, f"replay ({how}) of {loc}: {r.status} {msg}")
        else:
            self.shared.fail(REPLAY_NOT_REFUSED, key, f"replay ({how}) of {loc}: {r.status} {msg}")
        if self.keys[key].state() == "live":
            self.read_key("get after a replay", key)

    def retry_put(self):
        """A put whose answer is never read (the connection closed after its body), then
        retried through the meta or to the same Location, with the same bytes."""
        self.seq += 1
        key = f"cs-{self.cid}-{self.seq}"
        op, data, target = self.new_put(key)
        try:
            r = self.to_meta("PUT", target, data, expect=True)
            if r.status != 307:
                if self.acked_put(r, data):
                    op.ack()
                self.shared.count(f"retry: first answer {r.status} {r.error_message()}")
                return
            loc = r.headers["location"]
            op.where = self.rank_of(loc)
            addr, path = split_location(loc)
            c = Conn(addr, timeout=30)
            try:
                c.open().sendall(Conn.head("PUT", path, len(data)) + data)
            finally:
                c.close()
            time.sleep(self.rng.uniform(0, 0.3))
            if self.rng.random() < 0.5:
                r, _ = self.follow("PUT", target, data, expect=self.rng.random() < 0.5)
                how = "through the meta"
            else:
                r = self.exchange(addr, "PUT", path, data)
                how = "to the same Location"
            if self.acked_put(r, data):
                op.ack()
                self.shared.count(f"retry {how}: acknowledged")
            else:
                self.shared.count(f"retry {how}: {r.status} {r.error_message()}")
        finally:
            self.settle(key)

    def final_check(self):
        """After the chaos: every key read back once more (with a few retries)."""
        for key in list(self.keys):
            if not self.read_key("final", key, tries=5):
                self.shared.fail("unreadable at the end", key, "no answer after 5 tries")


class Chaos(threading.Thread):
    """Every few seconds one fault (see the module's docstring); after it, the rank restarted
    or resumed must serve within the heartbeat timeout + 1 s, and every segment must be listed
    OK again before the next one."""

    def __init__(self, args, cluster, shared):
        super().__init__(name="chaos", daemon=True)
        self.args = args
        self.cluster = cluster
        self.shared = shared
        self.rng = random.Random(args.seed * 7 + 1)
        self.stop_flag = threading.Event()
        self.actions = Counter()
        self.serve_times = []  # (fault, rank, seconds or None)
        self.failovers = []  # {fault, failover_s, ranks_ok_s}
        self.log = []
        self.error = None
        self.limit = args.heartbeat_timeout_ms / 1000 + 1.0

    def run(self):
        try:
            while not self.stop_flag.wait(self.rng.uniform(0.5, 1.5) * self.args.chaos_every):
                self.step()
        except Exception as e:  # a bug in the soak itself: report it
            self.error = repr(e)
            raise

    def note(self, text):
        self.log.append(f"{wall()} {text}")
        if self.args.verbose:
            print(f"chaos: {text}", flush=True)

    def fatal(self, what, who, detail):
        self.shared.fail(what, who, detail)
        self.stop_flag.set()
        self.shared.stop.set()

    def step(self):
        if self.args.sequence is not None:
            action = self.args.sequence.pop(0) if self.args.sequence else "none"
        else:
            weights = {k: v for k, v in FAULTS.items() if k in self.args.faults}
            action = self.rng.choices(list(weights), list(weights.values()))[0]
        self.actions[action] += 1
        if action == "none":
            return
        if action.startswith("leader-"):
            self.leader_fault(action)
        else:
            self.rank_fault(action, self.rng.randrange(len(self.cluster.locals)))
        if not self.stop_flag.is_set() and not self.cluster.wait_ready(30):
            self.fatal("ranks not listed OK within 30 s of a fault", action, "")

    def rank_fault(self, action, rank):
        p = self.cluster.locals[rank]
        timeout = self.args.heartbeat_timeout_ms / 1000
        self.shared.events.note(action, rank)
        p.note(action)
        if action in ("freeze-short", "freeze-long"):
            p.signal(signal.SIGSTOP)
            span = self.rng.uniform(*((0.1, 0.5) if action == "freeze-short" else (1.5, 3.0)))
            time.sleep(span * timeout)
            p.signal(signal.SIGCONT)
            resumed = time.monotonic()
            p.note("SIGCONT")
            self.note(f"{action} rank {rank}: SIGSTOP for {span * timeout:.2f} s")
            if action == "freeze-long":
                self.measure(action, rank, resumed)
            return
        if action == "kill":
            p.kill()
            self.note(f"kill -9 rank {rank}")
            # At once (the new process's join replaces the old membership), or before or
            # after the meta notices the loss.
            pause = 0 if self.rng.random() < 0.5 else self.rng.uniform(0.1, 2.0 * timeout)
            if pause == 0:
                self.actions["kill, restarted at once"] += 1
        else:
            t0 = time.monotonic()
            code = p.stop(signal.SIGTERM, 20)
            self.note(f"SIGTERM rank {rank}: exit {code} after {time.monotonic() - t0:.1f} s")
            if code != 0:
                self.shared.fail("SIGTERMed local service did not exit 0 within 20 s",
                                 f"rank {rank}", f"exit status {code}")
            pause = self.rng.uniform(0.1, 1.0)
        time.sleep(pause)
        restarted = time.monotonic()
        if not self.cluster.start_local(rank):
            self.fatal("restarted local service did not join", f"rank {rank}", p.log_path)
            return
        self.measure(action, rank, restarted)

    def measure(self, action, rank, since):
        served = self.cluster.serving(rank, since, self.limit)
        self.serve_times.append((action, rank, served))
        took = "never" if served is None else f"{served:.2f} s"
        self.note(f"rank {rank} serving again {took} after its {'resume' if action.startswith('freeze') else 'restart'}")
        if served is None or served > self.limit:
            self.shared.fail(SLOW_SERVING, f"rank {rank}",
                             f"after {action}: serving {took} after it (limit {self.limit:.1f} s)")

    def tier_moves_recent(self):
        """Whether the leader counted tier moves in the last second (a loss of their objects
        in a failover is documented)."""
        names = ("memcache_demoted_blobs_total", "memcache_flush_blobs_total",
                 "memcache_rewarm_total")
        before = self.cluster.counters(names)
        time.sleep(1.0)
        return self.cluster.counters(names) != before

    def leader_fault(self, action):
        c = self.cluster
        li = c.leader_index(10)
        if li is None:
            self.fatal("no serving leader before a leader fault", action, "")
            return
        moves = self.tier_moves_recent()
        old = c.metas[li]
        window = self.shared.open_window()
        try:
            self.leader_death(action, li, moves, window)
        finally:
            self.shared.close_window(window)

    def leader_death(self, action, li, moves, window):
        c = self.cluster
        old = c.metas[li]
        self.shared.events.note(action, None, moves)
        old.note(action)
        if action == "leader-kill":
            old.kill()
        else:
            old.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        self.note(f"{action} {old.name}{' (tier moves just before)' if moves else ''}")
        new = None
        while time.monotonic() < t0 + 15 and new is None:
            h = c.health(1 - li)
            if h and h.get("role") == "leader" and h.get("ha_state") == "serving":
                new = 1 - li
            else:
                time.sleep(0.05)
        failover = time.monotonic() - t0 if new is not None else None
        if action == "leader-freeze":
            # Frozen past its lease (the other leads by now), and a little longer.
            time.sleep(self.rng.uniform(0, 1.0))
            old.signal(signal.SIGCONT)
            old.note("SIGCONT")
        if new is None:
            self.fatal("no new leader within 15 s of the leader's death", action, "")
            return
        c.leader_index(1)
        self.note(f"{c.metas[new].name} leads {failover:.2f} s after it")
        if action == "leader-kill" and not c.start_meta(li):
            self.fatal("the killed meta did not start again", old.name, old.log_path)
            return
        if not c.standby_of(li, new, 10):
            self.fatal("a restarted or resumed meta is not a standby of the new leader within 10 s",
                       old.name, str(c.health(li)))
            return
        ready = c.wait_ready(30)
        self.shared.close_window(window)
        self.failovers.append({"fault": action, "failover_s": round(failover, 2),
                               "ranks_ok_s": round(time.monotonic() - t0, 2) if ready else None})


class Watch(threading.Thread):
    """Asks every running, unfrozen meta for /health every 100 ms: a meta that does not answer
    for more than half the heartbeat timeout is stalled (its local services' heartbeats go
    unanswered too, and past the timeout it declares live ranks lost). Stalls are reported;
    with --stall-dump the stalled meta's threads are dumped (gdb) into the logs."""

    def __init__(self, args, cluster, work):
        super().__init__(name="watch", daemon=True)
        self.args = args
        self.cluster = cluster
        self.work = work
        self.stop_flag = threading.Event()
        self.stalls = []  # [meta name, start (UTC), seconds]
        self.dumps = 0

    def run(self):
        since = {}
        limit = self.args.heartbeat_timeout_ms / 2000
        while not self.stop_flag.wait(0.1):
            for i, m in enumerate(self.cluster.metas):
                if not m.alive() or m.frozen:
                    since.pop(i, None)
                    continue
                t = time.monotonic()
                if self.cluster.health(i, timeout=0.5) is not None:
                    start = since.pop(i, None)
                    if start is not None and t - start[0] > limit:
                        self.stalls.append([m.name, wall(start[1]), round(t - start[0], 2)])
                    continue
                start = since.setdefault(i, (t, time.time(), False))
                if t - start[0] > limit and not start[2]:
                    since[i] = (start[0], start[1], True)
                    m.note(f"stalled: no /health answer for {t - start[0]:.1f} s")
                    if self.args.stall_dump and self.dumps < 3 and shutil.which("gdb"):
                        self.dumps += 1
                        self.dump(m)

    def dump(self, m):
        path = os.path.join(self.work, f"stall-{m.name.replace(' ', '-')}-{self.dumps}.txt")
        with open(path, "wb") as out:
            subprocess.run(["gdb", "-p", str(m.proc.pid), "-batch", "-ex",
                            "thread apply all bt"], stdout=out, stderr=subprocess.STDOUT,
                           timeout=60, check=False)
        m.note(f"threads dumped into {path}")


def leader_metrics(cluster):
    """A few of the leader's counters at the end (its own since it started leading)."""
    names = ["memcache_evict_deleted_objects_total", "memcache_demoted_blobs_total",
             "memcache_rereplicated_objects_total", "memcache_rereplicate_failed_total",
             "memcache_rereplicate_overflow_total", "memcache_stored_keys"]
    return {n[len("memcache_"):]: cluster.counters((n,)) for n in names}


def ranks_lost_in_logs(cluster):
    n = 0
    for m in cluster.metas:
        if os.path.exists(m.log_path):
            with open(m.log_path, "rb") as f:
                n += len(re.findall(rb"rank \d+ lost: no heartbeat", f.read()))
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.environ.get("MMC_SERVER", "target/release/mmc-server"))
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--clients", type=int, default=6, help="client threads (default 6)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    p.add_argument("--ranks", type=int, default=3, help="local services (default 3)")
    p.add_argument("--shards", type=int, default=1, help="shards per process (default 1)")
    p.add_argument("--dram-mb", type=int, default=128, help="DRAM per local service (128)")
    p.add_argument("--ssd-mb", type=int, default=256,
                   help="SSD segment per local service (256; 0: no SSD tier)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="live bytes times replicas to stay under (default: a quarter of the "
                        "DRAM of all ranks but one, so a drain always has room; above it, a "
                        "drain makes room by moving the other ranks' DRAM down to their SSD, "
                        "and what fits in neither is dropped: the verdict counts those losses "
                        "as failures, so keep the budget under the other ranks' DRAM plus SSD; "
                        "e.g. --dram-mb 16 --ssd-mb 256 --budget-mb 60)")
    p.add_argument("--chaos-every", type=float, default=3.0,
                   help="seconds between chaos actions, on average (default 3)")
    p.add_argument("--faults", default=None,
                   help="comma list of the faults to choose from (default: all of kill, term, "
                        "freeze-short, freeze-long, none, and with --ha leader-kill, "
                        "leader-freeze)")
    p.add_argument("--sequence", default=None,
                   help="comma list of faults injected in this order (then none), instead "
                        "of random ones")
    p.add_argument("--replay-weight", type=int, default=4,
                   help="weight of grant replays among the clients' operations (default 4)")
    p.add_argument("--ha", action="store_true",
                   help="two metas with HA on a real etcd (`etcd` on PATH), locals given both "
                        "URLs; the chaos also kills and freezes the leader")
    p.add_argument("--lease-ttl-ms", type=int, default=2000, help="HA lease TTL (default 2000)")
    p.add_argument("--heartbeat-ms", type=int, default=200)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1500)
    p.add_argument("--io-driver", default=None, help="passed to every server (default: theirs)")
    p.add_argument("--dir", default=None, help="directory for logs and SSD files (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the logs after a PASS")
    p.add_argument("--stall-dump", action="store_true",
                   help="dump a stalled meta's threads with gdb (up to 3 times) into the logs")
    p.add_argument("--verbose", action="store_true", help="print each chaos action")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra setting for the meta services")
    args = p.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    if args.ranks < 2:
        p.error("--ranks must be at least 2 (a drain needs another rank)")
    args.faults = set(args.faults.split(",")) if args.faults else set(FAULTS)
    if args.sequence is not None:
        args.sequence = [f for f in args.sequence.split(",") if f]
    for f in args.faults | set(args.sequence or ()):
        if f not in FAULTS:
            p.error(f"unknown fault {f!r} (known: {', '.join(FAULTS)})")
        if f in LEADER_FAULTS and not args.ha:
            if args.sequence and f in args.sequence:
                p.error(f"{f} needs --ha")
            args.faults.discard(f)
    if args.ha and shutil.which("etcd") is None:
        p.error("--ha needs etcd on PATH (apt-get install etcd-server)")
    args.grant_ttl_s = 10.0
    for kv in args.set:
        if kv.startswith("ock.mmc.cluster.grant_ttl_ms="):
            args.grant_ttl_s = int(kv.split("=", 1)[1]) / 1000
    budget = args.budget_mb * MIB if args.budget_mb else (args.ranks - 1) * args.dram_mb * MIB // 4

    work = tempfile.mkdtemp(prefix="mmc-cluster-soak-", dir=args.dir)
    print(f"cluster soak{' --ha' if args.ha else ''}: seed {args.seed}, {args.duration:.0f} s, "
          f"{args.clients} clients, {args.ranks} ranks of {args.dram_mb} MB DRAM"
          f"{f' + {args.ssd_mb} MB SSD' if args.ssd_mb else ''}, budget "
          f"{budget / MIB:.0f} MiB, logs in {work}", flush=True)
    cluster = Cluster(args, work)
    shared = Shared(budget)
    failures = []
    clients, chaos, watch = [], None, None
    metrics = {}
    started = time.monotonic()

    def on_signal(signum, _frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        deadline = time.monotonic() + args.duration
        clients = [Client(i, args, cluster, shared, deadline) for i in range(args.clients)]
        for c in clients:
            c.start()
        chaos = Chaos(args, cluster, shared)
        chaos.start()
        watch = Watch(args, cluster, work)
        watch.start()
        next_report = time.monotonic() + 10
        while any(c.is_alive() for c in clients) and any(m.alive() for m in cluster.metas):
            time.sleep(0.2)
            if time.monotonic() >= next_report:
                next_report += 10
                with shared.lock:
                    print(f"cluster soak: {max(0, deadline - time.monotonic()):4.0f} s left, "
                          f"{sum(shared.answers.values())} answers, "
                          f"{sum(chaos.actions.values())} faults, "
                          f"{shared.stored / MIB:.0f} MiB stored, {len(shared.failures)} failures",
                          flush=True)
        for c in clients:
            c.join(60)
        chaos.stop_flag.set()
        chaos.join(120)
        if chaos.is_alive():
            failures.append("the chaos thread did not finish its last action within 120 s")
        for m in cluster.metas:
            if not m.alive():
                failures.append(f"{m.name} died (exit status {m.proc.returncode})")
        for rank, lp in enumerate(cluster.locals):
            if not lp.alive():
                failures.append(f"rank {rank} died (exit status {lp.proc.returncode})")
                if not cluster.start_local(rank):
                    failures.append(f"rank {rank} could not be restarted for the final check")
        if any(m.alive() for m in cluster.metas):
            if not cluster.wait_ready(60):
                failures.append("the ranks were not all listed OK within 60 s of the load")
            else:
                checks = [threading.Thread(target=c.final_check, daemon=True) for c in clients]
                for t in checks:
                    t.start()
                for t in checks:
                    t.join(120)
                if any(t.is_alive() for t in checks):
                    failures.append("the final check did not end within 120 s")
            metrics = leader_metrics(cluster)
    finally:
        if chaos is not None:
            chaos.stop_flag.set()
        if watch is not None:
            watch.stop_flag.set()
            watch.join(5)
        shared.stop.set()
        for proc in cluster.procs():
            if proc.alive() and proc.frozen:
                proc.signal(signal.SIGCONT)
        # Stop: local services one by one (each drains to the others), then the metas, the
        # standby first.
        for rank, lp in enumerate(cluster.locals):
            if lp.alive():
                code = lp.stop(signal.SIGTERM, 20)
                if code != 0:
                    failures.append(f"rank {rank} exited {code} on the final SIGTERM (20 s)")
        li = cluster.leader if cluster.ha else 0
        for m in [m for i, m in enumerate(cluster.metas) if i != li] + [cluster.metas[li]]:
            if m.alive():
                code = m.stop(signal.SIGTERM, 30)
                if code != 0:
                    failures.append(f"{m.name} exited {code} on the final SIGTERM (30 s)")
        if cluster.etcd and cluster.etcd.alive():
            cluster.etcd.kill()
    for proc in cluster.metas + cluster.locals:
        if os.path.exists(proc.log_path) and proc.panicked():
            failures.append(f"{proc.name} panicked (see {proc.log_path})")

    with shared.lock:
        counts = {name: 0 for name in COUNTED.values()}
        for what, n in Counter(w for w, _, _ in shared.failures).items():
            if what in COUNTED:
                counts[COUNTED[what]] = n
            failures.append(f"{n} x {what}")
        if any(c.error for c in clients) or (chaos and chaos.error):
            failures.append("a soak thread failed: " + "; ".join(
                e for e in [c.error for c in clients] + [chaos and chaos.error] if e))

    print(f"\ncluster soak: {sum(shared.answers.values())} answers in "
          f"{time.monotonic() - started:.1f} s (seed {args.seed})")
    for k, n in sorted(shared.answers.items()):
        print(f"  {n:8}  {k}")
    if chaos is not None:
        print("chaos (UTC):")
        for line in chaos.log:
            print("  " + line)
    for what, key, detail in shared.failures[:30]:
        print(f"  FAIL {what}: {key}: {detail}")
    serve = [t for _, _, t in (chaos.serve_times if chaos else [])]
    timed = [t for t in serve if t is not None]
    replays = Counter()
    for k, n in shared.answers.items():
        if k.startswith("replay ("):
            replays["refused" if ": refused" in k else "no answer" if "no answer" in k
                    else "other"] += n
        elif k.startswith("read replay"):
            replays["read grants replayed"] += n
    states = Counter(c.where[k] for c in clients for k in c.keys)
    unjudged = sum(n for k, n in shared.answers.items() if "while a failover settles" in k)
    report = {
        "verdict": "FAIL" if failures else "PASS",
        "mode": "ha" if args.ha else "cluster",
        "seed": args.seed,
        "duration_s": args.duration,
        "wall_s": round(time.monotonic() - started, 1),
        "answers": sum(shared.answers.values()),
        "counts": counts,
        "chaos": dict(chaos.actions) if chaos else {},
        "restart_to_serving_s": {
            "limit": round(chaos.limit, 2) if chaos else None,
            "n": len(serve),
            "max": round(max(timed), 2) if timed else None,
            "median": round(statistics.median(timed), 2) if timed else None,
            "never": len(serve) - len(timed),
            "all": [[f, r, None if t is None else round(t, 2)]
                    for f, r, t in (chaos.serve_times if chaos else [])],
        },
        "failovers": chaos.failovers if chaos else [],
        "replays": dict(replays),
        "keys": dict(states),
        "lost_allowed": dict(shared.lost_allowed),
        "missing_while_a_failover_settled": unjudged,
        "ranks_declared_lost_in_logs": ranks_lost_in_logs(cluster),
        "meta_stalls": watch.stalls if watch else [],
        "metrics": metrics,
        "failures": failures,
        "logs": work,
    }
    print("\n" + json.dumps(report), flush=True)
    if failures:
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
