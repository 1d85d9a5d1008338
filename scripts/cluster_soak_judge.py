"""The cluster soak's judge (scripts/cluster_soak.py): what a client knows of its keys, the
faults the chaos injected, and what each answer of the cluster is allowed to be.

A key belongs to one client thread, which sends its puts and deletes one at a time, so the
key's history is exact: its operations in the order they were sent, each acknowledged (a 200)
or not (no answer, an error, a delete answered 503 "The removal was applied but a local
service holding a copy did not confirm it": it may or may not have taken effect, now or
later). Every put of a key writes bytes no other put wrote (they start with `key|version|`).

A read that starts after the last acknowledged operation L of its key may answer L's effect
(its bytes, or absent for a delete) or the effect of any operation sent after L. Anything
else is, for a 200:
- a **corrupt read**: bytes no put of that key sent (a refused grant replay's bytes, another
  key's, garbage);
- a **stale overwrite**: an older put's bytes after a newer put was acknowledged;
- a **resurrected delete**: an older put's bytes (or `exists`) after an acknowledged delete and
  no later put sent;
- **lost, then back**: bytes (or `exists`) of a put the cluster already answered missing.

and for "Key not found" (or `exists: false`) while L is an acknowledged put, a **loss**,
allowed only by a documented rule (docs/cluster-protocol.md, "What is still allowed to be
lost", and the faults table), checked against the faults injected since the put was sent:
- the only copy of an object on a rank declared lost: some rank was killed (-9) or frozen
  past the heartbeat timeout since the put was sent, and, for `replicas=r`, r distinct ranks
  were lost, drained (SIGTERM: a drain moves single copies only) or restarted since then, so
  that every copy could have gone (a `replicas=2` object survives one rank's loss);
- a tier move landed in the last moments before a failover (handed over as its source copy):
  a leader death (kill -9 or frozen past its lease) since the put was sent, in the second
  before which the leader counted tier moves (demotions, flushes, rewarms);
and nothing else: a short freeze, a drain, a restart of a rank after a drain, a grant
replay, a retried put and a failover without tier moves lose nothing. The soak keeps live
data far under the ranks' memory, so eviction drops nothing either.
"""

import threading
import time
import zlib

ABSENT = "absent"
PUT, DELETE, LOST = "put", "delete", "lost"

OK = "ok"
CORRUPT = "corrupt read"
STALE = "stale overwrite"
RESURRECTED = "resurrected delete"
LOST_BACK = "a key answered missing readable later"
LOSS = "loss"

# Faults that end a rank's membership (its copies dropped), copy removals that are not
# losses, and leader deaths.
RANK_LOSSES = ("kill", "freeze-long")
COPY_REMOVALS = RANK_LOSSES + ("term",)
LEADER_DEATHS = ("leader-kill", "leader-freeze")


def checksum(data):
    return (len(data), zlib.crc32(data))


def payload(rng, key, version, size):
    """Bytes of one put: `key|version|` then random bytes (at least `size` of them in all)."""
    head = f"{key}|{version}|".encode()
    return head + rng.randbytes(max(0, size - len(head)))


def origin(data):
    """Whose bytes these are, from their first bytes (for a failure's evidence)."""
    parts = data[:120].split(b"|")
    if len(parts) >= 3 and parts[0] == b"REPLAY":
        return f"a refused replay's bytes for {parts[1].decode('utf-8', 'replace')}"
    if len(parts) >= 3:
        return (f"bytes of key {parts[0].decode('utf-8', 'replace')} version "
                f"{parts[1].decode('utf-8', 'replace')}")
    return "bytes of no put"


class Op:
    __slots__ = ("kind", "ck", "sent", "wall", "acked", "replicas", "version", "acked_wall",
                 "where")

    def __init__(self, kind, ck=None, replicas=0, version=0):
        self.kind = kind
        self.ck = ck
        self.sent = time.monotonic()
        self.wall = time.time()
        self.acked = False
        self.replicas = replicas
        self.version = version
        self.acked_wall = None
        self.where = ""  # the local service the put was redirected to (for evidence)

    def ack(self):
        self.acked = True
        self.acked_wall = time.time()

    def effect(self):
        return self.ck if self.kind == PUT else ABSENT


class Key:
    """One key's operations, in the order they were sent."""

    def __init__(self):
        self.ops = []

    def add(self, op):
        self.ops.append(op)
        return op

    def last_acked(self):
        for i in range(len(self.ops) - 1, -1, -1):
            if self.ops[i].acked:
                return i
        return -1

    def allowed(self):
        """What a read may answer now: checksums, or ABSENT."""
        last = self.last_acked()
        vals = {ABSENT} if last < 0 else set()
        for op in self.ops[max(last, 0):]:
            vals.add(op.effect())
        return vals

    def state(self):
        """'live' (an acknowledged put, nothing after it), 'gone' (an acknowledged delete or
        loss, nothing after it) or 'unsure'."""
        last = self.last_acked()
        if last < 0 or last != len(self.ops) - 1:
            return "unsure"
        return "live" if self.ops[last].kind == PUT else "gone"

    def footprint(self):
        """Bytes times replicas this key may hold now (for the soak's budget)."""
        allowed = self.allowed()
        return max((op.ck[0] * op.replicas for op in self.ops
                    if op.kind == PUT and op.ck in allowed), default=0)

    def judge_value(self, ck):
        """A 200 with these bytes: (verdict, detail)."""
        if ck in self.allowed():
            return OK, ""
        idx = next((i for i in range(len(self.ops) - 1, -1, -1)
                    if self.ops[i].kind == PUT and self.ops[i].ck == ck), None)
        if idx is None:
            return CORRUPT, "bytes no put of this key sent"
        return self._after(idx, f"version {self.ops[idx].version}")

    def judge_present(self):
        """`exists: true` (no bytes): (verdict, detail)."""
        if any(v != ABSENT for v in self.allowed()):
            return OK, ""
        puts = [i for i, op in enumerate(self.ops) if op.kind == PUT]
        if not puts:
            return CORRUPT, "listed as existing, never put"
        return self._after(puts[-1], "listed as existing")

    def _after(self, idx, what):
        """An old value `what` (put `idx`) answered after what was acknowledged since."""
        later = [op for op in self.ops[idx + 1:] if op.acked]
        if any(op.kind == PUT for op in later):
            newer = max(op.version for op in later if op.kind == PUT)
            return STALE, f"{what} answered after version {newer} was acknowledged"
        if any(op.kind == DELETE for op in later):
            return RESURRECTED, f"{what} answered after its delete was acknowledged"
        return LOST_BACK, f"{what} answered after the key was answered missing"

    def judge_absent(self):
        """Key not found: (OK, None) or (LOSS, the acknowledged put)."""
        if ABSENT in self.allowed():
            return OK, None
        return LOSS, self.ops[self.last_acked()]


class Event:
    __slots__ = ("t", "wall", "kind", "rank", "tier_moves")

    def __init__(self, kind, rank, tier_moves=False):
        self.t = time.monotonic()
        self.wall = time.time()
        self.kind = kind
        self.rank = rank
        self.tier_moves = tier_moves


# How long after a fault is noted it may take to land (the signal sent, the process gone).
INJECT_SLACK_S = 0.1


class Events:
    """The faults the chaos injected, each noted just before it is injected."""

    def __init__(self):
        self.lock = threading.Lock()
        self.list = []

    def note(self, kind, rank=None, tier_moves=False):
        with self.lock:
            self.list.append(Event(kind, rank, tier_moves))

    def kills(self):
        with self.lock:
            return sum(e.kind in RANK_LOSSES + LEADER_DEATHS for e in self.list)

    def loss_cause(self, sent, replicas):
        """The documented rule that allows losing an acknowledged put sent at `sent` (a
        time.monotonic()) with `replicas` copies, or None. A fault noted up to INJECT_SLACK_S
        before the put was sent counts: it is noted just before it is injected, and a put sent
        in between may reach the rank before the signal does (seed 1208 with --ha: a put
        acknowledged by a rank in the millisecond its SIGSTOP landed, then declared lost)."""
        with self.lock:
            since = [e for e in self.list if e.t >= sent - INJECT_SLACK_S]
        lost = {e.rank for e in since if e.kind in RANK_LOSSES}
        removed = {e.rank for e in since if e.kind in COPY_REMOVALS}
        if lost and len(removed) >= replicas:
            return "rank loss"
        if any(e.kind in LEADER_DEATHS and e.tier_moves for e in since):
            return "tier move before a failover"
        return None

    def describe_since(self, sent):
        with self.lock:
            return [f"{wall(e.wall)} {e.kind}" + ("" if e.rank is None else f" rank {e.rank}")
                    for e in self.list if e.t >= sent - INJECT_SLACK_S]


def wall(t=None):
    """UTC time of day with milliseconds, as the servers' logs print it."""
    t = time.time() if t is None else t
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}"
