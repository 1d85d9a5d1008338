"""The same-host data path (docs/same-host.md) through mmc_client: used by itself for a server
on this host running as this user, bytes intact for every data-path call, TCP for a client of
another user (which the server refuses) and with MMC_TRANSPORT=tcp; and each safety claim of
the docs: a client names only its own memory, a failed copy stores nothing, a put is copied
once, a read holds its lease while the server copies."""

import ctypes
import json
import os
import platform
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import Server, free_port, wait_until
from mmc_client import DistributedObjectStore, LocalConfig
from mmc_client import _http, _mapped

OK = 0
INVALID = -3000


def make_store(url, **config):
    c = LocalConfig()
    c.meta_service_url = url
    for name, value in config.items():
        setattr(c, name, value)
    s = DistributedObjectStore()
    assert s.setup(c) == 0
    assert s.init(0) == 0
    return s


@pytest.fixture
def store(server, monkeypatch):
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    s = make_store("http://%s" % server.addr)
    yield s
    s.close()


def socket_path(server):
    conn = _http.Connection(server.host, server.port, 10)
    try:
        conn.send([b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"])
        _, headers = conn.read_head()
    finally:
        conn.close()
    return headers["x-mmc-same-host"].split(" ", 1)[1]


def cross_requests(server):
    """memcache_shard_cross_requests_total: requests a shard sent to another shard."""
    text = server.get("/metrics").decode()
    return float(re.search(r"^memcache_shard_cross_requests_total (\S+)$", text, re.M).group(1))


def record_sockets(monkeypatch):
    """The same-host socket path of each request sent (single or pipelined)."""
    paths = []
    real = _http.Client._take_local

    def take_local(self, host, port, path, pid=None):
        paths.append(path)
        return real(self, host, port, path, pid)

    monkeypatch.setattr(_http.Client, "_take_local", take_local)
    return paths


def keys_of_each_shard(prefix, per_shard):
    """``per_shard`` keys owned by each of two shards (the server's hash, _http.shard_for)."""
    keys = ([], [])
    i = 0
    while min(len(k) for k in keys) < per_shard:
        key = "%s/%d" % (prefix, i)
        owner = keys[_http.shard_for(key.encode(), 2)]
        if len(owner) < per_shard:
            owner.append(key)
        i += 1
    return keys


def count_transports(monkeypatch):
    """Counts the requests sent per transport (same-host socket or TCP)."""
    seen = {"unix": 0, "tcp": 0, "pipelined": 0}
    real, real_local = _http.Client._on, _http.Client._send_local
    real_pipeline = _http.Client.pipeline

    def on(self, conn, *args, **kwargs):
        seen["unix" if conn.sock.family == socket.AF_UNIX else "tcp"] += 1
        return real(self, conn, *args, **kwargs)

    def send_local(self, conn, *args, **kwargs):
        seen["unix"] += 1
        return real_local(self, conn, *args, **kwargs)

    def pipeline(self, requests):
        answers = real_pipeline(self, requests)
        seen["pipelined"] += sum(a is not None for a in answers)
        return answers

    monkeypatch.setattr(_http.Client, "_on", on)
    monkeypatch.setattr(_http.Client, "_send_local", send_local)
    monkeypatch.setattr(_http.Client, "pipeline", pipeline)
    return seen


def data(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def put_then_get(s, key, src, out):
    """put_from `src` under `key`, get_into `out`: both succeed and the bytes come back."""
    assert s.put_from(key, src.ctypes.data, src.nbytes) == OK
    assert s.get_into(key, out.ctypes.data, out.nbytes) == OK
    assert np.array_equal(src, out)


def batch_put_then_get(s, keys, vals):
    """batch_put_from ``vals`` under ``keys``, batch_get_into fresh buffers: all succeed and
    the bytes come back."""
    assert s.batch_put_from(keys, [v.ctypes.data for v in vals],
                            [v.nbytes for v in vals]) == [OK] * len(keys)
    outs = [np.zeros_like(v) for v in vals]
    assert s.batch_get_into(keys, [o.ctypes.data for o in outs],
                            [o.nbytes for o in outs]) == [OK] * len(keys)
    assert all(np.array_equal(v, o) for v, o in zip(vals, outs))


def process_state(pid):
    """The state letter of /proc/PID/stat (T: stopped)."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rpartition(")")[2].split()[0]


def put_then_get_each(s, keys, n):
    """put_then_get of ``n`` bytes (seeded by the key) for each of ``keys``."""
    for key in keys:
        put_then_get(s, key, data(n, len(key)), np.zeros(n, dtype=np.uint8))


def test_puts_and_gets_of_an_address_go_the_short_way_and_other_answers_go_on_from_there(
        server, store, monkeypatch):
    """put_from and get_into of an address (the common call) go the short way: the request
    sent and its answer read without the long way's layers (Client.local_start), mapped or
    copied by the server. An answer the short way does not finish (a missing key, a buffer of
    the wrong size, a put refused) goes on from where it is, the long way: one request each,
    the codes the long way gives."""
    warm = data(16, 40)
    assert store.put_from("sw/warm", warm.ctypes.data, warm.nbytes) == OK  # (finds the socket)
    seen = count_transports(monkeypatch)
    long_way = []
    real_on_local = _http.Client._on_local

    def on_local(self, *args, **kwargs):
        long_way.append(args[2])
        return real_on_local(self, *args, **kwargs)

    monkeypatch.setattr(_http.Client, "_on_local", on_local)
    src, out = data(1 << 20, 41), np.zeros(1 << 20, dtype=np.uint8)
    mapped0, counts0 = mapped_gets(server), same_host_counts(server)
    for mapped in ("1", "0"):
        monkeypatch.setenv("MMC_SAME_HOST_MAP", mapped)
        out[:] = 0
        put_then_get(store, "sw/%s" % mapped, src, out)
    assert mapped_gets(server) == mapped0 + 1
    counts = same_host_counts(server)
    assert (counts["puts"], counts["gets"]) == (counts0["puts"] + 2, counts0["gets"] + 2)
    assert long_way == [] and seen == {"unix": 4, "tcp": 0, "pipelined": 0}, (long_way, seen)
    # A missing key; a buffer of the wrong size (nothing written).
    assert store.get_into("sw/missing", out.ctypes.data, out.nbytes) == -3102
    small = np.full(10, 7, dtype=np.uint8)
    assert store.get_into("sw/1", small.ctypes.data, small.nbytes) == INVALID
    assert (small == 7).all()
    # A put of a key that is there: refused (200, success false); upstream's code for it
    # is 0 unless duplicate puts are errors.
    other = data(1 << 20, 42)
    assert store.put_from("sw/1", other.ctypes.data, other.nbytes) == OK
    assert store.get_into("sw/1", out.ctypes.data, out.nbytes) == OK
    assert np.array_equal(src, out)
    assert long_way == ["GET", "GET"] and seen == {"unix": 4 + 4, "tcp": 0, "pipelined": 0}, (
        long_way, seen)
    strict = make_store("http://%s" % server.addr, duplicate_put_is_error=True)
    try:
        # (The first request finds the socket, the long way.)
        assert strict.put_from("sw/strict", other.ctypes.data, other.nbytes) == OK
        assert strict.put_from("sw/1", other.ctypes.data, other.nbytes) == -3006
    finally:
        strict.close()
    assert long_way == ["GET", "GET", "PUT"], long_way


def test_every_data_path_call_goes_over_the_socket_with_bytes_intact(server, store,
                                                                     monkeypatch):
    host, port = server.host, server.port
    assert store._client.local_path(host, port) == socket_path(server)
    seen = count_transports(monkeypatch)
    for n in (1, 4096, 65536, 1 << 20, 5 << 20):
        src, out = data(n, n), np.zeros(n, dtype=np.uint8)
        assert store.put_from("sh/%d" % n, src.ctypes.data, n) == OK
        assert store.get_into("sh/%d" % n, out.ctypes.data, n) == OK
        assert np.array_equal(src, out), n
        # get() returns the same bytes (copied into its thread's shared buffer, or on the
        # socket when larger than it).
        assert store.get("sh/%d" % n) == src.tobytes()
    # Layers, both ways.
    layers = [data(100_000, i) for i in range(3)]
    assert store.put_from_layers("sh/layers", [a.ctypes.data for a in layers],
                                 [a.nbytes for a in layers]) == OK
    outs = [np.zeros(a.nbytes, dtype=np.uint8) for a in layers]
    assert store.get_into_layers("sh/layers", [o.ctypes.data for o in outs],
                                 [o.nbytes for o in outs]) == OK
    assert all(np.array_equal(a, o) for a, o in zip(layers, outs))
    # Batches, and their layer forms.
    keys = ["sh/b%d" % i for i in range(6)]
    vals = [data(300_000 + i, 100 + i) for i in range(6)]
    assert store.batch_put_from(keys, [v.ctypes.data for v in vals],
                                [v.nbytes for v in vals]) == [OK] * 6
    outs = [np.zeros_like(v) for v in vals]
    assert store.batch_get_into(keys + ["sh/missing"], [o.ctypes.data for o in outs] + [
        outs[0].ctypes.data], [o.nbytes for o in outs] + [10]) == [OK] * 6 + [-3102]
    assert all(np.array_equal(v, o) for v, o in zip(vals, outs))
    lkeys = ["sh/lb%d" % i for i in range(3)]
    assert store.batch_put_from_layers(lkeys, [[v.ctypes.data, v.ctypes.data] for v in vals[:3]],
                                       [[v.nbytes, v.nbytes] for v in vals[:3]]) == [OK] * 3
    louts = [[np.zeros_like(v), np.zeros_like(v)] for v in vals[:3]]
    assert store.batch_get_into_layers(lkeys, [[a.ctypes.data, b.ctypes.data] for a, b in louts],
                                       [[a.nbytes, b.nbytes] for a, b in louts]) == [OK] * 3
    assert all(np.array_equal(v, a) and np.array_equal(v, b) for v, (a, b) in zip(vals, louts))
    # A buffer of the wrong size: -3000 and nothing written, as over TCP.
    small = np.full(10, 7, dtype=np.uint8)
    assert store.get_into("sh/4096", small.ctypes.data, 10) == INVALID
    assert (small == 7).all()
    # Every put and get of bytes went over the socket (a batch's keys as single requests sent
    # back to back), get() included.
    assert seen == {"unix": 18, "pipelined": 19, "tcp": 0}, seen
    # A batch whose buffers do not fit some objects: those keys are -3000 (the bytes come on
    # the socket and are dropped, or the connection is closed past 1 MiB), the others intact.
    outs = [np.zeros_like(v) for v in vals]
    wrong = [np.zeros(10, dtype=np.uint8), np.zeros(2 << 20, dtype=np.uint8)]
    bufs = [wrong[0], outs[1], wrong[1], outs[3], outs[4], outs[5], np.zeros(10, np.uint8)]
    assert store.batch_get_into(keys + ["sh/%d" % (5 << 20)], [b.ctypes.data for b in bufs],
                                [b.nbytes for b in bufs]) == [INVALID, OK, INVALID, OK, OK, OK,
                                                              INVALID]
    assert all(np.array_equal(vals[i], outs[i]) for i in (1, 3, 4, 5))
    assert not wrong[0].any() and not wrong[1].any()


def test_each_key_goes_to_the_socket_of_its_owner_shard(server, store, monkeypatch):
    """The server (two shards) has a socket per shard; every single and batch call goes to
    the one of its key's owner, so no shard asks another (the cross-shard count stays)."""
    path = socket_path(server)
    assert store._client.local_path(server.host, server.port) == path
    assert store._client._local_shards[(server.host, server.port)][0] == 2
    paths = record_sockets(monkeypatch)
    before = cross_requests(server)
    ones, twos = keys_of_each_shard("sh/own", 4)
    put_then_get_each(store, ones + twos, 200_000)
    assert sorted(set(paths)) == [path + ".0", path + ".1"], paths
    assert paths.count(path + ".0") == 2 * len(ones)
    batch = ["sh/own/batch/%d" % i for i in range(10)]
    vals = [data(70_000 + i, i) for i in range(10)]
    batch_put_then_get(store, batch, vals)
    assert path not in paths, "a request went to the shared socket"
    assert cross_requests(server) == before, "a shard asked another for a key"


def test_a_shard_socket_that_is_not_the_server_s_is_not_used(monkeypatch):
    """A socket at a shard's path that another process bound (or an earlier server left) is
    recognised by its peer's pid and not used: those keys go to the shared socket, bytes
    intact, and nothing is sent to the impostor."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    srv = Server([])
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s = None
    try:
        path = socket_path(srv)
        os.unlink(path + ".0")
        impostor.bind(path + ".0")
        impostor.listen(16)
        s = make_store("http://%s" % srv.addr)
        assert s._client.local_path(srv.host, srv.port) == path
        seen = count_transports(monkeypatch)
        paths = record_sockets(monkeypatch)
        ones, twos = keys_of_each_shard("sh/impostor", 3)
        put_then_get_each(s, ones + twos, 100_000)
        assert seen["tcp"] == 0 and seen["unix"] == 12, seen
        # The first request to shard 0 found the impostor: from then on the shared socket.
        assert paths[0] in (path + ".0", path + ".1") and path in paths, paths
        impostor.setblocking(False)
        while True:
            try:
                conn, _ = impostor.accept()
            except BlockingIOError:
                break
            conn.settimeout(1)
            assert conn.recv(1) == b"", "a request was sent to the impostor"
            conn.close()
    finally:
        if s is not None:
            s.close()
        impostor.close()
        assert srv.stop() == 0, "".join(srv.log)


@pytest.mark.parametrize("buffers", ["ordinary", "shared", "mapped"])
def test_a_frozen_server_times_the_client_out_and_copies_nothing_once_it_resumes(monkeypatch,
                                                                                 buffers):
    """SIGSTOP on a server the client reaches through its shards' sockets: a get and a put
    wait no longer than the client's timeout and fail with the timeout's code. The client
    closes those connections; when the server resumes it finds the requests in their sockets
    and copies nothing for them: the get's buffer stays as it was, the put stores nothing (a
    copy then would read a buffer the caller has refilled since). The next requests succeed,
    on a shard's socket again. The same with shared buffers, which the server still has
    mapped when it resumes. And with mapped gets (the client copies; the get that timed out
    was answered, if at all, on a connection the client had closed: nothing copied)."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "1" if buffers == "mapped" else "0")
    srv = Server([])
    c = LocalConfig()
    c.meta_service_url = "http://%s" % srv.addr
    c.client_timeout_seconds = 1.0
    s = DistributedObjectStore()
    assert s.setup(c) == 0 and s.init(0) == 0
    try:
        src, out = data(1 << 20, 61), np.zeros(1 << 20, dtype=np.uint8)
        if buffers == "shared":
            src, out = shared_array(s, 1 << 20, seed=61), shared_array(s, 1 << 20)
        put_then_get(s, "sh/frozen", src, out)
        copies = same_host_counts(srv)["shared_copies"]
        assert copies == (2 if buffers == "shared" else 0)
        # get() copies into the thread's own shared buffer.
        assert s.get("sh/frozen") == src.tobytes()
        before_freeze = scratch_of(s)
        copies += 0 if buffers == "mapped" else 1
        assert (mapped_gets(srv) > 0) == (buffers == "mapped")
        out[:] = 0
        path = socket_path(srv)
        paths = record_sockets(monkeypatch)
        srv.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until("the server stopped", lambda: process_state(srv.proc.pid) == "T")
            t0 = time.monotonic()
            assert s.get_into("sh/frozen", out.ctypes.data, out.nbytes) == -3004
            assert s.put_from("sh/frozen/put", src.ctypes.data, src.nbytes) == -3004
            assert time.monotonic() - t0 < 6
            # The caller takes its buffers back: one to read into later, one refilled.
            src[:] = 1
            # A get() that times out gives up its thread's buffer (the server may still write
            # into it when it resumes): the next get() takes another.
            t0 = time.monotonic()
            assert s.get("sh/frozen") == b""
            assert time.monotonic() - t0 < 3
            assert scratch_of(s) is None
            assert before_freeze not in s._client._shared[1]
        finally:
            srv.proc.send_signal(signal.SIGCONT)
        # Both requests were in the server's sockets: give it time to handle them.
        time.sleep(0.5)
        assert not out.any(), "the server wrote into a buffer after its get timed out"
        assert s.is_exist("sh/frozen/put") == 0, "a put that timed out was stored"
        assert same_host_counts(srv)["shared_copies"] == copies
        owners = {path + ".%d" % _http.shard_for(k, 2) for k in (b"sh/frozen", b"sh/frozen/put")}
        assert set(paths) == owners, paths
        src[:] = data(1 << 20, 62)
        put_then_get(s, "sh/frozen/after", src, out)
        assert s.get("sh/frozen/after") == src.tobytes()
        assert scratch_of(s) is not None and scratch_of(s) is not before_freeze
        # (On new connections, which offer the shared buffers again.)
        assert same_host_counts(srv)["shared_copies"] == copies * 2
        put_then_get_each(s, ["sh/frozen/%d" % i for i in range(4)], 4096)
        assert path not in paths, paths
    finally:
        s.close()
        assert srv.stop() == 0, "".join(srv.log)


def same_host_counts(server):
    """memcache_same_host_{shared_copies,shared_refusals,gets,puts}_total, by short name."""
    text = server.get("/metrics").decode()
    return {name: int(float(re.search(r"^memcache_same_host_%s_total (\S+)$" % name, text,
                                      re.M).group(1)))
            for name in ("shared_copies", "shared_refusals", "gets", "puts")}


def held(server):
    """memcache_same_host_held_{answers,bytes}: what same-host connections hold now."""
    text = server.get("/metrics").decode()
    return tuple(int(float(re.search(r"^memcache_same_host_held_%s (\S+)$" % what, text,
                                     re.M).group(1))) for what in ("answers", "bytes"))


def mapped_gets(server):
    """memcache_same_host_mapped_gets_total: gets the client copied from its mapping."""
    text = server.get("/metrics").decode()
    return int(float(re.search(r"^memcache_same_host_mapped_gets_total (\S+)$", text,
                               re.M).group(1)))


def count_offers(monkeypatch):
    """The X-Mmc-Shared offers the client sends (one per connection and buffer)."""
    offers = []
    real = _http.Client._offer

    def offer(self, conn, iov):
        got = real(self, conn, iov)
        if got:
            offers.append(got)
        return got

    monkeypatch.setattr(_http.Client, "_offer", offer)
    return offers


def shared_array(store, n, seed=None):
    """A NumPy array over a new shared buffer of ``n`` bytes (random bytes, or zeros)."""
    b = store.alloc_shared_buffer(n)
    a = np.frombuffer(b.view, dtype=np.uint8)
    if seed is not None:
        a[:] = data(n, seed)
    return a


def test_shared_buffers_are_copied_by_the_server_itself_with_bytes_intact(server, store,
                                                                         monkeypatch):
    # (Gets the server copies: not mapped ones, which the client copies itself.)
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "0")
    offers = count_offers(monkeypatch)
    before = same_host_counts(server)
    # One buffer holds several objects' bytes: puts and gets at offsets in it.
    big = shared_array(store, 4 << 20, seed=1)
    out = shared_array(store, 4 << 20)
    sizes = [1, 4096, 65536, 1 << 20]
    at = 0
    for n in sizes:
        assert store.put_from("sb/%d" % n, big[at:].ctypes.data, n) == OK
        assert store.get_into("sb/%d" % n, out[at:].ctypes.data, n) == OK
        assert np.array_equal(big[at:at + n], out[at:at + n]), n
        assert store.get("sb/%d" % n) == big[at:at + n].tobytes()
        at += n
    # Layers in one buffer, and batches.
    assert store.put_from_layers("sb/layers", [big.ctypes.data, big[5000:].ctypes.data],
                                 [100, 200]) == OK
    assert store.get_into_layers("sb/layers", [out.ctypes.data, out[100:].ctypes.data],
                                 [100, 200]) == OK
    assert np.array_equal(out[:100], big[:100]) and np.array_equal(out[100:300], big[5000:5200])
    keys = ["sb/b%d" % i for i in range(8)]
    assert store.batch_put_from(keys, [big[i * 1000:].ctypes.data for i in range(8)],
                                [500] * 8) == [OK] * 8
    out[:] = 0
    assert store.batch_get_into(keys, [out[i * 500:].ctypes.data for i in range(8)],
                                [500] * 8) == [OK] * 8
    assert all(np.array_equal(out[i * 500:(i + 1) * 500], big[i * 1000:i * 1000 + 500])
               for i in range(8))
    after = same_host_counts(server)
    # Every copy went through the shared mapping: 4 puts, 4 gets into `out` and 4 get()s
    # into the thread's buffer, a layered put and get, 16 batched ones (none through the
    # kernel's copy, none refused).
    assert after["shared_copies"] - before["shared_copies"] == 30, (before, after)
    assert after["shared_refusals"] == before["shared_refusals"]
    assert after["puts"] - before["puts"] == 13 and after["gets"] - before["gets"] == 17
    # Each buffer (`big`, `out`, the get()s' own) offered once per connection that used it
    # (one per shard socket, at most).
    n_shards = store._client._local_shards[(server.host, server.port)][0]
    assert 3 <= len(offers) <= 3 * n_shards, offers
    # Ordinary memory beside them still goes through the kernel.
    plain = data(65536, 9)
    assert store.put_from("sb/plain", plain.ctypes.data, plain.nbytes) == OK
    assert store.get_into("sb/plain", out.ctypes.data, plain.nbytes) == OK
    assert np.array_equal(out[:plain.nbytes], plain)
    # (The get into `out` is a shared copy; the put from `plain` is not.)
    assert same_host_counts(server)["shared_copies"] == after["shared_copies"] + 1


def scratch_of(store):
    """This thread's get() buffer (Client.get_scratch), or None before its first get()."""
    held = getattr(store._client._scratch, "held", None)
    return held.buf if held is not None else None


def test_get_copies_into_the_thread_s_shared_buffer_any_length_up_to_its_size(server, store,
                                                                             monkeypatch):
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "0")
    sizes = [1, 65536, 1 << 20, (1 << 20) + 1, 3 << 20]
    vals = {n: data(n, 200 + n % 97) for n in sizes}
    for n, v in vals.items():
        assert store.put_from("sg/%d" % n, v.ctypes.data, n) == OK
    seen = count_transports(monkeypatch)
    before = same_host_counts(server)
    assert scratch_of(store) is None
    for n in sizes[:3]:
        assert store.get("sg/%d" % n) == vals[n].tobytes(), n
    first = scratch_of(store)
    assert first.size == 1 << 20
    after = same_host_counts(server)
    # Copied by the server into the shared buffer: three gets, three shared copies.
    assert after["gets"] - before["gets"] == 3 and \
        after["shared_copies"] - before["shared_copies"] == 3, (before, after)
    # Larger than the buffer: the bytes come on the socket (not a delivered get), and the
    # thread's buffer grows to the next power of two; the next get of that size is copied.
    assert store.get("sg/%d" % ((1 << 20) + 1)) == vals[(1 << 20) + 1].tobytes()
    assert same_host_counts(server)["gets"] == after["gets"]
    grown = scratch_of(store)
    assert grown.size == 2 << 20 and grown is not first
    assert first not in store._client._shared[1], "the outgrown buffer is freed"
    assert store.get("sg/%d" % ((1 << 20) + 1)) == vals[(1 << 20) + 1].tobytes()
    assert store.get("sg/%d" % (3 << 20)) == vals[3 << 20].tobytes()
    assert store.get("sg/%d" % (3 << 20)) == vals[3 << 20].tobytes()
    assert scratch_of(store).size == 4 << 20
    final = same_host_counts(server)
    assert final["gets"] - after["gets"] == 2, (after, final)
    # A missing key: b"", as over TCP.
    assert store.get("sg/missing") == b""
    assert seen == {"unix": 8, "tcp": 0, "pipelined": 0}, seen


def test_get_batch_copies_each_object_into_its_slot_of_the_thread_s_buffer(server, store,
                                                                          monkeypatch):
    small = {"gb/s%d" % i: data(65536 + i, 400 + i) for i in range(8)}
    large = {"gb/l%d" % i: data(512 << 10, 500 + i) for i in range(4)}
    many = {"gb/m%d" % i: data(1000 + i, 600 + i) for i in range(70)}
    for k, v in {**small, **large, **many}.items():
        assert store.put_from(k, v.ctypes.data, v.nbytes) == OK
    seen = count_transports(monkeypatch)
    before = same_host_counts(server)
    # Eight objects in eight slots of the 1 MiB buffer; a missing and an invalid key: b"".
    keys = list(small) + ["gb/missing", ""]
    assert store.get_batch(keys) == [v.tobytes() for v in small.values()] + [b"", b""]
    after = same_host_counts(server)
    assert after["gets"] - before["gets"] == 8, (before, after)
    assert scratch_of(store).size == 1 << 20
    # Four of 512 KiB do not fit a quarter of it: they come on the socket, and the buffer
    # grows to hold four of them; the same batch again is copied.
    assert store.get_batch(list(large)) == [v.tobytes() for v in large.values()]
    assert same_host_counts(server)["gets"] == after["gets"]
    assert scratch_of(store).size == 2 << 20
    assert store.get_batch(list(large)) == [v.tobytes() for v in large.values()]
    assert same_host_counts(server)["gets"] == after["gets"] + 4
    # More keys than one pipelined group.
    assert store.get_batch(list(many)) == [v.tobytes() for v in many.values()]
    assert same_host_counts(server)["gets"] == after["gets"] + 4 + 70
    assert seen["tcp"] == 0 and seen["pipelined"] == 10 + 4 + 4 + 70 - 1, seen


def test_get_buffers_are_per_thread_and_go_with_their_thread(server, store):
    keys = ["sg/t%d" % i for i in range(8)]
    vals = [data(200_000 + i, 300 + i) for i in range(8)]
    for k, v in zip(keys, vals):
        assert store.put_from(k, v.ctypes.data, v.nbytes) == OK
    shared_before = len(store._client._shared[1])
    scratch_before = scratch_of(store)
    bufs, bad = [], []

    def run(t):
        for r in range(20):
            i = (t + r) % 8
            if store.get(keys[i]) != vals[i].tobytes():
                bad.append((t, r))
        bufs.append(scratch_of(store).ptr)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, bad
    assert len(set(bufs)) == 4, "each thread has a buffer of its own"
    import gc
    gc.collect()
    # The threads ended: their buffers are freed (at this thread's next get).
    assert store.get(keys[0]) == vals[0].tobytes()
    assert len(store._client._shared[1]) == shared_before + (scratch_of(store) is not None and
                                                             scratch_before is None)


def test_an_up_to_iov_is_for_gets_only_and_a_larger_object_comes_on_the_socket(server, store):
    src = data(4096, 11)
    assert store.put_from("sg/raw", src.ctypes.data, src.nbytes) == OK
    out = np.full(8192, 5, dtype=np.uint8)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(socket_path(server))
        # Up to 8192 bytes: the 4096 of the object go into the first bytes.
        s.sendall(("GET /api/v1/objects?key=sg/raw HTTP/1.1\r\nHost: t\r\n"
                   "X-Mmc-Iov: ~%x:%d\r\n\r\n" % (out.ctypes.data, out.nbytes)).encode())
        answer = s.recv(65536).decode("latin-1")
        assert answer.startswith("HTTP/1.1 200") and "x-mmc-delivered: 4096" in \
            answer.lower(), answer
        assert np.array_equal(out[:4096], src) and (out[4096:] == 5).all()
        # Up to 100 bytes: the object is larger, its bytes come on the socket, nothing copied.
        out[:] = 5
        s.sendall(("GET /api/v1/objects?key=sg/raw HTTP/1.1\r\nHost: t\r\n"
                   "X-Mmc-Iov: ~%x:100\r\n\r\n" % out.ctypes.data).encode())
        answer = b""
        while not answer.endswith(src.tobytes()):
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b"x-mmc-delivered" not in answer.lower()
        assert (out == 5).all()
        # Without `~`, a shorter object is not delivered either (get_into's exact length).
        s.sendall(("GET /api/v1/objects?key=sg/raw HTTP/1.1\r\nHost: t\r\n"
                   "X-Mmc-Iov: %x:%d\r\n\r\n" % (out.ctypes.data, out.nbytes)).encode())
        answer = b""
        while not answer.endswith(src.tobytes()):
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
        assert (out == 5).all()
        # On a put, `~` is malformed: 400, nothing stored.
        s.sendall(("PUT /api/v1/objects?key=sg/raw-put HTTP/1.1\r\nHost: t\r\n"
                   "Content-Length: 0\r\nX-Mmc-Iov: ~%x:%d\r\n\r\n"
                   % (src.ctypes.data, src.nbytes)).encode())
        answer = s.recv(65536).decode("latin-1")
        assert answer.startswith("HTTP/1.1 400") and "malformed X-Mmc-Iov" in answer, answer
    assert store.is_exist("sg/raw-put") == 0


def test_a_freed_shared_buffer_gives_its_memory_back_and_is_ordinary_memory_after(server, store):
    b = store.alloc_shared_buffer(1 << 20)
    a = np.frombuffer(b.view, dtype=np.uint8)
    a[:] = data(1 << 20, 12)
    before = same_host_counts(server)
    assert store.put_from("sb/freed", b.ptr, b.size) == OK
    assert same_host_counts(server)["shared_copies"] == before["shared_copies"] + 1
    file = os.dup(b.fd)
    try:
        assert os.fstat(file).st_blocks > 0
        assert store.free_shared_buffer(b) == OK
        assert store.free_shared_buffer(b) == OK  # twice: nothing more
        # Its pages are gone; its addresses stay mapped (to the empty file): zeros.
        assert os.fstat(file).st_blocks == 0
        assert not a.any()
    finally:
        os.close(file)
    assert all(x is not b for x in store._client._shared[1])
    # The stored object is intact; the old addresses are ordinary memory now (no offer).
    out = shared_array(store, 1 << 20)
    assert store.get_into("sb/freed", out.ctypes.data, out.nbytes) == OK
    assert np.array_equal(out, data(1 << 20, 12))
    offers = []
    real = store._client._offer
    store._client._offer = lambda conn, iov: offers.append(real(conn, iov)) or offers[-1]
    assert store.put_from("sb/freed/again", b.ptr, b.size) == OK
    assert store.get("sb/freed/again") == bytes(1 << 20)
    # (The get() offers its thread's own buffer, never the freed one.)
    assert offers[0] is None and not any("%x:" % b.ptr in (o or "") for o in offers)


def unsealed_buffer(client, n, ino_delta=0):
    """A buffer registered with the client as shared, but not sealed against shrinking (or
    offered with another inode number): a server must not trust it."""
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, n)
    b = _http.SharedBuffer.__new__(_http.SharedBuffer)
    b._map = _http.mmap.mmap(fd, n)
    b.fd, b.size, b.ino = fd, n, os.fstat(fd).st_ino + ino_delta
    b.view = memoryview(b._map)
    b.ptr = _http.address_of(b.view)
    starts, bufs = client._shared
    client._shared = (starts + [b.ptr], bufs + [b])
    return b


@pytest.mark.parametrize("ino_delta", [0, 1], ids=["unsealed", "another-file"])
def test_a_buffer_the_server_cannot_trust_is_refused_and_copied_through_the_kernel(
        server, store, ino_delta):
    b = unsealed_buffer(store._client, 1 << 20, ino_delta)
    a = np.frombuffer(b.view, dtype=np.uint8)
    a[:] = data(1 << 20, 4)
    before = same_host_counts(server)
    assert store.put_from("sb/untrusted", b.ptr, b.size) == OK
    out = np.zeros(1 << 20, dtype=np.uint8)
    assert store.get_into("sb/untrusted", out.ctypes.data, out.nbytes) == OK
    assert np.array_equal(a, out)
    after = same_host_counts(server)
    assert after["shared_refusals"] == before["shared_refusals"] + 1, (before, after)
    assert after["shared_copies"] == before["shared_copies"]
    assert after["puts"] == before["puts"] + 1 and after["gets"] == before["gets"] + 1


def test_a_malformed_offer_is_refused_and_the_request_served_all_the_same(server, store):
    src = data(4096, 8)
    store.put_from("sb/malformed", src.ctypes.data, src.nbytes)
    out = np.zeros(4096, dtype=np.uint8)
    before = same_host_counts(server)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(socket_path(server))
        for offer in ("garbage", "1:2:0:5", "3:4:%x:%d,junk" % (out.ctypes.data, 4096)):
            s.sendall(("GET /api/v1/objects?key=sb/malformed HTTP/1.1\r\nHost: t\r\n"
                       "X-Mmc-Iov: %x:%d\r\nX-Mmc-Shared: %s\r\n\r\n"
                       % (out.ctypes.data, out.nbytes, offer)).encode())
            answer = s.recv(65536).decode("latin-1")
            assert answer.startswith("HTTP/1.1 200") and "x-mmc-delivered: 4096" in \
                answer.lower(), answer
    assert np.array_equal(src, out)
    after = same_host_counts(server)
    assert after["shared_refusals"] == before["shared_refusals"] + 3, (before, after)
    assert after["shared_copies"] == before["shared_copies"]


DYING_SHARED_CLIENT = r"""
import fcntl, mmap, os, socket, sys
n = 32 << 20
fd = os.memfd_create("dying", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, n)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
m = mmap.mmap(fd, n)
m[:] = b"\x44" * n
import ctypes
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(("PUT /api/v1/objects?key=%s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
           "X-Mmc-Iov: %x:%d\r\nX-Mmc-Shared: %d:%d:%x:%d\r\n\r\n"
           % (sys.argv[2], addr, n, fd, os.fstat(fd).st_ino, addr, n)).encode())
if sys.argv[3] == "wait":
    print(s.recv(4096).decode("latin-1").split("\r\n")[0])
os._exit(0)
"""


def test_a_put_from_a_shared_buffer_whose_client_dies_is_whole_or_absent(server, store):
    path = socket_path(server)
    # The same client waiting for its answer: stored, through the shared mapping.
    before = same_host_counts(server)
    ok = subprocess.run([sys.executable, "-c", DYING_SHARED_CLIENT, path, "sb/kept", "wait"],
                        timeout=60, capture_output=True, text=True)
    assert ok.stdout.startswith("HTTP/1.1 200"), (ok.stdout, ok.stderr)
    assert store.get("sb/kept") == b"\x44" * (32 << 20)
    assert same_host_counts(server)["shared_copies"] == before["shared_copies"] + 1
    # Killed right after sending (the server's mapping keeps the file's pages): the object is
    # stored whole or not at all, never in part; the server is unharmed.
    for i in range(3):
        child = subprocess.run([sys.executable, "-c", DYING_SHARED_CLIENT, path,
                                "sb/dying%d" % i, "exit"], timeout=60)
        assert child.returncode == 0
        got = store.get("sb/dying%d" % i)
        assert got in (b"", b"\x44" * (32 << 20)), len(got)
    assert server.get("/health")


def test_an_answer_is_polled_for_up_to_the_spin_time_then_read_blocking(monkeypatch):
    assert _http._spin_seconds(None) == pytest.approx(300e-6)
    assert _http._spin_seconds("0") == 0.0
    assert _http._spin_seconds("50") == pytest.approx(50e-6)
    assert _http._spin_seconds("-1") == 0.0 and _http._spin_seconds("x") == pytest.approx(300e-6)
    monkeypatch.setenv("MMC_SAME_HOST_SPIN_US", "0")
    assert _http.Client("http://127.0.0.1:1").spin_s == 0.0

    a, b = socket.socketpair()
    conn = _http.Connection.__new__(_http.Connection)
    conn.sock, conn.rbuf = a, bytearray()
    polls = []
    real_recv = a.recv

    class Counting:
        def recv(self, n, flags=0):
            polls.append(flags)
            return real_recv(n, flags)

    conn.sock = Counting()
    waiting = {}
    try:
        # Nothing comes: it polls (without blocking) until the time is up, buffers nothing.
        t0 = time.perf_counter()
        conn.wait_spinning(0.02, waiting)
        assert 0.02 <= time.perf_counter() - t0 < 1.0
        assert len(polls) > 1 and set(polls) == {socket.MSG_DONTWAIT} and conn.rbuf == b""
        assert waiting == {}
        # An answer sent meanwhile is taken by a poll and buffered for the read that follows.
        polls.clear()
        threading.Timer(0.005, b.send, args=(b"HTTP/1.1 200 OK\r\n\r\n",)).start()
        conn.wait_spinning(5.0, waiting)
        assert conn.rbuf == b"HTTP/1.1 200 OK\r\n\r\n" and len(polls) > 1
        # Bytes already buffered, or no spin time: no poll at all.
        polls.clear()
        conn.wait_spinning(5.0, waiting)
        conn.rbuf = bytearray()
        conn.wait_spinning(0.0, waiting)
        # Another thread of the client waiting too: this one sleeps instead (no poll).
        waiting[-1] = True
        conn.wait_spinning(5.0, waiting)
        assert polls == [] and waiting == {-1: True}
        del waiting[-1]
        # The server closed: the poll returns at once and the blocking read says so.
        b.close()
        conn.wait_spinning(5.0, waiting)
        assert conn.rbuf == b""
        with pytest.raises(EOFError):
            conn._fill()
    finally:
        a.close()


def test_mmc_transport_tcp_forces_tcp(server, monkeypatch):
    monkeypatch.setenv("MMC_TRANSPORT", "tcp")
    s = make_store("http://%s" % server.addr)
    try:
        seen = count_transports(monkeypatch)
        put_then_get(s, "sh/tcp", data(1 << 20, 3), np.zeros(1 << 20, dtype=np.uint8))
        assert s._client.local_path(server.host, server.port) is None
        assert seen["unix"] == 0 and seen["tcp"] >= 2
    finally:
        s.close()


def test_a_put_is_copied_once_and_a_failed_copy_stores_nothing(server, store):
    # Changing the buffer after the put changes nothing stored.
    buf = data(1 << 20, 5)
    first = buf.copy()
    assert store.put_from("sh/once", buf.ctypes.data, buf.nbytes) == OK
    buf[:] = 0
    assert store.get("sh/once") == first.tobytes()
    # A request naming memory that is not the client's: the server's copy fails, the
    # allocation is aborted, the key is not readable (a client dying mid-copy is the same:
    # its memory is gone).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    base = libc.mmap(None, 1 << 21, 3, 0x22, -1, 0)
    ctypes.memset(base, 0x5A, 1 << 20)
    assert libc.munmap(base + (1 << 20), 1 << 20) == 0
    path = socket_path(server)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(("PUT /api/v1/objects?key=sh/torn HTTP/1.1\r\nHost: t\r\nContent-Length: 0"
                   "\r\nX-Mmc-Iov: %x:%d\r\n\r\n" % (base, 1 << 21)).encode())
        answer = s.recv(65536).decode("latin-1")
    assert answer.startswith("HTTP/1.1 400"), answer
    assert "same-host copy failed" in answer
    assert store.is_exist("sh/torn") == 0
    libc.munmap(base, 1 << 20)
    # A client that exits right after sending its put: the object is stored whole (its
    # memory was copied before it was gone) or not at all, never in part.
    child = subprocess.run([sys.executable, "-c", DYING_CLIENT, path], timeout=60)
    assert child.returncode == 0
    got = store.get("sh/dying")
    assert got in (b"", bytes([0x33]) * (32 << 20)), len(got)


DYING_CLIENT = r"""
import ctypes, os, socket, sys
buf = ctypes.create_string_buffer(b"\x33" * (32 << 20), 32 << 20)
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(("PUT /api/v1/objects?key=sh/dying HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
           "X-Mmc-Iov: %x:%d\r\n\r\n" % (ctypes.addressof(buf), 32 << 20)).encode())
os._exit(0)
"""


def test_a_read_holds_its_lease_while_the_server_copies(server, store):
    """Readers get_into a key while a writer removes and puts it again with other bytes: a
    successful read is always one whole version (the blob it copies from is leased and pinned
    until the copy ends, so never freed and reused under it)."""
    n = 1 << 20
    stop = threading.Event()
    torn = []
    reads = [0]

    def writer():
        v = 1
        while not stop.is_set():
            src = np.full(n, v % 251 + 1, dtype=np.uint8)
            store.remove("sh/lease")
            store.put_from("sh/lease", src.ctypes.data, n)
            v += 1

    def reader():
        out = np.zeros(n, dtype=np.uint8)
        while not stop.is_set():
            out[:] = 0
            if store.get_into("sh/lease", out.ctypes.data, n) == OK:
                reads[0] += 1
                if not (out == out[0]).all() or out[0] == 0:
                    torn.append(int(out[0]))

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader)
                                                   for _ in range(2)]
    for t in threads:
        t.start()
    threading.Event().wait(3)
    stop.set()
    for t in threads:
        t.join(30)
    assert torn == []
    assert reads[0] > 0


OTHER_USER_CLIENT = r"""
import json, os, socket, sys
import numpy as np
from mmc_client import DistributedObjectStore, LocalConfig
url, path = sys.argv[1], sys.argv[2]
out = {"uid": os.geteuid()}
# The socket itself: closed to this user, or refused with 403 when the test opened it.
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    except OSError:
        pass  # the server may have answered and closed already
    out["raw"] = s.recv(4096).decode("latin-1").split("\r\n")[0]
except OSError as e:
    out["raw"] = "error: %s" % e.strerror
c = LocalConfig()
c.meta_service_url = url
st = DistributedObjectStore()
st.setup(c)
assert st.init(0) == 0
src = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
dst = np.zeros_like(src)
out["put"] = st.put_from("sh/other", src.ctypes.data, src.nbytes)
out["get"] = st.get_into("sh/other", dst.ctypes.data, dst.nbytes)
out["intact"] = bool(np.array_equal(src, dst))
host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
out["local"] = st._client.local_path(host, int(port))
out["unix_pooled"] = any(k[0].startswith("unix:") for k in st._client.pool._idle)
st.close()
print(json.dumps(out))
"""


def run_as_nobody(server, path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    env = {k: v for k, v in os.environ.items() if k not in ("MMC_TRANSPORT",)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        sys.executable, "-c", OTHER_USER_CLIENT, "http://%s" % server.addr, path],
                       capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_client_of_another_user_gets_tcp_and_correct_bytes(server):
    path = socket_path(server)
    # As started: the socket's directory and the socket are the server user's alone.
    out = run_as_nobody(server, path)
    assert out["uid"] != 0
    assert out["raw"].startswith("error"), out
    assert (out["put"], out["get"], out["intact"]) == (0, 0, True), out
    assert out["local"] is None and not out["unix_pooled"], out
    # Opened to everyone: the server still refuses another user's process (SO_PEERCRED),
    # and the client falls back to TCP by itself.
    d = os.path.dirname(path)
    dmode, smode = os.stat(d).st_mode, os.stat(path).st_mode
    os.chmod(d, 0o755)
    os.chmod(path, 0o777)
    try:
        out = run_as_nobody(server, path)
    finally:
        os.chmod(d, stat.S_IMODE(dmode))
        os.chmod(path, stat.S_IMODE(smode))
    assert out["raw"].startswith("HTTP/1.1 403"), out
    assert (out["put"], out["get"], out["intact"]) == (0, 0, True), out
    assert out["local"] is None and not out["unix_pooled"], out


def test_a_socket_of_another_server_at_the_advertised_path_is_not_used(server, tmp_path,
                                                                       monkeypatch):
    """The client checks that the socket answers as the same process as the TCP port: a
    server at another port whose socket sits at the path the first advertises is not it."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    other = Server(["--set", "ock.mmc.http.same_host_socket=%s" % (tmp_path / "o.sock")])
    try:
        c = _http.Client("http://%s" % server.addr)
        real = c._exchange

        def lying(method, host, port, target, *a, **k):
            resp = real(method, host, port, target, *a, **k)
            if target == "/health" and "x-mmc-same-host" in resp.headers:
                ident = resp.headers["x-mmc-same-host"].split(" ", 1)[0]
                resp.headers["x-mmc-same-host"] = "%s %s" % (ident, tmp_path / "o.sock")
            return resp

        c._exchange = lying
        assert c.local_path(server.host, server.port) is None
        c.close()
    finally:
        assert other.stop() == 0


@pytest.mark.parametrize("mapped", [False, True], ids=["copied", "mapped"])
def test_a_server_killed_and_restarted_on_its_port_is_taken_up_again(monkeypatch, mapped):
    """kill -9 and a restart on the same port: the client's pooled same-host connection and
    socket fail, its requests go over TCP with their bytes intact, and once the rediscovery
    interval has passed it finds the new process's socket and uses it again. Mapped: the
    client maps the new process's segments, and lets the dead one's go."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "1" if mapped else "0")
    monkeypatch.setattr(_http, "_REDISCOVER_SECONDS", 0.3)
    listen = "127.0.0.1:%d" % free_port()
    first = Server([], listen=listen)
    second = None
    s = make_store("http://%s" % first.addr)
    try:
        seen = count_transports(monkeypatch)
        src, out = data(1 << 20, 41), np.zeros(1 << 20, dtype=np.uint8)
        put_then_get(s, "sh/restart/0", src, out)
        assert seen["unix"] >= 2
        # Shared buffers offered to the first process.
        sh_src, sh_out = shared_array(s, 1 << 20, seed=43), shared_array(s, 1 << 20)
        put_then_get(s, "sh/restart/shared", sh_src, sh_out)
        # (A mapped get is the client's copy: only the put is the server's.)
        assert same_host_counts(first)["shared_copies"] == (1 if mapped else 2)
        assert (mapped_gets(first) == 2) == mapped
        assert any(k[0] == first.proc.pid for k in _mapped._segments) == mapped
        path = s._client.local_path(first.host, first.port)
        assert path is not None
        first.proc.kill()
        first.proc.wait(15)
        # While it is down: the request fails (no retries configured), nothing is written.
        out[:] = 0
        assert s.get_into("sh/restart/0", out.ctypes.data, out.nbytes) != OK
        assert not out.any()
        assert s._client.local_path(first.host, first.port) is None, "its socket failed"
        second = Server([], listen=listen)
        # Right after the restart, TCP carries the requests, bytes intact.
        tcp_before = seen["tcp"]
        put_then_get(s, "sh/restart/1", src, out)
        assert seen["tcp"] >= tcp_before + 2
        # Then the new process's socket (at the same path: the same port) is used again.
        before = seen["unix"]

        def back_on_the_socket():
            out[:] = 0
            assert s.get_into("sh/restart/1", out.ctypes.data, out.nbytes) == OK
            assert np.array_equal(src, out)
            return seen["unix"] > before

        wait_until("the client uses the restarted server's socket", back_on_the_socket)
        assert s._client.local_path(second.host, second.port) == path
        assert socket_path(second) == path
        # The same shared buffers work with the new process: offered again on its connections.
        sh_out[:] = 0
        put_then_get(s, "sh/restart/shared", sh_src, sh_out)
        assert same_host_counts(second)["shared_copies"] == (1 if mapped else 2)
        if mapped:
            assert any(k[0] == second.proc.pid for k in _mapped._segments)
            assert not any(k[0] == first.proc.pid for k in _mapped._segments), \
                "the dead server's segments are let go"
    finally:
        s.close()
        first.proc.kill()
        first.proc.wait(15)
        if second is not None:
            assert second.stop() == 0, "".join(second.log)


def test_through_a_meta_to_the_local_service_on_this_host(monkeypatch):
    """A pure meta and a local service on this host: a put or get goes to the meta's socket,
    which answers 307 to the local service holding the blob (under its grant); the client
    follows it to that local service's own socket, where the bytes are copied."""
    from test_cluster_client import Cluster

    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    c = Cluster()
    try:
        s = make_store("http://%s" % c.meta.addr)
        seen = count_transports(monkeypatch)
        hops, grants = [], []

        def redirected(method, target, host, port):
            hops.append(port)
            grants.append((method, target, host, port))

        s._client.on_redirect = redirected
        src = data(3 << 20, 11)
        out = np.zeros_like(src)
        assert s.put_from("sh/cl", src.ctypes.data, src.nbytes) == OK
        assert s.get_into("sh/cl", out.ctypes.data, out.nbytes) == OK
        assert np.array_equal(src, out)
        keys = ["sh/cl%d" % i for i in range(4)]
        vals = [data(200_000, 20 + i) for i in range(4)]
        batch_put_then_get(s, keys, vals)
        # get() and get_batch follow the meta's 307 into the thread's shared buffer.
        hops_before = len(hops)
        copied = sum(same_host_counts(l)["gets"] for l in c.locals)
        assert s.get("sh/cl") == src.tobytes()
        assert s.get_batch(keys + ["sh/cl-missing"]) == [v.tobytes() for v in vals] + [b""]
        assert len(hops) - hops_before == 5, hops
        # (The 3 MiB object came on the socket: larger than the thread's first buffer.)
        assert sum(same_host_counts(l)["gets"] for l in c.locals) - copied == 4
        local_ports = {l.port for l in c.locals}
        assert hops and set(hops) <= local_ports, hops
        for l in c.locals:
            if l.port in hops:
                assert s._client.local_path(l.host, l.port) == socket_path(l)
        # A write grant is used once: the same Location sent again on the local service's
        # socket with other bytes is refused before any of them lands.
        method, target, host, port = next(g for g in grants if g[0] == "PUT")
        other = data(3 << 20, 99)
        with socket.socket(socket.AF_UNIX) as u:
            u.connect(socket_path(next(l for l in c.locals if l.port == port)))
            u.sendall(("PUT %s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nX-Mmc-Iov: %x:%d"
                       "\r\n\r\n" % (target, other.ctypes.data, other.nbytes)).encode())
            answer = u.recv(65536).decode("latin-1")
        assert answer.startswith("HTTP/1.1 403"), answer
        assert s.get_into("sh/cl", out.ctypes.data, out.nbytes) == OK
        assert np.array_equal(src, out)
        # The meta's and the local services' sockets carried every request with bytes; TCP
        # only asked each server's /health once, for its socket.
        assert seen["tcp"] <= 1 + len(c.locals), seen
        s.close()
    finally:
        codes = c.stop()
        assert codes == [0] * len(codes), "".join(c.meta.log)


def test_a_server_and_client_of_one_unprivileged_user_use_the_socket():
    """The usual deployment: server and client run as one ordinary user (no CAP_SYS_PTRACE);
    the server's copies into the client's memory are allowed as for any process of the user."""
    from conftest import SERVER

    if os.geteuid() != 0:
        pytest.skip("needs root to start both as another user")
    proc = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             SERVER, "--listen", "127.0.0.1:0", "--shards", "2"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        addr = None
        for line in proc.stderr:
            m = re.search(r"listening on http://(\S+)", line)
            if m:
                addr = m.group(1)
                break
        assert addr, "the server did not start"
        threading.Thread(target=proc.stderr.read, daemon=True).start()

        class At:
            pass

        srv = At()
        srv.addr = addr
        srv.host, port = addr.rsplit(":", 1)
        srv.port = int(port)
        path = socket_path(srv)
        out = run_as_nobody(srv, path)
        assert out["raw"].startswith("HTTP/1.1 200"), out
        assert (out["put"], out["get"], out["intact"]) == (0, 0, True), out
        assert out["local"] == path and out["unix_pooled"], out
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def segment_mappings():
    """This process's mappings of a server's segment files: their permissions."""
    with open("/proc/self/maps") as f:
        return [line.split()[1] for line in f if "memfd:mmc-dram-segment" in line]


def test_mapped_gets_are_copied_by_the_client_from_a_read_only_mapping(server, store,
                                                                       monkeypatch):
    """With mapped gets (the default), every get form is answered with the blobs' places and
    copied by the client from its own read-only mapping of the segment, each segment mapped
    once; bytes intact, nothing on TCP, no copy by the server."""
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "1")
    sizes = [1, 4096, 65536, 1 << 20, 3 << 20]
    vals = {n: data(n, 700 + n % 89) for n in sizes}
    for n, v in vals.items():
        assert store.put_from("mg/%d" % n, v.ctypes.data, n) == OK
    small = {"mg/s%d" % i: data(1000 + i, 800 + i) for i in range(8)}
    for k, v in small.items():
        assert store.put_from(k, v.ctypes.data, v.nbytes) == OK
    seen = count_transports(monkeypatch)
    before, mapped_before = same_host_counts(server), mapped_gets(server)
    maps_before = _mapped.mappings_made
    for n, v in vals.items():
        out = np.zeros(n, dtype=np.uint8)
        assert store.get_into("mg/%d" % n, out.ctypes.data, n) == OK
        assert np.array_equal(out, v), n
    for n in sizes[:3]:
        assert store.get("mg/%d" % n) == vals[n].tobytes()
    v = vals[65536]
    a, b = np.zeros(1000, dtype=np.uint8), np.zeros(65536 - 1000, dtype=np.uint8)
    assert store.get_into_layers("mg/65536", [a.ctypes.data, b.ctypes.data],
                                 [a.nbytes, b.nbytes]) == OK
    assert np.array_equal(np.concatenate([a, b]), v)
    outs = {k: np.zeros(x.nbytes, dtype=np.uint8) for k, x in small.items()}
    assert store.batch_get_into(list(small), [o.ctypes.data for o in outs.values()],
                                [o.nbytes for o in outs.values()]) == [OK] * 8
    assert all(np.array_equal(outs[k], small[k]) for k in small)
    assert store.get_batch(list(small)) == [x.tobytes() for x in small.values()]
    # A buffer of the wrong size: refused as before, nothing written, nothing mapped.
    wrong = np.zeros(4095, dtype=np.uint8)
    assert store.get_into("mg/4096", wrong.ctypes.data, wrong.nbytes) == INVALID
    assert not wrong.any()
    after = same_host_counts(server)
    assert mapped_gets(server) - mapped_before == 5 + 3 + 1 + 8 + 8
    assert after["shared_copies"] == before["shared_copies"]
    assert seen["tcp"] == 0, seen
    # Into a buffer the client shares: mapped up to 2 MiB; larger, the server copies it
    # itself, in two halves at once (faster than the client's one memmove).
    for n, copied in ((1 << 20, 0), (3 << 20, 1)):
        sh = shared_array(store, n)
        mapped0, shared0 = mapped_gets(server), same_host_counts(server)["shared_copies"]
        assert store.get_into("mg/%d" % n, sh.ctypes.data, n) == OK
        assert np.array_equal(sh, vals[n]), n
        assert mapped_gets(server) - mapped0 == 1 - copied
        assert same_host_counts(server)["shared_copies"] - shared0 == copied
    # One mapping per segment the objects were in, read-only and shared, whatever the gets.
    assert _mapped.mappings_made - maps_before <= 2
    perms = segment_mappings()
    assert perms and all(p == "r--s" for p in perms), perms


def page_offset_array(n, at):
    """``n`` bytes of a fresh array starting ``at`` bytes into a page (the array, the address)."""
    room = np.zeros(n + 8192, dtype=np.uint8)
    start = (at - room.ctypes.data) % 4096
    return room, room.ctypes.data + start


def test_a_mapped_copy_1_to_31_bytes_past_its_source_modulo_a_page_skips_rep_movsb(
        server, store, monkeypatch):
    """glibc's memmove copies 2112 bytes up to the L2 cache's size (512 KiB here) with ``rep
    movsb``, some 20x slower on AMD Zen 3 when the destination is 1 to 31 bytes past the
    source modulo 4096, as a get from a blob (on a page) into numpy's array (16 bytes into
    one) is: those copies take glibc's SSE2 copy, the others memmove; bytes intact either
    way, and a get so takes it."""
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "1")
    if platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc":
        assert _mapped._plain is not None, "no memcpy@GLIBC_2.2.5 on x86_64 glibc"
    if _mapped._plain is None:
        pytest.skip("no SSE2 copy here (not x86_64 glibc)")
    calls = []
    plain, memmove = _mapped._plain, _mapped._memmove
    monkeypatch.setattr(_mapped, "_plain", lambda d, s, n: (calls.append("sse2"), plain(d, s, n)))
    monkeypatch.setattr(_mapped, "_memmove",
                        lambda d, s, n: (calls.append("memmove"), memmove(d, s, n)))
    src_room, src = page_offset_array(_mapped._ALIASED_MAX, 0)
    src_room[:] = np.arange(src_room.size, dtype=np.uint64).astype(np.uint8) * 7
    for rel in (0, 1, 16, 31, 32, 64, 4095):
        for n in (_mapped._ALIASED_MIN - 1, _mapped._ALIASED_MIN, 70000,
                  _mapped._ALIASED_MAX):
            room, dst = page_offset_array(n, rel)
            calls.clear()
            _mapped._copy(dst, src, n)
            want = "sse2" if 1 <= rel <= 31 and _mapped._ALIASED_MIN <= n < _mapped._ALIASED_MAX \
                else "memmove"
            assert calls == [want], (rel, n, calls)
            got = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(dst))
            start = src - src_room.ctypes.data
            assert np.array_equal(got, src_room[start:start + n]), (rel, n)
    # A get of a 256 KiB object into an array 16 bytes into a page: the blob is on a page.
    v = data(min(256 << 10, _mapped._ALIASED_MAX // 2), 917)
    assert store.put_from("alias/256k", v.ctypes.data, v.nbytes) == OK
    for at, want in ((16, "sse2"), (64, "memmove")):
        room, dst = page_offset_array(v.nbytes, at)
        calls.clear()
        assert store.get_into("alias/256k", dst, v.nbytes) == OK
        assert calls == [want], (at, calls)
        got = np.ctypeslib.as_array((ctypes.c_uint8 * v.nbytes).from_address(dst))
        assert np.array_equal(got, v)


def raw_mapped_get(sock, key, dest, done):
    """A same-host GET of ``key`` into ``dest`` asking for a mapped answer (X-Mmc-Map: done);
    returns the answer's headers, its body read."""
    sock.sendall(("GET /api/v1/objects?key=%s HTTP/1.1\r\nHost: t\r\nX-Mmc-Iov: %x:%d\r\n"
                  "X-Mmc-Map: %d\r\n\r\n" % (key, dest.ctypes.data, dest.nbytes, done))
                 .encode())
    data_ = b""
    while b"\r\n\r\n" not in data_:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data_ += chunk
    head, _, body = data_.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        body += sock.recv(65536)
    return headers


def test_a_mapped_get_holds_its_lease_until_the_client_is_done_or_closes(monkeypatch):
    """The blob a mapped answer names stays allocated and the object's (pinned: not freed,
    not reused) while the connection holds its lease, through a remove of its key and puts
    of others, and /metrics counts it held; once the client says it is done (X-Mmc-Map: LEASE
    on its next request), or closes the connection, it is freed and no longer counted."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    srv = Server(["--set", "ock.mmc.local_service.dram.size=16MB",
                  "--set", "ock.mmc.local_service.hbm.size=0"])
    s = make_store("http://%s" % srv.addr)
    path = socket_path(srv)
    n = 1 << 20
    dest = np.zeros(n, dtype=np.uint8)
    fill = data(n, 901)

    def allocated():
        text = srv.get("/metrics").decode()
        return int(float(re.search(r'^memcache_allocated_bytes\{medium="dram"\} (\S+)$', text,
                                   re.M).group(1)))

    def mapped_view(sock, key):
        headers = raw_mapped_get(sock, key, dest, 0)
        lease, ranges, _ = _mapped.parse(headers["x-mmc-mapped"])
        assert len(ranges) == 1 and ranges[0][3] == n, ranges
        pid = _http._peer_cred(sock)[0]
        fd, ino, off, length = ranges[0]
        seg = _mapped._map(pid, fd, ino, off + length)
        seg.users -= 1
        view = np.frombuffer((ctypes.c_ubyte * length).from_address(seg.base + off),
                             dtype=np.uint8)
        return lease, view

    try:
        for how in ("done", "close"):
            obj = data(n, 902)
            assert s.put_from("ml/" + how, obj.ctypes.data, n) == OK
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            lease, view = mapped_view(sock, "ml/" + how)
            assert np.array_equal(view, obj)
            assert not dest.any(), "a mapped get writes nothing into the client's buffer"
            assert s.remove("ml/" + how) == OK
            for i in range(8):
                assert s.put_from("ml/%s/%d" % (how, i), fill.ctypes.data, n) == OK
                assert s.remove("ml/%s/%d" % (how, i)) == OK
            time.sleep(0.2)
            assert allocated() == n, "the held blob was freed"
            assert np.array_equal(view, obj), "the held blob was reused"
            assert held(srv) == (1, n)
            if how == "done":
                headers = raw_mapped_get(sock, "ml/missing", dest, lease)
                assert "x-mmc-mapped" not in headers
            else:
                sock.close()
            wait_until("the blob is freed (%s)" % how, lambda: allocated() == 0)
            assert held(srv) == (0, 0)
            sock.close()
    finally:
        s.close()
        assert srv.stop() == 0, "".join(srv.log)


def test_a_mapped_copy_counts_only_if_its_connection_stayed_open():
    """The client's check after copying from a mapped blob: an open connection passes, with
    answers queued on it or not; one the server has shut down (which it does before letting
    its pins go) fails the copy, queued answers or not."""
    a, b = socket.socketpair()
    try:
        _mapped._check_open(a.fileno())
        b.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        _mapped._check_open(a.fileno())
        b.shutdown(socket.SHUT_RDWR)
        with pytest.raises(EOFError):
            _mapped._check_open(a.fileno())
    finally:
        a.close()
        b.close()


def test_a_client_that_cannot_map_the_segments_has_the_server_copy(server, store, monkeypatch):
    """Mapped gets off (MMC_SAME_HOST_MAP=0), or a server whose segment files this process
    cannot open: the server copies each get as before, bytes intact."""
    monkeypatch.setattr(_mapped, "_unmappable", set())
    monkeypatch.setattr(_mapped, "_segments", {})
    src, out = data(1 << 20, 903), np.zeros(1 << 20, dtype=np.uint8)
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "0")
    before, mapped_before = same_host_counts(server), mapped_gets(server)
    put_then_get(store, "mc/off", src, out)
    assert mapped_gets(server) == mapped_before
    assert same_host_counts(server)["gets"] == before["gets"] + 1
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "1")
    real_open = os.open

    def refuse(p, *a, **k):
        if p.startswith("/proc/"):
            raise PermissionError(13, "denied", p)
        return real_open(p, *a, **k)

    monkeypatch.setattr(_mapped.os, "open", refuse)
    out[:] = 0
    # The first get's answer cannot be copied: that get goes again (over TCP) ...
    assert store.get_into("mc/off", out.ctypes.data, out.nbytes) == OK
    assert np.array_equal(src, out)
    assert server.proc.pid in _mapped._unmappable
    # ... and this server is no longer asked for mapped answers: it copies.
    monkeypatch.setattr(_http, "_REDISCOVER_SECONDS", 0.0)
    gets = same_host_counts(server)["gets"]
    wait_until("the socket is used again",
               lambda: store.get_into("mc/off", out.ctypes.data, out.nbytes) == OK
               and same_host_counts(server)["gets"] > gets)
    assert np.array_equal(src, out)
    assert not any(k[0] == server.proc.pid for k in _mapped._segments)


@pytest.mark.parametrize("driver", ["auto", "uring", "epoll"])
def test_a_shard_polling_a_same_host_connection_still_serves_its_others(monkeypatch, driver):
    """After answering on a same-host connection the shard polls it for the next request
    (ock.mmc.http.same_host_spin_us, here 100 ms): meanwhile the shard's other connections,
    same-host (both on shard 0's own socket) and new TCP ones, are answered at once, not after
    it, on every io driver (the epoll driver does not poll)."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    srv = Server(["--set", "ock.mmc.http.same_host_spin_us=100000"], driver=driver)
    try:
        path = socket_path(srv) + ".0"
        first, second = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
        first.connect(path)
        second.connect(path)
        head = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
        slowest = 0.0
        for _ in range(6):
            first.sendall(head)
            assert first.recv(65536).startswith(b"HTTP/1.1 200")
            # The shard now polls `first` for up to 100 ms.
            t0 = time.monotonic()
            assert srv.get("/health")
            second.sendall(head)
            assert second.recv(65536).startswith(b"HTTP/1.1 200")
            slowest = max(slowest, time.monotonic() - t0)
        assert slowest < 0.05, "answered after %.0f ms" % (slowest * 1e3)
        first.close()
        second.close()
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_a_forked_child_never_uses_its_parent_s_same_host_connections(server, store,
                                                                      monkeypatch):
    """A same-host connection names the memory of the process that opened it: a child forked
    with the parent's pooled connections opens its own (the pool knows which process it runs
    in through os.register_at_fork, not a getpid per request). Were the child to send its get
    on the parent's connection, the server would copy the bytes into the parent's buffer at
    that address (the child's is a copy-on-write copy at the same address), and the child's
    would stay zero. (Gets the server copies: a mapped get is copied by the child itself.)"""
    monkeypatch.setenv("MMC_SAME_HOST_MAP", "0")
    n = 256 << 10
    src = data(n, 61)
    out = np.zeros(n, dtype=np.uint8)
    put_then_get(store, "fork/a", src, out)
    assert store._client.pool.idle_count() > 0
    out[:] = 0
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if store.get_into("fork/a", out.ctypes.data, n) == OK and np.array_equal(out, src) \
                    and store.put_from("fork/b", src.ctypes.data, n) == OK:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # Nothing was written into the parent's buffer, and its connections still work.
    assert not out.any()
    assert store.get_into("fork/b", out.ctypes.data, n) == OK and np.array_equal(out, src)
