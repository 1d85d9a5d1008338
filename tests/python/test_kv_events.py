"""KV cache events decoded the way KV-aware routers decode them: pyzmq, three frames
`[topic, seq, payload]`, and every payload decoded by typed decoders shaped like the consumers'
(vllm_kv_events.py): vLLM's msgspec structs for the configured wire form
(`ock.mmc.kv_events.encoding`), plus llm-d's positional reading for the `array` form. A batch any
of them rejects fails the test."""

import json
import subprocess
import time

import msgspec
import pytest
import zmq

from conftest import SERVER, free_port, wait_until
from vllm_kv_events import BATCH_TYPES, decode_typed, llmd_read, simplify_typed
from vllm_kv_events import dp_rank as batch_dp_rank

MASK = (1 << 64) - 1
END_OF_REPLAY = b"\xff" * 8


def kv_args(pub_port, replay_port=None, extra=(), encoding=None):
    """Server arguments; `encoding` None leaves ock.mmc.kv_events.encoding at its default."""
    args = [
        "--set", "ock.mmc.kv_events.enable=true",
        "--set", "ock.mmc.kv_events.endpoint=tcp://127.0.0.1:%d" % pub_port,
        "--set", "ock.mmc.kv_events.topic=kv@test",
        "--set", "ock.mmc.kv_events.batch_max_delay_ms=2",
        "--set", "ock.mmc.kv_events.data_parallel_rank=3",
    ]
    if encoding:
        args += ["--set", "ock.mmc.kv_events.encoding=" + encoding]
    if replay_port:
        args += ["--set", "ock.mmc.kv_events.replay_endpoint=tcp://127.0.0.1:%d" % replay_port]
    return args + list(extra)


def key(h):
    return "llama@1@0@%x@bf16" % h


# Encodings whose wire shape is the same (they differ only in medium names).
SAME_SHAPE = {"vllm-0.24": {"sglang"}, "sglang": {"vllm-0.24"}}


def decode_payload(payload, encoding):
    """Every decoder a consumer of `encoding` would use; they must agree. Returns the events as
    (kind, hashes, medium) tuples."""
    batch = decode_typed(payload, encoding)
    assert abs(batch.ts - time.time()) < 60, batch.ts
    assert batch_dp_rank(batch) == 3, batch
    events = [simplify_typed(e) for e in batch.events]
    # No hybrid: every other generation's (strict) typed decoder rejects a batch with a
    # BlockStored (the event whose shape every generation changed; a batch of removals or of
    # AllBlocksCleared alone is the same in several positional generations).
    stored = any(e[0] == "stored" for e in events)
    for other in BATCH_TYPES if stored else ():
        if other != encoding and other not in SAME_SHAPE.get(encoding, ()):
            with pytest.raises(msgspec.ValidationError):
                decode_typed(payload, other)
    if encoding == "array":
        ts, llmd_events, dp_rank = llmd_read(payload)
        assert (ts, llmd_events, dp_rank) == (batch.ts, events, 3)
    return events


def decode(frames, encoding):
    """What a router does with one published message."""
    assert len(frames) == 3, frames
    topic, seq, payload = frames
    assert len(seq) == 8
    return topic.decode(), int.from_bytes(seq, "big"), decode_payload(payload, encoding)


class Subscriber:
    def __init__(self, port, encoding):
        self.encoding = encoding
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@test")
        self.sock.setsockopt(zmq.RCVTIMEO, 10000)
        self.sock.connect("tcp://127.0.0.1:%d" % port)
        self.seqs = []
        self.events = []

    def take(self, n):
        while len(self.events) < n:
            topic, seq, events = decode(self.sock.recv_multipart(), self.encoding)
            assert topic == "kv@test"
            self.seqs.append(seq)
            self.events.extend(events)
        return self.events

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def join_stream(server, sub):
    """PUB/SUB subscriptions take a moment to reach the publisher: put probe objects until one
    is seen, then drop what was received so far."""
    i = 0
    deadline = time.time() + 30
    while True:
        i += 1
        assert time.time() < deadline, "the subscription never reached the publisher"
        server.put("probe@1@0@%x@bf16" % (0xF00000 + i), b"p", "&medium=dram")
        try:
            sub.sock.setsockopt(zmq.RCVTIMEO, 200)
            sub.take(1)
            break
        except zmq.Again:
            continue
    sub.sock.setsockopt(zmq.RCVTIMEO, 10000)
    time.sleep(0.05)
    while True:
        try:
            sub.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
    sub.seqs, sub.events = sub.seqs[-1:], []


# None: the default encoding, which is the positional one.
@pytest.mark.parametrize("encoding", [None, "map"], ids=["default-array", "map"])
def test_subscriber_sees_every_event_in_order(server_factory, encoding):
    pub = free_port()
    s = server_factory(kv_args(pub, encoding=encoding, extra=[
        "--set", "ock.mmc.local_service.hbm.size=1MB",
        "--set", "ock.mmc.segment.run_bytes=256KB",
    ]))
    sub = Subscriber(pub, encoding or "array")
    join_stream(s, sub)
    expected = []
    # Stored on DRAM, then on HBM; a long digest keeps its low 64 bits.
    s.put(key(0xA1), b"x" * 1000, "&medium=dram")
    expected.append(("stored", [0xA1], "CPU"))
    long = 0x123456789ABCDEF0FEDCBA98
    s.put(key(long), b"y" * 1000, "&medium=hbm")
    expected.append(("stored", [long & MASK], "GPU"))
    # A key that does not parse publishes nothing (and is counted).
    s.put("not-an-lmcache-key", b"z", "&medium=dram")
    # Removal.
    assert s.json("DELETE", "/key?key=" + key(0xA1))["success"] is True
    expected.append(("removed", [0xA1], "CPU"))
    # Eviction: HBM fills, its oldest blob moves down to DRAM.
    for h in range(0xB0, 0xB0 + 6):
        s.put(key(h), b"e" * (200 << 10), "&medium=hbm")
        expected.append(("stored", [h], "GPU"))
    # remove_all: one AllBlocksCleared.
    assert s.json("DELETE", "/all_keys")["success"] is True
    expected.append(("cleared",))
    got = []
    while not got or got[-1] != ("cleared",):
        got = sub.take(len(got) + 1)
    # Demotions (HBM → DRAM) show as removed-from-GPU plus stored-on-CPU of the same hash.
    demoted = {e[1][0] for e in got if e[0] == "removed" and e[2] == "GPU"
               and ("stored", e[1], "CPU") in got}
    assert long & MASK in demoted, got
    moves = [e for e in got if e[0] != "cleared" and e[1][0] in demoted
             and ((e[0] == "removed" and e[2] == "GPU") or (e[0] == "stored" and e[2] == "CPU"))]
    assert len(moves) == 2 * len(demoted), moves
    # Everything else arrives in the order it happened.
    assert [e for e in got if e not in moves] == expected
    # Sequence numbers are contiguous.
    assert sub.seqs == list(range(sub.seqs[0], sub.seqs[0] + len(sub.seqs))), sub.seqs
    st = s.json("GET", "/kv_events/status")
    assert st["skipped_unparsed_keys"] >= 1
    assert st["last_sequence"] == sub.seqs[-1]
    assert st["enabled"] is True and st["publisher_active"] is True
    sub.close()


@pytest.mark.parametrize("encoding", ["vllm-0.9", "array", "vllm-0.14", "vllm-0.24", "sglang",
                                      "map"])
def test_every_consumer_generation_decodes_its_batches(server_factory, encoding):
    """Each `ock.mmc.kv_events.encoding` is decoded by a copy of its generation's structs (and
    rejected by every other generation's): stored on two media, removed, cleared."""
    pub = free_port()
    s = server_factory(kv_args(pub, encoding=encoding))
    sub = Subscriber(pub, encoding)
    join_stream(s, sub)
    s.put(key(0xA1), b"x" * 100, "&medium=dram")
    s.put(key(0xA2), b"y" * 100, "&medium=hbm")
    assert s.json("DELETE", "/key?key=" + key(0xA1))["success"] is True
    assert s.json("DELETE", "/all_keys")["success"] is True
    got = sub.take(4)
    # vLLM 0.9's events carry no medium; SGLang names DRAM CPU_PINNED (read back as CPU).
    cpu, gpu = (None, None) if encoding == "vllm-0.9" else ("CPU", "GPU")
    assert got == [("stored", [0xA1], cpu), ("stored", [0xA2], gpu), ("removed", [0xA1], cpu),
                   ("cleared",)], got
    assert s.json("GET", "/kv_events/publisher")["encoding"] == encoding
    sub.close()


def replay_frames(sock, start):
    """A vLLM-style replay client on a DEALER (with the REQ envelope's empty delimiter): after
    the delimiter every answer unpacks as exactly `seq, payload`, until the end marker."""
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    pairs = []
    while True:
        frames = sock.recv_multipart()
        assert frames[0] == b"", frames
        seq, payload = frames[1:]  # exactly two frames: no topic frame
        assert len(seq) == 8, frames
        if seq == END_OF_REPLAY:
            assert payload == b"", frames
            return pairs
        pairs.append((int.from_bytes(seq, "big"), payload))


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_late_subscriber_recovers_through_replay(server_factory, encoding):
    pub, replay = free_port(), free_port()
    s = server_factory(kv_args(pub, replay, encoding=encoding))
    for h in range(20):
        s.put(key(0xC00 + h), b"r", "&medium=dram")
    wait_until("events published", lambda: s.json("GET", "/kv_events/status")["published_events"] == 20)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10000)
    dealer.connect("tcp://127.0.0.1:%d" % replay)
    pairs = replay_frames(dealer, 0)
    seqs = [seq for seq, _ in pairs]
    events = [e for _, payload in pairs for e in decode_payload(payload, encoding)]
    assert seqs == list(range(len(seqs))), seqs
    assert events == [("stored", [0xC00 + h], "CPU") for h in range(20)]
    # Asking from a later sequence returns only the rest.
    assert replay_frames(dealer, seqs[-1]) == pairs[-1:]
    # Past the end: only the end marker.
    assert replay_frames(dealer, seqs[-1] + 1) == []
    dealer.close(0)
    # vLLM's own client uses a REQ socket, which strips the delimiter: its first answer is the
    # pair `seq, payload` it unpacks.
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.RCVTIMEO, 10000)
    req.connect("tcp://127.0.0.1:%d" % replay)
    req.send(seqs[-1].to_bytes(8, "big"))
    seq_bytes, payload = req.recv_multipart()
    assert (int.from_bytes(seq_bytes, "big"), payload) == pairs[-1]
    req.close(0)
    ctx.term()


def test_flood_overflows_the_queue_and_every_event_is_accounted(server_factory):
    pub = free_port()
    s = server_factory(kv_args(pub, extra=[
        "--set", "ock.mmc.kv_events.queue_capacity=16",
        "--set", "ock.mmc.kv_events.hard_capacity=24",
        "--set", "ock.mmc.kv_events.batch_max_events=4",
        "--set", "ock.mmc.kv_events.batch_max_delay_ms=50",
        "--set", "ock.mmc.local_service.hbm.size=0",
    ]))
    n, per = 2000, 200
    for start in range(0, n, per):
        keys = ",".join(key(0xD000 + i) for i in range(start, start + per))
        status, _, body = s.request(
            "POST", "/api/v1/objects/batch_put?keys=%s&sizes=%s" % (keys, ",".join(["1"] * per)), b"q" * per)
        assert status == 200 and all(r["success"] for r in json.loads(body)["results"])
    # The server kept serving while the queue overflowed.
    assert s.json("GET", "/health")["status"] == "ok"
    st = s.json("GET", "/kv_events/status")
    assert st["queue_size"] <= 24
    # An empty queue is not the end: the publisher may still hold a partial batch, due within
    # batch_max_delay_ms. Every event is accounted for once that batch is out.
    def settled():
        st = s.json("GET", "/kv_events/status")
        return st["queue_size"] == 0 and st["published_events"] + st["dropped_events"] == n
    wait_until("every event is published or dropped", settled)
    st = s.json("GET", "/kv_events/status")
    assert st["dropped_stored_events"] > 0, st
    assert st["published_events"] + st["dropped_events"] == n, st
    assert st["published_by_type"]["stored"] == st["published_events"]
    assert st["published_by_medium"]["dram"] == st["published_events"]
    assert st["dropped_high_priority_events"] == 0
    # /metrics tells the same story.
    _, _, text = s.request("GET", "/metrics")
    m = dict(l.rsplit(" ", 1) for l in text.decode().splitlines() if l and not l.startswith("#"))
    assert int(m["memcache_kv_events_published_total"]) == st["published_events"]
    assert int(m["memcache_kv_events_dropped_total"]) == st["dropped_events"]
    assert int(m["memcache_kv_events_dropped_stored_total"]) == st["dropped_stored_events"]
    assert int(m["memcache_kv_events_queue_capacity"]) == 16
    assert int(m["memcache_kv_events_publisher_active"]) == 1
    # Removals have priority: a remove_all's clear event is never dropped at this depth.
    assert s.json("DELETE", "/all_keys")["success"] is True
    wait_until("the clear is published",
               lambda: s.json("GET", "/kv_events/status")["published_by_type"]["cleared"] == 1)


def test_disabled_by_default_and_bad_endpoints_refused(server_factory):
    s = server_factory([])
    st = s.json("GET", "/kv_events/status")
    assert list(st.keys()) == sorted(st.keys()), "the seed's key order"
    assert st["enabled"] is False and st["publisher_active"] is False
    assert st["queue_capacity"] == 65536
    assert list(st["published_by_medium"]) == ["dram", "hbm", "ssd", "unknown"]
    assert list(st["published_by_type"]) == ["cleared", "removed", "stored"]
    r = subprocess.run([SERVER, "--listen", "127.0.0.1:0", "--set", "ock.mmc.kv_events.enable=true",
                        "--set", "ock.mmc.kv_events.endpoint=tcp://1.2.3.4.5:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r
    assert "ock.mmc.kv_events.endpoint: cannot bind" in r.stderr, r.stderr
    r = subprocess.run([SERVER, "--set", "ock.mmc.kv_events.endpoint=udp://x"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "ock.mmc.kv_events.endpoint" in r.stderr, r


def test_a_damaged_ssd_copy_is_dropped_with_a_block_removed(server_factory, tmp_path):
    """The SSD file is truncated behind the server's back and grows again with zeros: a read
    of an object held only there fails its checksum, answers an error (never the zeros), and
    the copy is removed with a BlockRemoved on DISK."""
    pub = free_port()
    s = server_factory(kv_args(pub, extra=[
        "--set", "ock.mmc.local_service.hbm.size=0",
        "--set", "ock.mmc.local_service.dram.size=2MB",
        "--set", "ock.mmc.ssd.enable=true",
        "--set", "ock.mmc.ssd.path=%s" % tmp_path,
        "--set", "ock.mmc.ssd.size=256MB",
        "--set", "ock.mmc.segment.run_bytes=1MB",
        "--set", "ock.mmc.lease_ms=100",
    ]))
    sub = Subscriber(pub, "array")
    join_stream(s, sub)
    early = [0xC00 + i for i in range(16)]
    for h in early:
        s.put(key(h), bytes([h & 0xFF]) * (200 << 10), "&medium=dram")

    def only_on_disk(h):
        q = s.json("GET", "/query_key?key=" + key(h))
        return q.get("success", True) and [b["medium"] for b in q["blobs"]] == ["SSD"]

    wait_until("the first object reaches SSD only", lambda: only_on_disk(early[0]))
    with open(tmp_path / "mmc-rank-0.ssd", "r+b") as f:
        f.truncate(0)
    for i in range(16):
        s.put(key(0xD00 + i), b"n" * (200 << 10), "&medium=dram")
    damaged = []
    for h in early:
        status, ctype, body = s.request("GET", "/api/v1/objects?key=" + key(h))
        assert status == 200
        if ctype == "application/octet-stream":
            assert body == bytes([h & 0xFF]) * (200 << 10), "wrong bytes served for %x" % h
        else:
            v = json.loads(body)
            assert v["error_message"] == ("The object's copy on SSD is damaged (checksum "
                                          "mismatch or short read) and was dropped"), v
            damaged.append(h)
    assert damaged, "the truncation is noticed"
    want = [("removed", [h], "DISK") for h in damaged]
    got = []
    while not all(w in got for w in want):
        got = sub.take(len(got) + 1)  # bounded: each receive times out after 10 s
    sub.close()


def test_an_unknown_encoding_stops_the_start_with_one_line():
    r = subprocess.run([SERVER, "--listen", "127.0.0.1:0", "--set", "ock.mmc.kv_events.enable=true",
                        "--set", "ock.mmc.kv_events.encoding=json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "ock.mmc.kv_events.encoding" in lines[0] and "vllm-0.14" in lines[0], r.stderr


# Keys as the KV-cache layers that write to the store form them, and the hash each publishes.
H64 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
STACK_KEYS = [
    # LMCache's CacheEngineKey (model@world_size@worker_id@hash@dtype), a layer id after it.
    ("llama@1@0@a1@bfloat16", 0xA1),
    ("llama@1@0@a2@bfloat16@7", 0xA2),
    # LMCache before 0.2: fmt@model@world_size@worker_id@hash (the hash last, a sha256 digest).
    ("vllm@llama@4@2@" + H64, 0x8899AABBCCDDEEFF),
    # LMCache's multiprocess keys (its native L2 adapters): model@kv_rank@group@hash[@salt].
    ("llama@000000ff@0@000000b1", 0xB1),
    ("llama@000000ff@1@000000b2@alice", 0xB2),
    # vllm-ascend: pool keys (the hash last) and layer-wise keys.
    ("Qwen@pcp0@dcp0@head_or_tp_rank:1@pp_rank:0@group:0@cache_role:kv@cache_family:default"
     "@c1", 0xC1),
    ("Qwen@c2@3", 0xC2),
    ("Qwen@1@c3@3", 0xC3),
]


@pytest.mark.parametrize("key_format", [None, "regex"])
def test_the_keys_lmcache_and_vllm_ascend_write_publish_their_hash(server_factory, key_format):
    """LMCache's (every generation's) and vllm-ascend's keys publish their chunk hash; a key of
    no known form is counted, and the first such key is logged once. With
    ock.mmc.kv_events.key_format set to a regex, only keys it matches publish."""
    from mmc_client.lmcache import MmcL2Connector

    pub = free_port()
    extra = []
    if key_format == "regex":
        # (join_stream's probe keys match it too.)
        extra = ["--set",
                 r"ock.mmc.kv_events.key_format=^(?:kv/|probe@1@0@)(?P<hash>[0-9a-f]+)"]
    s = server_factory(kv_args(pub, extra=extra))
    sub = Subscriber(pub, "array")
    join_stream(s, sub)
    if key_format == "regex":
        s.put("kv/00d1/layer0", b"r", "&medium=dram")
        s.put("llama@1@0@a1@bfloat16", b"r", "&medium=dram")  # not this form: unparsed
        s.put("kv/00d2/layer0", b"r", "&medium=dram")
        assert sub.take(2) == [("stored", [0xD1], "CPU"), ("stored", [0xD2], "CPU")]
        assert s.json("GET", "/kv_events/status")["skipped_unparsed_keys"] >= 1
        sub.close()
        return
    # The LMCache connector writes LMCache's keys as LMCache gives them (a batch).
    conn = MmcL2Connector(url="http://%s:%d" % (s.host, s.port))
    try:
        names = [k for k, _ in STACK_KEYS]
        bufs = [bytearray(b"v" * 64) for _ in names]
        fid = conn.submit_batch_set(names, [memoryview(b) for b in bufs])
        deadline = time.time() + 10
        done = []
        while not done and time.time() < deadline:
            done = [c for c in conn.drain_completions() if c[0] == fid]
            time.sleep(0.01)
        assert done and done[0][1] is True, done
    finally:
        conn.close()
    before = s.json("GET", "/kv_events/status")["skipped_unparsed_keys"]
    s.put("Qwen@partial@req-7@0@4@1000@3", b"p", "&medium=dram")  # no hash: unparsed
    s.put("plain-key", b"p", "&medium=dram")
    got = sub.take(len(STACK_KEYS))
    assert sorted(e[1][0] for e in got) == sorted(h for _, h in STACK_KEYS), got
    assert all(e[0] == "stored" for e in got), got
    wait_until("unparsed keys counted",
               lambda: s.json("GET", "/kv_events/status")["skipped_unparsed_keys"] >= before + 2)
    logged = [line for line in s.log if "has no chunk hash" in line]
    assert len(logged) == 1, logged
    sub.close()
