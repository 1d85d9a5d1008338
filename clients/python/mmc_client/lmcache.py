"""An LMCache L2 connector over mmc-server: ``mmc_client.lmcache.MmcL2Connector``.

LMCache (0.4.3 and later) takes L2 storage in its multiprocess mode through ``--l2-adapter``
JSON; its ``native_plugin`` type imports a connector class and wraps it in LMCache's own
``NativeConnectorL2Adapter``::

    {"type": "native_plugin", "module_path": "mmc_client.lmcache",
     "class_name": "MmcL2Connector", "adapter_params": {"url": "http://127.0.0.1:8000"}}

The connector is what that adapter drives: ``event_fd()``, ``submit_batch_get/set/exists/
delete`` (each returns a future id at once), ``drain_completions()`` (the finished futures as
``(future_id, ok, error, per_key_results)``) and ``close()``. The work runs on a bounded pool
of worker threads, each on its own pooled keep-alive connection of one
:class:`~mmc_client.DistributedObjectStore`; a finished batch writes the eventfd.

Bytes are not copied in Python: a set sends LMCache's buffers with ``sendmsg`` (batch_put), a
get receives each object with ``recv_into`` straight into LMCache's buffer (batch_get). A get
succeeds for a key only when the object has exactly the buffer's size (LMCache's keys carry no
shape, so a shorter object must never look like a hit); the length comes from the batch answer's
framing, not from an extra request.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from . import errors
from .store import DistributedObjectStore, LocalConfig

log = logging.getLogger("mmc_client.lmcache")

# (future_id, ok, error message, per-key results or None), as LMCache's adapter drains them.
Completion = Tuple[int, bool, str, Optional[List[bool]]]

# A batch is split into parts of at least this many keys, one per worker, so a large batch
# uses several connections at once and a small one costs one request.
_MIN_PART_KEYS = 16


class _EventFd:
    """A counter that wakes LMCache's poller: an eventfd where the OS has one, else a pipe."""

    def __init__(self) -> None:
        self._r: int
        self._w: int
        if hasattr(os, "eventfd"):
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._r = self._w = fd
        else:  # pragma: no cover - Linux has eventfd
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
        self.closed = False

    def fileno(self) -> int:
        return self._r

    def notify(self) -> None:
        try:
            if self._r == self._w:
                os.eventfd_write(self._w, 1)
            else:  # pragma: no cover
                os.write(self._w, b"\x01")
        except (BlockingIOError, OSError):
            pass  # a full counter still wakes the poller

    def consume(self) -> None:
        try:
            if self._r == self._w:
                os.eventfd_read(self._r)
            else:  # pragma: no cover
                while os.read(self._r, 4096):
                    pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._r)
            if self._w != self._r:  # pragma: no cover
                os.close(self._w)


class MmcL2Connector:
    """LMCache's native connector interface over mmc-server's HTTP data plane.

    ``url``: one meta URL or several (a list, or a comma list: HA), as the client takes them.
    ``key_prefix``: prepended to every LMCache key (to share one server between deployments).
    ``token``: the API token (default: env ``MMC_API_TOKEN``). ``num_workers``: threads (and
    connections) working on batches; ``timeout_s`` bounds each socket operation and
    ``retry_ms`` the retries of a request that reached no server. ``https://`` URLs: the server's
    CA in ``ca_path``, the client certificate in ``cert_path``/``key_path`` (PEM).
    """

    def __init__(
        self,
        url: Union[str, Sequence[str], None] = None,
        key_prefix: str = "",
        token: Optional[str] = None,
        num_workers: int = 4,
        timeout_s: float = 30.0,
        retry_ms: int = 2000,
        ca_path: str = "",
        cert_path: str = "",
        key_path: str = "",
    ) -> None:
        if isinstance(url, (list, tuple)):
            url = ",".join(str(u) for u in url)
        if url is not None and not isinstance(url, str):
            raise TypeError("url must be a string or a list of strings")
        if not isinstance(key_prefix, str):
            raise TypeError("key_prefix must be a string")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError("num_workers must be a positive integer")
        config = LocalConfig()
        if url:
            config.meta_service_url = url
        if token is not None:
            config.api_token = token
        config.client_timeout_seconds = timeout_s
        config.client_retry_milliseconds = retry_ms
        config.tls_ca_path, config.tls_cert_path, config.tls_key_path = ca_path, cert_path, key_path
        self._store = DistributedObjectStore()
        if self._store.setup(config) != errors.MMC_OK:
            raise ValueError("invalid url %r" % (config.meta_service_url,))
        code = self._store.init()
        if code != errors.MMC_OK:
            self._store.close()
            raise ConnectionError("mmc-server at %s: %s (%d)" % (
                config.meta_service_url, errors.NAMES.get(code, "error"), code))
        self._prefix = key_prefix
        self._num_workers = num_workers
        self._pool = ThreadPoolExecutor(max_workers=num_workers,
                                        thread_name_prefix="mmc-l2-connector")
        self._efd = _EventFd()
        self._lock = threading.Lock()
        self._next_id = 1
        self._done: List[Completion] = []
        self._closed = False

    # -- LMCache's interface ---------------------------------------------------------------

    def event_fd(self) -> int:
        """Readable when completions are waiting (``drain_completions`` resets it)."""
        return self._efd.fileno()

    def submit_batch_set(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Stores each buffer under its key. The buffers must stay alive until completion."""
        return self._submit_buffers(keys, memoryviews, self._store.batch_put_from, "set")

    def submit_batch_get(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Receives each object into its buffer; a key succeeds only when its object exists
        and has exactly the buffer's size (a shorter or longer object fails, buffer untouched)."""
        return self._submit_buffers(keys, memoryviews, self._store.batch_get_into, "get")

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        names = self._names(keys)

        def run(lo: int, hi: int) -> List[int]:
            return list(self._store.batch_is_exist(names[lo:hi]))

        return self._submit(len(names), run, lambda code: code == 1, "exists",
                            error=lambda code: code < 0)

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        names = self._names(keys)

        def run(lo: int, hi: int) -> List[int]:
            return list(self._store.remove_batch(names[lo:hi]))

        return self._submit(len(names), run, lambda code: code == errors.MMC_OK, "delete",
                            error=lambda code: code not in (errors.MMC_OK,
                                                            errors.MMC_UNMATCHED_KEY))

    def drain_completions(self) -> List[Completion]:
        """The batches finished since the last call (and resets the eventfd)."""
        self._efd.consume()
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Waits for the batches under way, then closes the connections and the eventfd."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True)
        self._store.close()
        self._efd.close()

    # -- synchronous helpers (tests, tools) ------------------------------------------------

    def exists(self, keys: Sequence[str]) -> List[bool]:
        """Whether each key is stored, now (one batch_exist request)."""
        return [c == 1 for c in self._store.batch_is_exist(self._names(keys))]

    @property
    def store(self) -> DistributedObjectStore:
        """The underlying client."""
        return self._store

    # -- internals --------------------------------------------------------------------------

    def _names(self, keys: Sequence[str]) -> List[str]:
        if isinstance(keys, str):
            raise TypeError("keys must be a list of strings")
        return [self._prefix + k for k in keys]

    def _new_id(self) -> int:
        with self._lock:
            if self._closed:
                raise RuntimeError("MmcL2Connector is closed")
            fid = self._next_id
            self._next_id += 1
            return fid

    def _complete(self, item: Completion) -> None:
        with self._lock:
            self._done.append(item)
        self._efd.notify()

    def _submit_buffers(self, keys: Sequence[str], memoryviews: Sequence[Any],
                        batch: Callable[[List[str], List[Any], List[int]], List[int]],
                        op: str) -> int:
        """A set or get: ``batch(keys, buffers, sizes)`` over parts of the batch."""
        names = self._names(keys)
        views = list(memoryviews)
        if len(views) != len(names):
            return self._fail_now("keys and buffers differ in number")

        def run(lo: int, hi: int) -> List[int]:
            part = views[lo:hi]
            return list(batch(names[lo:hi], part, [_nbytes(v) for v in part]))

        return self._submit(len(names), run, lambda code: code == errors.MMC_OK, op)

    def _fail_now(self, message: str) -> int:
        fid = self._new_id()
        self._complete((fid, False, message, None))
        return fid

    def _submit(self, n: int, run: Callable[[int, int], List[int]],
                hit: Callable[[int], bool], op: str,
                error: Optional[Callable[[int], bool]] = None) -> int:
        """Runs ``run`` over parts of the batch on the pool; completes the future once every
        part answered. ``hit`` says which per-key code is a True result, ``error`` which makes
        the whole batch not ok (default: any code that is not a hit)."""
        fid = self._new_id()
        if n == 0:
            self._complete((fid, True, "", []))
            return fid
        parts = max(1, min(self._num_workers, n // _MIN_PART_KEYS))
        step = -(-n // parts)
        bounds = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
        codes: List[int] = [errors.MMC_ERROR] * n
        left = [len(bounds)]
        failure: List[str] = []
        state = threading.Lock()
        is_error = error if error is not None else (lambda code: not hit(code))

        def work(lo: int, hi: int) -> None:
            try:
                got = run(lo, hi)
                if len(got) != hi - lo:
                    raise RuntimeError("%d results for %d keys" % (len(got), hi - lo))
                codes[lo:hi] = got
            except Exception as e:  # noqa: BLE001 - reported as the batch's error
                log.warning("batch %s failed: %r", op, e)
                with state:
                    failure.append("%s: %r" % (op, e))
            with state:
                left[0] -= 1
                last = left[0] == 0
            if last:
                bad = [c for c in codes if is_error(c)]
                message = failure[0] if failure else ""
                if bad and not message:
                    message = "%s: %d of %d keys failed (%s)" % (
                        op, len(bad), n, ", ".join(sorted({errors.NAMES.get(c, str(c))
                                                          for c in bad})))
                self._complete((fid, not bad and not failure, message,
                                [hit(c) for c in codes]))

        try:
            for lo, hi in bounds:
                self._pool.submit(work, lo, hi)
        except RuntimeError as e:  # the pool was shut down by a concurrent close()
            self._complete((fid, False, str(e), None))
        return fid

    def __enter__(self) -> "MmcL2Connector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _nbytes(view: Any) -> int:
    try:
        return int(memoryview(view).nbytes)
    except TypeError:
        return len(view)
