#!/usr/bin/env python3
"""Soak test of mmc-server: many clients, random sizes, random faults; every acknowledged
object is verified by checksum at the end. Not run in CI (see scripts/soak.sh).

The server runs with a small HBM and DRAM tier and an SSD tier, so objects keep moving
between tiers. Clients put objects of random sizes (buffered and streamed puts, batch puts),
read them back, delete some, read batches through the POST form, trickle bodies slowly, and
drop connections in the middle of a body. One random SSD fault is injected through the
server's fault hooks (`MMC_FAULT_SSD_WRITE` / `MMC_FAULT_SSD_READ` = `eio|enospc@N`: every
SSD write or read from the N-th on fails).

The live data is kept under half the SSD tier, so without injected faults nothing may be
lost. Verdict, after the run:
- FAIL when an object is answered 200 with bytes other than the acknowledged ones (during
  the run or at the end), when a key whose put was abandoned mid-body or that was deleted is
  readable, when the server dies, panics or does not stop cleanly on SIGTERM, or when an
  acknowledged object is lost or unreadable although no fault was injected;
- a put whose whole body was sent but whose answer never came (the connection broke) may or
  may not be stored, but if it is, with exactly its bytes;
- with injected faults, lost or unreadable objects are reported (a clear error, never wrong
  bytes), not failed.

Timeouts can be tightened with `--set`, e.g. `--set ock.mmc.store.alloc_timeout_ms=3000
--set ock.mmc.http.header_timeout_ms=1000`, so that trickled uploads (up to `--slow-max-s`)
outlive an allocation's timeout, as in issue 10.

Standard library only. Run `scripts/soak.sh --help` for the options.
"""

import argparse
import json
import os
import re
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from urllib.parse import quote

MIB = 1 << 20
NOT_FOUND = "Key not found"


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def is_json(self):
        return self.headers.get("content-type", "").startswith("application/json")

    def json(self):
        return json.loads(self.body)

    def error_message(self):
        """The envelope's message when this is an error envelope, else None."""
        if not self.is_json():
            return None
        try:
            v = self.json()
        except ValueError:
            return "unparsable JSON"
        if isinstance(v, dict) and v.get("success") is False:
            return v.get("error_message", "?")
        return None


class Conn:
    """A keep-alive HTTP/1.1 connection that sees the bytes on the wire."""

    def __init__(self, addr, timeout=30.0):
        self.addr = addr
        self.timeout = timeout
        self.sock = None
        self.buf = b""

    def open(self):
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        return self.sock

    def close(self, reset=False):
        if self.sock is not None:
            if reset:
                # SO_LINGER 0: the close sends RST instead of FIN.
                self.sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self.buf = b""

    @staticmethod
    def head(method, target, length=None, headers=()):
        lines = [f"{method} {target} HTTP/1.1", "Host: soak"]
        lines += [f"{k}: {v}" for k, v in headers]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def request(self, method, target, body=None, headers=()):
        s = self.open()
        try:
            data = self.head(method, target, None if body is None else len(body), headers)
            s.sendall(data + (body or b""))
            return self.read_reply(method == "HEAD")
        except (OSError, ValueError):
            self.close()
            raise

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed by the server")
        self.buf += chunk

    def read_reply(self, head_only=False, interim=False):
        """The next reply; a 100 Continue is skipped unless `interim` (then it is answered)."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n\r\n") + 4
        lines = self.buf[: end - 4].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status == 100:
            self.buf = self.buf[end:]
            if interim:
                return Reply(status, headers, b"")
            return self.read_reply(head_only)
        length = 0 if head_only else int(headers.get("content-length", "0"))
        while len(self.buf) < end + length:
            self._fill()
        body = self.buf[end : end + length]
        self.buf = self.buf[end + length :]
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, headers, body)


def checksum(data):
    return (len(data), zlib.crc32(data))


class Ledger:
    """What the clients know about the server's contents (shared, locked)."""

    def __init__(self, budget_bytes):
        self.lock = threading.Lock()
        self.acked = {}  # key -> (len, crc)
        self.deleted = set()
        # Puts whose body did not arrive whole: the key must not exist.
        self.abandoned = set()
        # Puts sent whole but not answered (the connection broke): the key may exist, but then
        # with exactly these bytes.
        self.unanswered = {}
        self.live_bytes = 0
        self.budget_bytes = budget_bytes
        self.ops = Counter()
        self.answers = Counter()
        self.corrupt = []  # (key, when, expected, got)

    def ack(self, key, data):
        with self.lock:
            self.acked[key] = checksum(data)
            self.live_bytes += len(data)

    def forget(self, key):
        with self.lock:
            if key in self.acked:
                self.live_bytes -= self.acked.pop(key)[0]
                self.deleted.add(key)

    def pick(self, rng):
        with self.lock:
            if not self.acked:
                return None
            # Sampling a dict needs a sequence; a bounded random probe is cheaper than a copy.
            keys = list(self.acked.keys()) if len(self.acked) < 2048 else None
        if keys is not None:
            return rng.choice(keys)
        with self.lock:
            it = iter(self.acked)
            for _ in range(rng.randrange(min(len(self.acked), 2048))):
                next(it)
            return next(it, None)

    def expected(self, key):
        with self.lock:
            return self.acked.get(key)

    def over_budget(self):
        with self.lock:
            return self.live_bytes > self.budget_bytes

    def count(self, op, outcome):
        # Sizes and counts in messages would make every answer distinct.
        outcome = re.sub(r"\d+", "N", str(outcome))
        with self.lock:
            self.ops[op] += 1
            self.answers[f"{op}: {outcome}"] += 1

    def corruption(self, key, when, expected, got):
        with self.lock:
            self.corrupt.append((key, when, expected, got))


class Client(threading.Thread):
    def __init__(self, cid, args, addr, ledger, deadline, slow_slots):
        super().__init__(name=f"client-{cid}", daemon=True)
        self.cid = cid
        self.args = args
        self.addr = addr
        self.ledger = ledger
        self.deadline = deadline
        self.slow_slots = slow_slots
        self.rng = random.Random(args.seed * 1000 + cid)
        self.conn = Conn(addr)
        self.seq = 0
        self.error = None

    def new_key(self):
        self.seq += 1
        return f"soak-{self.cid}-{self.seq}"

    def size(self):
        r = self.rng.random()
        if r < 0.55:
            n = self.rng.randrange(0, 64 << 10)
        elif r < 0.9:
            n = self.rng.randrange(64 << 10, 1 * MIB)
        else:
            n = self.rng.randrange(1 * MIB, 4 * MIB)
        return min(n, self.args.max_size)

    def run(self):
        ops = [
            (self.put, 40),
            (self.get_verify, 25),
            (self.delete, 5),
            (self.batch_put, 5),
            (self.batch_get, 5),
            (self.slow_put, 4),
            (self.abandon_put, 8),
        ]
        funcs = [f for f, _ in ops]
        weights = [w for _, w in ops]
        try:
            while time.monotonic() < self.deadline:
                op = self.rng.choices(funcs, weights)[0]
                if self.ledger.over_budget():
                    op = self.delete
                try:
                    op()
                except (OSError, ConnectionError, ValueError) as e:
                    self.ledger.count(op.__name__, f"connection error ({type(e).__name__})")
                    self.conn.close()
                    time.sleep(0.05)
        except Exception as e:  # a bug in the soak itself: report it
            self.error = repr(e)
            raise

    def record_put(self, op, key, data, reply):
        msg = reply.error_message()
        if reply.status == 200 and msg is None:
            v = reply.json()
            if v.get("success") is True and v.get("size") == len(data):
                self.ledger.ack(key, data)
                self.ledger.count(op, "acknowledged")
                return
            self.ledger.count(op, f"unexpected answer {reply.body[:80]!r}")
            return
        self.ledger.count(op, f"{reply.status} {msg}")

    def unanswered(self, key, data):
        with self.ledger.lock:
            self.ledger.unanswered[key] = checksum(data)

    def put(self):
        key = self.new_key()
        data = self.rng.randbytes(self.size())
        medium = self.rng.choice(["", "", "&medium=dram", "&medium=hbm"])
        try:
            reply = self.conn.request("PUT", f"/api/v1/objects?key={key}{medium}", data)
        except (OSError, ConnectionError, ValueError):
            self.unanswered(key, data)
            raise
        self.record_put("put", key, data, reply)

    def check_read(self, op, key, reply_status, body, is_bytes, msg):
        """Compares a read with the ledger: wrong bytes are corruption."""
        expected = self.ledger.expected(key)
        if expected is None:
            return  # deleted meanwhile by this client
        if is_bytes:
            got = checksum(body)
            if got != expected:
                self.ledger.corruption(key, op, expected, got)
                self.ledger.count(op, "CORRUPT")
            else:
                self.ledger.count(op, "ok")
        else:
            self.ledger.count(op, f"{reply_status} {msg}")

    def get_verify(self):
        key = self.ledger.pick(self.rng)
        if key is None:
            return
        reply = self.conn.request("GET", f"/api/v1/objects?key={quote(key)}")
        msg = reply.error_message()
        is_bytes = reply.status == 200 and msg is None
        self.check_read("get", key, reply.status, reply.body, is_bytes, msg)

    def delete(self):
        key = self.ledger.pick(self.rng)
        if key is None:
            return
        reply = self.conn.request("DELETE", f"/api/v1/objects?key={quote(key)}")
        msg = reply.error_message()
        if reply.status == 200 and msg is None:
            self.ledger.forget(key)
            self.ledger.count("delete", "deleted")
        else:
            # A key lost before its delete stays in the ledger: the final check judges it.
            self.ledger.count("delete", f"{reply.status} {msg}")

    def batch_put(self):
        keys = [self.new_key() for _ in range(self.rng.randrange(1, 9))]
        datas = [self.rng.randbytes(self.rng.randrange(0, 128 << 10)) for _ in keys]
        target = "/api/v1/objects/batch_put?keys={}&sizes={}".format(
            ",".join(keys), ",".join(str(len(d)) for d in datas)
        )
        try:
            reply = self.conn.request("POST", target, b"".join(datas))
        except (OSError, ConnectionError, ValueError):
            for key, data in zip(keys, datas):
                self.unanswered(key, data)
            raise
        msg = reply.error_message()
        if reply.status != 200 or msg is not None:
            self.ledger.count("batch_put", f"{reply.status} {msg}")
            return
        for key, data, res in zip(keys, datas, reply.json()["results"]):
            if res.get("success") is True:
                self.ledger.ack(key, data)
                self.ledger.count("batch_put item", "acknowledged")
            else:
                self.ledger.count("batch_put item", res.get("error_message"))

    def batch_get(self):
        keys = [self.ledger.pick(self.rng) for _ in range(self.rng.randrange(1, 17))]
        keys = [k for k in dict.fromkeys(keys) if k is not None]
        if not keys:
            return
        body = json.dumps({"keys": keys}).encode()
        reply = self.conn.request(
            "POST",
            "/api/v1/objects/batch_get",
            body,
            headers=[("Content-Type", "application/json")],
        )
        msg = reply.error_message()
        if reply.status != 200 or msg is not None:
            self.ledger.count("batch_get", f"{reply.status} {msg}")
            return
        pos, b = 0, reply.body
        for key in keys:
            if pos + 8 > len(b):
                self.ledger.corruption(key, "batch_get (short frame)", None, None)
                return
            n = int.from_bytes(b[pos : pos + 8], "big")
            pos += 8
            if n == (1 << 64) - 1:
                self.check_read("batch_get item", key, 200, None, False, NOT_FOUND)
                continue
            self.check_read("batch_get item", key, 200, b[pos : pos + n], True, None)
            pos += n
        if pos != len(b):
            self.ledger.corruption(keys[-1], "batch_get (trailing bytes)", None, None)

    def slow_put(self):
        """A client that trickles its body, on its own connection."""
        if not self.slow_slots.acquire(blocking=False):
            return self.put()
        try:
            key = self.new_key()
            big = self.rng.random() < 0.5  # >= 256 KiB: the streamed path
            n = self.rng.randrange(256 << 10, 1 * MIB) if big else self.rng.randrange(1, 64 << 10)
            n = min(n, self.args.max_size)
            data = self.rng.randbytes(n)
            seconds = self.rng.uniform(0.5, self.args.slow_max_s)
            pieces = max(1, min(40, n))
            step = -(-n // pieces)
            c = Conn(self.addr, timeout=self.args.slow_max_s + 30)
            sent = 0
            try:
                s = c.open()
                s.sendall(Conn.head("PUT", f"/api/v1/objects?key={key}", n))
                for i in range(0, n, step):
                    if time.monotonic() > self.deadline + self.args.slow_max_s:
                        break
                    s.sendall(data[i : i + step])
                    sent = min(n, i + step)
                    time.sleep(seconds / pieces)
                reply = c.read_reply()
            except (OSError, ConnectionError, ValueError) as e:
                # Cut by the server (a body timeout) or reset: not acknowledged.
                whole = sent == n
                self.ledger.count(
                    "slow_put",
                    f"cut {'after' if whole else 'before'} the whole body ({type(e).__name__})",
                )
                if whole:
                    self.unanswered(key, data)
                else:
                    with self.ledger.lock:
                        self.ledger.abandoned.add(key)
                return
            finally:
                c.close()
            self.record_put("slow_put", key, data, reply)
            if self.ledger.expected(key) is None:
                with self.ledger.lock:
                    self.ledger.abandoned.add(key)
        finally:
            self.slow_slots.release()

    def abandon_put(self):
        """A client that disconnects in the middle of a body (FIN or RST)."""
        key = self.new_key()
        n = max(2, self.size())
        c = Conn(self.addr)
        s = c.open()
        try:
            s.sendall(Conn.head("PUT", f"/api/v1/objects?key={key}", n))
            s.sendall(self.rng.randbytes(self.rng.randrange(1, n)))
            time.sleep(self.rng.uniform(0, 0.05))
        except OSError:
            pass
        with self.ledger.lock:
            self.ledger.abandoned.add(key)
        c.close(reset=self.rng.random() < 0.5)
        self.ledger.count("abandon_put", "sent part of the body, then disconnected")


_HANDED_OUT = set()


def free_port():
    """A loopback port free now and not handed out before by this process: the ports of a
    cluster are all chosen before any of its processes listens, and the kernel may give the
    same free port twice (a cluster soak once started a local service on its etcd's port)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def start_server(args, ssd_dir, faults, log_path):
    port = free_port()
    cmd = [
        args.server,
        "--listen",
        f"127.0.0.1:{port}",
        "--shards",
        str(args.shards),
        "--set",
        f"ock.mmc.local_service.hbm.size={args.hbm_mb}MB",
        "--set",
        f"ock.mmc.local_service.dram.size={args.dram_mb}MB",
        "--set",
        "ock.mmc.ssd.enable=true",
        "--set",
        f"ock.mmc.ssd.path={ssd_dir}",
        "--set",
        f"ock.mmc.ssd.size={args.ssd_mb}MB",
    ]
    for kv in args.set:
        cmd += ["--set", kv]
    env = dict(os.environ)
    env.pop("MMC_FAULT_SSD_WRITE", None)
    env.pop("MMC_FAULT_SSD_READ", None)
    env.update(faults)
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    addr = ("127.0.0.1", port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited at start; log {log_path}:\n" + open(log_path).read())
        try:
            if Conn(addr, timeout=2).request("GET", "/ready").status == 200:
                return proc, addr
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the server was not ready within 30 s")


def choose_faults(args, rng):
    kind = args.faults if args.faults != "random" else rng.choice(
        ["none", "ssd-write", "ssd-read", "ssd-both"]
    )
    faults = {}
    if kind in ("ssd-write", "ssd-both"):
        faults["MMC_FAULT_SSD_WRITE"] = f"{rng.choice(['eio', 'enospc'])}@{rng.randrange(20, 400)}"
    if kind in ("ssd-read", "ssd-both"):
        faults["MMC_FAULT_SSD_READ"] = f"eio@{rng.randrange(20, 400)}"
    return kind, faults


def verify_all(addr, ledger, threads, limit_s):
    """Reads back every acknowledged object, and every abandoned or deleted key."""
    with ledger.lock:
        acked = list(ledger.acked.items())
        gone = sorted(ledger.abandoned | ledger.deleted)
        unanswered = list(ledger.unanswered.items())
    outcome = Counter()
    problems = []
    lock = threading.Lock()
    deadline = time.monotonic() + limit_s
    work = (
        [("acked", k, v) for k, v in acked]
        + [("gone", k, None) for k in gone]
        + [("unanswered", k, v) for k, v in unanswered]
    )
    idx = iter(range(len(work)))

    def worker():
        c = Conn(addr)
        for i in idx:
            if time.monotonic() > deadline:
                with lock:
                    outcome["not verified (time limit)"] += 1
                continue
            kind, key, expected = work[i]
            try:
                r = c.request("GET", f"/api/v1/objects?key={quote(key)}")
            except (OSError, ConnectionError, ValueError) as e:
                with lock:
                    outcome[f"{kind}: connection error ({type(e).__name__})"] += 1
                    problems.append((kind, key, f"connection error {e!r}"))
                c.close()
                continue
            msg = r.error_message()
            with lock:
                if kind == "acked":
                    if r.status == 200 and msg is None:
                        got = checksum(r.body)
                        if got == expected:
                            outcome["acked: identical"] += 1
                        else:
                            outcome["acked: CORRUPT"] += 1
                            ledger.corruption(key, "final read", expected, got)
                    elif msg == NOT_FOUND:
                        outcome["acked: lost (Key not found)"] += 1
                        problems.append((kind, key, msg))
                    else:
                        outcome[f"acked: unreadable ({r.status} {msg})"] += 1
                        problems.append((kind, key, f"{r.status} {msg}"))
                elif kind == "unanswered":
                    if msg == NOT_FOUND:
                        outcome["unanswered: absent"] += 1
                    elif r.status == 200 and msg is None:
                        got = checksum(r.body)
                        if got == expected:
                            outcome["unanswered: stored, identical"] += 1
                        else:
                            outcome["unanswered: CORRUPT"] += 1
                            ledger.corruption(key, "final read (unanswered put)", expected, got)
                    else:
                        outcome[f"unanswered: {r.status} {msg}"] += 1
                else:
                    if msg == NOT_FOUND:
                        outcome["abandoned/deleted: absent"] += 1
                    elif r.status == 200 and msg is None:
                        outcome["abandoned/deleted: READABLE"] += 1
                        how = "abandoned" if key in ledger.abandoned else "deleted"
                        problems.append((kind, key, f"{how}, readable: {len(r.body)} bytes"))
                    else:
                        outcome[f"abandoned/deleted: {r.status} {msg}"] += 1

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(limit_s + 60)
    return outcome, problems


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.environ.get("MMC_SERVER", "target/release/mmc-server"))
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--clients", type=int, default=16, help="client threads (default 16)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    p.add_argument(
        "--faults",
        choices=["random", "none", "ssd-write", "ssd-read", "ssd-both"],
        default="random",
        help="injected SSD faults (default: one picked at random from the seed)",
    )
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--hbm-mb", type=int, default=16)
    p.add_argument("--dram-mb", type=int, default=48)
    p.add_argument("--ssd-mb", type=int, default=512)
    p.add_argument("--max-size", type=int, default=4 * MIB, help="largest object in bytes")
    p.add_argument("--slow-max-s", type=float, default=8.0, help="longest trickled body, seconds")
    p.add_argument("--slow-clients", type=int, default=4, help="trickling uploads at once, at most")
    p.add_argument("--dir", default=None, help="directory for the SSD file (default: a temp dir)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra server setting"
    )
    args = p.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    rng = random.Random(args.seed)
    kind, faults = choose_faults(args, rng)

    work = tempfile.mkdtemp(prefix="mmc-soak-", dir=args.dir)
    ssd_dir = os.path.join(work, "ssd")
    os.mkdir(ssd_dir)
    log_path = os.path.join(work, "server.log")
    print(
        f"soak: seed {args.seed}, {args.duration:.0f} s, {args.clients} clients, faults: {kind} "
        f"{' '.join(f'{k}={v}' for k, v in faults.items())}",
        flush=True,
    )
    proc, addr = start_server(args, ssd_dir, faults, log_path)
    print(f"soak: server pid {proc.pid} on {addr[0]}:{addr[1]}, log {log_path}", flush=True)

    # Live data under half the SSD tier: without faults, nothing may be evicted for good.
    ledger = Ledger(budget_bytes=args.ssd_mb * MIB // 2)
    started = time.monotonic()
    deadline = started + args.duration
    slow_slots = threading.Semaphore(args.slow_clients)
    clients = [Client(i, args, addr, ledger, deadline, slow_slots) for i in range(args.clients)]
    for c in clients:
        c.start()
    while any(c.is_alive() for c in clients):
        time.sleep(1)
        if proc.poll() is not None:
            break
        left = deadline - time.monotonic()
        if int(left) % 10 == 0 and left > 0:
            with ledger.lock:
                print(
                    f"soak: {left:4.0f} s left, {sum(ledger.ops.values())} ops, "
                    f"{len(ledger.acked)} live objects ({ledger.live_bytes / MIB:.0f} MiB), "
                    f"{len(ledger.corrupt)} corrupt",
                    flush=True,
                )
    for c in clients:
        c.join(args.slow_max_s + 60)
    load_s = time.monotonic() - started

    failures = []
    alive = proc.poll() is None
    if not alive:
        failures.append(f"the server died during the load (exit status {proc.returncode})")
        outcome, problems = Counter(), []
    else:
        outcome, problems = verify_all(addr, ledger, threads=8, limit_s=300)
        summary = Conn(addr).request("GET", "/metrics/summary").body.decode()

    # Stop the server: SIGTERM, a clean exit within 30 s.
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
            if code != 0:
                failures.append(f"the server exited with status {code} after SIGTERM")
        except subprocess.TimeoutExpired:
            proc.kill()
            failures.append("the server did not stop within 30 s of SIGTERM")
    log = open(log_path, errors="replace").read()
    if "panicked at" in log:
        failures.append("the server panicked (see its log)")

    with ledger.lock:
        corrupt = list(ledger.corrupt)
        ops = sum(ledger.ops.values())
        acked = len(ledger.acked)
    if corrupt:
        failures.append(f"{len(corrupt)} reads returned bytes other than the acknowledged ones")
    if outcome["abandoned/deleted: READABLE"]:
        failures.append(
            f"{outcome['abandoned/deleted: READABLE']} abandoned or deleted keys are readable"
        )
    unread = sum(
        n
        for k, n in outcome.items()
        if k.startswith("acked:") and k not in ("acked: identical", "acked: CORRUPT")
    )
    if unread and not faults:
        failures.append(f"{unread} acknowledged objects lost or unreadable without an injected fault")
    if any(c.error for c in clients):
        failures.append("a soak client failed: " + "; ".join(c.error for c in clients if c.error))

    print(f"\nsoak: {ops} operations in {load_s:.1f} s by {args.clients} clients (seed {args.seed})")
    print("answers during the load:")
    for k, n in sorted(ledger.answers.items()):
        print(f"  {n:8}  {k}")
    print(f"final check of {acked} acknowledged objects and the abandoned or deleted keys:")
    for k, n in sorted(outcome.items()):
        print(f"  {n:8}  {k}")
    shown = Counter()
    for kind_, key, what in problems:
        shape = re.sub(r"\d+", "N", what)
        shown[(kind_, shape)] += 1
        if shown[(kind_, shape)] <= 3:
            print(f"  e.g. {kind_} {key}: {what}")
    for key, when, exp, got in corrupt[:10]:
        print(f"  CORRUPT {key} ({when}): expected (len, crc32) {exp}, got {got}")
    if alive:
        fields = dict(kv.split("=", 1) for kv in summary.split())
        print(
            "server summary: "
            + " ".join(f"{k}={fields.get(k)}" for k in ("keys", "evict", "rewarm", "rewarm_fail", "flush_blobs", "get_req", "get_success", "get_fail", "get_not_found"))
        )
    if failures:
        print("\nsoak: FAIL")
        for f in failures:
            print(f"  - {f}")
        print(f"  server log: {log_path}")
        return 1
    print("\nsoak: PASS")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
