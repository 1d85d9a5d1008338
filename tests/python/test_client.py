"""mmc_client.DistributedObjectStore against a real mmc-server: every method, its upstream return
codes, ctypes and NumPy buffers, threads sharing one store, retries, timeouts, HA URL lists and
307 redirects (followed with Expect: 100-continue, against a stub)."""

import ctypes
import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from conftest import Server, free_port
from mmc_client import DistributedObjectStore, KeyInfo, LocalConfig, ReplicateConfig, errors

OK = 0
NOT_FOUND = -3102
INVALID = -3000


def make_store(url, **cfg):
    c = LocalConfig()
    c.meta_service_url = url
    for k, v in cfg.items():
        setattr(c, k, v)
    s = DistributedObjectStore()
    assert s.setup(c) == 0
    return s


@pytest.fixture
def store(server):
    s = make_store("http://%s" % server.addr)
    assert s.init(0) == 0
    yield s
    s.close()


def test_setup_and_init_errors(server):
    s = DistributedObjectStore()
    bad = LocalConfig()
    bad.meta_service_url = "ftp://x"
    assert s.setup(bad) == INVALID
    # Before init every method answers "client not initialised", never raises.
    assert s.put("k", b"v") == errors.MMC_CLIENT_NOT_INIT
    assert s.get("k") == b""
    assert s.is_exist("k") == errors.MMC_CLIENT_NOT_INIT
    assert s.remove_batch(["a", "b"]) == [errors.MMC_CLIENT_NOT_INIT] * 2
    assert s.get_batch(["a"]) == [b""]
    assert s.get_key_info("k").size() == 0
    dead = make_store("http://127.0.0.1:%d" % free_port())
    t = time.monotonic()
    assert dead.init(0) == errors.MMC_NOT_CONNET_META
    assert time.monotonic() - t < 2
    # tcp:// and a bare host:port are taken as http; init_bm is accepted either way.
    for url in ("tcp://%s" % server.addr, server.addr):
        s2 = make_store(url)
        assert s2.init(0, init_bm=True) == 0
        s2.close()


def test_put_get_exist_remove(store):
    assert store.put("pg/a", b"hello") == OK
    assert store.get("pg/a") == b"hello"
    assert store.is_exist("pg/a") == 1
    assert store.is_exist("pg/missing") == 0
    assert store.get("pg/missing") == b""
    # A duplicate put is skipped and reported as success, as upstream; the first value stays.
    assert store.put("pg/a", b"other") == OK
    assert store.get("pg/a") == b"hello"
    # bytearray, memoryview and an empty object.
    assert store.put("pg/b", bytearray(b"\x00\x01\xff")) == OK
    assert store.put("pg/c", memoryview(b"abcdef")[2:4]) == OK
    assert store.put("pg/empty", b"") == OK
    assert store.get("pg/b") == b"\x00\x01\xff"
    assert store.get("pg/c") == b"cd"
    assert store.get("pg/empty") == b""
    assert store.is_exist("pg/empty") == 1
    # Keys with characters that need percent-encoding.
    odd = "pg/odd key,&?=%/ü"
    assert store.put(odd, b"odd") == OK
    assert store.get(odd) == b"odd"
    assert store.remove("pg/a") == OK
    assert store.remove("pg/a") == NOT_FOUND
    assert store.get("pg/a") == b""
    assert store.is_exist("pg/a") == 0
    # Invalid arguments.
    assert store.put("", b"x") == INVALID
    assert store.put("x" * 5000, b"x") == INVALID
    # Upstream answers an invalid replica count with -1, and a value of the wrong type raises.
    assert store.put("pg/r", b"x", ReplicateConfig(replicaNum=9)) == errors.MMC_ERROR
    with pytest.raises(TypeError):
        store.put("pg/r", 12345)
    with pytest.raises(TypeError):
        store.put("pg/r", "a str")
    with pytest.raises(TypeError):
        store.put(b"pg/r", b"x")
    assert store.is_exist("") == INVALID
    assert store.remove("") == INVALID


def test_duplicate_put_as_error_when_asked(server):
    s = make_store("http://%s" % server.addr, duplicate_put_is_error=True)
    assert s.init(0) == 0
    assert s.put("dup/a", b"1") == OK
    assert s.put("dup/a", b"2") == errors.MMC_DUPLICATED_OBJECT
    assert s.put_batch(["dup/a", "dup/b"], [b"3", b"4"]) == errors.MMC_DUPLICATED_OBJECT
    assert s.get_batch(["dup/a", "dup/b"]) == [b"1", b"4"]
    s.close()


def test_replicate_config_and_medium(store):
    assert store.put("rc/dram", b"abc", ReplicateConfig(medium="dram")) == OK
    info = store.get_key_info("rc/dram")
    assert info.type_list() == [1] and info.size() == 3
    assert store.put("rc/hbm", b"abcd", ReplicateConfig(replicaNum=1, medium="hbm")) == OK
    assert store.get_key_info("rc/hbm").type_list() == [0]
    assert store.put("rc/bad", b"x", ReplicateConfig(medium="ssd")) == INVALID


def test_put_from_get_into_ctypes(store):
    for size in (1, 4096, 300 * 1024):  # 300 KiB goes through Expect: 100-continue
        src = ctypes.create_string_buffer(bytes((i * 7 + size) % 256 for i in range(size)), size)
        key = "ct/%d" % size
        assert store.put_from(key, ctypes.addressof(src), size) == OK
        dst = (ctypes.c_ubyte * size)()
        assert store.get_into(key, ctypes.addressof(dst), size) == OK
        assert bytes(dst) == src.raw
        assert store.get(key) == src.raw
    # A larger buffer than the object: not a full read, so not a success (a shorter object must
    # never look like a hit over the buffer's stale bytes): -3000, and not one byte written.
    big = ctypes.create_string_buffer(b"\x55" * 8192, 8192)
    assert store.get_into("ct/4096", ctypes.addressof(big), 8192) == INVALID
    assert big.raw == b"\x55" * 8192
    # The 4 KiB body was read past: the same connection serves the next call.
    assert store.get_into("ct/4096", ctypes.addressof(big), 4096) == OK
    assert big.raw[:4096] == store.get("ct/4096")
    # Too small a buffer: -3000, and not one byte written.
    small = ctypes.create_string_buffer(b"\xaa" * 100, 100)
    assert store.get_into("ct/4096", ctypes.addressof(small), 100) == INVALID
    assert small.raw == b"\xaa" * 100
    # The connection dropped for it does not disturb the next calls.
    assert store.get_into("ct/1", ctypes.addressof(small), 1) == OK
    assert store.get_into("ct/1", ctypes.addressof(small), 100) == INVALID
    assert store.get_into("ct/missing", ctypes.addressof(small), 100) == NOT_FOUND
    # Bad pointers and directions.
    assert store.put_from("ct/x", 0, 10) == INVALID
    assert store.put_from("ct/x", ctypes.addressof(small), -1) == INVALID
    # The device directions are upstream's unsupported direction here: -1.
    assert store.get_into("ct/1", ctypes.addressof(small), 1, direct=1) == errors.MMC_ERROR
    assert store.put_from("ct/x", ctypes.addressof(small), 10, direct=0) == errors.MMC_ERROR
    with pytest.raises(TypeError):
        store.put_from("ct/x", "not a buffer", 10)
    # Objects with the buffer protocol are accepted in place of an address.
    arr = bytearray(b"from-buffer")
    assert store.put_from("ct/buf", arr, len(arr)) == OK
    out = bytearray(len(arr))
    assert store.get_into("ct/buf", out, len(out)) == OK and out == arr


def test_numpy_buffers_and_batches(store):
    rng = np.random.default_rng(1)
    sizes = [1, 1000, 65536, 300 * 1024, 0]
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    keys = ["np/%d" % i for i in range(len(sizes))]
    codes = store.batch_put_from(keys, [a.ctypes.data if a.size else a for a in srcs], sizes)
    assert codes == [OK] * len(sizes)
    dsts = [np.zeros(n, dtype=np.uint8) for n in sizes]
    codes = store.batch_get_into(keys + ["np/missing"],
                                 [d.ctypes.data if d.size else bytearray(1) for d in dsts]
                                 + [bytearray(8)],
                                 sizes + [8])
    assert codes == [OK] * len(sizes) + [NOT_FOUND]
    for s, d in zip(srcs, dsts):
        assert np.array_equal(s, d)
    # One buffer too small, one too large: those keys alone fail and their buffers are left as
    # they were (a shorter object is not a hit over stale bytes); the others arrive.
    d0, d1 = np.zeros(1000, dtype=np.uint8), np.full(10, 0x5A, dtype=np.uint8)
    d2 = np.zeros(1, dtype=np.uint8)
    assert store.batch_get_into(["np/1", "np/2", "np/0", "np/0"],
                                [d0.ctypes.data, d1.ctypes.data, d1.ctypes.data, d2.ctypes.data],
                                [1000, 10, 10, 1]) == [OK, INVALID, INVALID, OK]
    assert np.array_equal(d0, srcs[1]) and (d1 == 0x5A).all() and d2[0] == srcs[0][0]
    # Mismatched list lengths.
    assert store.batch_put_from(["a", "b"], [d0.ctypes.data], [1]) == [errors.MMC_ERROR] * 2
    assert store.batch_get_into(["a"], [d0.ctypes.data], [1, 2]) == [errors.MMC_ERROR]
    # One bad key or buffer fails alone: the others of the batch go on (upstream: per key).
    assert store.batch_put_from(["np/pk1", "", "np/pk2", "np/pk3"],
                                [d0.ctypes.data, d0.ctypes.data, 0, d0.ctypes.data],
                                [1000, 1000, 1000, 1000]) == [OK, INVALID, INVALID, OK]
    assert store.batch_is_exist(["np/pk1", "", "np/pk2"]) == [1, INVALID, 0]
    assert store.batch_get_into(["np/pk1", "", "np/pk3"], [d0.ctypes.data] * 3,
                                [1000] * 3) == [OK, INVALID, OK]
    assert store.remove_batch(["np/pk1", "x" * 5000, "np/pk3"]) == [OK, INVALID, OK]
    with pytest.raises(TypeError):
        store.batch_is_exist(["ok", 5])
    # A float32 tensor round trip through put_from/get_into.
    t = rng.standard_normal((64, 128)).astype(np.float32)
    assert store.put_from("np/tensor", t.ctypes.data, t.nbytes) == OK
    back = np.empty_like(t)
    assert store.get_into("np/tensor", back.ctypes.data, back.nbytes) == OK
    assert np.array_equal(t, back)


def test_put_batch_get_batch_large(store):
    # Enough keys that batch_put is split by the 8 KiB request-target limit, and batch_get
    # needs the POST form.
    keys = ["lb/%04d/%s" % (i, "k" * 40) for i in range(700)]
    values = [("v%d" % i).encode() * (i % 5) for i in range(700)]
    assert store.put_batch(keys, values) == OK
    assert store.get_batch(keys) == values
    assert store.batch_is_exist(keys[:3] + ["lb/none"]) == [1, 1, 1, 0]
    # The same key twice in one call: the first value is stored, the second is a duplicate.
    assert store.put_batch(["lb/twice", "lb/twice"], [b"first", b"second"]) == OK
    assert store.get("lb/twice") == b"first"
    assert store.get_batch(["lb/none", "lb/twice"]) == [b"", b"first"]
    assert store.put_batch(["lb/x"], [b"1", b"2"]) == INVALID
    assert store.put_batch([""], [b"1"]) == INVALID
    assert store.remove_batch(keys) == [OK] * len(keys)
    assert store.remove_batch(keys[:2]) == [NOT_FOUND] * 2
    assert store.batch_is_exist(keys[:2]) == [0, 0]


def test_get_and_get_batch_over_tcp_read_each_object_straight_into_its_bytes(server,
                                                                             monkeypatch):
    """Over TCP (the same host's socket turned off), get and get_batch give bytes objects
    equal to what was stored, large (received straight into the new object) and small,
    missing keys as b""; the connection stays usable after each."""
    monkeypatch.setenv("MMC_TRANSPORT", "tcp")
    s = make_store("http://%s" % server.addr)
    assert s.init(0) == 0
    try:
        rng = np.random.default_rng(5)
        sizes = [0, 1, 65535, 65536, 300_001, 3 << 20]
        keys = ["tb/%d" % n for n in sizes]
        vals = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
        assert s.put_batch(keys[1:], vals[1:]) == OK
        for k, v in zip(keys[1:], vals[1:]):
            got = s.get(k)
            assert type(got) is bytes and got == v and hash(got) == hash(v)
        got = s.get_batch(keys + ["tb/missing"])
        assert got == [b""] + vals[1:] + [b""]
        assert all(type(g) is bytes for g in got)
        assert s.get("tb/1") == vals[1]
    finally:
        s.close()


def test_read_bytes_fills_a_new_bytes_object_or_fails_whole():
    from mmc_client import _http
    a, b = socket.socketpair()
    try:
        conn = _http.Connection.__new__(_http.Connection)
        conn.sock, conn.rbuf = a, bytearray(b"head-start")
        payload = bytes(range(256)) * 1024
        # (From a thread: more than the socket pair's buffer holds.)
        sender = threading.Thread(target=b.sendall, args=(payload[10:],))
        sender.start()
        stream = b"head-start" + payload[10:]
        got = conn.read_bytes(len(payload) - 256)
        assert type(got) is bytes and got == stream[:-256]
        assert conn.read_bytes(256) == payload[-256:]
        sender.join(10)
        # The peer closes in the middle of a large body: EOFError, nothing returned.
        b.sendall(b"x" * 1000)
        b.close()
        with pytest.raises(EOFError):
            conn.read_bytes(100_000)
    finally:
        a.close()


def test_key_info(store):
    assert store.put("ki/a", b"12345", ReplicateConfig(medium="dram")) == OK
    info = store.get_key_info("ki/a")
    assert isinstance(info, KeyInfo)
    assert info.size() == 5 and info.loc_list() == [0] and info.type_list() == [1]
    assert "size=5" in str(info)
    missing = store.get_key_info("ki/missing")
    assert missing.size() == 0 and missing.loc_list() == [] and missing.type_list() == []
    infos = store.batch_get_key_info(["ki/a", "ki/missing"])
    assert [i.size() for i in infos] == [5, 0]
    assert infos[0].type_list() == [1]


def test_remove_all(server):
    s = make_store("http://%s" % server.addr)
    assert s.init(0) == 0
    assert s.put_batch(["ra/1", "ra/2"], [b"1", b"2"]) == OK
    assert s.remove_all() == OK
    assert s.batch_is_exist(["ra/1", "ra/2"]) == [0, 0]
    s.close()
    assert s.put("ra/3", b"x") == errors.MMC_CLIENT_NOT_INIT


def test_threads_share_one_store(store):
    errors_seen = []
    n_threads, per_thread = 8, 40

    def work(t):
        buf = np.full(20000 + t, t, dtype=np.uint8)
        out = np.zeros_like(buf)
        for i in range(per_thread):
            key = "th/%d/%d" % (t, i)
            if store.put_from(key, buf.ctypes.data, buf.nbytes) != OK:
                errors_seen.append(("put", key))
            out[:] = 0
            if store.get_into(key, out.ctypes.data, out.nbytes) != OK or not np.array_equal(
                    buf, out):
                errors_seen.append(("get", key))
            if store.remove(key) != OK:
                errors_seen.append(("remove", key))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert errors_seen == []
    # Connections are kept alive and pooled: at most one per thread and socket (TCP for the
    # JSON calls; on this host the same-host socket of each of the server's two shards for the
    # bytes, and the shared one that found them), reused afterwards.
    pool = store._client.pool
    assert 1 <= pool.idle_count() <= 3 * n_threads + 1
    before = pool.idle_count()
    for i in range(20):
        assert store.is_exist("th/none") == 0
    assert pool.idle_count() == before


def test_stale_pooled_connection_and_retry_budget(tmp_path):
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    s = make_store(url, client_retry_milliseconds=10000)
    srv = {}

    def start_later():
        time.sleep(0.5)
        srv["s"] = Server([], listen="127.0.0.1:%d" % port)

    starter = threading.Thread(target=start_later)
    starter.start()
    # The server is not there yet: init waits for it within client_retry_milliseconds.
    assert s.init(0) == 0
    starter.join(30)
    first = srv["s"]
    assert s.put("st/a", b"1") == OK
    # Restart the server: the pooled connection is dead, the next call reconnects.
    first.stop()
    second = Server([], listen="127.0.0.1:%d" % port)
    try:
        assert s.put("st/b", b"2") == OK
        assert s.get("st/b") == b"2"
        assert s.get("st/a") == b""  # a new, empty cache
    finally:
        s.close()
        second.stop()
    # Without a retry budget a dead server fails at once.
    quick = make_store(url)
    t = time.monotonic()
    assert quick.init(0) == errors.MMC_NOT_CONNET_META
    assert time.monotonic() - t < 2


def test_ha_url_list_skips_a_dead_endpoint(server):
    dead = "http://127.0.0.1:%d" % free_port()
    s = make_store(dead + ",http://%s" % server.addr, client_retry_milliseconds=5000)
    assert s.init(0) == 0
    assert s.put("ha/a", b"1") == OK
    assert s.get("ha/a") == b"1"
    assert s._client.base_url == "http://%s" % server.addr
    s.close()


class Stub:
    """A tiny HTTP server for client behaviour the real server does not show: it answers every
    request with ``answer(head)`` (bytes) and records each request head and any body bytes that
    arrive within ``linger`` seconds after its answer."""

    def __init__(self, answer, linger=0.3):
        self.answer = answer
        self.linger = linger
        self.requests = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stop_flag = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        self.sock.settimeout(0.2)
        while not self.stop_flag:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        c.settimeout(5)
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head, _, rest = buf.partition(b"\r\n\r\n")
            rec = {"head": head.decode("latin-1"), "body": rest}
            self.requests.append(rec)
            out = self.answer(rec["head"])
            if out is None:
                time.sleep(10)
                return
            c.sendall(out)
            c.settimeout(self.linger)
            try:
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    rec["body"] += d
            except socket.timeout:
                pass
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.stop_flag = True
        self.sock.close()


def redirect_to(server):
    def answer(head):
        target = head.split("\r\n")[0].split(" ")[1]
        return ("HTTP/1.1 307 Temporary Redirect\r\nLocation: http://%s%s\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n" % (server.addr, target)).encode()
    return answer


def test_307_followed_with_expect_continue(server):
    stub = Stub(redirect_to(server))
    try:
        s = make_store("http://127.0.0.1:%d" % stub.port)
        # init's /health is redirected too.
        assert s.init(0) == 0
        size = 512 * 1024
        src = np.arange(size, dtype=np.uint32).astype(np.uint8)
        assert s.put_from("redir/big", src.ctypes.data, size) == OK
        put = [r for r in stub.requests if r["head"].startswith("PUT ")]
        assert len(put) == 1
        # The large body announced Expect: 100-continue and was never sent to the stub.
        assert "Expect: 100-continue" in put[0]["head"]
        assert put[0]["body"] == b""
        # It went once, to the server the 307 named.
        dst = np.zeros(size, dtype=np.uint8)
        assert s.get_into("redir/big", dst.ctypes.data, size) == OK
        assert np.array_equal(src, dst)
        assert s.get("redir/big") == src.tobytes()
        # Small bodies are sent without waiting (they are resent to the redirect target).
        assert s.put("redir/small", b"tiny") == OK
        assert s.get("redir/small") == b"tiny"
        assert s.batch_is_exist(["redir/big", "redir/none"]) == [1, 0]
        assert s.remove_batch(["redir/big", "redir/small"]) == [OK, OK]
        s.close()
    finally:
        stub.close()


def test_redirect_loop_and_protocol_errors_are_codes():
    loop = Stub(lambda head: None)
    loop.answer = lambda head: (
        "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:%d/x\r\n"
        "Content-Length: 0\r\n\r\n" % loop.port).encode()
    garbage = Stub(lambda head: b"NOT HTTP AT ALL\r\n\r\n")
    try:
        s = make_store("http://127.0.0.1:%d" % loop.port)
        assert s.init(0) == errors.MMC_ERROR
        s._config.meta_service_url = "http://127.0.0.1:%d" % garbage.port
        assert s.init(0) == errors.MMC_ERROR
        assert s.put("g/a", b"1") == errors.MMC_ERROR
        assert s.get("g/a") == b""
        assert s.batch_is_exist(["a", "b"]) == [errors.MMC_ERROR] * 2
        s.close()
    finally:
        loop.close()
        garbage.close()


def _envelope(message, kind=None):
    """A business error as mmc-server answers it, with ``kind`` in X-MMC-Error-Code (None: a
    server from before the header)."""
    body = json.dumps({"success": False, "error_message": message, "timestamp": 1}).encode()
    extra = "X-MMC-Error-Code: %s\r\n" % kind if kind else ""
    return ("HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
            "Content-Length: %d\r\n%s\r\n" % (len(body), extra)).encode() + body


def test_error_codes_come_from_the_kind_header_not_the_text():
    answer = {}

    def reply(head):
        if head.startswith("GET /health"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        return answer["now"]

    stub = Stub(reply, linger=0)
    try:
        s = make_store("http://127.0.0.1:%d" % stub.port)
        assert s.init(0) == OK
        # The header decides, whatever the text says (a text no prefix rule knows, or one
        # that would map to another code).
        answer["now"] = _envelope("Out of room in a way this client never saw", "no_space")
        assert s.put("k/a", b"x") == errors.MMC_NOT_ENOUGH_MEMORY
        answer["now"] = _envelope("No space, even after eviction", "key_not_found")
        assert s.remove("k/a") == NOT_FOUND
        answer["now"] = _envelope("Key not found", "invalid_param")
        assert s.remove("k/a") == INVALID
        answer["now"] = _envelope("Key not found", "failed")
        assert s.remove("k/a") == errors.MMC_ERROR
        # Without the header (an older server), or with a kind this client does not know (a
        # newer server's), the text decides as before.
        answer["now"] = _envelope("Key not found")
        assert s.remove("k/a") == NOT_FOUND
        answer["now"] = _envelope("No space on DRAM for 5 bytes, even after eviction", "brand_new")
        assert s.put("k/b", b"12345") == errors.MMC_NOT_ENOUGH_MEMORY
        # A batch's failed items: their error_code decides, else their text.
        results = [{"key": "a", "success": True},
                   {"key": "b", "success": False, "error_message": "Something new",
                    "error_code": "key_not_found"},
                   {"key": "c", "success": False, "error_message": "Key not found",
                    "error_code": "invalid_param"},
                   {"key": "d", "success": False, "error_message": "Key not found"}]
        body = json.dumps({"success": True, "results": results}).encode()
        answer["now"] = ("HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                         "Content-Length: %d\r\n\r\n" % len(body)).encode() + body
        assert s.remove_batch(["a", "b", "c", "d"]) == [OK, NOT_FOUND, INVALID, NOT_FOUND]
        s.close()
    finally:
        stub.close()
    # Every kind the server has maps to one of upstream's codes.
    assert set(errors.KINDS.values()) <= set(errors.NAMES)


def test_the_server_sends_the_kinds_the_client_maps(server, store):
    """The real server's errors carry the kinds (tests/it/errors.rs checks each one)."""
    host, port = server.addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    for method, target, kind in [("GET", "/api/v1/objects?key=kinds/absent", "key_not_found"),
                                 ("GET", "/api/v1/objects", "invalid_param"),
                                 ("PUT", "/api/v1/objects?key=kinds/a&medium=tape", "invalid_param")]:
        c.request(method, target, body=b"1" if method == "PUT" else None)
        r = c.getresponse()
        assert json.loads(r.read())["success"] is False
        assert r.getheader("X-MMC-Error-Code") == kind, target
    c.close()
    assert store.remove("kinds/absent") == NOT_FOUND


def test_timeout_is_honoured():
    silent = Stub(lambda head: None)
    try:
        s = make_store("http://127.0.0.1:%d" % silent.port, client_timeout_seconds=1)
        t = time.monotonic()
        assert s.init(0) == errors.MMC_TIMEOUT
        assert time.monotonic() - t < 5
        t = time.monotonic()
        assert s.put("to/a", b"x") == errors.MMC_TIMEOUT
        assert s.get("to/a") == b""
        assert time.monotonic() - t < 6
        s.close()
    finally:
        silent.close()


def test_token(server_factory, caplog):
    srv = server_factory(["--set", "ock.mmc.http.auth_token=sekrit-data-token"])
    url = "http://%s" % srv.addr
    no_token = make_store(url, api_token=None)
    with caplog.at_level("WARNING", logger="mmc_client"):
        assert no_token.init(0) == errors.MMC_ERROR
    # The -1 has no code of its own upstream: the log says what the server said.
    refused = [r.getMessage() for r in caplog.records if "refused the request, 401" in r.getMessage()]
    assert refused and "api_token" in refused[0], caplog.text
    s = make_store(url, api_token="sekrit-data-token")
    assert s.init(0) == 0
    assert s.put("tok/a", b"1") == OK
    assert s.get("tok/a") == b"1"
    s.close()
