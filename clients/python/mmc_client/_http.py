"""A small HTTP/1.1 client for mmc-server's data plane: pooled keep-alive sockets, bodies sent
with ``socket.sendmsg`` from memoryviews and received with ``recv_into`` straight into the
caller's memory, ``Expect: 100-continue`` for large bodies, and ``307``/``308`` redirects
followed (the body is sent once per hop, only after the target's go-ahead).

Same host (docs/same-host.md): a server on this host running as this user serves the same
requests on a Unix socket, where an object's bytes are not sent at all: the request names
where they are in this process's memory (``X-Mmc-Iov``) and the server copies them itself.
Used per server reached (a meta, the local service a redirect names) when its ``/health``
advertises the socket and the socket answers as the same process; TCP otherwise, and always
with ``MMC_TRANSPORT=tcp``.

Everything here raises :class:`TransportError` (with an upstream-style code) or returns a
:class:`Response`; the store turns both into return codes.
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import mmap
import os
import random
import socket
import ssl
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, cast
from urllib.parse import urlsplit

from . import _mapped, errors

_xxh3: Optional[Callable[[bytes, int], int]]
try:
    from xxhash import xxh3_64_intdigest as _xxh3
except ImportError:  # a dependency of the package; without it, no routing by shard
    _xxh3 = None

# The server's key-to-shard hash (src/shards/mod.rs, shard_for): xxh3-64 of the key's bytes
# with this seed, reduced to a shard by multiply-high.
_SHARD_SEED = 0x6D6D635F73686172


def shard_for(key: bytes, shards: int) -> int:
    """The shard of ``shards`` that owns ``key`` in the server (``shard_for`` there)."""
    assert _xxh3 is not None
    return (_xxh3(key, _SHARD_SEED) * shards) >> 64

# iovecs per sendmsg call (IOV_MAX is 1024 on Linux).
_IOV_MAX = 1000
_RECV_CHUNK = 256 * 1024
# Heads and chunk lines are read in small pieces, so that a body mostly stays in the socket
# until it is received straight into its destination (recv_into).
_HEAD_CHUNK = 4096
_MAX_REDIRECTS = 5
# A server found without a same-host socket, or whose socket failed, is asked again after this
# many seconds: a server killed and restarted on its port makes a new socket (and a new process
# behind it), which its clients take up again instead of staying on TCP for good.
_REDISCOVER_SECONDS = 5.0
# Each thread's shared buffer for same-host get()s (Client.get_scratch): its first size, and
# the largest it grows to (a larger object comes over the socket).
_SCRATCH_MIN_BYTES = 1 << 20
_SCRATCH_MAX_BYTES = 64 << 20


class TransportError(Exception):
    """The request could not be carried out; ``code`` is the upstream-style return code,
    ``retryable`` whether it is safe and useful to try again (nothing reached the server, or
    the server said so)."""

    def __init__(self, code: int, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        # Set on the way out: whether a meta service (not a local service) failed, and the
        # answer that made the request fail when there was one (a 429 or 503).
        self.at_meta = True
        self.response: Optional[Response] = None


class _StaleConnection(Exception):
    """A pooled connection turned out closed before any byte of the answer arrived."""


_T = TypeVar("_T")


class Response:
    __slots__ = ("status", "headers", "body", "url", "from_meta")

    def __init__(self, status: int, headers: Dict[str, str], body: Any, url: str) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.url = url
        # Whether a meta service answered (not a local service reached through a grant).
        self.from_meta = True

    def header(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name.lower(), default)


def parse_url(url: str) -> Tuple[str, int, bool]:
    """``http://host:port`` or ``https://host:port`` (also ``tcp://``, or a bare ``host:port``,
    read as http) -> (host, port, https)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "tcp"):
        raise ValueError("unsupported scheme %r (http:// or https://)" % parts.scheme)
    if not parts.hostname:
        raise ValueError("no host in %r" % url)
    https = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if https else 80), https


def parse_base_url(url: str) -> Tuple[str, int]:
    """(host, port) of a base URL (see :func:`parse_url`)."""
    host, port, _ = parse_url(url)
    return host, port


def parse_endpoints(urls: str) -> List[Tuple[str, int]]:
    """A comma-separated list of base URLs (HA: several meta services) -> [(host, port)]."""
    eps = [parse_base_url(u) for u in urls.split(",") if u.strip()]
    if not eps:
        raise ValueError("no URL given")
    return eps


# This process's pid, kept up to date across fork: the pool asks at every request which
# process it runs in, and os.getpid() is a system call (0.5 us) where this is a global's read.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _spin_seconds(value: Optional[str]) -> float:
    """``MMC_SAME_HOST_SPIN_US`` in seconds: 300 us when unset or not a number."""
    try:
        us = float(value) if value is not None else 300.0
    except ValueError:
        us = 300.0
    return max(0.0, min(us, 100_000.0)) * 1e-6


class Connection:
    """One keep-alive socket with its read buffer. Used by one thread at a time."""

    def __init__(self, host: str, port: int, timeout: Optional[float],
                 tls: Optional[ssl.SSLContext] = None, unix_path: Optional[str] = None) -> None:
        self.host, self.port = host, port
        # The process that opened it: a same-host server copies to and from its memory only.
        self.pid = _pid
        if unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(unix_path)
                if timeout is not None:
                    # Blocking calls bounded by the kernel (SO_RCVTIMEO/SO_SNDTIMEO; past it
                    # they fail with EAGAIN) instead of Python's timeout mode, which polls
                    # before every call: 30 us more per request, measured.
                    tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                    sock.settimeout(None)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock: socket.socket = sock
        # A same-host server's pid (SO_PEERCRED): whose segment files a mapped get names.
        self.peer_pid: Optional[int] = None
        if unix_path is not None:
            try:
                self.peer_pid = _peer_cred(sock)[0]
            except OSError:
                pass
        # The last lease of a mapped get copied on this connection (_mapped): said to the
        # server with the next request, which lets its pins go.
        self.map_done = 0
        self.tls = tls is not None
        self.rbuf = bytearray()
        self.uses = 0
        self.closed = False
        # The shared buffers (their inode numbers) offered to the server on this connection.
        self.shared: Set[int] = set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass

    def settimeout(self, t: Optional[float]) -> None:
        self.sock.settimeout(t)

    # -- sending -------------------------------------------------------------------------

    def send(self, parts: Sequence[Any]) -> None:
        """Sends every buffer of ``parts`` (bytes or memoryviews) without joining them."""
        if len(parts) == 1 and type(parts[0]) is bytes and not self.tls:
            # A head alone (every same-host request): no iovec list to build.
            self.sock.sendall(parts[0])
            return
        views = [memoryview(p).cast("B") if not isinstance(p, bytes) else memoryview(p)
                 for p in parts if len(p)]
        if self.tls:
            # TLS sockets have no sendmsg: each buffer is encrypted from where it is.
            for v in views:
                self.sock.sendall(v)
            return
        i = 0
        while i < len(views):
            batch = views[i:i + _IOV_MAX]
            n = self.sock.sendmsg(batch)
            # Skip what went out; keep the rest of a partly sent buffer.
            while n > 0 and i < len(views):
                if n >= len(views[i]):
                    n -= len(views[i])
                    i += 1
                else:
                    views[i] = views[i][n:]
                    n = 0

    # -- receiving -----------------------------------------------------------------------

    def wait_spinning(self, seconds: float, waiting: Dict[int, bool]) -> None:
        """Waits up to ``seconds`` for the server's next bytes by polling the socket, the CPU
        yielded between polls, rather than asleep in ``recv``: a thread that sleeps lets its
        CPU go idle, and waking it takes tens of microseconds on a VM (a same-host socket's
        round trip measured 60-70 us with both sides asleep, 20 us with one polling), more
        than a same-host answer of 64 KiB takes to come. The yield lets the server's threads
        run on this CPU meanwhile. Nothing is waited for when bytes are already buffered; the
        bytes that came are buffered, and the blocking read that follows finds them.

        ``waiting``: the threads of this client waiting for an answer (by thread id); this one
        polls only while it is the only one. Several polling threads would pass the GIL back
        and forth at every poll, and the other threads keep the CPU busy anyway (4 threads: 6 %
        slower polling, measured)."""
        if seconds <= 0 or self.rbuf:
            return
        me = threading.get_ident()
        waiting[me] = True
        try:
            sock = self.sock
            deadline = time.perf_counter() + seconds
            while len(waiting) == 1:
                try:
                    data = sock.recv(_HEAD_CHUNK, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    if time.perf_counter() > deadline:
                        return
                    os.sched_yield()
                    continue
                # (b"": the server closed; the read that follows says so.)
                self.rbuf += data
                return
        finally:
            del waiting[me]

    def _fill(self) -> None:
        data = self.sock.recv(_HEAD_CHUNK)
        if not data:
            raise EOFError("connection closed by the server")
        self.rbuf += data

    def read_head(self) -> Tuple[int, Dict[str, str]]:
        """Reads one response head: (status, headers dict with lower-case names)."""
        return parse_head(self.read_head_text())

    def read_head_text(self) -> str:
        """Reads one response head, as text without its final empty line."""
        start = 0
        while True:
            end = self.rbuf.find(b"\r\n\r\n", start)
            if end >= 0:
                break
            start = max(0, len(self.rbuf) - 3)
            if len(self.rbuf) > 64 * 1024:
                raise ValueError("response head too large")
            self._fill()
        head = self.rbuf[:end].decode("latin-1")
        del self.rbuf[:end + 4]
        return head

    def read_exact_into(self, view: memoryview) -> None:
        """Fills ``view`` (a writable byte memoryview) from the buffer, then the socket."""
        n = len(view)
        have = min(n, len(self.rbuf))
        if have:
            view[:have] = self.rbuf[:have]
            del self.rbuf[:have]
        pos = have
        while pos < n:
            got = self.sock.recv_into(view[pos:], n - pos)
            if got == 0:
                raise EOFError("connection closed in the middle of a body")
            pos += got

    def read_bytes(self, n: int) -> bytes:
        """The next ``n`` bytes as a new ``bytes``. From ``_FILL_BYTES_MIN`` up they are
        received straight into it: the object is made uninitialised
        (``PyBytes_FromStringAndSize`` with no source, as CPython's own readers do) and filled
        before anything else sees it; no zeroed ``bytearray`` first and no copy of it after
        (each costs a fresh allocation's page faults: an 8 MiB body read 4 ms faster)."""
        if n < _FILL_BYTES_MIN:
            return bytes(self.read_exact(n))
        b = _PyBytes_FromStringAndSize(None, n)
        view = _PyMemoryView_FromMemory(_PyBytes_AsString(b), n, _PyBUF_WRITE)
        try:
            self.read_exact_into(view)
        finally:
            view.release()
        return cast(bytes, b)

    def read_exact(self, n: int) -> bytearray:
        out = bytearray(n)
        self.read_exact_into(memoryview(out))
        return out

    def skip(self, n: int) -> None:
        if n <= 0:
            return
        scratch = memoryview(bytearray(min(n, _RECV_CHUNK)))
        while n > 0:
            k = min(n, len(scratch))
            self.read_exact_into(scratch[:k])
            n -= k

    def read_line(self) -> bytes:
        while True:
            i = self.rbuf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.rbuf[:i])
                del self.rbuf[:i + 2]
                return line
            if len(self.rbuf) > 64 * 1024:
                raise ValueError("line too long")
            self._fill()

    def read_chunked(self) -> bytearray:
        out = bytearray()
        while True:
            size = int(self.read_line().split(b";", 1)[0].strip(), 16)
            if size == 0:
                while self.read_line():
                    pass
                return out
            out += self.read_exact(size)
            if self.read_line():
                raise ValueError("chunk not followed by CRLF")

    def read_to_close(self) -> bytearray:
        out = bytearray(self.rbuf)
        self.rbuf.clear()
        while True:
            data = self.sock.recv(_RECV_CHUNK)
            if not data:
                return out
            out += data


def parse_head(head: str) -> Tuple[int, Dict[str, str]]:
    """A response head's (status, headers dict with lower-case names)."""
    lines = head.split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise ValueError("bad status line %r" % lines[0])
    status = int(status_line[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def head_field(head: str, name: str) -> Optional[str]:
    """The value of header ``name`` in a response head's text when the server spelled its name
    so (the same-host short way's look-up: a name spelled otherwise is found by parse_head);
    None when absent."""
    i = head.find("\r\n%s: " % name)
    if i < 0:
        return None
    i += len(name) + 4
    j = head.find("\r\n", i)
    return head[i:] if j < 0 else head[i:j]


class BodyReader:
    """Reads a response body. The default keeps the whole body as bytes; a data-path caller
    passes its own (``get_into``, ``batch_get_into``) to receive bytes where they belong."""

    def read(self, conn: Connection, status: int, headers: Dict[str, str],
             length: Optional[int]) -> Any:
        if length is None:
            return bytes(conn.read_chunked() if _chunked(headers) else conn.read_to_close())
        return conn.read_bytes(length)


def _chunked(headers: Dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


_DEFAULT_READER = BodyReader()


class Pool:
    """Idle keep-alive connections per (host, port), shared by every thread of a store."""

    def __init__(self, timeout: Optional[float], max_idle_per_host: int = 64) -> None:
        self.timeout = timeout
        self.max_idle = max_idle_per_host
        self._idle: Dict[Tuple[str, int], List[Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, host: str, port: int, tls: Optional[ssl.SSLContext] = None,
             unix_path: Optional[str] = None) -> Tuple[Connection, bool]:
        """(connection, reused); a new connection speaks TLS with ``tls``, or goes to the
        same-host socket ``unix_path`` (pooled apart from the TCP ones)."""
        key = (host, port) if unix_path is None else ("unix:" + unix_path, 0)
        pid = _pid
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.pid == pid:
                    return conn, True
                # Inherited through fork: the server of a same-host connection copies to and
                # from the parent's memory, so it is never used here (nor closed: it is the
                # parent's).
        conn = Connection(host, port, self.timeout, tls, unix_path)
        if unix_path is not None:
            conn.host, conn.port = key
        return conn, False

    def give(self, conn: Connection) -> None:
        if conn.closed:
            return
        with self._lock:
            if not self._closed:
                idle = self._idle.setdefault((conn.host, conn.port), [])
                if len(idle) < self.max_idle:
                    idle.append(conn)
                    return
        conn.close()

    def discard(self, host: str, port: int) -> None:
        """Closes the idle connections to a server that failed (it died, or restarted)."""
        with self._lock:
            conns = self._idle.pop((host, port), [])
        for c in conns:
            c.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for lst in self._idle.values() for c in lst]
            self._idle.clear()
        for c in conns:
            c.close()

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())


class Client:
    """Requests against a meta service (one URL, or several for HA), with retries within
    ``retry_ms`` for failures that reached no server (refused connections), connections to a
    meta service that broke, and answers the server marked as retryable (429, 503); and
    ``timeout`` seconds per socket operation.

    Cluster: a ``307``/``308`` answer is followed to its ``Location`` (a local service holding
    the blob, under the meta's grant, or the leader when a standby answered). A body is sent
    only after that server's ``100 Continue`` when it is at least ``expect_continue_bytes`` (the
    meta answers a redirected put of 256 KiB or more before its body, so the body goes only to
    the local service; a smaller body is read by the meta first, and then sent again).

    HA: every URL of the list is tried once at once when the current one fails (refused,
    broken, 503), then again with backoff until ``retry_ms`` has passed. A standby's 307 to a
    leader that is in the list makes that leader the current URL. ``on_redirect`` may be set
    to learn where keys live.
    """

    def __init__(self, urls: str, timeout: Optional[float] = 60.0, retry_ms: int = 0,
                 token: Optional[str] = None, expect_continue_bytes: int = 256 * 1024,
                 expect_timeout: float = 1.0,
                 tls: Optional[ssl.SSLContext] = None) -> None:
        parsed = [parse_url(u) for u in urls.split(",") if u.strip()]
        if not parsed:
            raise ValueError("no URL given")
        self.endpoints = [(h, p) for h, p, _ in parsed]
        # The servers reached over https (the URLs given, and redirects' Locations).
        self._https: Set[Tuple[str, int]] = {(h, p) for h, p, https in parsed if https}
        if self._https and tls is None:
            tls = ssl.create_default_context()
        self.tls = tls
        self.current = 0
        self.timeout = timeout
        self.retry_ms = retry_ms
        self.token = token
        self.expect_continue_bytes = expect_continue_bytes
        self.expect_timeout = expect_timeout
        self.pool = Pool(timeout)
        self.on_redirect = None
        self._ep_lock = threading.Lock()
        # The same-host socket of each server reached: its path, or None (TCP). Filled on
        # the first data-path request to that server.
        self.same_host = os.environ.get("MMC_TRANSPORT", "").strip().lower() != "tcp"
        self._local: Dict[Tuple[str, int], Optional[str]] = {}
        # When each server's entry in _local was last set (monotonic seconds).
        self._local_at: Dict[Tuple[str, int], float] = {}
        # Servers whose every shard also listens on a socket of its own (PATH.N): (number of
        # shards, the server's pid). A key's request goes to its owner's socket.
        self._local_shards: Dict[Tuple[str, int], Tuple[int, int]] = {}
        # How long a same-host request's thread polls for its answer before it sleeps in
        # recv (Connection.wait_spinning); MMC_SAME_HOST_SPIN_US, 0 to sleep at once.
        self.spin_s = _spin_seconds(os.environ.get("MMC_SAME_HOST_SPIN_US"))
        # The threads waiting in Connection.wait_spinning (set and deleted per thread id: each
        # one atomic under the GIL).
        self._waiting: Dict[int, bool] = {}
        # The buffers alloc_shared made, sorted by address, beside their addresses (for
        # bisect); replaced whole, never changed in place, so it is read without a lock.
        self._shared: Tuple[List[int], List[SharedBuffer]] = ([], [])
        # Each thread's shared buffer for get()'s bytes (get_scratch), and those of threads
        # gone, to free.
        self._scratch = threading.local()
        self._orphans: List[SharedBuffer] = []

    def close(self) -> None:
        self.pool.close()
        # The connections that offered them are closed: the servers have unmapped them.
        with self._ep_lock:
            bufs, self._shared = self._shared[1], ([], [])
        for b in bufs:
            b.close()

    def alloc_shared(self, size: int) -> "SharedBuffer":
        """A buffer of ``size`` bytes that same-host servers copy to and from with ``memcpy``
        (``SharedBuffer``); freed by ``close``."""
        b = SharedBuffer(size)
        with self._ep_lock:
            starts, bufs = list(self._shared[0]), list(self._shared[1])
            i = bisect.bisect(starts, b.ptr)
            starts.insert(i, b.ptr)
            bufs.insert(i, b)
            self._shared = (starts, bufs)
        return b

    def get_scratch(self, at_least: int = 0) -> Optional["SharedBuffer"]:
        """This thread's shared buffer that same-host gets of new bytes (``get``) are copied
        into: ``_SCRATCH_MIN_BYTES`` at first, replaced by one of the next power of two when
        an object of ``at_least`` bytes did not fit (up to ``_SCRATCH_MAX_BYTES``); freed when
        the thread ends. None where shared memory cannot be made (no ``memfd_create``)."""
        while self._orphans:
            self.free_shared(self._orphans.pop())
        held: Optional[_Scratch] = getattr(self._scratch, "held", None)
        b = held.buf if held is not None else None
        if b is not None and b.size >= at_least:
            return b
        if getattr(self._scratch, "failed", False) or at_least > _SCRATCH_MAX_BYTES:
            return b
        size = max(_SCRATCH_MIN_BYTES, 1 << max(at_least - 1, 0).bit_length())
        try:
            new = self.alloc_shared(size)
        except OSError:
            self._scratch.failed = True
            return b
        if held is not None:
            held.free()
        self._scratch.held = _Scratch(self, new)
        return new

    def drop_scratch(self) -> None:
        """Frees this thread's buffer of ``get_scratch``; its next get takes a new one."""
        held: Optional[_Scratch] = getattr(self._scratch, "held", None)
        if held is not None:
            self._scratch.held = None
            held.free()

    def free_shared(self, b: "SharedBuffer") -> None:
        """Frees ``b``'s memory and forgets it (see ``SharedBuffer.retire``); a buffer not
        of this client, or freed already: nothing."""
        with self._ep_lock:
            starts, bufs = self._shared
            i = next((i for i, x in enumerate(bufs) if x is b), -1)
            if i < 0:
                return
            self._shared = (starts[:i] + starts[i + 1:], bufs[:i] + bufs[i + 1:])
        b.retire()

    def _offer(self, conn: Connection, iov: str) -> Optional[str]:
        """``X-Mmc-Shared`` for the shared buffers ``iov`` falls in that ``conn`` has not
        offered yet (None: none). An entry not wholly in one shared buffer is copied through
        the kernel as before."""
        out = []
        starts, bufs = self._shared
        for item in iov.lstrip("~").split(","):
            a, _, n = item.partition(":")
            addr = int(a, 16)
            i = bisect.bisect(starts, addr) - 1
            if i < 0:
                continue
            b = bufs[i]
            if addr + int(n) > b.ptr + b.size or b.ino in conn.shared:
                continue
            conn.shared.add(b.ino)
            out.append("%d:%d:%x:%d" % (b.fd, b.ino, b.ptr, b.size))
        return ",".join(out) or None

    def _scheme(self, host: str, port: int) -> str:
        return "https" if (host, port) in self._https else "http"

    def _tls_for(self, host: str, port: int) -> Optional[ssl.SSLContext]:
        return self.tls if (host, port) in self._https else None

    @property
    def base_url(self) -> str:
        host, port = self.endpoints[self.current]
        return "%s://%s:%d" % (self._scheme(host, port), host, port)

    def _rotate(self, failed_index: int) -> None:
        with self._ep_lock:
            if self.current == failed_index and len(self.endpoints) > 1:
                self.current = (failed_index + 1) % len(self.endpoints)

    def _prefer(self, host: str, port: int) -> None:
        """A standby named the leader: go there first from now on, when it is one of ours."""
        with self._ep_lock:
            try:
                self.current = self.endpoints.index((host, port))
            except ValueError:
                pass

    def request(self, method: str, target: str, body: Sequence[Any] = (),
                headers: Optional[Dict[str, str]] = None,
                reader: BodyReader = _DEFAULT_READER,
                local: Optional[str] = None, key: Optional[bytes] = None,
                first: Optional[Tuple[Connection, bool, str]] = None) -> Response:
        """``body`` is a sequence of buffers sent back to back (no copy). ``local``: the
        ``X-Mmc-Iov`` of the object's buffers (the put's body, the get's destination), for a
        server on this host that takes it instead of bytes on the socket; ``key`` (its bytes)
        then picks the socket of the shard that owns it. ``first``: the request was sent
        already, the short way (:meth:`local_start`), and this is its connection, whether it
        was pooled, and its answer's head: the request goes on from there."""
        deadline = time.monotonic() + self.retry_ms / 1000.0
        attempt = 0
        # Failures in a row that moved to the next URL: each URL gets one try without waiting.
        quick = 0
        while True:
            index = self.current
            host, port = self.endpoints[index]
            try:
                # (A request sent the short way goes on once; any later attempt is a new one.)
                sent, first = first, None
                resp = self._follow(method, host, port, target, body, headers, reader, local,
                                    key, sent)
                if resp.status not in (429, 503):
                    return resp
                failure = TransportError(errors.from_answer(resp),
                                         "server answered %d" % resp.status, retryable=True)
                failure.at_meta = resp.from_meta
                failure.response = resp
            except TransportError as e:
                if not e.retryable:
                    raise
                failure = e
            at_meta = failure.at_meta
            if at_meta:
                self._rotate(index)
                quick += 1
            else:
                quick = len(self.endpoints)
            now = time.monotonic()
            free = at_meta and quick < len(self.endpoints)
            if now >= deadline and not free:
                if failure.response is not None:
                    return failure.response
                raise failure
            if not free:
                quick = 0
                attempt += 1
                pause = min(0.005 * (2 ** min(attempt, 8)), 0.5) * (0.5 + random.random() / 2)
                time.sleep(min(pause, max(0.0, deadline - now)))

    def _follow(self, method: str, host: str, port: int, target: str, body: Sequence[Any],
                headers: Optional[Dict[str, str]], reader: BodyReader,
                local: Optional[str] = None, key: Optional[bytes] = None,
                sent: Optional[Tuple[Connection, bool, str]] = None,
                origin: Optional[Tuple[str, int, str]] = None) -> Response:
        at_meta = origin is None
        first = True
        # Where the request starts again after an expired mapped copy: the meta (a followed
        # pipelined request names it: its own first hop was the local service).
        origin = origin or (host, port, target)
        expired = 0
        for _ in range(_MAX_REDIRECTS + 1):
            try:
                resp = None
                if local is not None:
                    once, sent = sent, None
                    try:
                        resp = self._same_host(method, host, port, target, headers, reader,
                                               local, key, once)
                    except _mapped.Expired:
                        # A mapped copy under a local service's grant ended after the grant
                        # did: nothing of it counts, and the request starts again at the meta
                        # for a new grant (twice at most; then TCP carries the grant).
                        expired += 1
                        if expired <= 2:
                            host, port, target = origin
                            at_meta = True
                            continue
                if resp is None:
                    body_len = sum(len(b) for b in body)
                    expect = 0 < body_len and body_len >= self.expect_continue_bytes
                    resp = self._exchange(method, host, port, target, body, headers, reader,
                                          expect, at_meta)
            except TransportError as e:
                e.at_meta = at_meta
                raise
            resp.from_meta = at_meta
            if resp.status not in (307, 308) or not resp.header("location"):
                return resp
            loc = resp.header("location")
            if loc.startswith("/"):
                target = loc
            else:
                parts = urlsplit(loc)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    return resp
                https = parts.scheme == "https"
                host, port = parts.hostname, parts.port or (443 if https else 80)
                if https:
                    with self._ep_lock:
                        self._https.add((host, port))
                        if self.tls is None:
                            self.tls = ssl.create_default_context()
                target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
            # A local service's URL carries the meta's grant; a standby's names the leader.
            granted = "grant=" in target.partition("?")[2]
            if at_meta and not granted and first:
                self._prefer(host, port)
            at_meta = at_meta and not granted
            first = False
            if self.on_redirect is not None:
                self.on_redirect(method, target, host, port)
        raise TransportError(errors.MMC_ERROR, "too many redirects")

    def local_path(self, host: str, port: int) -> Optional[str]:
        """The same-host socket of the server at (host, port), or None: it runs elsewhere, as
        another user, without one, or ``MMC_TRANSPORT=tcp``. Found out at the first request to
        that server, and again ``_REDISCOVER_SECONDS`` after it was found without one or its
        socket failed."""
        if not self.same_host or (host, port) in self._https:
            return None
        # Known already (the common case): no lock (a dict read is atomic).
        known = self._local.get((host, port))
        if known is not None:
            return known
        now = time.monotonic()
        with self._ep_lock:
            if (host, port) in self._local:
                known = self._local[(host, port)]
                if known is not None or now - self._local_at[(host, port)] < _REDISCOVER_SECONDS:
                    return known
            else:
                self._local[(host, port)] = None
            # Asked (again) once, by this thread; the others keep TCP meanwhile.
            self._local_at[(host, port)] = now
        path = self._discover(host, port)
        with self._ep_lock:
            self._local[(host, port)] = path
            self._local_at[(host, port)] = time.monotonic()
        return path

    def _discover(self, host: str, port: int) -> Optional[str]:
        try:
            resp = self._exchange("GET", host, port, "/health", (), None, _DEFAULT_READER)
            advert = resp.header("x-mmc-same-host")
            if resp.status != 200 or not advert:
                return None
            path = str(advert).partition(" ")[2]
            # Every shard also has a socket of its own: PATH.0, PATH.1, ...
            count = str(resp.header("x-mmc-same-host-shards") or "")
            shards = int(count) if count.isdigit() else 0
            conn, _ = self.pool.take(host, port, None, path)
            try:
                server_pid, server_uid = _peer_cred(conn.sock)
                if server_uid != os.geteuid():
                    conn.close()
                    return None
                # The same process as the one behind the TCP port (not another server's
                # socket at that path).
                resp, keep = self._on(conn, False, "GET", host, port, "/health", (), None,
                                      _DEFAULT_READER, False)
                if resp.status != 200 or resp.header("x-mmc-same-host") != advert:
                    conn.close()
                    return None
                _allow_ptrace(server_pid)
                with self._ep_lock:
                    if shards > 1 and _xxh3 is not None:
                        self._local_shards[(host, port)] = (shards, server_pid)
                    else:
                        self._local_shards.pop((host, port), None)
            except BaseException:
                conn.close()
                raise
            if keep:
                self.pool.give(conn)
            else:
                conn.close()
            return path
        except (OSError, EOFError, ValueError, TransportError):
            return None

    def _same_host(self, method: str, host: str, port: int, target: str,
                   headers: Optional[Dict[str, str]], reader: BodyReader,
                   local: str, key: Optional[bytes] = None,
                   sent: Optional[Tuple[Connection, bool, str]] = None) -> Optional[Response]:
        """The request over the server's same-host socket with ``X-Mmc-Iov: local`` (the
        socket of ``key``'s owner shard when the server has one per shard); None when the
        server has none (or refuses this process), so TCP carries it. ``sent``: as
        ``request``'s ``first``."""
        path = None
        if sent is None:
            path = self.local_path(host, port)
            if path is None:
                return None
        hdrs = dict(headers) if headers else {}
        hdrs["X-Mmc-Iov"] = local
        for _ in range(3):
            head = None
            if sent is not None:
                conn, reused, head = sent
                sent = None
            else:
                path = path or self.local_path(host, port)
                if path is None:
                    return None
                try:
                    conn, reused = self._take_owner(host, port, path, key)
                except OSError:
                    self._forget_local(host, port)
                    return None
            try:
                got = self._on_socket(conn, host, port, lambda: self._on_local(
                    conn, reused, method, host, port, target, hdrs, reader, head))
            except _StaleConnection:
                conn.close()
                continue
            if got is None:
                return None
            resp, keep = got
            if keep:
                self.pool.give(conn)
            else:
                conn.close()
            if resp.status in (400, 403) and b"same-host" in bytes(resp.body or b""):
                # Refused, or the copy failed (the server may not read this process's memory,
                # see _allow_ptrace): TCP from now on for this server.
                self._forget_local(host, port, again=False)
                return None
            return resp
        return None

    def _take_local(self, host: str, port: int, path: str,
                    pid: Optional[int] = None) -> Tuple[Connection, bool]:
        """A pooled or new connection to a same-host socket. A new one (in a process forked
        after the socket was found, too) names its server as this process's ptracer where Yama
        asks for it (see _allow_ptrace). With ``pid``, a new one must reach that process
        (OSError otherwise)."""
        conn, reused = self.pool.take(host, port, None, path)
        if not reused:
            try:
                peer = _peer_cred(conn.sock)[0]
            except OSError:
                peer = None
            if pid is not None and peer != pid:
                conn.close()
                raise OSError("%s is not the server's socket" % path)
            if peer is not None:
                try:
                    _allow_ptrace(peer)
                except OSError:
                    pass
        return conn, reused

    def owner_socket(self, host: str, port: int, path: str,
                     key: Optional[bytes]) -> Tuple[str, Optional[int]]:
        """The socket for ``key``'s request to the server whose shared same-host socket is
        ``path``: its owner shard's, with the server's pid to check, when the server has one
        per shard; else ``path``."""
        if key is None:
            return path, None
        routing = self._local_shards.get((host, port))
        if routing is None:
            return path, None
        shards, pid = routing
        return "%s.%d" % (path, shard_for(key, shards)), pid

    def _take_owner(self, host: str, port: int, path: str,
                    key: Optional[bytes]) -> Tuple[Connection, bool]:
        """A connection to ``key``'s owner shard's socket, or to the shared socket when the
        server has none per shard or that one cannot be reached (then the shared socket for
        every key of that server, until its socket fails and it is found again)."""
        own, pid = self.owner_socket(host, port, path, key)
        if own != path:
            try:
                return self._take_local(host, port, own, pid)
            except OSError:
                with self._ep_lock:
                    self._local_shards.pop((host, port), None)
        return self._take_local(host, port, path)

    def _forget_local(self, host: str, port: int, again: bool = True) -> None:
        """TCP for that server: until it is asked again (``again``: its socket failed), or for
        good (it refused this process)."""
        with self._ep_lock:
            self._local[(host, port)] = None
            self._local_at[(host, port)] = time.monotonic() if again else float("inf")

    def _exchange(self, method: str, host: str, port: int, target: str, body: Sequence[Any],
                  headers: Optional[Dict[str, str]], reader: BodyReader, expect: bool = False,
                  at_meta: bool = True) -> Response:
        """One request on one (pooled or new) connection; a stale pooled connection is
        replaced once, transparently."""
        for _ in range(3):
            try:
                conn, reused = self.pool.take(host, port, self._tls_for(host, port))
            except socket.timeout as e:
                raise TransportError(errors.MMC_TIMEOUT, "connect to %s:%d timed out" % (host, port),
                                     retryable=True) from e
            except ssl.SSLError as e:
                # A certificate the CA does not vouch for (or no TLS there) is not transient.
                raise TransportError(errors.MMC_NOT_CONNET_META,
                                     "TLS with %s:%d failed: %s" % (host, port, e)) from e
            except OSError as e:
                self.pool.discard(host, port)
                raise TransportError(errors.MMC_NOT_CONNET_META,
                                     "cannot connect to %s:%d: %s" % (host, port, e.strerror or e),
                                     retryable=True) from e
            try:
                resp, keep = self._on(conn, reused, method, host, port, target, body, headers,
                                      reader, expect)
            except _StaleConnection:
                conn.close()
                continue
            except socket.timeout as e:
                conn.close()
                raise TransportError(errors.MMC_TIMEOUT, "request timed out") from e
            except (OSError, EOFError) as e:
                conn.close()
                self.pool.discard(host, port)
                # A meta service that went away mid-request (a leader killed): another URL
                # may answer. A local service is not retried blindly (the meta decides).
                raise TransportError(errors.MMC_ERROR, "connection to %s:%d failed: %s"
                                     % (host, port, e), retryable=at_meta) from e
            except ValueError as e:
                conn.close()
                raise TransportError(errors.MMC_ERROR, "connection to %s:%d failed: %s"
                                     % (host, port, e)) from e
            except BaseException:
                conn.close()
                raise
            if keep:
                self.pool.give(conn)
            else:
                conn.close()
            return resp
        raise TransportError(errors.MMC_NOT_CONNET_META, "connections keep closing", retryable=True)

    def follow(self, resp: Response, method: str, body: Sequence[Any], reader: BodyReader,
               local: Optional[str], key: Optional[bytes] = None,
               origin: Optional[str] = None) -> Response:
        """Carries a request on from the ``307``/``308`` it was answered (a pipelined one:
        the meta allocated or leased for it, so it goes where the meta said, not again to
        the meta). ``origin``: the request's target at the current meta, where a get whose
        mapped copy outlived its grant starts again (``_follow``)."""
        loc = str(resp.header("location") or "")
        parts = urlsplit(loc)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return resp
        https = parts.scheme == "https"
        host, port = parts.hostname, parts.port or (443 if https else 80)
        if https:
            with self._ep_lock:
                self._https.add((host, port))
                if self.tls is None:
                    self.tls = ssl.create_default_context()
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        if self.on_redirect is not None:
            self.on_redirect(method, target, host, port)
        start = None
        if origin is not None:
            meta_host, meta_port = self.endpoints[self.current]
            start = (meta_host, meta_port, origin)
        return self._follow(method, host, port, target, body, None, reader, local, key,
                            origin=start)

    def _head(self, method: str, host: str, port: int, target: str, body_len: int,
              headers: Optional[Dict[str, str]], expect: bool) -> bytes:
        lines = ["%s %s HTTP/1.1" % (method, target), "Host: %s:%d" % (host, port)]
        if body_len or method in ("PUT", "POST"):
            lines.append("Content-Length: %d" % body_len)
        if expect:
            lines.append("Expect: 100-continue")
        if self.token:
            lines.append("Authorization: Bearer " + self.token)
        for k, v in (headers or {}).items():
            lines.append("%s: %s" % (k, v))
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def pipeline(self, requests: Sequence[Tuple[str, str, str, BodyReader, bytes]]
                 ) -> List[Optional[Response]]:
        """Same host: ``(method, target, X-Mmc-Iov, reader, key)`` requests to the current
        meta sent back to back on same-host connections, one per socket they go to (each
        key's owner shard's when the server has one per shard, else the shared one): every
        group is sent before any answer is read, so the shards work on them at once; the
        answers are read in order per connection (the server answers pipelined requests in
        order, with one write for those it has). One ``Response`` per request, or None for
        each one not answered (no same-host socket, a connection broke): the caller sends
        those alone."""
        out: List[Optional[Response]] = [None] * len(requests)
        host, port = self.endpoints[self.current]
        path = self.local_path(host, port)
        if path is None or not requests:
            return out
        # Per socket (with the pid it must reach: None for the shared one), its requests.
        groups: Dict[Tuple[str, Optional[int]], List[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(self.owner_socket(host, port, path, req[4]), []).append(i)
        sent: List[Tuple[Connection, str, List[int]]] = []
        try:
            for (sock_path, pid), idxs in groups.items():
                try:
                    conn, _ = self._take_local(host, port, sock_path, pid)
                except OSError:
                    continue
                sent.append((conn, sock_path, idxs))
                try:
                    conn.send([b"".join(
                        self._local_head(conn, requests[i][0], host, port, requests[i][1],
                                         "X-Mmc-Iov: %s\r\n" % requests[i][2], requests[i][2])
                        for i in idxs)])
                except OSError:
                    conn.close()
            for conn, sock_path, idxs in sent:
                if not conn.closed:
                    self._read_pipelined(conn, sock_path, requests, idxs, out)
        except BaseException:
            for conn, _, _ in sent:
                conn.close()
            raise
        return out

    def _read_pipelined(self, conn: Connection, sock_path: str,
                        requests: Sequence[Tuple[str, str, str, BodyReader, bytes]],
                        idxs: List[int], out: List[Optional[Response]]) -> None:
        """The answers to ``requests[idxs]``, sent in that order on ``conn``, into ``out``;
        the connection back to the pool when it stays open."""
        keep = True
        try:
            for i in idxs:
                _, target, _, reader, _ = requests[i]
                conn.wait_spinning(self.spin_s, self._waiting)
                status, hdrs = conn.read_head()
                clen = hdrs.get("content-length")
                length = int(clen) if clen is not None else None
                data = reader.read(conn, status, hdrs, length)
                out[i] = Response(status, hdrs, data, "unix:%s%s" % (sock_path, target))
                keep = length is not None and hdrs.get("connection", "").lower() != "close"
                if not keep:
                    break
        except (OSError, EOFError, ValueError):
            keep = False
        if keep and not conn.closed:
            self.pool.give(conn)
        else:
            conn.close()

    def _send_local(self, conn: Connection, reused: bool, method: str, host: str, port: int,
                    target: str, lines: str, iov: str) -> str:
        """Sends a same-host request on ``conn``: it has no body (its bytes are named by
        ``X-Mmc-Iov``), so no ``Expect``; one ``sendall`` of the head (``lines``: its own header
        lines, ``X-Mmc-Iov``'s among them). Returns its answer's head (text); raises
        _StaleConnection for a pooled connection the server had closed."""
        conn.uses += 1
        try:
            conn.sock.sendall(self._local_head(conn, method, host, port, target, lines, iov))
            conn.wait_spinning(self.spin_s, self._waiting)
            return conn.read_head_text()
        except (BrokenPipeError, ConnectionResetError, EOFError):
            # Closed before any answer: a pooled connection the server had closed.
            if reused and not conn.rbuf:
                raise _StaleConnection()
            raise

    def _local_head(self, conn: Connection, method: str, host: str, port: int, target: str,
                    lines: str, iov: str) -> bytes:
        """A same-host request's head on ``conn`` (``lines``: its own header lines,
        ``X-Mmc-Iov``'s among them): with the token, the lease the client is done with
        (``X-Mmc-Map``) and the offer of the shared buffers ``iov`` uses that ``conn`` has not
        offered yet."""
        if self.token:
            lines += "Authorization: Bearer %s\r\n" % self.token
        if method in ("PUT", "POST"):
            lines += "Content-Length: 0\r\n"
        if _mapped.may_map(conn.peer_pid):
            lines += "X-Mmc-Map: %d\r\n" % conn.map_done
        if self._shared[1]:
            offer = self._offer(conn, iov)
            if offer:
                lines += "X-Mmc-Shared: %s\r\n" % offer
        return ("%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s\r\n"
                % (method, target, host, port, lines)).encode("latin-1")

    def _on_local(self, conn: Connection, reused: bool, method: str, host: str, port: int,
                  target: str, headers: Dict[str, str], reader: BodyReader,
                  head: Optional[str] = None) -> Tuple[Response, bool]:
        """``_on`` for a same-host request (``head``: its answer's head when it was sent
        already)."""
        if head is None:
            head = self._send_local(conn, reused, method, host, port, target,
                                    "".join("%s: %s\r\n" % kv for kv in headers.items()),
                                    headers["X-Mmc-Iov"])
        status, hdrs = parse_head(head)
        while 100 <= status < 200:
            status, hdrs = conn.read_head()
        clen = hdrs.get("content-length")
        length = int(clen) if clen is not None else None
        if status in (204, 304):
            data, length = b"", 0
        else:
            data = reader.read(conn, status, hdrs, length)
        keep = length is not None and not conn.closed \
            and hdrs.get("connection", "").lower() != "close"
        return Response(status, hdrs, data, "unix:%s%s" % (conn.host[5:], target)), keep

    def local_start(self, method: str, target: str, iov: str,
                    key: bytes) -> Optional[Tuple[Connection, bool, str]]:
        """The short way of a same-host put or get (docs/same-host.md, *The client's short
        way*): when the server this client talks to now is known to have a same-host socket,
        sends the request there (``X-Mmc-Iov: iov``, on ``key``'s owner shard's socket) and
        reads its answer's head. Returns the connection, whether it was pooled, and that
        head; the caller finishes an answer it knows (then gives the connection back with
        :meth:`local_done`) or hands the rest to ``request(..., first=...)``. None when
        nothing was sent (no socket known yet, none to reach, a pooled connection the server
        had closed): the request goes the long way, which also finds, forgets or retries
        what this one met."""
        host, port = self.endpoints[self.current]
        path = self._local.get((host, port)) if self.same_host else None
        if path is None:
            return None
        try:
            conn, reused = self._take_owner(host, port, path, key)
        except OSError:
            return None
        try:
            head = self._on_socket(conn, host, port, lambda: self._send_local(
                conn, reused, method, host, port, target, "X-Mmc-Iov: %s\r\n" % iov, iov))
        except _StaleConnection:
            conn.close()
            return None
        return None if head is None else (conn, reused, head)

    def _on_socket(self, conn: Connection, host: str, port: int,
                   step: Callable[[], _T]) -> Optional[_T]:
        """``step()``, an exchange on the same-host connection ``conn`` to (host, port), and
        what its failures mean: a timeout is the request's (TransportError); the server gone
        mid-request closes ``conn`` and means TCP for that server until it is asked again
        (None: TCP says what happened to it); a pooled connection found closed
        (_StaleConnection) is the caller's to retry."""
        try:
            return step()
        except _StaleConnection:
            raise
        except _mapped.Expired:
            # The server and the connection are fine; the grant is spent (``_follow``).
            conn.close()
            raise
        except (socket.timeout, BlockingIOError) as e:
            # (SO_RCVTIMEO's end is EAGAIN.)
            conn.close()
            raise TransportError(errors.MMC_TIMEOUT, "request timed out") from e
        except (OSError, EOFError, ValueError):
            conn.close()
            self._forget_local(host, port)
            return None
        except BaseException:
            conn.close()
            raise

    def local_body(self, conn: Connection, length: int) -> Optional[bytes]:
        """The body of a short-way answer whose head said its length, read whole; the
        connection back to the pool. None when it could not be read (closed, and TCP for its
        server, as the long way does): the request goes the long way again."""
        host, port = self.endpoints[self.current]
        data = self._on_socket(conn, host, port, lambda: conn.read_bytes(length))
        if data is not None:
            self.pool.give(conn)
        return data

    def local_done(self, conn: Connection) -> None:
        """A connection of the short way whose answer was read whole, back to the pool."""
        self.pool.give(conn)

    def local_failed(self, conn: Connection) -> None:
        """A connection of the short way whose answer could not be read or copied: closed, and
        TCP for its server until it is asked again (as the long way does)."""
        conn.close()
        host, port = self.endpoints[self.current]
        self._forget_local(host, port)

    def _on(self, conn: Connection, reused: bool, method: str, host: str, port: int,
            target: str, body: Sequence[Any], headers: Optional[Dict[str, str]],
            reader: BodyReader, expect: bool) -> Tuple[Response, bool]:
        body_len = sum(len(b) for b in body)
        expect = expect and body_len > 0
        head = self._head(method, host, port, target, body_len, headers, expect)
        conn.uses += 1
        sent_any_answer = [False]

        def read_final_head() -> Tuple[int, Dict[str, str]]:
            while True:
                try:
                    status, hdrs = conn.read_head()
                except EOFError:
                    if reused and not sent_any_answer[0] and not conn.rbuf:
                        raise _StaleConnection()
                    raise
                sent_any_answer[0] = True
                if 100 <= status < 200:
                    continue
                return status, hdrs

        body_sent = True
        try:
            if expect:
                conn.send([head])
                # Wait for the go-ahead (or an early final answer: a redirect, a refusal).
                conn.settimeout(self.expect_timeout)
                try:
                    status, hdrs = conn.read_head()
                    sent_any_answer[0] = True
                except socket.timeout:
                    # No answer in time: send the body anyway (RFC 9110 allows it).
                    status, hdrs = 100, {}
                except EOFError:
                    if reused and not conn.rbuf:
                        raise _StaleConnection()
                    raise
                finally:
                    conn.settimeout(self.timeout)
                if status == 100:
                    conn.send(body)
                    status, hdrs = read_final_head()
                elif 100 < status < 200:
                    conn.send(body)
                    status, hdrs = read_final_head()
                else:
                    body_sent = False
            else:
                conn.send([head] + list(body))
                status, hdrs = read_final_head()
        except BrokenPipeError:
            if reused and not sent_any_answer[0]:
                raise _StaleConnection()
            raise
        except ConnectionResetError:
            if reused and not sent_any_answer[0]:
                raise _StaleConnection()
            raise
        clen = hdrs.get("content-length")
        length = int(clen) if clen is not None else None
        if method == "HEAD" or status in (204, 304):
            data, length = b"", 0
        else:
            data = reader.read(conn, status, hdrs, length)
        keep = (length is not None or _chunked(hdrs)) and body_sent \
            and hdrs.get("connection", "").lower() != "close" and not conn.closed
        return Response(status, hdrs, data, "%s://%s:%d%s" % (self._scheme(host, port), host, port,
                                                              target)), keep


# Linux's SO_PEERCRED answer: pid, uid, gid.
_UCRED = struct.Struct("3i")
# prctl(PR_SET_PTRACER, pid): lets that process ptrace (and process_vm_* into) this one under
# Yama's ptrace_scope 1.
_PR_SET_PTRACER = 0x59616D61


def _peer_cred(sock: socket.socket) -> Tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, as the kernel saw it."""
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                _UCRED.size))
    return pid, uid


def _allow_ptrace(pid: int) -> None:
    """Under Yama's ptrace_scope 1 a process of the same user may read or write this one's
    memory only if it is an ancestor, or named with PR_SET_PTRACER: name the server (one
    process at a time: the last same-host server found). Nothing to do as root, or without
    Yama, or when it forbids ptrace altogether (the server's copies then fail and TCP is used)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return
    if scope != "1" or os.geteuid() == 0:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_AsString = ctypes.pythonapi.PyBytes_AsString
_PyBytes_AsString.argtypes = (ctypes.py_object,)
_PyBytes_AsString.restype = ctypes.c_void_p
_PyMemoryView_FromMemory = ctypes.pythonapi.PyMemoryView_FromMemory
_PyMemoryView_FromMemory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyMemoryView_FromMemory.restype = ctypes.py_object
_PyBUF_WRITE = 0x200
# Bodies from this size up are received straight into their bytes (Connection.read_bytes).
_FILL_BYTES_MIN = 64 * 1024

_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_GetBuffer.restype = ctypes.c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_ReleaseBuffer.restype = None
_PyBUF_SIMPLE = 0


# Mappings of freed shared buffers, kept so that their addresses are never reused
# (SharedBuffer.retire).
_RETIRED: List[mmap.mmap] = []


class _Scratch:
    """A thread's buffer of ``Client.get_scratch``, held in its ``threading.local``: freed
    when replaced, or when the thread ends and its locals go."""

    def __init__(self, client: Client, buf: "SharedBuffer") -> None:
        self.buf = buf
        self._client = weakref.ref(client)
        self._done = weakref.finalize(self, _free_scratch, self._client, buf)

    def free(self) -> None:
        """Frees it now (its thread, outside the client's lock)."""
        if self._done.detach() is not None:
            c = self._client()
            if c is not None:
                c.free_shared(self.buf)


def _free_scratch(client: "weakref.ReferenceType[Client]", buf: "SharedBuffer") -> None:
    # Run by the garbage collector at any moment, perhaps in a thread that holds the client's
    # lock: only noted here (a list append is atomic); the next get_scratch frees it.
    c = client()
    if c is not None:
        c._orphans.append(buf)


class SharedBuffer:
    """Memory this process shares with the same-host servers it uses: a ``memfd`` sealed
    against shrinking and mapped here (docs/same-host.md, *Shared buffers*). A put from it or a
    get into it is a ``memcpy`` in the server (no kernel copy); elsewhere the same calls work
    as on any memory. ``ptr`` is its address, ``view`` a writable ``memoryview`` of it
    (``numpy.frombuffer(b.view, dtype=numpy.uint8)`` for an array)."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("a shared buffer needs a positive size")
        fd = os.memfd_create("mmc-shared", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            # It can never shrink under a server's copy (the server checks).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.size, self.ino = fd, size, os.fstat(fd).st_ino
        self.view = memoryview(self._map)
        self.ptr = address_of(self.view)

    def retire(self) -> None:
        """Frees its memory (``MADV_REMOVE`` empties the file) but keeps its addresses
        mapped, to the empty file, for the rest of the process: servers may still have it
        mapped for connections that offered it, and memory allocated later at the same
        addresses would be copied into their old mapping instead. So no new allocation lands
        there; a stray use reads zeros. Costs address space only."""
        if self.fd >= 0:
            self._map.madvise(mmap.MADV_REMOVE)
            _RETIRED.append(self._map)
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Frees it; while arrays made from ``view`` still exist, the memory stays mapped
        until the last of them goes (the descriptor is closed at once either way)."""
        if self.fd >= 0:
            try:
                self.view.release()
                self._map.close()
            except BufferError:
                pass
            os.close(self.fd)
            self.fd = -1


def address_of(view: memoryview) -> int:
    """The address of a contiguous byte memoryview's first byte (the caller keeps ``view``,
    and so the memory, alive while the address is used)."""
    b = _PyBuffer()
    if _GetBuffer(view, ctypes.byref(b), _PyBUF_SIMPLE) != 0:
        raise ValueError("not a contiguous buffer")
    try:
        return int(b.buf or 0)
    finally:
        _ReleaseBuffer(ctypes.byref(b))


def iov_header(views: Sequence[memoryview]) -> str:
    """``X-Mmc-Iov`` for ``views``, in order: hexadecimal address, decimal length."""
    return ",".join("%x:%d" % (address_of(v), len(v)) for v in views if len(v))
