"""Mapped same-host gets from a local service, under a meta's grant (docs/same-host.md,
*Mapped gets*): the client copies from its mapping of the local service's segment, within
the grant's expiry, and a local service that joins a meta again shuts down the connections
holding such answers first."""

import contextlib
import re
import signal
import socket

import numpy as np

import cluster_ready
from conftest import wait_until
from mmc_client import _mapped
from test_cluster_client import Cluster
from test_same_host import data, held, make_store, mapped_gets, socket_path

OK = 0


@contextlib.contextmanager
def cluster_holding(key, seed):
    """A pure meta, two local services on this host, a same-host store and a 1 MiB object
    `key` put through it: (cluster, store, its bytes, a buffer of their size)."""
    c = Cluster()
    try:
        s = make_store("http://%s" % c.meta.addr)
        src = data(1 << 20, seed)
        assert s.put_from(key, src.ctypes.data, src.nbytes) == OK
        yield c, s, src, np.zeros_like(src)
        s.close()
    finally:
        codes = c.stop()
        assert codes == [0] * len(codes), "".join(c.meta.log)


def granted_get(c, s, key, out):
    """get_into of `key` through the meta; the local service the 307 named, and the grant
    URL (the target) it was sent to."""
    hops = []
    s._client.on_redirect = lambda method, target, host, port: hops.append((target, port))
    try:
        assert s.get_into(key, out.ctypes.data, out.nbytes) == OK
    finally:
        s._client.on_redirect = None
    target, port = hops[-1]
    return next(l for l in c.locals if l.port == port), target


def test_gets_from_a_local_service_are_mapped_within_the_grant_s_expiry(monkeypatch):
    """A get that the meta sends to the local service on this host is answered there with
    where the blob is (mapped) and the grant's expiry: the client copies it from its mapping
    of the local service's segment, then checks the connection and the time. A copy that
    ended after the expiry counts for nothing (the bytes may be another object's by then):
    the get starts again at the meta for a new grant, and its bytes are right."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    monkeypatch.delenv("MMC_SAME_HOST_MAP", raising=False)
    with cluster_holding("shc/a", 5) as (c, s, src, out):
        before = {l.port: mapped_gets(l) for l in c.locals}
        limits = []
        real = _mapped._check_in_time

        def check(until):
            limits.append(until)
            real(until)

        monkeypatch.setattr(_mapped, "_check_in_time", check)
        local, target = granted_get(c, s, "shc/a", out)
        assert np.array_equal(src, out)
        assert mapped_gets(local) == before[local.port] + 1, "copied by the client"
        # The store's connection holds the answer until its next request; it pins nothing
        # there (the meta's lease holds the range), so no bytes are counted.
        assert held(local) == (1, 0)
        assert limits and limits[-1] > 0, limits
        # The limit is the grant's expiry: in the future, within the grant's time to live.
        now_ms = _mapped._now_ms()
        assert now_ms < limits[-1] <= now_ms + 10_000 + 2_000, (limits, now_ms)

        # The same get with the client's clock past the expiry after its first copy: that
        # copy is discarded, and the get starts again at the meta for a new grant, whose
        # copy counts.
        out[:] = 0
        checks, hops = [], []

        def late_once(until):
            checks.append(until)
            if len(checks) == 1:
                raise _mapped.Expired("a mapped get's copy ended after its grant expired")
            real(until)

        monkeypatch.setattr(_mapped, "_check_in_time", late_once)
        s._client.on_redirect = lambda method, target, host, port: hops.append(port)
        mapped = mapped_gets(local)
        assert s.get_into("shc/a", out.ctypes.data, out.nbytes) == OK
        assert np.array_equal(src, out), "the bytes came again, right"
        assert len(checks) == 2, "copied twice, the first discarded"
        assert hops == [local.port, local.port], "the meta was asked again: a new grant"
        assert mapped_gets(local) == mapped + 2

        # The same in a batch, whose gets go to the meta pipelined and on to the local
        # service from the meta's answers: the expired copy starts that key's get again at
        # the meta too, not at the local service's URL, whose grant it spent (refused there).
        out[:] = 0
        checks.clear()
        hops.clear()
        assert s.batch_get_into(["shc/a"], [out.ctypes.data], [out.nbytes]) == [OK]
        assert np.array_equal(src, out), "the bytes came again, right"
        assert len(checks) == 2, "copied twice, the first discarded"
        assert hops == [local.port, local.port], "the meta was asked again: a new grant"
        assert mapped_gets(local) == mapped + 4


def test_a_local_service_that_joins_again_shuts_connections_holding_mapped_reads_down(
        monkeypatch):
    """A connection holding a mapped answer read under a meta's grant is shut down when its
    local service joins a meta again (here: frozen past the heartbeat timeout, then
    resumed): the next membership's grants may write into that range, and a client that was
    still copying finds its connection closed after the copy, which then counts for
    nothing. The old grant is refused after the join; new gets are mapped again."""
    monkeypatch.delenv("MMC_TRANSPORT", raising=False)
    monkeypatch.delenv("MMC_SAME_HOST_MAP", raising=False)
    with cluster_holding("shc/b", 6) as (c, s, src, out):
        local, target = granted_get(c, s, "shc/b", out)
        # This test's own connection to the local service's socket: a mapped get it does not
        # say it is done with, so the connection holds it.
        u = socket.socket(socket.AF_UNIX)
        u.connect(socket_path(local))
        u.settimeout(30)
        dst = np.zeros_like(src)
        u.sendall(("GET %s HTTP/1.1\r\nHost: t\r\nX-Mmc-Map: 0\r\nX-Mmc-Iov: %x:%d\r\n\r\n"
                   % (target, dst.ctypes.data, dst.nbytes)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += u.recv(65536)
        text = head.decode("latin-1")
        assert text.startswith("HTTP/1.1 200"), text
        mapped = re.search(r"(?im)^x-mmc-mapped: (.*)$", text).group(1).strip()
        lease, ranges, until = _mapped.parse(mapped)
        assert lease >= 1 and len(ranges) == 1 and until > _mapped._now_ms(), mapped
        assert ranges[0][3] == src.nbytes

        local.proc.send_signal(signal.SIGSTOP)
        try:
            # Past the meta's heartbeat timeout (1.5 s): the rank is lost.
            wait_until("the frozen rank is lost",
                       lambda: cluster_ready.ready_count(c.meta.get) < 2, timeout=15)
        finally:
            local.proc.send_signal(signal.SIGCONT)
        # It joins again, and shuts the held connection down first.
        assert u.recv(1) == b"", "the connection holding the mapped read was shut down"
        u.close()
        # (This one and the store's pooled connection, which holds its own get's answer.)
        wait_until("the join logs what it shut down",
                   lambda: any(re.search(r"shut down [12] same-host connections", line)
                               for line in local.log))
        wait_until("both ranks joined again",
                   lambda: cluster_ready.ready_count(c.meta.get) == 2, timeout=30)
        # The previous membership's grant is void here now.
        with socket.socket(socket.AF_UNIX) as v:
            v.connect(socket_path(local))
            v.settimeout(30)
            v.sendall(("GET %s HTTP/1.1\r\nHost: t\r\nX-Mmc-Map: 0\r\n\r\n" % target).encode())
            answer = v.recv(65536).decode("latin-1")
        assert answer.startswith("HTTP/1.1 403"), answer
        # New gets are mapped again (the service's next epoch registers their connections).
        mapped = sum(mapped_gets(l) for l in c.locals)
        assert s.put_from("shc/c", src.ctypes.data, src.nbytes) == OK
        assert s.get_into("shc/c", out.ctypes.data, out.nbytes) == OK
        assert np.array_equal(src, out)
        assert sum(mapped_gets(l) for l in c.locals) == mapped + 1
