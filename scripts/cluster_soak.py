#!/usr/bin/env python3
"""Cluster chaos soak of mmc-server: a pure meta service and N local services (`--role
local`, fixed ranks and ports), client threads doing puts, gets, deletes, batch gets and batch
exists through the meta (following its 307s to the local services), while a chaos thread
kills (-9) or stops (SIGTERM, which drains a rank's objects to the others) one local service
at a time and restarts it on the same rank and port. See scripts/cluster_soak.sh.

Every key is owned by one client thread, so what it should hold is exact. Verdict:
- FAIL when a read answers 200 with bytes other than the acknowledged ones; when a key whose
  delete was acknowledged is read or listed as existing afterwards; when the meta service dies,
  any process panics, a SIGTERMed local service does not exit 0 within 20 s, a restarted one
  does not come back, or a process does not exit 0 on the final SIGTERM;
- FAIL when an acknowledged object is lost ("Key not found", or `exists: false`) although no
  kill -9 happened since its put was sent. The live data stays well under the memory of the
  ranks that remain during a drain, so a drain must lose nothing;
- an object may be lost (a clear "Key not found", never wrong bytes) when a kill -9 happened
  since its put was sent: those are counted and reported, by replica count;
- a put or delete whose answer never came or was an error may or may not have taken effect,
  but a key that exists then holds exactly the bytes sent; a connection error on a rank being
  killed is counted (a read is retried), not a failure.

At the end the chaos stops, every rank must be listed OK again, every key is read back, and
all processes are stopped with SIGTERM (locals one by one, then the meta) and must exit 0.
The last line is the verdict as JSON. Exit status 0 = PASS, 1 = FAIL.

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
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from urllib.parse import quote

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import cluster_ready  # noqa: E402  (tests/python/cluster_ready.py)
from soak import Conn, checksum, free_port  # noqa: E402  (scripts/soak.py)

KIB, MIB = 1 << 10, 1 << 20
NOT_FOUND = "Key not found"
NET_ERRORS = (OSError, ConnectionError, ValueError)


class Proc:
    """One server process (restartable on the same command line), its stderr in a log file."""

    def __init__(self, name, cmd, log_path):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.proc = None
        self.starts = 0

    def start(self, want, timeout=30.0):
        """Starts it and waits for the log line matching `want` (a regex) from this start on;
        answers the match, or None (the process is then killed)."""
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        log.write(f"---- soak: start {self.starts + 1}: {' '.join(self.cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        self.starts += 1
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

    def stop(self, sig, timeout):
        """Sends `sig` and waits: the exit status, or None when it did not exit in time (it is
        then killed)."""
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


class Cluster:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        beat = [
            "--set", f"ock.mmc.cluster.heartbeat_interval_ms={args.heartbeat_ms}",
            "--set", f"ock.mmc.cluster.heartbeat_timeout_ms={args.heartbeat_timeout_ms}",
        ]
        common = ["--shards", str(args.shards)]
        if args.io_driver:
            common += ["--io-driver", args.io_driver]
        self.meta = Proc(
            "meta",
            [args.server, "--listen", "127.0.0.1:0", *common,
             "--set", "ock.mmc.embedded.ranks=0", *beat, *sum((["--set", kv] for kv in args.set), [])],
            os.path.join(work, "meta.log"),
        )
        self.meta_addr = None
        self.locals = []
        self.segments_per_rank = 1 + (args.ssd_mb > 0)
        for rank in range(args.ranks):
            port = free_port()
            cmd = [
                args.server, "--role", "local", "--listen", f"127.0.0.1:{port}", *common,
                "--set", f"ock.mmc.local_service.rank={rank}",
                "--set", f"ock.mmc.local_service.dram.size={args.dram_mb}MB",
                "--set", "ock.mmc.local_service.hbm.size=0", *beat,
            ]
            if args.ssd_mb > 0:
                ssd = os.path.join(work, f"ssd-{rank}")
                os.mkdir(ssd)
                cmd += ["--set", "ock.mmc.ssd.enable=true", "--set", f"ock.mmc.ssd.path={ssd}",
                        "--set", f"ock.mmc.ssd.size={args.ssd_mb}MB"]
            self.locals.append(Proc(f"rank {rank}", cmd, os.path.join(work, f"local-{rank}.log")))
        self.conn_lock = threading.Lock()
        self.conn = None

    def start(self):
        m = self.meta.start(r"listening on http://(\S+)")
        if m is None:
            raise SystemExit("the meta service did not start; log " + self.meta.log_path)
        host, port = m.group(1).rsplit(":", 1)
        self.meta_addr = (host, int(port))
        self.conn = Conn(self.meta_addr, timeout=10)
        url = "http://%s:%d" % self.meta_addr
        for p in self.locals:
            p.cmd += ["--set", f"ock.mmc.meta_service_url={url}"]
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

    def get(self, path):
        with self.conn_lock:
            try:
                return self.conn.request("GET", path).body
            except NET_ERRORS:
                self.conn.close()
                return b""

    def wait_ready(self, timeout):
        want = len(self.locals) * self.segments_per_rank
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cluster_ready.ready_count(self.get) == want:
                return True
            if not self.meta.alive():
                return False
            time.sleep(0.1)
        return False


class Shared:
    """What the threads share: counters, failures, the kill -9 count, the stored bytes."""

    def __init__(self, budget):
        self.lock = threading.Lock()
        self.kills = 0
        self.answers = Counter()
        self.failures = []  # (what, key, detail)
        self.stored = 0  # acknowledged bytes times replicas
        self.budget = budget

    def count(self, what):
        what = re.sub(r"\d+", "N", str(what))
        with self.lock:
            self.answers[what] += 1

    def fail(self, what, key, detail):
        detail = f"{detail} (at {time.strftime('%H:%M:%S')})"
        with self.lock:
            self.failures.append((what, key, detail))
            self.answers["FAIL: " + what] += 1

    def add_stored(self, n):
        with self.lock:
            self.stored += n

    def over_budget(self):
        with self.lock:
            return self.stored > self.budget


class Keys:
    """One client's keys (only that client's thread touches them)."""

    def __init__(self):
        self.acked = {}  # key -> (len, crc, kills when the put was sent, replicas)
        self.deleted = set()  # an acknowledged delete: must never be readable again
        self.maybe = {}  # key -> (len, crc): unanswered or failed put/delete; absent or these bytes
        self.lost = {}  # key -> (len, crc, replicas): lost after a kill -9 (allowed)


class Client(threading.Thread):
    def __init__(self, cid, args, cluster, shared, deadline):
        super().__init__(name=f"client-{cid}", daemon=True)
        self.cid = cid
        self.args = args
        self.meta = cluster.meta_addr
        self.shared = shared
        self.deadline = deadline
        self.rng = random.Random(args.seed * 1000 + cid)
        self.conns = {}
        self.keys = Keys()
        self.seq = 0
        self.error = None

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

    def follow(self, method, target, body=None, expect=False, slow=False):
        """A request to the meta, following a 307 to the local service (once)."""
        r = self.exchange(self.meta, method, target, body, expect)
        if r.status != 307:
            return r, False
        loc = r.headers["location"]
        m = re.match(r"https?://([^/:]+):(\d+)(/.*)$", loc)
        if slow:
            time.sleep(self.rng.uniform(0.2, 2.0))
        return self.exchange((m.group(1), int(m.group(2))), method, m.group(3), body), True

    def kills(self):
        with self.shared.lock:
            return self.shared.kills

    def run(self):
        ops = [(self.put, 40), (self.get, 30), (self.delete, 10), (self.batch_get, 10),
               (self.batch_exist, 10)]
        funcs, weights = [f for f, _ in ops], [w for _, w in ops]
        try:
            while time.monotonic() < self.deadline:
                op = self.rng.choices(funcs, weights)[0]
                if op == self.put and self.shared.over_budget():
                    op = self.delete
                try:
                    op()
                except NET_ERRORS as e:
                    self.shared.count(f"{op.__name__}: connection error ({type(e).__name__})")
                    time.sleep(0.05)
        except Exception as e:  # a bug in the soak itself: report it
            self.error = repr(e)
            raise

    # -- judging answers --

    def read_bytes(self, what, key, body):
        """Bytes answered 200 for `key`: they must be the acknowledged ones."""
        k = self.keys
        got = checksum(body)
        if key in k.deleted:
            self.shared.fail("deleted key readable", key, f"{what}: {len(body)} bytes")
        elif key in k.acked:
            if got != k.acked[key][:2]:
                self.shared.fail("wrong bytes", key, f"{what}: expected {k.acked[key][:2]}, got {got}")
            else:
                self.shared.count(f"{what}: ok")
        elif key in k.maybe or key in k.lost:
            exp = (k.maybe.get(key) or k.lost[key])[:2]
            if got != exp:
                self.shared.fail("wrong bytes", key, f"{what}: expected {exp}, got {got}")
            elif key in k.lost:
                # The meta said it did not exist; nobody put it again.
                self.shared.fail("a key answered missing was readable later", key, what)
            else:
                self.shared.count(f"{what}: ok (unanswered put or delete)")

    def missing(self, what, key):
        """The meta says `key` does not exist."""
        k = self.keys
        if key not in k.acked:
            self.shared.count(f"{what}: absent")
            return
        size, crc, sent_at, replicas = k.acked.pop(key)
        self.shared.add_stored(-size * replicas)
        if self.kills() > sent_at:
            k.lost[key] = (size, crc, replicas)
            self.shared.count(f"{what}: lost after a kill -9 (replicas={replicas})")
        else:
            self.shared.fail("lost without a kill -9", key, f"{what}: replicas={replicas}")

    def pick(self, pool):
        return self.rng.choice(list(pool)) if pool else None

    # -- operations --

    def put(self):
        self.seq += 1
        key = f"cs-{self.cid}-{self.seq}"
        data = self.rng.randbytes(self.rng.randrange(KIB, MIB + 1))
        replicas = self.rng.choice([1, 1, 2])
        target = f"/api/v1/objects?key={key}&replicas={replicas}"
        if self.rng.random() < 0.8:
            target += f"&prefer_rank={self.rng.randrange(self.args.ranks)}"
        sent_at = self.kills()
        self.keys.maybe[key] = checksum(data)
        r, _ = self.follow("PUT", target, data, expect=self.rng.random() < 0.5)
        msg = r.error_message()
        if r.status == 200 and msg is None and r.json().get("size") == len(data):
            del self.keys.maybe[key]
            self.keys.acked[key] = checksum(data) + (sent_at, replicas)
            self.shared.add_stored(len(data) * replicas)
            self.shared.count("put: acknowledged")
        else:
            self.shared.count(f"put: {r.status} {msg}")

    def get(self):
        k = self.keys
        if k.deleted and self.rng.random() < 0.15:
            key = self.pick(k.deleted)
        else:
            key = self.pick(k.acked)
        if key is None:
            return
        self.read_key("get", key, slow=self.rng.random() < 0.05)

    def read_key(self, what, key, slow=False, tries=3):
        """A GET through the meta (and its 307), judged; a refusal or a connection error on
        the local service is asked again. False when no try got an answer to judge."""
        for _ in range(tries):
            try:
                r, redirected = self.follow("GET", f"/api/v1/objects?key={quote(key)}", slow=slow)
            except NET_ERRORS as e:
                self.shared.count(f"{what}: connection error ({type(e).__name__}), retried")
                time.sleep(0.2)
                continue
            msg = r.error_message()
            if r.status == 200 and msg is None:
                self.read_bytes(what, key, r.body)
                return True
            if not redirected and msg == NOT_FOUND:
                self.missing(what, key)
                return True
            # A local service's refusal (a stale grant, a rank being replaced): ask again.
            self.shared.count(f"{what}: {'local' if redirected else 'meta'} answered {r.status} {msg}")
            time.sleep(0.2)
        return False

    def delete(self):
        key = self.pick(self.keys.acked)
        if key is None:
            return
        size, crc, _, replicas = self.keys.acked[key]
        try:
            r = self.exchange(self.meta, "DELETE", f"/api/v1/objects?key={quote(key)}")
        except NET_ERRORS:
            # Deleted or not: absent, or these bytes.
            del self.keys.acked[key]
            self.shared.add_stored(-size * replicas)
            self.keys.maybe[key] = (size, crc)
            raise
        msg = r.error_message()
        if r.status == 200 and msg is None:
            del self.keys.acked[key]
            self.shared.add_stored(-size * replicas)
            self.keys.deleted.add(key)
            self.shared.count("delete: deleted")
        elif msg == NOT_FOUND:
            self.missing("delete", key)
        else:
            self.shared.count(f"delete: {r.status} {msg}")

    def some_keys(self):
        k = self.keys
        keys = [self.pick(k.acked) for _ in range(self.rng.randrange(1, 9))]
        keys += [self.pick(k.deleted) for _ in range(self.rng.randrange(0, 3))]
        return [x for x in dict.fromkeys(keys) if x is not None]

    def batch_get(self):
        keys = self.some_keys()
        if not keys:
            return
        body = json.dumps({"keys": keys}).encode()
        r = self.exchange(self.meta, "POST", "/api/v1/objects/batch_get", body,
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
                if key in self.keys.acked:
                    # The meta also answers a copy it could not fetch (its rank just died or
                    # left) as missing: a get says whether the key is gone.
                    self.shared.count("batch_get item: missing, checked with a get")
                    self.read_key("batch_get item (checked)", key)
                else:
                    self.missing("batch_get item", key)
                continue
            self.read_bytes("batch_get item", key, b[pos:pos + n])
            pos += n
        if pos != len(b):
            self.shared.fail("malformed batch_get answer", keys[-1], "trailing bytes")

    def batch_exist(self):
        keys = self.some_keys()
        if not keys:
            return
        r = self.exchange(self.meta, "GET", "/api/v1/objects/batch_exist?keys="
                          + ",".join(quote(x, safe="") for x in keys))
        msg = r.error_message()
        if r.status != 200 or msg is not None:
            self.shared.count(f"batch_exist: {r.status} {msg}")
            return
        for key, exists in zip(keys, r.json()["exists"]):
            if exists and key in self.keys.deleted:
                self.shared.fail("deleted key exists", key, "batch_exist")
            elif not exists:
                self.missing("batch_exist", key)
            else:
                self.shared.count("batch_exist: exists")

    def final_check(self):
        """After the chaos: every key read back once more (with a few retries)."""
        k = self.keys
        for key in list(k.acked) + list(k.deleted) + list(k.maybe) + list(k.lost):
            if not self.read_key("final", key, tries=5):
                self.shared.fail("unreadable at the end", key, "no answer after 5 tries")


class Chaos(threading.Thread):
    """Every few seconds: kill -9 a random local service, SIGTERM one, or nothing; the rank
    is restarted (same rank, same port) after a pause and must be listed OK again."""

    def __init__(self, args, cluster, shared):
        super().__init__(name="chaos", daemon=True)
        self.args = args
        self.cluster = cluster
        self.shared = shared
        self.rng = random.Random(args.seed * 7 + 1)
        self.stop_flag = threading.Event()
        self.actions = Counter()
        self.log = []
        self.error = None

    def run(self):
        try:
            while not self.stop_flag.wait(self.rng.uniform(0.5, 1.5) * self.args.chaos_every):
                self.step()
        except Exception as e:  # a bug in the soak itself: report it
            self.error = repr(e)
            raise

    def note(self, text):
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")
        if self.args.verbose:
            print(f"chaos: {text}", flush=True)

    def step(self):
        action = self.rng.choices(["kill", "term", "none"], [4, 4, 2])[0]
        self.actions[action] += 1
        if action == "none":
            return
        rank = self.rng.randrange(len(self.cluster.locals))
        p = self.cluster.locals[rank]
        if action == "kill":
            with self.shared.lock:
                self.shared.kills += 1
                p.proc.kill()
            p.proc.wait()
            self.note(f"kill -9 rank {rank}")
        else:
            t0 = time.monotonic()
            code = p.stop(signal.SIGTERM, 20)
            self.note(f"SIGTERM rank {rank}: exit {code} after {time.monotonic() - t0:.1f} s")
            if code != 0:
                self.shared.fail("SIGTERMed local service did not exit 0 within 20 s",
                                 f"rank {rank}", f"exit status {code}")
        # Sometimes back before the meta notices the loss (heartbeat timeout), sometimes after.
        time.sleep(self.rng.uniform(0.1, 2.0 * self.args.heartbeat_timeout_ms / 1000))
        if not self.cluster.start_local(rank):
            self.shared.fail("restarted local service did not join", f"rank {rank}", p.log_path)
            self.stop_flag.set()
            return
        if not self.cluster.wait_ready(30):
            self.shared.fail("ranks not listed OK within 30 s of a restart", f"rank {rank}", "")
            self.stop_flag.set()
            return
        self.note(f"rank {rank} back and OK")


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
    p.add_argument("--heartbeat-ms", type=int, default=200)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1500)
    p.add_argument("--io-driver", default=None, help="passed to every server (default: theirs)")
    p.add_argument("--dir", default=None, help="directory for logs and SSD files (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the logs after a PASS")
    p.add_argument("--verbose", action="store_true", help="print each chaos action")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra setting for the meta service")
    args = p.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    if args.ranks < 2:
        p.error("--ranks must be at least 2 (a drain needs another rank)")
    budget = args.budget_mb * MIB if args.budget_mb else (args.ranks - 1) * args.dram_mb * MIB // 4

    work = tempfile.mkdtemp(prefix="mmc-cluster-soak-", dir=args.dir)
    print(f"cluster soak: seed {args.seed}, {args.duration:.0f} s, {args.clients} clients, "
          f"{args.ranks} ranks of {args.dram_mb} MB DRAM"
          f"{f' + {args.ssd_mb} MB SSD' if args.ssd_mb else ''}, budget "
          f"{budget / MIB:.0f} MiB, logs in {work}", flush=True)
    cluster = Cluster(args, work)
    shared = Shared(budget)
    failures = []
    clients, chaos = [], None
    started = time.monotonic()
    try:
        cluster.start()
        deadline = time.monotonic() + args.duration
        clients = [Client(i, args, cluster, shared, deadline) for i in range(args.clients)]
        for c in clients:
            c.start()
        chaos = Chaos(args, cluster, shared)
        chaos.start()
        next_report = time.monotonic() + 10
        while any(c.is_alive() for c in clients) and cluster.meta.alive():
            time.sleep(0.2)
            if time.monotonic() >= next_report:
                next_report += 10
                with shared.lock:
                    print(f"cluster soak: {max(0, deadline - time.monotonic()):4.0f} s left, "
                          f"{sum(shared.answers.values())} answers, {shared.kills} kills, "
                          f"{shared.stored / MIB:.0f} MiB stored, {len(shared.failures)} failures",
                          flush=True)
        for c in clients:
            c.join(60)
        chaos.stop_flag.set()
        chaos.join(90)
        if chaos.is_alive():
            failures.append("the chaos thread did not finish its last action within 90 s")
        if not cluster.meta.alive():
            failures.append(f"the meta service died (exit status {cluster.meta.proc.returncode})")
        else:
            for rank, lp in enumerate(cluster.locals):
                if not lp.alive() and not cluster.start_local(rank):
                    failures.append(f"rank {rank} could not be restarted for the final check")
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
    finally:
        if chaos is not None:
            chaos.stop_flag.set()
        # Stop: local services one by one (each drains to the others), then the meta.
        for rank, lp in enumerate(cluster.locals):
            if lp.alive():
                code = lp.stop(signal.SIGTERM, 20)
                if code != 0:
                    failures.append(f"rank {rank} exited {code} on the final SIGTERM (20 s)")
        if cluster.meta.alive():
            code = cluster.meta.stop(signal.SIGTERM, 30)
            if code != 0:
                failures.append(f"the meta service exited {code} on the final SIGTERM (30 s)")
    for proc in [cluster.meta] + cluster.locals:
        if os.path.exists(proc.log_path) and proc.panicked():
            failures.append(f"{proc.name} panicked (see {proc.log_path})")

    with shared.lock:
        for what, n in Counter(w for w, _, _ in shared.failures).items():
            failures.append(f"{n} x {what}")
        if any(c.error for c in clients) or (chaos and chaos.error):
            failures.append("a soak thread failed: " + "; ".join(
                e for e in [c.error for c in clients] + [chaos and chaos.error] if e))
    lost = Counter()
    for c in clients:
        for _, _, replicas in c.keys.lost.values():
            lost[f"replicas={replicas}"] += 1

    print(f"\ncluster soak: {sum(shared.answers.values())} answers in {time.monotonic() - started:.1f} s "
          f"(seed {args.seed})")
    for k, n in sorted(shared.answers.items()):
        print(f"  {n:8}  {k}")
    if chaos is not None:
        print("chaos:")
        for line in chaos.log:
            print("  " + line)
    for what, key, detail in shared.failures[:20]:
        print(f"  FAIL {what}: {key}: {detail}")
    report = {
        "verdict": "FAIL" if failures else "PASS",
        "seed": args.seed,
        "duration_s": args.duration,
        "wall_s": round(time.monotonic() - started, 1),
        "answers": sum(shared.answers.values()),
        "kills": shared.kills,
        "chaos": dict(chaos.actions) if chaos else {},
        "live_keys": sum(len(c.keys.acked) for c in clients),
        "deleted_keys": sum(len(c.keys.deleted) for c in clients),
        "lost_after_kill": dict(lost),
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
