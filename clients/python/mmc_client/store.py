"""``DistributedObjectStore``: upstream MemCache Hybrid's Python API over mmc-server's HTTP data
plane. Every data-path method returns upstream's codes (0 success, negative errors), ``get``
returns ``b""`` on failure, ``is_exist`` 1/0. As upstream's binding, an argument of the wrong
type raises ``TypeError`` (a ``str`` where bytes are expected, a key that is not a ``str``);
nothing else raises on the data path."""

from __future__ import annotations

import ctypes
import enum
import functools
import json
import logging
import os
import re
import ssl
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, cast
from urllib.parse import quote

from . import _localconf, _mapped, errors
from ._gva import GvaMixin
from ._http import (_PyBUF_WRITE, BodyReader, Client, Connection, Response, SharedBuffer,
                    TransportError, _PyMemoryView_FromMemory, address_of, head_field,
                    iov_header, parse_head)

log = logging.getLogger("mmc_client")


class MmcCopyDirect(enum.IntEnum):
    """Copy directions, as upstream's ``MmcCopyDirect``: local (device) or host memory to and
    from the global pool. Only the host directions are served here (no device memory)."""

    SMEMB_COPY_L2G = 0
    SMEMB_COPY_G2L = 1
    SMEMB_COPY_G2H = 2
    SMEMB_COPY_H2G = 3


SMEMB_COPY_L2G = MmcCopyDirect.SMEMB_COPY_L2G
SMEMB_COPY_G2L = MmcCopyDirect.SMEMB_COPY_G2L
SMEMB_COPY_G2H = MmcCopyDirect.SMEMB_COPY_G2H
SMEMB_COPY_H2G = MmcCopyDirect.SMEMB_COPY_H2G
# Upstream's short names.
L2G, G2L, G2H, H2G = SMEMB_COPY_L2G, SMEMB_COPY_G2L, SMEMB_COPY_G2H, SMEMB_COPY_H2G

# Media codes of KeyInfo.type_list(), as upstream's MediaType.
MEDIA_HBM = 0
MEDIA_DRAM = 1
MEDIA_SSD = 2
_MEDIA = {"HBM": MEDIA_HBM, "DRAM": MEDIA_DRAM, "SSD": MEDIA_SSD}

_MAX_BATCH_KEYS = 4096
# The request target is limited to 8 KiB: batch_put's keys= and sizes= stay well inside it.
_MAX_QUERY_BYTES = 7000
# batch_put's body is buffered by the server (ock.mmc.http.max_body_bytes, 64 MB by default).
_MAX_BATCH_BODY = 16 * 1024 * 1024
_MISSING = 0xFFFFFFFFFFFFFFFF
# Same host: the single requests of a batch sent back to back on one connection at a time.
_PIPELINE = 64
# A get_into body of the wrong size up to this many bytes is read and dropped (the connection
# stays pooled); a larger one closes the connection instead of crossing the network for nothing.
_SKIP_LIMIT = 1024 * 1024
# What batch_put answers for a key it placed on a remote rank (whose bytes it cannot write).
_REMOTE_BATCH_FAILURE = "Write failed"
# Upstream's limit on the layers of one object (*_layers).
MAX_LAYER_NUM = 255

_PyBUF_READ = 0x100

# A buffer argument: an address of host memory (int) or an object with the buffer protocol.
Buffer = Any
# One object's bytes as the buffers they are sent from or received into, back to back.
Parts = List[memoryview]
# A request sent the short way (Client.local_start): its connection, whether it was pooled, and
# its answer's head.
Started = Tuple[Connection, bool, str]
# A put's answer read by the short way: its body up to this many bytes (the server's answer to a
# put is a few dozen); a longer one goes the long way.
_SHORT_BODY_MAX = 4096
# How the server's answer to a same-host get that it copied, or whose places it says, begins.
_GOT_HEAD = ("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
             "Content-Length: 0\r\n")


class _Fail(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _ArgTypeError(TypeError):
    """An argument of the wrong type: raised to the caller, as upstream's binding does."""


def _view(ptr: Buffer, size: int, writable: bool) -> memoryview:
    """A byte memoryview over ``size`` bytes of host memory at address ``ptr`` (an int from
    ctypes.addressof, numpy's ``ctypes.data``, torch's ``data_ptr()``), or over an object that
    exposes the buffer protocol. No copy."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise _ArgTypeError("size must be an int, not %s" % type(size).__name__)
    if size < 0:
        raise _Fail(errors.MMC_INVALID_PARAM)
    if isinstance(ptr, int) and not isinstance(ptr, bool):
        if ptr == 0:
            raise _Fail(errors.MMC_INVALID_PARAM)
        if size == 0:
            return memoryview(b"")
        return cast(memoryview, _PyMemoryView_FromMemory(
            ptr, size, _PyBUF_WRITE if writable else _PyBUF_READ))
    if isinstance(ptr, str):
        raise _ArgTypeError("a buffer address (int) or a buffer is expected, not str")
    try:
        mv = memoryview(ptr).cast("B")
    except TypeError:
        raise _ArgTypeError("a buffer address (int) or an object with the buffer protocol is "
                            "expected, not %s" % type(ptr).__name__) from None
    if len(mv) < size or (writable and mv.readonly):
        raise _Fail(errors.MMC_INVALID_PARAM)
    return mv[:size]


def _bytes_view(buf: Any) -> memoryview:
    if isinstance(buf, str):
        raise _ArgTypeError("bytes-like value expected, not str (encode it)")
    try:
        return memoryview(buf).cast("B")
    except TypeError:
        raise _ArgTypeError("bytes-like value expected, not %s" % type(buf).__name__) from None


# Keys made only of characters a query value carries as they are (unreserved ones, and "/",
# ":", "@", which RFC 3986 allows in a query and the server takes literally) need no quoting:
# most keys. ("+" reads as a space, "%", "&", "=", "#" and the rest are quoted.)
_UNRESERVED_KEY = re.compile(r"[A-Za-z0-9_.~/:@-]{1,4096}").fullmatch


def _check_key(key: Any) -> str:
    """``key`` quoted for a query; ``_ArgTypeError`` or ``_Fail`` when it is not a key."""
    if type(key) is str and _UNRESERVED_KEY(key):
        return key
    if not isinstance(key, str):
        raise _ArgTypeError("key must be a str, not %s" % type(key).__name__)
    if not key or len(key.encode()) > 4096:
        raise _Fail(errors.MMC_INVALID_PARAM)
    return quote(key, safe="")


def _str_list(keys: Any, what: str = "keys") -> List[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise _ArgTypeError("%s must be a list of str" % what)
    for k in keys:
        if not isinstance(k, str):
            raise _ArgTypeError("%s must be a list of str, found %s" % (what, type(k).__name__))
    return list(keys)


def _seq(v: Any, what: str) -> List[Any]:
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
        raise _ArgTypeError("%s must be a list" % what)
    return list(v)


def _direct(direct: Any, host: MmcCopyDirect) -> None:
    """Only the host direction is served: a device direction or an unknown value is upstream's
    code for an unsupported direction, -1."""
    if isinstance(direct, bool) or not isinstance(direct, int):
        raise _ArgTypeError("direct must be an int (MmcCopyDirect)")
    if direct != host:
        raise _Fail(errors.MMC_ERROR)


def _layer_views(ptrs: Any, sizes: Any, writable: bool) -> Parts:
    """One object's layers: the buffers it is sent from or received into, in order."""
    ptrs, sizes = _seq(ptrs, "buffer_ptrs"), _seq(sizes, "sizes")
    if not ptrs or len(ptrs) > MAX_LAYER_NUM or len(ptrs) != len(sizes):
        raise _Fail(errors.MMC_ERROR)
    return [_view(p, n, writable) for p, n in zip(ptrs, sizes)]


def _status_code(resp: Any) -> int:
    """The code of a protocol error; an authorization failure (401, 403), which has no code of
    its own upstream (-1), is logged with the server's message, since the code cannot say it."""
    if resp.status in (401, 403):
        log.warning("the server at %s refused the request, %d: %s (check api_token)",
                    resp.url, resp.status, errors.message_of(resp.body))
    return errors.from_answer(resp)


def _code_of_envelope(resp: Any) -> Optional[int]:
    """The code of a JSON answer that is an error envelope or a protocol error, else None."""
    if resp.status != 200:
        return _status_code(resp)
    return None


def _json(resp: Any) -> Any:
    code = _code_of_envelope(resp)
    if code is not None:
        raise _Fail(code)
    try:
        v = json.loads(resp.body)
    except ValueError:
        raise _Fail(errors.MMC_ERROR) from None
    if isinstance(v, dict) and v.get("success") is False:
        raise _Fail(errors.from_answer(resp, v.get("error_message")))
    return v


_F = TypeVar("_F", bound=Callable[..., Any])


def _guard(default: Callable[[int, Tuple[Any, ...]], Any]) -> Callable[[_F], _F]:
    """Never raise from the data path (but for wrong argument types): failures become
    ``default(code, args)``."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except _ArgTypeError:
                raise
            except _Fail as f:
                return default(f.code, args)
            except TransportError as e:
                log.warning("%s: %s", fn.__name__, e)
                return default(e.code, args)
            except Exception as e:  # noqa: BLE001 - the data path returns codes
                log.warning("%s failed: %r", fn.__name__, e)
                return default(errors.MMC_ERROR, args)

        return cast(_F, inner)

    return wrap


def _code(code: int, _args: Tuple[Any, ...]) -> int:
    return code


def _codes(code: int, args: Tuple[Any, ...]) -> List[int]:
    n = len(args[0]) if args and isinstance(args[0], (list, tuple)) else 0
    return [code] * n


class LocalConfig:
    """Upstream's client configuration. Only the fields below matter to this client; every
    other upstream field (protocol, dram_size, hbm_size, tls_*, ...) is accepted and ignored,
    since this client contributes no memory and talks HTTP.

    - ``meta_service_url``: ``http://host:port`` of mmc-server, or a comma list for HA.
    - ``client_timeout_seconds``: per socket operation (connect, send, receive).
    - ``client_retry_milliseconds``: total time to keep retrying a request that reached no
      server (refused), or that the server answered 429/503, rotating through the URLs.

    Extensions: ``api_token`` (default: env ``MMC_API_TOKEN``), ``expect_continue_bytes``
    (bodies from this size are sent after the server's ``100 Continue``),
    ``duplicate_put_is_error`` (False: a put of an existing key returns 0 and keeps the first
    value, as upstream; True: it returns -3006) and ``local_service_id`` (what
    ``get_local_service_id()`` answers; -1: no local service).

    TLS: an ``https://`` URL is verified against ``tls_ca_path`` (PEM; the system's CAs when
    unset) and presents ``tls_cert_path``/``tls_key_path`` as the client certificate when set
    (mmc-server's ``ock.mmc.metrics.tls.*`` requires one).
    """

    def __init__(self) -> None:
        self.meta_service_url: str = os.environ.get("MMC_URL", "http://127.0.0.1:8000")
        self.config_store_url = "tcp://127.0.0.1:6000"
        self.log_level = "info"
        self.world_size = 256
        self.protocol = "host_tcp"
        self.dram_size = "0"
        self.hbm_size = "0"
        self.client_retry_milliseconds: int = 0
        self.client_timeout_seconds: float = 60
        self.api_token: Optional[str] = os.environ.get("MMC_API_TOKEN") or None
        self.expect_continue_bytes: int = 256 * 1024
        self.duplicate_put_is_error: bool = False
        self.local_service_id: int = -1
        self.tls_ca_path: str = ""
        self.tls_cert_path: str = ""
        self.tls_key_path: str = ""

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The TLS context of ``https://`` URLs (None: the client's default, system CAs)."""
        if not (self.tls_ca_path or self.tls_cert_path):
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca_path or None)
        if self.tls_cert_path:
            ctx.load_cert_chain(self.tls_cert_path, self.tls_key_path or None)
        return ctx

    @classmethod
    def from_local_config(cls, path: str) -> "LocalConfig":
        """Upstream's local configuration file (the one ``MMC_LOCAL_CONFIG_PATH`` names);
        ``ValueError`` when it cannot be read or a value does not parse."""
        keys = _localconf.read(path)
        c = cls()
        try:
            if "ock.mmc.meta_service_url" in keys:
                c.meta_service_url = _localconf.meta_urls(keys["ock.mmc.meta_service_url"])
            if keys.get("ock.mmc.client.timeout.seconds"):
                c.client_timeout_seconds = float(keys["ock.mmc.client.timeout.seconds"])
            if keys.get("ock.mmc.client.retry_milliseconds"):
                c.client_retry_milliseconds = int(keys["ock.mmc.client.retry_milliseconds"])
            if keys.get("ock.mmc.local_service.rank"):
                c.local_service_id = int(keys["ock.mmc.local_service.rank"])
            if keys.get("ock.mmc.client.api_token"):
                c.api_token = keys["ock.mmc.client.api_token"]
            if keys.get("ock.mmc.local_service.protocol"):
                c.protocol = keys["ock.mmc.local_service.protocol"]
            c.tls_ca_path = keys.get("ock.mmc.tls.ca.path", "")
            c.tls_cert_path = keys.get("ock.mmc.tls.cert.path", "")
            c.tls_key_path = keys.get("ock.mmc.tls.key.path", "")
            if keys.get("ock.mmc.tls.enable", "").lower() == "true":
                c.meta_service_url = c.meta_service_url.replace("http://", "https://")
        except ValueError as e:
            raise ValueError("%s: %s" % (path, e)) from None
        return c

    def __repr__(self) -> str:
        fields = ", ".join("%s=%r" % (k, v) for k, v in sorted(vars(self).items())
                           if k != "api_token")
        return "LocalConfig(%s)" % fields


class ReplicateConfig:
    """``replicaNum`` (1-8) copies on distinct ranks. ``preferredLocalServiceIDs``: the first
    id is the rank the first copy goes to when it has room (``prefer_rank=``; a negative id,
    as ``get_local_service_id()`` answers without a local service, is no preference); the others
    are ignored. Extension: ``medium`` ``"hbm"``/``"dram"``/None."""

    def __init__(self, replicaNum: int = 1,
                 preferredLocalServiceIDs: Optional[Sequence[int]] = None,
                 medium: Optional[str] = None) -> None:
        self.replicaNum = replicaNum
        self.preferredLocalServiceIDs = list(preferredLocalServiceIDs or [])
        self.medium = medium

    def query(self) -> str:
        q = ""
        if self.replicaNum is not None and self.replicaNum != 1:
            if isinstance(self.replicaNum, bool) or not isinstance(self.replicaNum, int):
                raise _ArgTypeError("replicaNum must be an int")
            if not 1 <= self.replicaNum <= 8:
                # Upstream answers an invalid replica count with -1.
                raise _Fail(errors.MMC_ERROR)
            q += "&replicas=%d" % self.replicaNum
        if self.preferredLocalServiceIDs:
            rank = self.preferredLocalServiceIDs[0]
            if isinstance(rank, bool) or not isinstance(rank, int):
                raise _ArgTypeError("preferredLocalServiceIDs must be ints")
            if rank >= 0:
                q += "&prefer_rank=%d" % rank
        if self.medium:
            if self.medium not in ("hbm", "dram"):
                raise _Fail(errors.MMC_INVALID_PARAM)
            q += "&medium=" + self.medium
        return q


class KeyInfo:
    """What upstream's ``get_key_info`` returns: size, the ranks of the copies and their media
    (0 HBM, 1 DRAM, 2 SSD), and ``gva_list()``: the global address this client gives the object
    for ``batch_add_lease``/``batch_copy``. A missing key is ``KeyInfo(0, [])``."""

    def __init__(self, size: int = 0, locs: Sequence[int] = (), types: Sequence[int] = (),
                 leases_ms: Sequence[int] = (), gvas: Sequence[int] = ()) -> None:
        self._size = size
        self._locs = list(locs)
        self._types = list(types)
        self._leases = list(leases_ms)
        self._gvas = list(gvas)

    def size(self) -> int:
        return self._size

    def loc_list(self) -> List[int]:
        return list(self._locs)

    def type_list(self) -> List[int]:
        return list(self._types)

    def gva_list(self) -> List[int]:
        return list(self._gvas)

    def lease_list(self) -> List[int]:
        """Extension: the remaining lease of each copy, in ms."""
        return list(self._leases)

    def __str__(self) -> str:
        return "KeyInfo(size=%d, locs=%s, types=%s)" % (self._size, self._locs, self._types)

    __repr__ = __str__

    @classmethod
    def from_query(cls, v: Any) -> "KeyInfo":
        if not v or not v.get("valid"):
            return cls()
        blobs = v.get("blobs") or []
        return cls(v.get("size", 0), [b.get("rank", 0) for b in blobs],
                   [_MEDIA.get(b.get("medium"), -1) for b in blobs],
                   [b.get("leaseTimeoutTtlMs", 0) for b in blobs])


def _local_iov(parts: Parts) -> Optional[str]:
    """The ``X-Mmc-Iov`` of an object's buffers, for a same-host server (None: nothing to
    copy, the bytes go on the socket)."""
    if not sum(len(v) for v in parts):
        return None
    try:
        return iov_header(parts)
    except ValueError:
        return None


def _ptr_iov(ptr: Buffer, size: int) -> Optional[str]:
    """The ``X-Mmc-Iov`` of ``size`` bytes at the address ``ptr`` (checked by _view), without
    asking the memoryview for it; None for a buffer object or nothing to copy."""
    if type(ptr) is int and size > 0:
        return "%x:%d" % (ptr, size)
    return None


def _put_ok(status: int, body: Any) -> bool:
    """Whether a put's answer is the server's success (read without parsing it)."""
    return status == 200 and isinstance(body, bytes) and body.startswith(b'{"success":true,')


def _skip_or_close(conn: Connection, length: int) -> Optional[int]:
    if length <= _SKIP_LIMIT:
        conn.skip(length)
        return length
    conn.close()
    return None


class _IntoReader(BodyReader):
    """get_into (and get_into_layers): an object's bytes go straight into the caller's memory,
    its layers one after the other; only when the object has exactly their total size."""

    def __init__(self, parts: Parts, iov: Optional[str] = None) -> None:
        """``iov``: the parts' ``X-Mmc-Iov`` when the caller has it."""
        self.parts = parts
        self.iov = iov
        self.total = sum(len(v) for v in parts)
        self.code = errors.MMC_OK
        self.length: Optional[int] = None

    def read(self, conn: Connection, status: int, headers: Dict[str, str],
             length: Optional[int]) -> Any:
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        mapped = headers.get("x-mmc-mapped")
        if status == 200 and octets and mapped is not None and length == 0:
            # Same host, mapped: this thread copies the leased blobs from the server's
            # segment (only when they are exactly the buffers' size).
            if self.iov:
                dests = [(int(a, 16), int(n)) for a, _, n in
                         (e.partition(":") for e in self.iov.split(","))]
            else:
                dests = [(address_of(v), len(v)) for v in self.parts if len(v)]
            lease, self.length = _mapped.copy(conn.peer_pid or 0, conn.sock.fileno(), mapped,
                                              dests)
            conn.map_done = lease
            self.code = errors.MMC_OK
            return self.length
        delivered = headers.get("x-mmc-delivered")
        if status == 200 and octets and delivered is not None and length == 0:
            # Same host: the server copied the object into the buffers itself (only when it
            # is exactly their size).
            self.length = int(delivered)
            self.code = errors.MMC_OK if self.length == self.total else errors.MMC_ERROR
            return self.length
        if status != 200 or not octets or length is None:
            return super().read(conn, status, headers, length)
        self.length = length
        if length != self.total:
            # The buffer is not the object's size: nothing is written (a shorter object must
            # not look like a full read over stale bytes).
            self.code = errors.MMC_INVALID_PARAM
            return _skip_or_close(conn, length)
        for view in self.parts:
            conn.read_exact_into(view)
        return length


class _GetReader(BodyReader):
    """get() on the same host: the object's bytes as the server copied them into the thread's
    shared buffer (``X-Mmc-Delivered``), or as they came on the socket when they did not fit
    (``larger``: their length)."""

    def __init__(self, scratch: SharedBuffer, at: int = 0, room: int = -1) -> None:
        """The object goes to ``room`` bytes at ``at`` (all of the buffer by default)."""
        self.scratch = scratch
        self.at = at
        self.room = scratch.size if room < 0 else room
        self.larger = 0

    def read(self, conn: Connection, status: int, headers: Dict[str, str],
             length: Optional[int]) -> Any:
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        mapped = headers.get("x-mmc-mapped")
        if status == 200 and octets and mapped is not None and length == 0:
            # Mapped: the bytes made straight from the server's segment (one copy).
            lease, data = _mapped.string_at(conn.peer_pid or 0, conn.sock.fileno(), mapped,
                                            self.room)
            conn.map_done = lease
            return data
        delivered = headers.get("x-mmc-delivered")
        if status == 200 and octets and delivered is not None and length == 0:
            n = int(delivered)
            if n > self.room:
                raise ValueError("delivered %d bytes into room for %d" % (n, self.room))
            return bytes(self.scratch.view[self.at:self.at + n])
        if status == 200 and octets and length is not None and length > self.room:
            self.larger = length
        return super().read(conn, status, headers, length)


class _BatchIntoReader(BodyReader):
    """batch_get_into (and the layers form): the length-prefixed answer is read key by key
    into each key's buffers."""

    def __init__(self, parts: Sequence[Parts]) -> None:
        self.parts = parts
        self.codes: Optional[List[int]] = None
        # Each object's length as the answer framed it (-1 for a missing key).
        self.lengths: List[int] = []

    def read(self, conn: Connection, status: int, headers: Dict[str, str],
             length: Optional[int]) -> Any:
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        if status != 200 or not octets or length is None:
            return super().read(conn, status, headers, length)
        codes = []
        left = length
        for views in self.parts:
            if left < 8:
                raise ValueError("batch_get answer ended early")
            (n,) = struct.unpack(">Q", bytes(conn.read_exact(8)))
            left -= 8
            if n == _MISSING:
                codes.append(errors.MMC_UNMATCHED_KEY)
                self.lengths.append(-1)
                continue
            if n > left:
                raise ValueError("batch_get answer ended early")
            self.lengths.append(n)
            if n != sum(len(v) for v in views):
                # Not the buffers' size (larger or shorter): nothing is written into them.
                conn.skip(n)
                codes.append(errors.MMC_INVALID_PARAM)
            else:
                for view in views:
                    conn.read_exact_into(view)
                codes.append(errors.MMC_OK)
            left -= n
        if left:
            conn.skip(left)
        self.codes = codes
        return None


class _BatchBytesReader(BodyReader):
    """get_batch over TCP: the length-prefixed answer read object by object, each straight
    into its new ``bytes`` (``values``: None for a missing key)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.values: Optional[List[Optional[bytes]]] = None

    def read(self, conn: Connection, status: int, headers: Dict[str, str],
             length: Optional[int]) -> Any:
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        if status != 200 or not octets or length is None:
            return super().read(conn, status, headers, length)
        values: List[Optional[bytes]] = []
        left = length
        for _ in range(self.count):
            if left < 8:
                raise ValueError("batch_get answer ended early")
            (n,) = struct.unpack(">Q", bytes(conn.read_exact(8)))
            left -= 8
            if n == _MISSING:
                values.append(None)
                continue
            if n > left:
                raise ValueError("batch_get answer ended early")
            values.append(conn.read_bytes(n))
            left -= n
        if left:
            conn.skip(left)
        self.values = values
        return None


def _split_batch_get(body: bytes, count: int) -> List[Optional[bytes]]:
    out: List[Optional[bytes]] = []
    pos = 0
    for _ in range(count):
        (n,) = struct.unpack_from(">Q", body, pos)
        pos += 8
        if n == _MISSING:
            out.append(None)
        else:
            out.append(bytes(body[pos:pos + n]))
            pos += n
    return out


_T = TypeVar("_T")


def _chunks(items: Sequence[_T], limit: int = _MAX_BATCH_KEYS) -> List[Sequence[_T]]:
    return [items[i:i + limit] for i in range(0, len(items), limit)]


def _per_key(keys: Sequence[str], codes: List[int]) -> List[int]:
    """The indexes of the keys that are valid; an invalid one gets its own code in ``codes``
    (upstream answers batches key by key: one bad key does not fail the others)."""
    ok = []
    for i, k in enumerate(keys):
        try:
            _check_key(k)
            ok.append(i)
        except _Fail as f:
            codes[i] = f.code
    return ok


class DistributedObjectStore(GvaMixin):
    """Upstream's ``memcache_hybrid.DistributedObjectStore`` over HTTP. Safe to share between
    threads: each call takes its own pooled keep-alive connection."""

    def __init__(self) -> None:
        super().__init__()
        self._config: Optional[LocalConfig] = None
        self._client: Optional[Client] = None
        # Set when a batch_put answered that every key went to a remote rank (a pure meta).
        self._batch_put_remote = False

    # -- lifecycle -----------------------------------------------------------------------

    def setup(self, config: LocalConfig) -> int:
        """Takes a :class:`LocalConfig`; 0, or -3000 when its URL does not parse."""
        try:
            Client(config.meta_service_url).close()
        except (ValueError, AttributeError, TypeError):
            return errors.MMC_INVALID_PARAM
        self._config = config
        return errors.MMC_OK

    def init(self, device_id: int = 0, init_bm: bool = True) -> int:
        """Connects to the meta service (waiting up to ``client_retry_milliseconds`` for it).
        Without ``setup()``, the configuration is upstream's local configuration file named by
        ``MMC_LOCAL_CONFIG_PATH`` (``ValueError`` when it cannot be read), else the defaults.
        ``device_id`` and ``init_bm`` are accepted for compatibility: this client never
        contributes memory, and reads and writes work in either mode. 0, or -3017 when the
        server cannot be reached, -3004 on a timeout."""
        cfg = self._config
        if cfg is None:
            path = _localconf.env_path()
            cfg = LocalConfig.from_local_config(path) if path else LocalConfig()
        try:
            if self._client is not None:
                self._client.close()
            self._client = Client(
                cfg.meta_service_url,
                timeout=float(cfg.client_timeout_seconds) or None,
                retry_ms=int(cfg.client_retry_milliseconds),
                token=getattr(cfg, "api_token", None),
                expect_continue_bytes=int(getattr(cfg, "expect_continue_bytes", 256 * 1024)),
                tls=cfg.ssl_context() if hasattr(cfg, "ssl_context") else None,
            )
            self._config = cfg
            self._batch_put_remote = False
            resp = self._client.request("GET", "/health")
            if resp.status != 200:
                return _status_code(resp)
            return errors.MMC_OK
        except TransportError as e:
            log.warning("init: %s", e)
            return e.code
        except (ValueError, TypeError, OSError) as e:
            # A URL that does not parse, TLS files that cannot be read.
            log.warning("init: %s", e)
            return errors.MMC_INVALID_PARAM

    def close(self) -> int:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._gva_reset()
        return errors.MMC_OK

    def __enter__(self) -> "DistributedObjectStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def alloc_shared_buffer(self, size: int) -> SharedBuffer:
        """``size`` bytes of memory shared with the same-host servers this store uses (an
        extension: upstream has no such call). A ``put_from`` from it or a ``get_into`` into it
        (and the ``*_layers`` and batch forms) is then copied by the server with ``memcpy``,
        without the kernel's copy between processes: about twice as fast at 1 MiB
        (docs/same-host.md, *Shared buffers*). Anywhere else, over TCP included, it is ordinary
        memory. ``.ptr`` is its address, ``.view`` a writable ``memoryview``; it is freed by
        ``free_shared_buffer`` or when the store is closed. Raises ``RuntimeError`` before
        ``init``."""
        c = self._client
        if c is None:
            raise RuntimeError("alloc_shared_buffer before init")
        return c.alloc_shared(size)

    def free_shared_buffer(self, buffer: SharedBuffer) -> int:
        """Frees a buffer of ``alloc_shared_buffer`` before the store is closed: its memory
        goes at once; its addresses stay reserved (mapped to nothing) for the life of the
        process, so nothing else is allocated where the servers may still have it mapped.
        0; ``MMC_CLIENT_NOT_INIT`` before ``init``."""
        c = self._client
        if c is None:
            return errors.MMC_CLIENT_NOT_INIT
        c.free_shared(buffer)
        return errors.MMC_OK

    def register_buffer(self, buffer_ptr: Buffer, size: int) -> int:
        """Host memory needs no registration over HTTP: 0."""
        return errors.MMC_OK

    def unregister_buffer(self, buffer_ptr: Buffer, size: int) -> int:
        return errors.MMC_OK

    def get_local_service_id(self) -> int:
        """The rank of this client's local service: ``LocalConfig.local_service_id``
        (``ock.mmc.local_service.rank`` of the local configuration file); -1 when it has none
        (this client contributes no memory of its own)."""
        cfg = self._config
        return int(getattr(cfg, "local_service_id", -1)) if cfg is not None else -1

    def _c(self) -> Client:
        c = self._client
        if c is None:
            raise _Fail(errors.MMC_CLIENT_NOT_INIT)
        return c

    def _pipelined(self, method: str, idxs: Sequence[int], keys: List[str],
                   values: Sequence[Optional[Parts]], codes: List[int],
                   replicateConfig: Optional[ReplicateConfig]) -> None:
        """Same host: a batch as single puts or gets (``method``) of each key, sent
        ``_PIPELINE`` at a time back to back on one same-host connection; a key whose answer
        is not final there (none, a redirect to a local service, a refusal) goes alone."""
        extra = (replicateConfig or ReplicateConfig()).query() if method == "PUT" else ""
        alone: List[int] = []
        for lo in range(0, len(idxs), _PIPELINE):
            part, reqs, readers = [], [], []
            for i in idxs[lo:lo + _PIPELINE]:
                parts = cast(Parts, values[i])
                iov = _local_iov(parts)
                if iov is None:
                    alone.append(i)
                    continue
                reader = _IntoReader(parts, iov) if method == "GET" else BodyReader()
                part.append(i)
                readers.append(reader)
                reqs.append((method, "/api/v1/objects?key=" + _check_key(keys[i]) + extra,
                             iov, reader, keys[i].encode()))
            answers = self._c().pipeline(reqs)
            for j, (i, reader, resp) in enumerate(zip(part, readers, answers)):
                try:
                    if resp is not None and resp.status in (307, 308):
                        # The meta allocated (or leased) for this request: on to the local
                        # service it names, under its grant, as a single request does.
                        parts = cast(Parts, values[i])
                        reader = _IntoReader(parts) if method == "GET" else BodyReader()
                        resp = self._c().follow(resp, method, parts if method == "PUT" else (),
                                                reader, _local_iov(parts), keys[i].encode(),
                                                reqs[j][1])
                    if resp is None or resp.status in (429, 503) or (
                            resp.status in (400, 403)
                            and b"same-host" in bytes(resp.body or b"")):
                        alone.append(i)
                        continue
                    if method == "GET":
                        if isinstance(resp.body, bytes):
                            _json(resp)
                            codes[i] = errors.MMC_ERROR
                        else:
                            codes[i] = cast(_IntoReader, reader).code
                    else:
                        if not _put_ok(resp.status, resp.body):
                            _json(resp)  # (raises for a refusal)
                        codes[i] = errors.MMC_OK
                except _Fail as f:
                    codes[i] = self._put_code(f.code) if method == "PUT" else f.code
                except TransportError as e:
                    codes[i] = e.code
        for i in alone:
            try:
                parts = cast(Parts, values[i])
                codes[i] = self._get_parts(keys[i], parts) if method == "GET" \
                    else self._put_parts(keys[i], parts, replicateConfig)
            except (_Fail, TransportError) as f:
                codes[i] = f.code

    def _same_host_now(self) -> bool:
        """Whether the meta service this client talks to now is reached on this host through
        its same-host socket (docs/same-host.md)."""
        c = self._c()
        host, port = c.endpoints[c.current]
        return c.local_path(host, port) is not None

    def _put_code(self, code: int) -> int:
        cfg = self._config
        if code == errors.MMC_DUPLICATED_OBJECT and not (cfg and cfg.duplicate_put_is_error):
            return errors.MMC_OK
        return code

    # -- puts ----------------------------------------------------------------------------

    def _put_parts(self, key: str, parts: Parts,
                   replicateConfig: Optional[ReplicateConfig], q: Optional[str] = None,
                   iov: Optional[str] = None, first: Optional[Started] = None,
                   extra: Optional[str] = None) -> int:
        """``q``, ``iov`` and ``first`` as for _get_parts; ``extra``: replicateConfig's query,
        when the caller has it."""
        q = q or _check_key(key)
        if extra is None:
            extra = replicateConfig.query() if replicateConfig is not None else ""
        resp = self._c().request("PUT", "/api/v1/objects?key=" + q + extra, list(parts),
                                 local=iov or _local_iov(parts), key=key.encode(),
                                 first=first)
        return self._put_answer(resp)

    def _put_answer(self, resp: Response) -> int:
        try:
            _json(resp)
        except _Fail as f:
            return self._put_code(f.code)
        return errors.MMC_OK

    def _put_from_short(self, key: str, q: str, ptr: int, size: int,
                        replicateConfig: Optional[ReplicateConfig]) -> int:
        """put_from of ``size`` bytes at the address ``ptr``, the short way when it applies (as
        _get_into_short): a 200 answer is finished here, any other goes on the long way."""
        c = self._c()
        iov = "%x:%d" % (ptr, size)
        extra = replicateConfig.query() if replicateConfig is not None else ""
        target = "/api/v1/objects?key=" + q + extra
        kb = key.encode()
        started = c.local_start("PUT", target, iov, kb)
        if started is not None:
            conn, _, head = started
            clen = head_field(head, "Content-Length")
            if head.startswith("HTTP/1.1 200 ") and "\r\nConnection:" not in head \
                    and clen is not None and clen.isdigit() and int(clen) <= _SHORT_BODY_MAX:
                body = c.local_body(conn, int(clen))
                if body is None:
                    started = None
                elif _put_ok(200, body):
                    return errors.MMC_OK
                else:
                    return self._put_answer(Response(200, parse_head(head)[1], body,
                                                     "unix:%s%s" % (conn.host[5:], target)))
        return self._put_parts(key, [_view(ptr, size, False)], replicateConfig, q, iov,
                               started, extra)

    @_guard(_code)
    def put(self, key: str, buf: Any, replicateConfig: Optional[ReplicateConfig] = None) -> int:
        return self._put_parts(key, [_bytes_view(buf)], replicateConfig)

    @_guard(_code)
    def put_from(self, key: str, buffer_ptr: Buffer, size: int,
                 direct: int = SMEMB_COPY_H2G,
                 replicateConfig: Optional[ReplicateConfig] = None) -> int:
        q = _check_key(key)
        _direct(direct, SMEMB_COPY_H2G)
        if type(buffer_ptr) is int and type(size) is int and size > 0 and buffer_ptr:
            return self._put_from_short(key, q, buffer_ptr, size, replicateConfig)
        view = _view(buffer_ptr, size, False)
        return self._put_parts(key, [view], replicateConfig, q, _ptr_iov(buffer_ptr, size))

    @_guard(_code)
    def put_from_layers(self, key: str, buffer_ptrs: Sequence[Buffer], sizes: Sequence[int],
                        direct: int = SMEMB_COPY_H2G,
                        replicateConfig: Optional[ReplicateConfig] = None) -> int:
        """One object made of layers: the buffers are sent back to back (one ``sendmsg`` iovec
        list, no concatenation); the object's size is the sum of ``sizes``. 0; -1 for an
        unsupported ``direct`` (only ``SMEMB_COPY_H2G``: host memory), no layer, more than 255,
        or ``sizes`` of another length."""
        _check_key(key)
        _direct(direct, SMEMB_COPY_H2G)
        return self._put_parts(key, _layer_views(buffer_ptrs, sizes, False), replicateConfig)

    def _batch_put(self, keys: List[str], values: Sequence[Optional[Parts]],
                   replicateConfig: Optional[ReplicateConfig],
                   codes: Optional[List[int]] = None) -> List[int]:
        """Puts through batch_put, split so each request's target and body fit; returns one
        code per key. A key whose value is None (or whose code is already set) is skipped."""
        if len(keys) != len(values):
            raise _Fail(errors.MMC_ERROR)
        extra = (replicateConfig or ReplicateConfig()).query()
        codes = codes if codes is not None else [errors.MMC_ERROR] * len(keys)
        valid = [i for i in _per_key(keys, codes) if values[i] is not None
                 and codes[i] == errors.MMC_ERROR]
        quoted = {i: _check_key(keys[i]) for i in valid}
        group: List[int] = []
        names: Set[str] = set()
        qlen = blen = 0

        def flush() -> None:
            if group:
                self._batch_put_group(group, quoted, values, extra, codes, keys,
                                      replicateConfig)
            group.clear()
            names.clear()

        for i in valid:
            parts = cast(Parts, values[i])
            n = sum(len(v) for v in parts)
            q = quoted[i]
            if n > _MAX_BATCH_BODY:
                flush()
                qlen = blen = 0
                codes[i] = self._put_parts(keys[i], parts, replicateConfig)
                continue
            item = len(q) + len(str(n)) + 2
            if group and (qlen + item > _MAX_QUERY_BYTES or blen + n > _MAX_BATCH_BODY
                          or len(group) >= _MAX_BATCH_KEYS or q in names):
                flush()
                qlen = blen = 0
            group.append(i)
            names.add(q)
            qlen += item
            blen += n
        flush()
        return codes

    def _batch_put_group(self, group: List[int], quoted: Dict[int, str],
                         values: Sequence[Optional[Parts]], extra: str, codes: List[int],
                         keys: List[str], replicateConfig: Optional[ReplicateConfig]) -> None:
        parts_of = [cast(Parts, values[i]) for i in group]
        if self._same_host_now():
            # Same host: each object is copied by the server straight from its buffers (one
            # request per key on the same-host socket, instead of one body of them all).
            self._pipelined("PUT", group, keys, values, codes, replicateConfig)
            return
        if self._batch_put_remote:
            # The meta service holds none of the bytes (a pure meta): one put per key, each
            # redirected to its local service.
            for i, parts in zip(group, parts_of):
                codes[i] = self._put_parts(keys[i], parts, replicateConfig)
            return
        target = "/api/v1/objects/batch_put?keys=%s&sizes=%s%s" % (
            ",".join(quoted[i] for i in group),
            ",".join(str(sum(len(v) for v in p)) for p in parts_of), extra)
        try:
            body = [v for p in parts_of for v in p]
            resp = self._c().request("POST", target, body)
            v = _json(resp)
        except (_Fail, TransportError) as f:
            for i in group:
                codes[i] = f.code
            return
        results = v.get("results") or []
        remote = []
        for j, i in enumerate(group):
            r = results[j] if j < len(results) else {}
            if r.get("success"):
                codes[i] = errors.MMC_OK
            elif r.get("error_message") == _REMOTE_BATCH_FAILURE:
                remote.append(j)
            else:
                codes[i] = self._put_code(errors.from_item(r))
        if remote and len(remote) == len(group):
            # Every key was placed on another host's rank: this meta has no rank of its own
            # (or none with room); later batches go key by key straight away.
            self._batch_put_remote = True
        # batch_put writes only the meta's own ranks; a key placed on a remote rank failed
        # (and was released): put it alone, which follows the redirect to its local service.
        for j in remote:
            i = group[j]
            codes[i] = self._put_parts(keys[i], parts_of[j], replicateConfig)

    @_guard(_code)
    def put_batch(self, keys: Sequence[str], values: Sequence[Any],
                  replicateConfig: Optional[ReplicateConfig] = None) -> int:
        """0 when every object was stored, else the first failing key's code."""
        keys = _str_list(keys)
        if len(keys) != len(values):
            return errors.MMC_INVALID_PARAM
        codes = self._batch_put(keys, [[_bytes_view(v)] for v in values], replicateConfig)
        return next((c for c in codes if c != errors.MMC_OK), errors.MMC_OK)

    def _buffers_per_key(self, keys: Any, buffer_ptrs: Any, sizes: Any, direct: Any,
                         host: MmcCopyDirect, make: Callable[[Any, Any], Parts],
                         ) -> Tuple[List[str], List[Optional[Parts]], List[int]]:
        """A batch's arguments checked: the keys, each key's buffers (``make(ptr, size)``) or
        None with its own code when they are invalid (a null pointer, a negative size, a bad
        layer list: the other keys go on), and the codes so far. Lists of different lengths
        are -1 for every key."""
        keys = _str_list(keys)
        buffer_ptrs, sizes = _seq(buffer_ptrs, "buffer_ptrs"), _seq(sizes, "sizes")
        _direct(direct, host)
        codes = [errors.MMC_ERROR] * len(keys)
        out: List[Optional[Parts]] = [None] * len(keys)
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return keys, out, codes
        for i in range(len(keys)):
            try:
                out[i] = make(buffer_ptrs[i], sizes[i])
            except _Fail as f:
                codes[i] = f.code
        return keys, out, codes

    @_guard(_codes)
    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Buffer],
                       sizes: Sequence[int], direct: int = SMEMB_COPY_H2G,
                       replicateConfig: Optional[ReplicateConfig] = None) -> List[int]:
        """One code per key; a key with an invalid key or buffer fails alone."""
        names, values, codes = self._buffers_per_key(
            keys, buffer_ptrs, sizes, direct, SMEMB_COPY_H2G, lambda p, n: [_view(p, n, False)])
        return self._batch_put(names, values, replicateConfig, codes)

    @_guard(_codes)
    def batch_put_from_layers(self, keys: Sequence[str],
                              buffer_ptrs: Sequence[Sequence[Buffer]],
                              sizes: Sequence[Sequence[int]], direct: int = SMEMB_COPY_H2G,
                              replicateConfig: Optional[ReplicateConfig] = None) -> List[int]:
        """One object per key made of its layers (``buffer_ptrs[i]``, ``sizes[i]``), sent
        through batch_put back to back; one code per key."""
        names, values, codes = self._buffers_per_key(
            keys, buffer_ptrs, sizes, direct, SMEMB_COPY_H2G,
            lambda p, n: _layer_views(p, n, False))
        return self._batch_put(names, values, replicateConfig, codes)

    # -- gets ----------------------------------------------------------------------------

    @_guard(lambda code, args: b"")
    def get(self, key: str) -> bytes:
        """The object's bytes, or ``b""`` on any failure. On the same host the server copies
        them into this thread's shared buffer (``X-Mmc-Iov: ~…``, any length up to its size),
        and they are copied from there into the new ``bytes``: two ``memcpy`` instead of the
        socket's two copies through the kernel."""
        target = "/api/v1/objects?key=" + _check_key(key)
        c = self._c()
        scratch = c.get_scratch() if self._same_host_now() else None
        if scratch is None:
            resp = c.request("GET", target)
        else:
            reader = _GetReader(scratch)
            try:
                resp = c.request("GET", target, reader=reader,
                                 local="~%x:%d" % (scratch.ptr, scratch.size),
                                 key=key.encode())
            except TransportError:
                # A server that resumes after the timeout may still write into the buffer:
                # the thread takes another.
                c.drop_scratch()
                raise
            if reader.larger:
                # It came on the socket: the next get of its size fits.
                c.get_scratch(reader.larger)
        if resp.status == 200 and resp.header("content-type", "").startswith(
                "application/octet-stream"):
            return cast(bytes, resp.body)
        return b""

    def _get_parts(self, key: str, parts: Parts, q: Optional[str] = None,
                   iov: Optional[str] = None, first: Optional[Started] = None) -> int:
        """``q``: the key quoted, when the caller has it; ``iov``: the parts' ``X-Mmc-Iov``,
        when the caller has it; ``first``: the request went the short way, and this is where
        it stands (``Client.request``'s ``first``)."""
        iov = iov or _local_iov(parts)
        reader = _IntoReader(parts, iov)
        resp = self._c().request("GET", "/api/v1/objects?key=" + (q or _check_key(key)),
                                 reader=reader, local=iov,
                                 key=key.encode(), first=first)
        if isinstance(resp.body, bytes):
            _json(resp)
            return errors.MMC_ERROR
        return reader.code

    @_guard(_code)
    def get_into(self, key: str, buffer_ptr: Buffer, size: int,
                 direct: int = SMEMB_COPY_G2H) -> int:
        """Receives the object straight into ``size`` bytes at ``buffer_ptr``: 0; -3102 for a
        missing key; -3000 when the buffer is not the object's size, larger or smaller
        (nothing written: a shorter object is not a full read)."""
        q = _check_key(key)
        _direct(direct, SMEMB_COPY_G2H)
        if type(buffer_ptr) is int and type(size) is int and size > 0 and buffer_ptr:
            return self._get_into_short(key, q, buffer_ptr, size)
        view = _view(buffer_ptr, size, True)
        return self._get_parts(key, [view], q, _ptr_iov(buffer_ptr, size))

    def _get_into_short(self, key: str, q: str, ptr: int, size: int) -> int:
        """get_into of ``size`` bytes at the address ``ptr``, the short way when it applies
        (``Client.local_start``, docs/same-host.md): an answer that is the bytes' places in a
        segment (copied here) or says the server copied them is finished here; any other goes
        on the long way, from where it is."""
        c = self._c()
        iov = "%x:%d" % (ptr, size)
        target = "/api/v1/objects?key=" + q
        kb = key.encode()
        started = c.local_start("GET", target, iov, kb)
        if started is not None:
            conn, _, head = started
            # (The server's own spelling and order; spelled otherwise, the long way reads it.)
            if head.startswith(_GOT_HEAD) and "\r\nConnection:" not in head:
                mapped = head_field(head, "X-Mmc-Mapped")
                if mapped is not None:
                    try:
                        conn.map_done = _mapped.copy(conn.peer_pid or 0, conn.sock.fileno(),
                                                     mapped, [(ptr, size)])[0]
                    except (ValueError, EOFError, OSError):
                        # (As the long way: not copied, and TCP for this server for now.)
                        c.local_failed(conn)
                        started = None
                    else:
                        c.local_done(conn)
                        return errors.MMC_OK
                else:
                    delivered = head_field(head, "X-Mmc-Delivered")
                    if delivered is not None:
                        c.local_done(conn)
                        return errors.MMC_OK if delivered == str(size) else errors.MMC_ERROR
        return self._get_parts(key, [_view(ptr, size, True)], q, iov, started)

    @_guard(_code)
    def get_into_layers(self, key: str, buffer_ptrs: Sequence[Buffer], sizes: Sequence[int],
                        direct: int = SMEMB_COPY_G2H) -> int:
        """Receives the object into its layers, each buffer filled in turn: 0 when the object is
        exactly ``sum(sizes)`` bytes; -3000 otherwise (nothing written); -3102 missing."""
        _check_key(key)
        _direct(direct, SMEMB_COPY_G2H)
        return self._get_parts(key, _layer_views(buffer_ptrs, sizes, True))

    def _batch_json(self, method: str, path: str, keys: Sequence[str],
                    reader: Optional[BodyReader] = None) -> Any:
        body = json.dumps({"keys": list(keys)}).encode()
        return self._c().request(method, path, [body], {"Content-Type": "application/json"},
                                 reader if reader is not None else BodyReader())

    @_guard(lambda code, args: [b""] * len(args[0]) if args else [])
    def get_batch(self, keys: Sequence[str]) -> List[bytes]:
        """One bytes object per key, ``b""`` for a missing or invalid one."""
        keys = _str_list(keys)
        out = [b""] * len(keys)
        valid = _per_key(keys, [0] * len(keys))
        if valid and self._same_host_now():
            valid = self._get_batch_local(keys, valid, out)
        for part in _chunks(valid):
            reader = _BatchBytesReader(len(part))
            resp = self._batch_json("POST", "/api/v1/objects/batch_get", [keys[i] for i in part],
                                    reader)
            if reader.values is None:
                if resp.status == 200 and resp.header("content-type", "").startswith(
                        "application/octet-stream"):
                    # (A chunked answer: read whole.)
                    reader.values = _split_batch_get(resp.body, len(part))
                else:
                    _json(resp)
                    raise _Fail(errors.MMC_ERROR)
            for i, v in zip(part, reader.values):
                out[i] = v if v is not None else b""
        return out

    def _get_batch_local(self, keys: List[str], idxs: List[int], out: List[bytes]) -> List[int]:
        """Same host: get_batch as single gets sent back to back (``_PIPELINE`` at a time), each
        copied by the server into its slot of the thread's shared buffer (an equal share of it,
        ``X-Mmc-Iov: ~…``) or, larger than its slot, on the socket; the thread's buffer then
        grows so that the next batch of such objects fits. A redirect to a local service is
        followed as by a single get. Returns the keys left for the batch route over TCP (no
        answer, a refusal)."""
        c = self._c()
        rest: List[int] = []
        largest = 0
        for lo in range(0, len(idxs), _PIPELINE):
            group = idxs[lo:lo + _PIPELINE]
            scratch = c.get_scratch()
            if scratch is None:
                return idxs[lo:] + rest
            slot = scratch.size // len(group) // 64 * 64
            if slot == 0:
                return idxs[lo:] + rest
            readers = [_GetReader(scratch, j * slot, slot) for j in range(len(group))]
            reqs = [("GET", "/api/v1/objects?key=" + _check_key(keys[i]),
                     "~%x:%d" % (scratch.ptr + j * slot, slot), readers[j], keys[i].encode())
                    for j, i in enumerate(group)]
            try:
                answers = c.pipeline(reqs)
            except TransportError:
                # A server that resumes after the timeout may still write into the buffer.
                c.drop_scratch()
                raise
            if any(a is None for a in answers):
                # A connection broke: what its server still does is not known.
                c.drop_scratch()
            for j, (i, reader, resp) in enumerate(zip(group, readers, answers)):
                if resp is not None and resp.status in (307, 308):
                    # The meta leased it for this request: on to the local service it names
                    # (its same-host socket too when on this host), into the same slot.
                    reader = _GetReader(scratch, j * slot, slot)
                    try:
                        resp = c.follow(resp, "GET", (), reader, reqs[j][2], keys[i].encode(),
                                        reqs[j][1])
                    except TransportError:
                        c.drop_scratch()
                        raise
                largest = max(largest, reader.larger)
                if resp is None or resp.status in (307, 308, 429, 503) or (
                        resp.status in (400, 403) and b"same-host" in bytes(resp.body or b"")):
                    rest.append(i)
                elif resp.status == 200 and resp.header("content-type", "").startswith(
                        "application/octet-stream"):
                    out[i] = cast(bytes, resp.body)
        if largest:
            # Room for a batch of objects of that size next time (up to the cap).
            c.get_scratch(largest * min(len(idxs), _PIPELINE))
        return rest

    def _batch_get_parts(self, keys: List[str], values: Sequence[Optional[Parts]],
                         codes: List[int]) -> List[int]:
        """batch_get into each key's buffers; keys whose code is already set are skipped."""
        valid = [i for i in _per_key(keys, codes) if values[i] is not None
                 and codes[i] == errors.MMC_ERROR]
        if valid and self._same_host_now():
            # Same host: each object is copied by the server straight into its buffers.
            self._pipelined("GET", valid, keys, values, codes, None)
            return codes
        for part in _chunks(valid):
            reader = _BatchIntoReader([cast(Parts, values[i]) for i in part])
            try:
                resp = self._batch_json("POST", "/api/v1/objects/batch_get",
                                        [keys[i] for i in part], reader)
                if reader.codes is None:
                    _json(resp)
                    raise _Fail(errors.MMC_ERROR)
                for i, c in zip(part, reader.codes):
                    codes[i] = c
            except (_Fail, TransportError) as f:
                for i in part:
                    codes[i] = f.code
        return codes

    @_guard(_codes)
    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[Buffer],
                       sizes: Sequence[int], direct: int = SMEMB_COPY_G2H) -> List[int]:
        """One code per key (as get_into's), each object received into its buffer."""
        names, values, codes = self._buffers_per_key(
            keys, buffer_ptrs, sizes, direct, SMEMB_COPY_G2H, lambda p, n: [_view(p, n, True)])
        return self._batch_get_parts(names, values, codes)

    @_guard(_codes)
    def batch_get_into_layers(self, keys: Sequence[str],
                              buffer_ptrs: Sequence[Sequence[Buffer]],
                              sizes: Sequence[Sequence[int]],
                              direct: int = SMEMB_COPY_G2H) -> List[int]:
        """One code per key (as get_into_layers'), each object received into its layers."""
        names, values, codes = self._buffers_per_key(
            keys, buffer_ptrs, sizes, direct, SMEMB_COPY_G2H,
            lambda p, n: _layer_views(p, n, True))
        return self._batch_get_parts(names, values, codes)

    # -- existence, removal, info --------------------------------------------------------

    @_guard(_code)
    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error."""
        v = _json(self._c().request("GET", "/api/v1/objects/exist?key=" + _check_key(key)))
        return 1 if v.get("exists") else 0

    def _batch_keys(self, keys: Sequence[str], path: str, field: str,
                    code_of: Callable[[Any], int]) -> List[int]:
        """A JSON batch route over the valid keys (4096 a request): ``code_of`` reads each
        key's entry of ``field``; an invalid key gets its code alone."""
        names = _str_list(keys)
        out = [errors.MMC_ERROR] * len(names)
        for part in _chunks(_per_key(names, out)):
            v = _json(self._batch_json("POST", path, [names[i] for i in part]))
            for i, e in zip(part, v.get(field, [])):
                out[i] = code_of(e)
        return out

    @_guard(_codes)
    def batch_is_exist(self, keys: Sequence[str]) -> List[int]:
        """1/0 per key; an invalid key gets its code alone."""
        return self._batch_keys(keys, "/api/v1/objects/batch_exist", "exists",
                                lambda e: 1 if e else 0)

    @_guard(_code)
    def remove(self, key: str) -> int:
        """0, or -3102 for a missing key."""
        _json(self._c().request("DELETE", "/api/v1/objects?key=" + _check_key(key)))
        return errors.MMC_OK

    @_guard(_codes)
    def remove_batch(self, keys: Sequence[str]) -> List[int]:
        """A code per key: 0, or -3102 for a missing one."""
        return self._batch_keys(
            keys, "/api/v1/objects/batch_remove", "results",
            lambda r: errors.MMC_OK if r.get("success")
            else errors.from_item(r))

    @_guard(_code)
    def remove_all(self) -> int:
        _json(self._c().request("DELETE", "/all_keys"))
        return errors.MMC_OK

    @_guard(lambda code, args: KeyInfo())
    def get_key_info(self, key: str) -> KeyInfo:
        resp = self._c().request("GET", "/query_key?key=" + _check_key(key))
        try:
            info = KeyInfo.from_query(_json(resp))
        except _Fail:
            return KeyInfo()
        return self._with_gva(key, info)

    def _key_infos(self, keys: List[str]) -> List[KeyInfo]:
        out = [KeyInfo() for _ in keys]
        valid = _per_key(keys, [0] * len(keys))
        for part in _chunks(valid):
            v = _json(self._batch_json("POST", "/batch_query_keys", [keys[i] for i in part]))
            for i, d in zip(part, v.get("data", [])):
                out[i] = KeyInfo.from_query(d)
        return out

    @_guard(lambda code, args: [KeyInfo() for _ in args[0]] if args else [])
    def batch_get_key_info(self, keys: Sequence[str], query_type: int = 0) -> List[KeyInfo]:
        """A ``KeyInfo`` per key (``KeyInfo()`` for a missing or invalid one). ``query_type``
        (upstream's newer second argument) is accepted: every answer here is of readable
        objects."""
        keys = _str_list(keys)
        return [self._with_gva(k, i) for k, i in zip(keys, self._key_infos(keys))]
