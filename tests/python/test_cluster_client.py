"""mmc_client against a cluster: a pure meta service (no rank of its own) and two local
services. Puts and gets follow the meta's 307 to the local service that holds the blob, bodies
go once (a counting proxy in front of the meta sees only heads), batch puts fall back to single
puts, a killed local service's replicated objects stay readable; and an HA pair on a real etcd
(standby URL first, then the leader killed). mmcctl with a URL list and remote segments."""

import ctypes
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import cluster_ready
from conftest import Server, free_port, wait_until
from mmc_client import DistributedObjectStore, LocalConfig, ReplicateConfig, errors

OK = errors.MMC_OK
SIZES = [1, 1000, 64 * 1024, 300 * 1024, 2 << 20]
MMCCTL = os.path.join(os.path.dirname(sys.executable), "mmcctl")


def data_of(tag, size):
    d = hashlib.sha256(tag.encode()).digest() * (size // 32 + 1)
    return d[:size]


def local_service(meta, extra=()):
    return Server(["--role", "local",
                   "--set", "ock.mmc.meta_service_url=http://%s" % meta.addr,
                   "--set", "ock.mmc.local_service.dram.size=64MB",
                   "--set", "ock.mmc.local_service.hbm.size=0",
                   "--set", "ock.mmc.cluster.heartbeat_interval_ms=200"] + list(extra))


class Cluster:
    def __init__(self):
        self.meta = Server(["--set", "ock.mmc.embedded.ranks=0",
                            "--set", "ock.mmc.cluster.heartbeat_timeout_ms=1500"])
        self.locals = []
        try:
            for _ in range(2):
                self.locals.append(local_service(self.meta))
            wait_until("both ranks joined", lambda: cluster_ready.ready_count(self.meta.get) == 2)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        codes = [s.stop() for s in self.locals] + [self.meta.stop()]
        return codes


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    codes = c.stop()
    assert codes == [0] * len(codes), "".join(c.meta.log)


def make_store(url, **cfg):
    c = LocalConfig()
    c.meta_service_url = url
    c.client_timeout_seconds = 20
    c.client_retry_milliseconds = 3000
    for k, v in cfg.items():
        setattr(c, k, v)
    s = DistributedObjectStore()
    assert s.setup(c) == 0
    assert s.init(0, init_bm=False) == 0
    return s


class CountingProxy:
    """Forwards TCP connections to a server and counts the bytes clients send through it."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.upstream_bytes = 0
        self.lock = threading.Lock()
        self.stop_flag = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop_flag:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            threading.Thread(target=self._pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, False), daemon=True).start()

    def _pump(self, src, dst, count):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if count:
                    with self.lock:
                        self.upstream_bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def sent(self):
        with self.lock:
            return self.upstream_bytes

    def close(self):
        self.stop_flag = True
        self.sock.close()


def test_every_method_through_redirects(cluster):
    s = make_store("http://%s" % cluster.meta.addr)
    local_addrs = {("127.0.0.1", l.port) for l in cluster.locals}
    hops = []
    s._client.on_redirect = lambda method, target, host, port: hops.append((method, host, port))
    try:
        for replicas in (1, 2):
            rc = ReplicateConfig(replicaNum=replicas)
            for size in SIZES:
                tag = "cc/%d/%d" % (replicas, size)
                data = data_of(tag, size)
                hops.clear()
                assert s.put(tag + "/put", data, rc) == OK
                # The put went to a local service, under the meta's grant.
                assert hops and hops[0][0] == "PUT" and (hops[0][1], hops[0][2]) in local_addrs
                hops.clear()
                assert s.get(tag + "/put") == data
                # Read straight from the local service that holds it.
                assert [(m, (h, p) in local_addrs) for m, h, p in hops] == [("GET", True)]

                src = (ctypes.c_ubyte * size).from_buffer_copy(data)
                assert s.put_from(tag + "/from", ctypes.addressof(src), size,
                                  replicateConfig=rc) == OK
                dst = (ctypes.c_ubyte * size)()
                assert s.get_into(tag + "/from", ctypes.addressof(dst), size) == OK
                assert bytes(dst) == data
                # Too small a buffer through a redirect: -3000, nothing written.
                if size > 1:
                    small = (ctypes.c_ubyte * (size - 1))()
                    assert s.get_into(tag + "/from", ctypes.addressof(small),
                                      size - 1) == errors.MMC_INVALID_PARAM
                    assert bytes(small) == b"\0" * (size - 1)

                assert s.is_exist(tag + "/put") == 1
                info = s.get_key_info(tag + "/from")
                assert info.size() == size
                assert len(info.loc_list()) == replicas
                assert len(set(info.loc_list())) == replicas
                assert s.remove(tag + "/put") == OK
                assert s.is_exist(tag + "/put") == 0
                assert s.get(tag + "/put") == b""
                assert s.remove(tag + "/put") == errors.MMC_UNMATCHED_KEY
                assert s.remove(tag + "/from") == OK

            # Batches: batch_put on a pure meta falls back to puts per key.
            keys = ["cb/%d/%d" % (replicas, n) for n in SIZES]
            values = [data_of(k, n) for k, n in zip(keys, SIZES)]
            assert s.put_batch(keys, values, rc) == OK
            assert s.get_batch(keys + ["cb/missing"]) == values + [b""]
            assert s.batch_is_exist(keys + ["cb/missing"]) == [1] * len(keys) + [0]
            bufs = [np.zeros(n, dtype=np.uint8) for n in SIZES]
            assert s.batch_get_into(keys, [b.ctypes.data for b in bufs], SIZES) == [OK] * 5
            assert [b.tobytes() for b in bufs] == values
            assert s.remove_batch(keys) == [OK] * len(keys)

            fkeys = ["cf/%d/%d" % (replicas, n) for n in SIZES]
            srcs = [np.frombuffer(data_of(k, n), dtype=np.uint8).copy()
                    for k, n in zip(fkeys, SIZES)]
            assert s.batch_put_from(fkeys, [a.ctypes.data for a in srcs], SIZES,
                                    replicateConfig=rc) == [OK] * len(fkeys)
            outs = [np.zeros(n, dtype=np.uint8) for n in SIZES]
            assert s.batch_get_into(fkeys, [o.ctypes.data for o in outs], SIZES) == [OK] * 5
            assert all(np.array_equal(a, b) for a, b in zip(srcs, outs))
            for k, n in zip(fkeys, SIZES):
                assert len(s.get_key_info(k).loc_list()) == replicas
            assert s.remove_batch(fkeys) == [OK] * len(fkeys)
        # Duplicate put through a redirect: 0 and the first value kept (as upstream).
        assert s.put("cc/dup", b"first") == OK
        assert s.put("cc/dup", b"second") == OK
        assert s.get("cc/dup") == b"first"
        assert s.remove("cc/dup") == OK
    finally:
        s.close()


def test_threads_share_a_store_across_ranks(cluster):
    s = make_store("http://%s" % cluster.meta.addr)
    ranks = [int(n.split("-")[1]) for n in cluster_ready.segments(cluster.meta.get)]
    failures = []

    def work(t):
        for i in range(20):
            k = "ct/%d/%d" % (t, i)
            d = data_of(k, 1000 + 997 * i)
            rc = ReplicateConfig(preferredLocalServiceIDs=[ranks[i % len(ranks)]])
            if s.put(k, d, rc) != OK or s.get(k) != d or s.remove(k) != OK:
                failures.append(k)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    # Keep-alive connections to the meta and to both local services are pooled for reuse.
    idle = {k for k, v in s._client.pool._idle.items() if v}
    assert {("127.0.0.1", l.port) for l in cluster.locals} | {("127.0.0.1", cluster.meta.port)} \
        <= idle
    s.close()


def test_put_bodies_are_sent_once(cluster, monkeypatch):
    """A proxy in front of the meta counts what the client sends it: with Expect:
    100-continue the meta answers 307 before the body, which goes to the local service only.
    Over TCP: on the same host the client would reach the meta's same-host socket, around the
    proxy (docs/same-host.md)."""
    monkeypatch.setenv("MMC_TRANSPORT", "tcp")
    proxy = CountingProxy(cluster.meta.port)
    s = make_store("http://127.0.0.1:%d" % proxy.port)
    try:
        big = data_of("once/big", 2 << 20)
        before = proxy.sent()
        assert s.put("once/big", big) == OK
        assert proxy.sent() - before < 4096
        src = np.frombuffer(big, dtype=np.uint8).copy()
        before = proxy.sent()
        assert s.put_from("once/from", src.ctypes.data, src.nbytes) == OK
        assert proxy.sent() - before < 4096
        # A body under 256 KiB is read by the meta before its 307 (then sent again): it is
        # sent without waiting for a go-ahead.
        mid = data_of("once/mid", 100 * 1024)
        before = proxy.sent()
        assert s.put("once/mid", mid) == OK
        assert len(mid) <= proxy.sent() - before < len(mid) + 4096
        # Batches of a pure meta: after the first, key by key without the body passing the meta.
        keys = ["once/b%d" % i for i in range(4)]
        vals = [data_of(k, 300 * 1024) for k in keys]
        assert s.put_batch(keys, vals) == OK
        before = proxy.sent()
        keys2 = ["once/c%d" % i for i in range(4)]
        assert s.put_batch(keys2, vals) == OK
        assert proxy.sent() - before < 16 * 1024
        assert s.get("once/big") == big and s.get("once/mid") == mid
        assert s.get_batch(keys + keys2) == vals + vals
        assert s.remove_batch(keys + keys2 + ["once/big", "once/from", "once/mid"]) == [OK] * 11
    finally:
        s.close()
        proxy.close()


def test_mmcctl_url_list_and_remote_segments(cluster):
    dead = "http://127.0.0.1:%d" % free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MMC_URL", "MMC_API_TOKEN")}
    p = subprocess.run([MMCCTL, "--url", "%s,http://%s" % (dead, cluster.meta.addr), "segments"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0, p.stderr
    names = cluster_ready.segments(cluster.meta.get)
    assert len(names) == 2
    for name in names:
        assert name in p.stdout
    p = subprocess.run([MMCCTL, "--url", "%s,%s" % (dead, dead), "health"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def rank_addresses(s, meta):
    """{rank: (host, port)} of the local services, learnt by putting a probe on each rank
    (``preferredLocalServiceIDs``) and watching where the meta sends it."""
    out = {}
    for name in cluster_ready.segments(meta.get):
        rank = int(name.split("-")[1])
        hops = []
        s._client.on_redirect = lambda m, t, h, p: hops.append((h, p))
        key = "probe/%d" % rank
        assert s.put(key, b"p", ReplicateConfig(preferredLocalServiceIDs=[rank])) == OK
        s._client.on_redirect = None
        assert s.get_key_info(key).loc_list() == [rank]
        assert s.remove(key) == OK
        out[rank] = hops[0]
    return out


def test_preferred_local_service(cluster):
    s = make_store("http://%s" % cluster.meta.addr)
    try:
        addrs = rank_addresses(s, cluster.meta)
        assert sorted(addrs.values()) == sorted(("127.0.0.1", l.port) for l in cluster.locals)
        for rank in addrs:
            rc = ReplicateConfig(replicaNum=2, preferredLocalServiceIDs=[rank, 99])
            assert s.put("pref/%d" % rank, b"x" * 3000, rc) == OK
            assert s.get_key_info("pref/%d" % rank).loc_list()[0] == rank
            assert s.remove("pref/%d" % rank) == OK
        # A negative id (get_local_service_id() of a client without a local service) is no
        # preference; an id that is not an int is a TypeError, as upstream's binding.
        assert s.put("pref/none", b"x", ReplicateConfig(preferredLocalServiceIDs=[-1])) == OK
        with pytest.raises(TypeError):
            s.put("pref/bad", b"x", ReplicateConfig(preferredLocalServiceIDs=["1"]))
    finally:
        s.close()


def test_a_killed_local_service(cluster):
    """Runs last on the module's cluster: one local service dies; objects with a copy on the
    other stay readable. Their first copy is on the dead one: a get sent there meets a refused
    connection and is retried through the meta until it has declared the rank lost."""
    s = make_store("http://%s" % cluster.meta.addr, client_retry_milliseconds=10000)
    try:
        addrs = rank_addresses(s, cluster.meta)
        victim = cluster.locals.pop()
        vrank = next(r for r, a in addrs.items() if a == ("127.0.0.1", victim.port))
        keys = ["kill/%d" % i for i in range(6)]
        vals = [data_of(k, 50_000 + i) for i, k in enumerate(keys)]
        rc = ReplicateConfig(replicaNum=2, preferredLocalServiceIDs=[vrank])
        for k, v in zip(keys, vals):
            assert s.put(k, v, rc) == OK
            assert s.get_key_info(k).loc_list()[0] == vrank
        alone = data_of("kill/alone", 70_000)
        assert s.put("kill/alone", alone, ReplicateConfig(preferredLocalServiceIDs=[vrank])) == OK
        assert s.get_key_info("kill/alone").loc_list() == [vrank]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        hops = []
        s._client.on_redirect = lambda m, t, h, p: hops.append((h, p))
        t = time.monotonic()
        for k, v in zip(keys, vals):
            assert s.get(k) == v
        assert time.monotonic() - t < 15
        # The meta still sent the first get to the dead rank's service: the retry carried it.
        assert hops[0] == ("127.0.0.1", victim.port)
        assert hops[-1] != ("127.0.0.1", victim.port)
        wait_until("the rank is lost",
                   lambda: len(cluster_ready.segments(cluster.meta.get)) == 1, timeout=15)
        for k, v in zip(keys, vals):
            assert s.get(k) == v
            assert len(s.get_key_info(k).loc_list()) == 1
        # Its only copy died with the rank.
        assert s.get("kill/alone") == b""
        assert s.is_exist("kill/alone") == 0
        assert s.put("kill/after", b"x" * 5000) == OK
        assert s.get("kill/after") == b"x" * 5000
    finally:
        s.close()


# -- HA --------------------------------------------------------------------------------------


class Etcd:
    def __init__(self, tmp_path):
        self.client_port, self.peer_port = free_port(), free_port()
        client = "http://127.0.0.1:%d" % self.client_port
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.proc = subprocess.Popen(
            ["etcd", "--name", "mmc-test", "--data-dir", str(tmp_path / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "mmc-test=" + peer],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = client

        def answers():
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=1) as c:
                    body = b'{"key":"AA=="}'
                    c.sendall(b"POST /v3/kv/range HTTP/1.1\r\nHost: etcd\r\nContent-Length: %d"
                              b"\r\nConnection: close\r\n\r\n%s" % (len(body), body))
                    return c.recv(64).startswith(b"HTTP/1.1 200")
            except OSError:
                return False

        wait_until("etcd answers", answers, timeout=15)

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)


def ha_meta(etcd, port):
    return Server(["--set", "ock.mmc.meta.ha.enable=true",
                   "--set", "ock.mmc.meta.ha.etcd_endpoints=" + etcd.endpoint,
                   "--set", "ock.mmc.meta.ha.advertise_url=http://127.0.0.1:%d" % port,
                   "--set", "ock.mmc.meta.ha.lease_ttl_ms=2000"],
                  listen="127.0.0.1:%d" % port)


def role(server):
    import json

    status, _, body = server.request("GET", "/health")
    return json.loads(body) if status == 200 else {}


def test_ha_pair_standby_first_then_leader_killed(tmp_path):
    if subprocess.run(["which", "etcd"], capture_output=True).returncode != 0:
        if os.environ.get("MMC_REQUIRE_ETCD"):
            pytest.fail("etcd is not installed and MMC_REQUIRE_ETCD is set")
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    etcd = Etcd(tmp_path)
    metas = []
    try:
        metas = [ha_meta(etcd, free_port()), ha_meta(etcd, free_port())]

        def settled():
            rs = [role(m) for m in metas]
            return sorted(r.get("role") for r in rs) == ["leader", "standby"] and all(
                r.get("leader_address") not in (None, "unknown") for r in rs) and any(
                r.get("ha_state") == "serving" for r in rs)

        wait_until("an HA pair settled", settled, timeout=15)
        leader = next(m for m in metas if role(m)["role"] == "leader")
        standby = next(m for m in metas if m is not leader)
        urls = "http://%s,http://%s" % (standby.addr, leader.addr)
        s = make_store(urls, client_retry_milliseconds=15000)
        try:
            data = data_of("ha/a", 300 * 1024)
            assert s.put("ha/a", data) == OK
            assert s.get("ha/a") == data
            # The standby's 307 named the leader: it is the current URL now.
            assert s._client.base_url == "http://%s" % leader.addr
            assert s.put_batch(["ha/b", "ha/c"], [b"b" * 10, b"c" * 20]) == OK
            assert s.get_batch(["ha/b", "ha/c"]) == [b"b" * 10, b"c" * 20]

            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait(10)
            t = time.monotonic()
            # The first call waits out the failover (connection refused, then the standby's
            # 503 while it has no leader), within client_retry_milliseconds.
            assert s.put("ha/after", data) == OK
            took = time.monotonic() - t
            assert took < 15, took
            assert s.get("ha/after") == data
            assert s.is_exist("ha/after") == 1
            assert s._client.base_url == "http://%s" % standby.addr
            assert role(standby)["role"] == "leader"
            out = np.zeros(len(data), dtype=np.uint8)
            assert s.get_into("ha/after", out.ctypes.data, out.nbytes) == OK
            assert out.tobytes() == data
            assert s.remove("ha/after") == OK
        finally:
            s.close()
    finally:
        for m in metas:
            m.stop()
        etcd.stop()
