"""Mapped same-host gets (docs/same-host.md, *Mapped gets*): the client copies a leased blob
itself from a read-only mapping of the server's DRAM segment.

A same-host get sent with ``X-Mmc-Map: N`` may be answered ``200`` with no body and
``X-Mmc-Mapped: LEASE FD:INO:OFFSET:LENGTH[,…]``: the object is those ranges of the server's
segment files (its descriptor numbers, their inode numbers), pinned by the server until this
connection says it is done with the lease (``X-Mmc-Map: LEASE`` on a later request) or closes.
This module maps each segment once per process, read-only (``/proc/PID/fd/FD`` opened
``O_RDONLY``, checked to be that inode), copies the ranges with ``memmove`` (:func:`_copy`)
into the caller's memory, and then checks that the connection is still open: the server
shuts a connection down before it lets its pins go, so a copy followed by an open connection
was made while the pins were held. A local service serving under a meta's read grant adds
the grant's expiry (``X-Mmc-Mapped: LEASE RANGES UNTIL``, Unix ms): nothing pins those bytes
but the meta's lease, so a copy that ended at or after it counts for nothing either (the
service shuts the connection down when it joins a meta again, for the same check).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import select
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_READ = 1
_MAP_SHARED = 1
_MAP_FAILED = ctypes.c_void_p(-1).value
_memmove = ctypes.memmove
_POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)


def _plain_memcpy() -> Optional[Callable[[int, int, int], object]]:
    """glibc's SSE2 copy, which never uses ``rep movsb`` (``memcpy@GLIBC_2.2.5``: x86-64 glibc
    keeps it for programs linked before 2.14, with ``memmove``'s meaning), or None where there
    is none (another libc, another architecture)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        dlvsym = _libc.dlvsym
    except AttributeError:
        return None
    dlvsym.restype = ctypes.c_void_p
    dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    addr = dlvsym(None, b"memcpy", b"GLIBC_2.2.5")  # RTLD_DEFAULT
    if not addr:
        return None
    proto = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return proto(addr)


def _rep_movsb_max() -> int:
    """Where glibc's memmove stops using ``rep movsb`` on AMD CPUs: the L2 cache's size
    (``_SC_LEVEL2_CACHE_SIZE``, 191 in glibc); 512 KiB (Zen 3's) when it does not say."""
    try:
        sysconf = _libc.sysconf
        sysconf.restype = ctypes.c_long
        sysconf.argtypes = [ctypes.c_int]
        size = int(sysconf(191))
    except AttributeError:
        size = 0
    return size if size > 0 else 512 << 10


_plain = _plain_memcpy()
# glibc's memmove copies 2112 bytes up to the L2 cache's size with ``rep movsb`` on CPUs that
# have ERMS; on AMD Zen 3 (this project's reference machine) ``rep movsb`` runs some 20x slower
# when the destination is 1 to 31 bytes past the source modulo 4096 (1.8 GB/s against 30:
# docs/same-host.md, *A copy's alignment*). A blob starts on a page; an array of numpy's, or
# any buffer glibc's malloc maps, starts 16 bytes into one. Those copies go through the SSE2
# copy instead (larger ones keep glibc's AVX loop, faster from memory out of cache).
_ALIASED_MIN = 2048
_ALIASED_MAX = _rep_movsb_max()


def _copy(dst: int, src: int, n: int) -> None:
    """``memmove(dst, src, n)`` for ranges that do not overlap, past ``rep movsb``'s slow
    case (above) where the SSE2 copy is there."""
    if _ALIASED_MIN <= n < _ALIASED_MAX and 0 < (dst - src) & 4095 < 32 and _plain is not None:
        _plain(dst, src, n)
    else:
        _memmove(dst, src, n)


class _Segment:
    __slots__ = ("base", "size", "users")

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size, self.users = base, size, 0


_lock = threading.Lock()
# (server pid, its descriptor number, the file's inode) -> the segment mapped here.
_segments: Dict[Tuple[int, int, int], _Segment] = {}
# Servers (pids) whose segments could not be mapped: no mapped gets asked of them again.
_unmappable: Set[int] = set()
# Mappings made so far (for tests: each segment is mapped once per process).
mappings_made = 0


# ``os.environ``'s own dictionary (CPython keeps it, encoded, in ``_data``): read per request, and
# ``os.environ.get`` of an unset name costs a caught KeyError, ~1 us, where this costs 0.05. Where
# there is no such dictionary, ``os.environ`` itself.
_ENV: Optional[Dict[object, object]] = getattr(os.environ, "_data", None)
_ENV_MAP_KEY: object = os.environ.encodekey("MMC_SAME_HOST_MAP")
_ENV_OFF: object = os.environ.encodevalue("0")


def enabled() -> bool:
    """``MMC_SAME_HOST_MAP`` is not ``0`` (read each time: it may change while a client runs)."""
    if _ENV is not None:
        return _ENV.get(_ENV_MAP_KEY) != _ENV_OFF
    return os.environ.get("MMC_SAME_HOST_MAP", "1") != "0"


def may_map(pid: Optional[int]) -> bool:
    """Whether gets to the server ``pid`` may ask for mapped answers."""
    return pid is not None and pid not in _unmappable and enabled()


class MapFailed(ValueError):
    """A mapped answer that could not be copied (the segment could not be mapped, or the
    answer was malformed): the request is made again without mapping."""


def _map(pid: int, fd: int, ino: int, need: int) -> _Segment:
    """The segment ``(pid, fd, ino)``, mapped on first use; its ``users`` counted up (the
    caller counts it down when its copy is done)."""
    global mappings_made
    key = (pid, fd, ino)
    with _lock:
        seg = _segments.get(key)
        if seg is not None and seg.size >= need:
            seg.users += 1
            return seg
    try:
        f = os.open("/proc/%d/fd/%d" % (pid, fd), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        _unmappable.add(pid)
        raise MapFailed("cannot open the server's segment: %s" % e) from e
    try:
        st = os.fstat(f)
        if st.st_ino != ino or st.st_size < need:
            # A descriptor number reused for another file: never mapped as the segment.
            raise MapFailed("the server's descriptor %d is not the segment named" % fd)
        base = _mmap(None, st.st_size, _PROT_READ, _MAP_SHARED, f, 0)
        if base is None or base == _MAP_FAILED:
            _unmappable.add(pid)
            raise MapFailed("cannot map the server's segment: errno %d" % ctypes.get_errno())
    finally:
        os.close(f)
    seg = _Segment(base, st.st_size)
    stale: List[_Segment] = []
    with _lock:
        old = _segments.get(key)
        if old is not None and old.users == 0:
            stale.append(old)
        _segments[key] = seg
        seg.users += 1
        mappings_made += 1
        # Segments of servers that are gone keep their memory while mapped: let them go
        # (those no copy is using).
        for k, s in list(_segments.items()):
            if k[0] != pid and s.users == 0 and not _alive(k[0]):
                del _segments[k]
                stale.append(s)
    for s in stale:
        _munmap(s.base, s.size)
    return seg


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _range(entry: str) -> Tuple[int, int, int, int]:
    """One ``FD:INO:OFFSET:LENGTH`` of ``X-Mmc-Mapped``."""
    fd, ino, off, n = entry.split(":")
    return int(fd), int(ino), int(off), int(n)


def parse(text: str) -> Tuple[int, List[Tuple[int, int, int, int]], int]:
    """``X-Mmc-Mapped``'s lease, ranges ``(fd, ino, offset, length)`` and the Unix time (ms)
    the copy must end before (0: none)."""
    try:
        lease, _, rest = text.strip().partition(" ")
        rest, _, until = rest.partition(" ")
        return int(lease), [_range(entry) for entry in rest.split(",")], int(until or 0)
    except ValueError as e:
        raise MapFailed("malformed X-Mmc-Mapped: %r" % text) from e


def _one_range(text: str) -> Tuple[int, Tuple[int, int, int, int], int]:
    """``X-Mmc-Mapped``'s lease, its one range and its time limit (no list built: the common
    answer)."""
    try:
        lease, _, rest = text.strip().partition(" ")
        rest, _, until = rest.partition(" ")
        return int(lease), _range(rest), int(until or 0)
    except ValueError as e:
        raise MapFailed("malformed X-Mmc-Mapped: %r" % text) from e


class Expired(EOFError):
    """A copy of bytes read under a meta's grant that ended at or after the grant's expiry:
    it counts for nothing, and the grant is spent (the request starts again at the meta)."""


def _now_ms() -> float:
    return time.time() * 1000.0


def _check_in_time(until: int) -> None:
    """Raises Expired when a copy of bytes read under a meta's grant (on a local service)
    ended at or after ``until``, the grant's expiry: its range may have been another
    object's by then. The same clock as the server's (this host's), read after the copy."""
    if until and _now_ms() >= until:
        raise Expired("a mapped get's copy ended after its grant expired")


def copy(pid: int, sock_fd: int, text: str, dests: Sequence[Tuple[int, int]],
         up_to: bool = False) -> Tuple[int, int]:
    """Copies the object ``X-Mmc-Mapped: text`` names into ``dests`` (address, length), in
    order: exactly their total length, or (``up_to``) at most. Returns (lease, bytes copied).
    Raises MapFailed for an answer it cannot copy, EOFError when the connection (``sock_fd``)
    closed, which may have been before the copy ended: then nothing copied counts."""
    if len(dests) == 1 and "," not in text:
        # One blob into one buffer (a get_into of an object in one blob): the short way.
        lease, (fd, ino, off, n), until = _one_range(text)
        if n > dests[0][1] or (n != dests[0][1] and not up_to):
            raise MapFailed("a mapped answer of %d bytes for %d" % (n, dests[0][1]))
        seg = _map(pid, fd, ino, off + n)
        try:
            _copy(dests[0][0], seg.base + off, n)
        finally:
            with _lock:
                seg.users -= 1
        _check_open(sock_fd)
        _check_in_time(until)
        return lease, n
    lease, ranges, until = parse(text)
    total = sum(r[3] for r in ranges)
    room = sum(d[1] for d in dests)
    if total > room or (total != room and not up_to):
        raise MapFailed("a mapped answer of %d bytes for %d" % (total, room))
    with _mapped_ranges(pid, ranges) as segs:
        di, dat = 0, 0
        for (fd, ino, off, n), seg in zip(ranges, segs):
            src = seg.base + off
            while n > 0:
                daddr, dlen = dests[di]
                step = min(n, dlen - dat)
                _copy(daddr + dat, src, step)
                src += step
                n -= step
                dat += step
                if dat == dlen:
                    di, dat = di + 1, 0
    _check_open(sock_fd)
    _check_in_time(until)
    return lease, total


@contextlib.contextmanager
def _mapped_ranges(pid: int, ranges: List[Tuple[int, int, int, int]]) -> Iterator[List[_Segment]]:
    """The segments of ``ranges``, mapped, and counted in use (not unmapped) meanwhile."""
    segs: List[_Segment] = []
    try:
        for fd, ino, off, n in ranges:
            segs.append(_map(pid, fd, ino, off + n))
        yield segs
    finally:
        with _lock:
            for seg in segs:
                seg.users -= 1


_CLOSED = _POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL
_pollers = threading.local()


def _check_open(sock_fd: int) -> None:
    """Raises EOFError unless the connection ``sock_fd`` is still open: the server held the
    pins for the whole copy just made (it shuts a connection down before it lets its pins go),
    whatever answers it may have queued on it."""
    # One poll object per thread, which keeps the last descriptor asked about registered (a
    # poll object only holds numbers: each poll() asks the kernel about the descriptor that has
    # that number now).
    p = getattr(_pollers, "p", None)
    if p is None:
        p = _pollers.p = select.poll()
        _pollers.fd = -1
    if _pollers.fd != sock_fd:
        if _pollers.fd >= 0:
            p.unregister(_pollers.fd)
        p.register(sock_fd, _POLLRDHUP)
        _pollers.fd = sock_fd
    for _, ev in p.poll(0):
        if ev & _CLOSED:
            raise EOFError("the connection closed while a mapped get was copied")


def string_at(pid: int, sock_fd: int, text: str, limit: int) -> Tuple[int, bytes]:
    """The object ``X-Mmc-Mapped: text`` names as new ``bytes`` (one copy), at most ``limit``
    bytes. Returns (lease, bytes); raises as :func:`copy`."""
    lease, ranges, until = parse(text)
    total = sum(r[3] for r in ranges)
    if total > limit:
        raise MapFailed("a mapped answer of %d bytes for %d" % (total, limit))
    with _mapped_ranges(pid, ranges) as segs:
        out = b"".join(ctypes.string_at(seg.base + off, n)
                       for (_, _, off, n), seg in zip(ranges, segs))
    _check_open(sock_fd)
    _check_in_time(until)
    return lease, out
