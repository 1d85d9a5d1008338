"""``DistributedObjectStore``: upstream MemCache Hybrid's Python API over mmc-server's HTTP data
plane. Every data-path method returns upstream's codes (0 success, negative errors), ``get``
returns ``b""`` on failure, ``is_exist`` 1/0; none raises."""

import ctypes
import functools
import json
import logging
import os
import struct
from urllib.parse import quote

from . import errors
from ._http import BodyReader, Client, TransportError

log = logging.getLogger("mmc_client")

# Copy directions, as upstream's MmcCopyDirect (only host memory is supported here).
SMEMB_COPY_L2G = 0
SMEMB_COPY_G2L = 1
SMEMB_COPY_G2H = 2
SMEMB_COPY_H2G = 3

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
# A get_into body of the wrong size up to this many bytes is read and dropped (the connection
# stays pooled); a larger one closes the connection instead of crossing the network for nothing.
_SKIP_LIMIT = 1024 * 1024
# What batch_put answers for a key it placed on a remote rank (whose bytes it cannot write).
_REMOTE_BATCH_FAILURE = "Write failed"

_PyMemoryView_FromMemory = ctypes.pythonapi.PyMemoryView_FromMemory
_PyMemoryView_FromMemory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyMemoryView_FromMemory.restype = ctypes.py_object
_PyBUF_READ = 0x100
_PyBUF_WRITE = 0x200


class _Fail(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


def _view(ptr, size, writable):
    """A byte memoryview over ``size`` bytes of host memory at address ``ptr`` (an int from
    ctypes.addressof, numpy's ``ctypes.data``, torch's ``data_ptr()``), or over an object that
    exposes the buffer protocol. No copy."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise _Fail(errors.MMC_INVALID_PARAM)
    if isinstance(ptr, int) and not isinstance(ptr, bool):
        if ptr == 0:
            raise _Fail(errors.MMC_INVALID_PARAM)
        if size == 0:
            return memoryview(b"")
        return _PyMemoryView_FromMemory(ptr, size, _PyBUF_WRITE if writable else _PyBUF_READ)
    try:
        mv = memoryview(ptr).cast("B")
    except TypeError:
        raise _Fail(errors.MMC_INVALID_PARAM) from None
    if len(mv) < size or (writable and mv.readonly):
        raise _Fail(errors.MMC_INVALID_PARAM)
    return mv[:size]


def _bytes_view(buf):
    try:
        return memoryview(buf).cast("B")
    except TypeError:
        if isinstance(buf, str):
            return memoryview(buf.encode())
        raise _Fail(errors.MMC_INVALID_PARAM) from None


def _check_key(key):
    if not isinstance(key, str) or not key or len(key.encode()) > 4096:
        raise _Fail(errors.MMC_INVALID_PARAM)
    return quote(key, safe="")


def _code_of_envelope(resp):
    """The code of a JSON answer that is an error envelope or a protocol error, else None."""
    if resp.status != 200:
        return errors.from_status(resp.status)
    return None


def _json(resp):
    code = _code_of_envelope(resp)
    if code is not None:
        raise _Fail(code)
    try:
        v = json.loads(resp.body)
    except ValueError:
        raise _Fail(errors.MMC_ERROR) from None
    if isinstance(v, dict) and v.get("success") is False:
        raise _Fail(errors.from_message(v.get("error_message")))
    return v


def _guard(default):
    """Never raise from the data path: unexpected exceptions become ``default(self, *args)``."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except _Fail as f:
                return default(f.code, args)
            except TransportError as e:
                log.warning("%s: %s", fn.__name__, e)
                return default(e.code, args)
            except Exception as e:  # noqa: BLE001 - the data path returns codes
                log.warning("%s failed: %r", fn.__name__, e)
                return default(errors.MMC_ERROR, args)

        return inner

    return wrap


def _code(code, _args):
    return code


def _codes(code, args):
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
    (bodies from this size are sent after the server's ``100 Continue``), and
    ``duplicate_put_is_error`` (False: a put of an existing key returns 0 and keeps the first
    value, as upstream; True: it returns -3006).
    """

    def __init__(self):
        self.meta_service_url = os.environ.get("MMC_URL", "http://127.0.0.1:8000")
        self.config_store_url = "tcp://127.0.0.1:6000"
        self.log_level = "info"
        self.world_size = 256
        self.protocol = "host_tcp"
        self.dram_size = "0"
        self.hbm_size = "0"
        self.client_retry_milliseconds = 0
        self.client_timeout_seconds = 60
        self.api_token = os.environ.get("MMC_API_TOKEN") or None
        self.expect_continue_bytes = 256 * 1024
        self.duplicate_put_is_error = False

    def __repr__(self):
        fields = ", ".join("%s=%r" % (k, v) for k, v in sorted(vars(self).items())
                           if k != "api_token")
        return "LocalConfig(%s)" % fields


class ReplicateConfig:
    """``replicaNum`` (1-8) copies on distinct ranks. ``preferredLocalServiceIDs``: the first
    id is the rank the first copy goes to when it has room (``prefer_rank=``); the others are
    ignored. Extension: ``medium`` ``"hbm"``/``"dram"``/None."""

    def __init__(self, replicaNum=1, preferredLocalServiceIDs=None, medium=None):
        self.replicaNum = replicaNum
        self.preferredLocalServiceIDs = list(preferredLocalServiceIDs or [])
        self.medium = medium

    def query(self):
        q = ""
        if self.replicaNum is not None and self.replicaNum != 1:
            if not isinstance(self.replicaNum, int) or not 1 <= self.replicaNum <= 8:
                raise _Fail(errors.MMC_INVALID_PARAM)
            q += "&replicas=%d" % self.replicaNum
        if self.preferredLocalServiceIDs:
            rank = self.preferredLocalServiceIDs[0]
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise _Fail(errors.MMC_INVALID_PARAM)
            q += "&prefer_rank=%d" % rank
        if self.medium:
            if self.medium not in ("hbm", "dram"):
                raise _Fail(errors.MMC_INVALID_PARAM)
            q += "&medium=" + self.medium
        return q


class KeyInfo:
    """What upstream's ``get_key_info`` returns: size, the ranks of the copies and their media
    (0 HBM, 1 DRAM, 2 SSD). A missing key is ``KeyInfo(0, [])``."""

    def __init__(self, size=0, locs=(), types=(), leases_ms=()):
        self._size = size
        self._locs = list(locs)
        self._types = list(types)
        self._leases = list(leases_ms)

    def size(self):
        return self._size

    def loc_list(self):
        return list(self._locs)

    def type_list(self):
        return list(self._types)

    def lease_list(self):
        """Extension: the remaining lease of each copy, in ms."""
        return list(self._leases)

    def __str__(self):
        return "KeyInfo(size=%d, locs=%s, types=%s)" % (self._size, self._locs, self._types)

    __repr__ = __str__

    @classmethod
    def from_query(cls, v):
        if not v or not v.get("valid"):
            return cls()
        blobs = v.get("blobs") or []
        return cls(v.get("size", 0), [b.get("rank", 0) for b in blobs],
                   [_MEDIA.get(b.get("medium"), -1) for b in blobs],
                   [b.get("leaseTimeoutTtlMs", 0) for b in blobs])


class _IntoReader(BodyReader):
    """get_into: an object's bytes go straight into the caller's memory."""

    def __init__(self, view):
        self.view = view
        self.code = errors.MMC_OK
        self.length = None

    def read(self, conn, status, headers, length):
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        if status != 200 or not octets or length is None:
            return super().read(conn, status, headers, length)
        self.length = length
        if length != len(self.view):
            # The buffer is not the object's size: nothing is written (a shorter object must not
            # look like a full read over stale bytes). A small body is skipped, keeping the
            # connection; a large one is not read at all: the connection is dropped.
            self.code = errors.MMC_INVALID_PARAM
            if length <= _SKIP_LIMIT:
                conn.skip(length)
                return length
            conn.close()
            return None
        conn.read_exact_into(self.view)
        return length


class _BatchIntoReader(BodyReader):
    """batch_get_into: the length-prefixed answer is read key by key into each buffer."""

    def __init__(self, views):
        self.views = views
        self.codes = None
        # Each object's length as the answer framed it (-1 for a missing key).
        self.lengths = []

    def read(self, conn, status, headers, length):
        octets = headers.get("content-type", "").startswith("application/octet-stream")
        if status != 200 or not octets or length is None:
            return super().read(conn, status, headers, length)
        codes = []
        left = length
        for view in self.views:
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
            if n != len(view):
                # Not the buffer's size (larger or shorter): nothing is written into it.
                conn.skip(n)
                codes.append(errors.MMC_INVALID_PARAM)
            else:
                conn.read_exact_into(view)
                codes.append(errors.MMC_OK)
            left -= n
        if left:
            conn.skip(left)
        self.codes = codes
        return None


def _split_batch_get(body, count):
    out = []
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


def _chunks(items, limit=_MAX_BATCH_KEYS):
    for i in range(0, len(items), limit):
        yield items[i:i + limit]


class DistributedObjectStore:
    """Upstream's ``memcache_hybrid.DistributedObjectStore`` over HTTP. Safe to share between
    threads: each call takes its own pooled keep-alive connection."""

    def __init__(self):
        self._config = None
        self._client = None
        # Set when a batch_put answered that every key went to a remote rank (a pure meta).
        self._batch_put_remote = False

    # -- lifecycle -----------------------------------------------------------------------

    def setup(self, config):
        """Takes a :class:`LocalConfig`; 0, or -3000 when its URL does not parse."""
        try:
            Client(config.meta_service_url).close()
        except (ValueError, AttributeError, TypeError):
            return errors.MMC_INVALID_PARAM
        self._config = config
        return errors.MMC_OK

    def init(self, device_id=0, init_bm=True):
        """Connects to the meta service (waiting up to ``client_retry_milliseconds`` for it).
        ``device_id`` and ``init_bm`` are accepted for compatibility: this client never
        contributes memory, and reads and writes work in either mode. 0, or -3017 when the
        server cannot be reached, -3004 on a timeout."""
        try:
            cfg = self._config or LocalConfig()
            if self._client is not None:
                self._client.close()
            self._client = Client(
                cfg.meta_service_url,
                timeout=float(cfg.client_timeout_seconds) or None,
                retry_ms=int(cfg.client_retry_milliseconds),
                token=getattr(cfg, "api_token", None),
                expect_continue_bytes=int(getattr(cfg, "expect_continue_bytes", 256 * 1024)),
            )
            self._config = cfg
            self._batch_put_remote = False
            resp = self._client.request("GET", "/health")
            if resp.status != 200:
                return errors.from_status(resp.status)
            return errors.MMC_OK
        except TransportError as e:
            log.warning("init: %s", e)
            return e.code
        except (ValueError, TypeError) as e:
            log.warning("init: %s", e)
            return errors.MMC_INVALID_PARAM

    def close(self):
        if self._client is not None:
            self._client.close()
            self._client = None
        return errors.MMC_OK

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def register_buffer(self, buffer_ptr, size):
        """Host memory needs no registration over HTTP: 0."""
        return errors.MMC_OK

    def unregister_buffer(self, buffer_ptr, size):
        return errors.MMC_OK

    def _c(self):
        c = self._client
        if c is None:
            raise _Fail(errors.MMC_CLIENT_NOT_INIT)
        return c

    def _put_code(self, code):
        if code == errors.MMC_DUPLICATED_OBJECT and not self._config.duplicate_put_is_error:
            return errors.MMC_OK
        return code

    # -- puts ----------------------------------------------------------------------------

    def _put_view(self, key, view, replicateConfig):
        q = _check_key(key)
        extra = (replicateConfig or ReplicateConfig()).query()
        resp = self._c().request("PUT", "/api/v1/objects?key=" + q + extra, [view])
        try:
            _json(resp)
        except _Fail as f:
            return self._put_code(f.code)
        return errors.MMC_OK

    @_guard(_code)
    def put(self, key, buf, replicateConfig=None):
        return self._put_view(key, _bytes_view(buf), replicateConfig)

    @_guard(_code)
    def put_from(self, key, buffer_ptr, size, direct=SMEMB_COPY_H2G, replicateConfig=None):
        if direct != SMEMB_COPY_H2G:
            return errors.MMC_INVALID_PARAM
        return self._put_view(key, _view(buffer_ptr, size, False), replicateConfig)

    def _batch_put(self, keys, views, replicateConfig):
        """Puts through batch_put, split so each request's target and body fit; returns one
        code per key."""
        if len(keys) != len(views):
            raise _Fail(errors.MMC_INVALID_PARAM)
        extra = (replicateConfig or ReplicateConfig()).query()
        quoted = [_check_key(k) for k in keys]
        codes = [errors.MMC_ERROR] * len(keys)
        group, qlen, blen, names = [], 0, 0, set()

        def flush():
            if group:
                self._batch_put_group(group, quoted, views, extra, codes, keys,
                                      replicateConfig)
            group.clear()
            names.clear()

        for i, q in enumerate(quoted):
            n = len(views[i])
            if n > _MAX_BATCH_BODY:
                flush()
                qlen = blen = 0
                codes[i] = self._put_view(keys[i], views[i], replicateConfig)
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

    def _batch_put_group(self, group, quoted, views, extra, codes, keys, replicateConfig):
        if self._batch_put_remote:
            # The meta service holds none of the bytes (a pure meta): one put per key, each
            # redirected to its local service.
            for i in group:
                codes[i] = self._put_view(keys[i], views[i], replicateConfig)
            return
        target = "/api/v1/objects/batch_put?keys=%s&sizes=%s%s" % (
            ",".join(quoted[i] for i in group),
            ",".join(str(len(views[i])) for i in group), extra)
        try:
            resp = self._c().request("POST", target, [views[i] for i in group])
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
                remote.append(i)
            else:
                codes[i] = self._put_code(errors.from_message(r.get("error_message")))
        if remote and len(remote) == len(group):
            # Every key was placed on another host's rank: this meta has no rank of its own
            # (or none with room); later batches go key by key straight away.
            self._batch_put_remote = True
        # batch_put writes only the meta's own ranks; a key placed on a remote rank failed
        # (and was released): put it alone, which follows the redirect to its local service.
        for i in remote:
            codes[i] = self._put_view(keys[i], views[i], replicateConfig)

    @_guard(_code)
    def put_batch(self, keys, values, replicateConfig=None):
        """0 when every object was stored, else the first failing key's code."""
        codes = self._batch_put(list(keys), [_bytes_view(v) for v in values], replicateConfig)
        return next((c for c in codes if c != errors.MMC_OK), errors.MMC_OK)

    @_guard(_codes)
    def batch_put_from(self, keys, buffer_ptrs, sizes, direct=SMEMB_COPY_H2G,
                       replicateConfig=None):
        """One code per key."""
        if direct != SMEMB_COPY_H2G or not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [errors.MMC_INVALID_PARAM] * len(keys)
        views = [_view(p, s, False) for p, s in zip(buffer_ptrs, sizes)]
        return self._batch_put(list(keys), views, replicateConfig)

    # -- gets ----------------------------------------------------------------------------

    @_guard(lambda code, args: b"")
    def get(self, key):
        """The object's bytes, or ``b""`` on any failure."""
        resp = self._c().request("GET", "/api/v1/objects?key=" + _check_key(key))
        if resp.status == 200 and resp.header("content-type", "").startswith(
                "application/octet-stream"):
            return resp.body
        return b""

    @_guard(_code)
    def get_into(self, key, buffer_ptr, size, direct=SMEMB_COPY_G2H):
        """Receives the object straight into ``size`` bytes at ``buffer_ptr``: 0; -3102 for a
        missing key; -3000 when the buffer is not the object's size, larger or smaller
        (nothing written: a shorter object is not a full read)."""
        if direct != SMEMB_COPY_G2H:
            return errors.MMC_INVALID_PARAM
        reader = _IntoReader(_view(buffer_ptr, size, True))
        resp = self._c().request("GET", "/api/v1/objects?key=" + _check_key(key), reader=reader)
        if isinstance(resp.body, bytes):
            _json(resp)
            return errors.MMC_ERROR
        return reader.code

    def _batch_json(self, method, path, keys, reader=None):
        body = json.dumps({"keys": keys}).encode()
        kwargs = {"reader": reader} if reader is not None else {}
        return self._c().request(method, path, [body], {"Content-Type": "application/json"},
                                 **kwargs)

    @_guard(lambda code, args: [b""] * len(args[0]) if args else [])
    def get_batch(self, keys):
        """One bytes object per key, ``b""`` for a missing one."""
        keys = list(keys)
        for k in keys:
            _check_key(k)
        out = []
        for part in _chunks(keys):
            resp = self._batch_json("POST", "/api/v1/objects/batch_get", part)
            if resp.status != 200 or not resp.header("content-type", "").startswith(
                    "application/octet-stream"):
                _json(resp)
                raise _Fail(errors.MMC_ERROR)
            out += [v if v is not None else b"" for v in _split_batch_get(resp.body, len(part))]
        return out

    @_guard(_codes)
    def batch_get_into(self, keys, buffer_ptrs, sizes, direct=SMEMB_COPY_G2H):
        """One code per key (as get_into's), each object received into its buffer."""
        keys = list(keys)
        if direct != SMEMB_COPY_G2H or not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [errors.MMC_INVALID_PARAM] * len(keys)
        for k in keys:
            _check_key(k)
        views = [_view(p, s, True) for p, s in zip(buffer_ptrs, sizes)]
        codes = []
        for start in range(0, len(keys), _MAX_BATCH_KEYS):
            part = keys[start:start + _MAX_BATCH_KEYS]
            reader = _BatchIntoReader(views[start:start + _MAX_BATCH_KEYS])
            try:
                resp = self._batch_json("POST", "/api/v1/objects/batch_get", part, reader)
                if reader.codes is None:
                    _json(resp)
                    raise _Fail(errors.MMC_ERROR)
                codes += reader.codes
            except (_Fail, TransportError) as f:
                codes += [f.code] * len(part)
        return codes

    # -- existence, removal, info --------------------------------------------------------

    @_guard(_code)
    def is_exist(self, key):
        """1 present, 0 absent, negative on error."""
        v = _json(self._c().request("GET", "/api/v1/objects/exist?key=" + _check_key(key)))
        return 1 if v.get("exists") else 0

    @_guard(_codes)
    def batch_is_exist(self, keys):
        keys = list(keys)
        for k in keys:
            _check_key(k)
        out = []
        for part in _chunks(keys):
            v = _json(self._batch_json("POST", "/api/v1/objects/batch_exist", part))
            out += [1 if e else 0 for e in v.get("exists", [])]
        return out

    @_guard(_code)
    def remove(self, key):
        """0, or -3102 for a missing key."""
        _json(self._c().request("DELETE", "/api/v1/objects?key=" + _check_key(key)))
        return errors.MMC_OK

    @_guard(_codes)
    def remove_batch(self, keys):
        keys = list(keys)
        for k in keys:
            _check_key(k)
        out = []
        for part in _chunks(keys):
            v = _json(self._batch_json("POST", "/api/v1/objects/batch_remove", part))
            for r in v.get("results", []):
                out.append(errors.MMC_OK if r.get("success")
                           else errors.from_message(r.get("error_message")))
        return out

    @_guard(_code)
    def remove_all(self):
        _json(self._c().request("DELETE", "/all_keys"))
        return errors.MMC_OK

    @_guard(lambda code, args: KeyInfo())
    def get_key_info(self, key):
        resp = self._c().request("GET", "/query_key?key=" + _check_key(key))
        try:
            return KeyInfo.from_query(_json(resp))
        except _Fail:
            return KeyInfo()

    @_guard(lambda code, args: [KeyInfo() for _ in args[0]] if args else [])
    def batch_get_key_info(self, keys):
        keys = list(keys)
        for k in keys:
            _check_key(k)
        out = []
        for part in _chunks(keys):
            v = _json(self._batch_json("POST", "/batch_query_keys", part))
            out += [KeyInfo.from_query(d) for d in v.get("data", [])]
        return out
