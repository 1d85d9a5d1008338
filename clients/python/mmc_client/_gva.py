"""Upstream's global-address (GVA) calls over this client's HTTP data plane:
``batch_alloc`` / ``batch_copy`` / ``batch_copy_layers`` / ``batch_write_finish`` on the write
side, ``batch_get_key_info`` (its ``gva_list()``) / ``batch_add_lease`` / ``batch_copy`` /
``batch_remove_lease`` on the read side (vllm-ascend's layer-wise path).

Upstream hands out addresses inside the pool's global memory and copies into them directly.
Here a GVA names a range of this client's own address space, one per key (disjoint ranges, so
``gva + offset`` works as upstream's), backed by host memory the client holds:

- ``batch_alloc(keys, sizes)`` reserves a write range per key (0 for a key that already exists,
  as upstream, which answers MMC_DUPLICATED_OBJECT and registers nothing); ``batch_copy`` in the
  host-to-pool direction (``SMEMB_COPY_H2G``) copies into it; ``batch_write_finish(keys, res)``
  stores each object whose ``res`` is 0 (one batch_put, sent from that memory) and drops the
  others; either way the range is released;
- ``batch_get_key_info`` gives each readable key a read range (``gva_list()``);
  ``batch_add_lease(keys)`` fetches those objects into it (one batch_get); ``batch_copy`` in the
  pool-to-host direction (``SMEMB_COPY_G2H``) copies out of it; ``batch_remove_lease`` releases
  the memory.

The device directions (``SMEMB_COPY_L2G``/``G2L``) answer -1: there is no device memory here.
A copy outside a range, or into a range not allocated for writing, answers -1.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from . import errors
from ._http import TransportError

if TYPE_CHECKING:
    from .store import KeyInfo

# Ranges start here and are 4 KiB aligned with a 4 KiB gap between two.
_GVA_BASE = 1 << 40
_ALIGN = 4096
# Read ranges handed out by batch_get_key_info and not leased yet are forgotten past this many
# (oldest first): a reader that asked for key info and never leased costs nothing for long.
_MAX_IDLE_READ_RANGES = 65536


class _Range:
    __slots__ = ("key", "base", "size", "writable", "mem")

    def __init__(self, key: str, base: int, size: int, writable: bool) -> None:
        self.key = key
        self.base = base
        self.size = size
        self.writable = writable
        self.mem: Optional[ctypes.Array[ctypes.c_char]] = None

    def addr(self) -> int:
        assert self.mem is not None
        return ctypes.addressof(self.mem)


class GvaMixin:
    """The GVA calls of :class:`~mmc_client.DistributedObjectStore`."""

    def __init__(self) -> None:
        self._gva_lock = threading.Lock()
        self._gva_next = _GVA_BASE
        self._gva_bases: List[int] = []
        self._gva_by_base: Dict[int, _Range] = {}
        self._gva_write: Dict[str, _Range] = {}
        self._gva_read: "OrderedDict[str, _Range]" = OrderedDict()

    # -- the address space --------------------------------------------------------------------

    def _gva_reset(self) -> None:
        with self._gva_lock:
            self._gva_bases.clear()
            self._gva_by_base.clear()
            self._gva_write.clear()
            self._gva_read.clear()

    def _gva_new(self, key: str, size: int, writable: bool) -> _Range:
        """A new range (the lock held)."""
        r = _Range(key, self._gva_next, size, writable)
        self._gva_next += (max(size, 1) + 2 * _ALIGN - 1) // _ALIGN * _ALIGN
        bisect.insort(self._gva_bases, r.base)
        self._gva_by_base[r.base] = r
        return r

    def _gva_drop(self, r: _Range) -> None:
        """Forgets a range (the lock held)."""
        i = bisect.bisect_left(self._gva_bases, r.base)
        if i < len(self._gva_bases) and self._gva_bases[i] == r.base:
            del self._gva_bases[i]
        self._gva_by_base.pop(r.base, None)
        r.mem = None

    def _gva_find(self, gva: int, n: int) -> Optional[_Range]:
        with self._gva_lock:
            i = bisect.bisect_right(self._gva_bases, gva) - 1
            if i < 0:
                return None
            r = self._gva_by_base[self._gva_bases[i]]
        if gva + n > r.base + r.size or r.mem is None:
            return None
        return r

    def _with_gva(self, key: str, info: "KeyInfo") -> "KeyInfo":
        """``info`` with the read range of its key (a readable object only)."""
        from .store import KeyInfo

        if info.size() <= 0:
            return info
        with self._gva_lock:
            r = self._gva_read.get(key)
            if r is not None and r.size != info.size():
                self._gva_drop(self._gva_read.pop(key))
                r = None
            if r is None:
                r = self._gva_new(key, info.size(), False)
                self._gva_read[key] = r
                idle = [k for k, v in self._gva_read.items() if v.mem is None]
                for k in idle[:max(0, len(idle) - _MAX_IDLE_READ_RANGES)]:
                    self._gva_drop(self._gva_read.pop(k))
            else:
                self._gva_read.move_to_end(key)
        return KeyInfo(info.size(), info.loc_list(), info.type_list(), info.lease_list(),
                       [r.base])

    # -- write side ---------------------------------------------------------------------------

    def batch_alloc(self, keys: Sequence[str], sizes: Sequence[int], media: int = 1) -> List[int]:
        """A write range per key (its GVA), 0 for a key that exists, is being written by this
        client, or whose size is not positive. ``media`` is accepted (the server places the
        object at ``batch_write_finish``)."""
        from .store import _str_list, _seq

        keys = _str_list(keys)
        sizes = _seq(sizes, "sizes")
        if len(sizes) != len(keys):
            return [0] * len(keys)
        exists = self.batch_is_exist(keys)  # type: ignore[attr-defined]
        out = []
        with self._gva_lock:
            for k, n, e in zip(keys, sizes, exists):
                if (e != 0 or isinstance(n, bool) or not isinstance(n, int) or n <= 0
                        or k in self._gva_write):
                    out.append(0)
                    continue
                r = self._gva_new(k, n, True)
                r.mem = (ctypes.c_char * n)()
                self._gva_write[k] = r
                out.append(r.base)
        return out

    def batch_write_finish(self, keys: Sequence[str], res: Sequence[int]) -> List[int]:
        """Stores each allocated key whose ``res`` is 0 (one batch_put, from the range's
        memory) and drops the others; releases the ranges. A code per key: 0, the put's code,
        or -3102 for a key without a write range."""
        from .store import _str_list, _seq, _Fail

        keys = _str_list(keys)
        res = _seq(res, "res")
        if len(res) != len(keys):
            return [errors.MMC_ERROR] * len(keys)
        codes = [errors.MMC_UNMATCHED_KEY] * len(keys)
        ranges: List[Optional[_Range]] = []
        with self._gva_lock:
            for k in keys:
                ranges.append(self._gva_write.pop(k, None))
        values: List[Any] = []
        for i, r in enumerate(ranges):
            if r is None or r.mem is None or res[i] != 0:
                if r is not None:
                    codes[i] = errors.MMC_OK  # the aborted write is dropped
                values.append(None)
            else:
                codes[i] = errors.MMC_ERROR
                values.append([memoryview(r.mem).cast("B")])
        try:
            if any(v is not None for v in values):
                self._batch_put(keys, values, None, codes)  # type: ignore[attr-defined]
        except (_Fail, TransportError) as f:
            codes = [f.code if v is not None else c for v, c in zip(values, codes)]
        finally:
            with self._gva_lock:
                for r in ranges:
                    if r is not None:
                        self._gva_drop(r)
        return codes

    # -- read side ----------------------------------------------------------------------------

    def batch_add_lease(self, keys: Sequence[str], lease_ttl_ms: int = 0) -> List[int]:
        """Fetches each key's object into its read range (given by batch_get_key_info, or
        found now): 0, or -3102 for a key that is not readable. ``lease_ttl_ms`` is accepted:
        the bytes stay with this client until ``batch_remove_lease``."""
        from .store import _Fail, _str_list

        keys = _str_list(keys)
        codes = [errors.MMC_ERROR] * len(keys)
        todo: List[int] = []
        with self._gva_lock:
            for i, k in enumerate(keys):
                r = self._gva_read.get(k)
                if r is not None and r.mem is not None:
                    codes[i] = errors.MMC_OK
                else:
                    todo.append(i)
        unknown = [i for i in todo if keys[i] not in self._gva_read]
        if unknown:
            try:
                infos = self._key_infos([keys[i] for i in unknown])  # type: ignore[attr-defined]
            except (_Fail, TransportError) as f:
                for i in unknown:
                    codes[i] = f.code
                todo = [i for i in todo if i not in set(unknown)]
                infos = []
            for i, info in zip(unknown, infos):
                self._with_gva(keys[i], info)
        values: List[Any] = [None] * len(keys)
        mems: Dict[int, Any] = {}
        with self._gva_lock:
            for i in todo:
                r = self._gva_read.get(keys[i])
                if r is None:
                    codes[i] = errors.MMC_UNMATCHED_KEY
                    continue
                mems[i] = (ctypes.c_char * r.size)()
                values[i] = [memoryview(mems[i]).cast("B")]
        if mems:
            try:
                self._batch_get_parts(keys, values, codes)  # type: ignore[attr-defined]
            except (_Fail, TransportError) as f:
                for i in mems:
                    codes[i] = f.code
        with self._gva_lock:
            for i, mem in mems.items():
                r = self._gva_read.get(keys[i])
                if codes[i] == errors.MMC_OK and r is not None:
                    r.mem = mem
                elif codes[i] == errors.MMC_INVALID_PARAM and r is not None:
                    # The object changed size since its key info: look again next time.
                    self._gva_drop(self._gva_read.pop(keys[i]))
                    codes[i] = errors.MMC_UNMATCHED_KEY
        return codes

    def batch_remove_lease(self, keys: Sequence[str]) -> int:
        """Releases the fetched bytes of each key: 0."""
        from .store import _str_list

        with self._gva_lock:
            for k in _str_list(keys):
                r = self._gva_read.pop(k, None)
                if r is not None:
                    self._gva_drop(r)
        return errors.MMC_OK

    # -- copies -------------------------------------------------------------------------------

    def _gva_copy_one(self, gva: Any, ptr: Any, size: Any, direct: int) -> int:
        from .store import SMEMB_COPY_G2H, SMEMB_COPY_H2G, _view

        if isinstance(gva, bool) or not isinstance(gva, int):
            raise TypeError("gva must be an int")
        view = _view(ptr, size, direct == SMEMB_COPY_G2H)
        n = len(view)
        if n == 0:
            return errors.MMC_OK
        r = self._gva_find(gva, n)
        if r is None or (direct == SMEMB_COPY_H2G and not r.writable):
            return errors.MMC_ERROR
        mem = r.mem
        if mem is None:
            return errors.MMC_ERROR
        off = gva - r.base
        dst = memoryview(mem).cast("B")
        if direct == SMEMB_COPY_H2G:
            dst[off:off + n] = view
        else:
            view[:] = dst[off:off + n]
        return errors.MMC_OK

    def _gva_batch(self, gva_ptrs: Any, buffer_ptrs: Any, sizes: Any, direct: Any,
                   copy: Callable[[int, Any, Any], int]) -> int:
        """Checks a copy batch's arguments, then ``copy(gva, buffers, sizes)`` per GVA: 0, or the
        first failure's code. Only the host directions are served (-1 for the others)."""
        from .store import SMEMB_COPY_G2H, SMEMB_COPY_H2G, _Fail, _seq

        gva_ptrs, buffer_ptrs = _seq(gva_ptrs, "gva_ptrs"), _seq(buffer_ptrs, "buffer_ptrs")
        sizes = _seq(sizes, "sizes")
        if isinstance(direct, bool) or not isinstance(direct, int):
            raise TypeError("direct must be an int (MmcCopyDirect)")
        if direct not in (SMEMB_COPY_G2H, SMEMB_COPY_H2G):
            return errors.MMC_ERROR
        if not len(gva_ptrs) == len(buffer_ptrs) == len(sizes):
            return errors.MMC_ERROR
        for g, p, n in zip(gva_ptrs, buffer_ptrs, sizes):
            try:
                code = copy(g, p, n)
            except _Fail as f:
                code = f.code
            if code != errors.MMC_OK:
                return code
        return errors.MMC_OK

    def batch_copy(self, gva_ptrs: Sequence[int], buffer_ptrs: Sequence[Any],
                   sizes: Sequence[int], direct: int) -> int:
        """Copies ``sizes[i]`` bytes between ``gva_ptrs[i]`` (anywhere inside a range) and the
        host buffer ``buffer_ptrs[i]``: 0, or the first failure's code (-1)."""
        return self._gva_batch(gva_ptrs, buffer_ptrs, sizes, direct,
                               lambda g, p, n: self._gva_copy_one(g, p, n, direct))

    def batch_copy_layers(self, gva_ptrs: Sequence[int], buffer_ptrs: Sequence[Sequence[Any]],
                          sizes: Sequence[Sequence[int]], direct: int) -> int:
        """Per GVA, its layers back to back from that address: 0, or the first failure's
        code."""
        from .store import MAX_LAYER_NUM, _seq

        def layers(g: int, ptrs: Any, lens: Any) -> int:
            ptrs, lens = _seq(ptrs, "buffer_ptrs[i]"), _seq(lens, "sizes[i]")
            if not ptrs or len(ptrs) > MAX_LAYER_NUM or len(ptrs) != len(lens):
                return errors.MMC_ERROR
            off = 0
            for p, n in zip(ptrs, lens):
                code = self._gva_copy_one(g + off, p, n, direct)
                if code != errors.MMC_OK:
                    return code
                off += n
            return errors.MMC_OK

        return self._gva_batch(gva_ptrs, buffer_ptrs, sizes, direct, layers)
