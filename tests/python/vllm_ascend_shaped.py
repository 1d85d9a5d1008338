"""A vllm-ascend-shaped client of mmc_client: the calls vllm-ascend's memcache backend
(``vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/backend/memcache_backend.py``) and
its layer-wise transfer path (``pool_worker.py``, ``kv_transfer.py``) make on upstream's
``DistributedObjectStore``, in their order and with their argument shapes, on host memory:

- the store found through ``MMC_LOCAL_CONFIG_PATH`` only (``init(local_rank, init_bm=...)``,
  no ``setup()``), buffers registered;
- the whole-block path: ``batch_is_exist``, ``batch_put_from_layers`` / ``batch_get_into_layers``
  (a list of layer addresses and sizes per key), pool keys ``model@pcp0@dcp0@...@hash``;
- the layer-wise path with GVAs: ``batch_alloc`` per new key (``model@hash@rank``,
  ``model@group@hash@rank``), ``batch_copy`` per layer with ``gva + offset`` split into packets
  of at most ``max_transfer_bytes``, ``batch_write_finish``; on load ``batch_get_key_info`` ->
  ``gva_list()[0]``, ``batch_add_lease``, ``batch_copy`` per layer, ``batch_remove_lease``.

vllm-ascend copies between NPU memory and the pool (``COPY_L2G``/``COPY_G2L``); there is no
device here, so those directions are checked to answer upstream's -1 and the bytes move with
the host directions (``SMEMB_COPY_H2G``/``G2H``). Every store call is recorded
(:class:`RecordingStore`); ``run()`` returns the record. ``python vllm_ascend_shaped.py`` runs it
against the server the environment's ``MMC_LOCAL_CONFIG_PATH`` names.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from mmc_client import DistributedObjectStore, MmcCopyDirect, errors

NUM_LAYERS = 4
BLOCK_BYTES = 4096  # one layer's share of a block
NUM_BLOCKS = 6
MAX_TRANSFER_BYTES = 1536  # packets split as vllm-ascend's _split_transfer_packets does
MODEL = "Qwen3-8B"
RANK = 1


class RecordingStore:
    """The store with every call recorded as (method, number of keys or None, result)."""

    def __init__(self, store: DistributedObjectStore) -> None:
        self._store = store
        self.calls: List[Tuple[str, Any, Any]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            n = len(args[0]) if args and isinstance(args[0], list) else None
            self.calls.append((name, n, result))
            return result

        return call


def _blocks(seed: int) -> np.ndarray:
    """A KV arena: NUM_BLOCKS blocks of NUM_LAYERS layers, each layer's bytes its own."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (NUM_LAYERS, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8)


def _layer_addrs(arena: np.ndarray, block: int) -> List[int]:
    return [arena[layer, block].ctypes.data for layer in range(NUM_LAYERS)]


def _split(gva: int, addr: int, size: int) -> List[Tuple[int, int, int]]:
    """One copy split in packets of at most MAX_TRANSFER_BYTES (gva + offset, addr + offset)."""
    return [(gva + off, addr + off, min(MAX_TRANSFER_BYTES, size - off))
            for off in range(0, size, MAX_TRANSFER_BYTES)]


def whole_block_path(store: RecordingStore, tag: str) -> None:
    src, dst = _blocks(1), np.zeros((NUM_LAYERS, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    store.register_buffer(src.ctypes.data, src.nbytes)
    keys = ["%s@pcp0@dcp0@head_or_tp_rank:%d@pp_rank:0@group:0@cache_role:kv"
            "@cache_family:default@%s%04x" % (MODEL, RANK, tag, b) for b in range(NUM_BLOCKS)]
    assert store.batch_is_exist(keys) == [0] * NUM_BLOCKS
    addrs = [_layer_addrs(src, b) for b in range(NUM_BLOCKS)]
    sizes = [[BLOCK_BYTES] * NUM_LAYERS for _ in range(NUM_BLOCKS)]
    # vllm-ascend's own direction (NPU memory): upstream's unsupported-direction code here.
    assert store.batch_put_from_layers(keys, addrs, sizes, MmcCopyDirect.SMEMB_COPY_L2G.value) \
        == [errors.MMC_ERROR] * NUM_BLOCKS
    assert store.batch_put_from_layers(keys, addrs, sizes, MmcCopyDirect.SMEMB_COPY_H2G.value) \
        == [0] * NUM_BLOCKS
    assert store.batch_is_exist(keys) == [1] * NUM_BLOCKS
    daddrs = [_layer_addrs(dst, b) for b in range(NUM_BLOCKS)]
    assert store.batch_get_into_layers(keys, daddrs, sizes, MmcCopyDirect.SMEMB_COPY_G2L.value) \
        == [errors.MMC_ERROR] * NUM_BLOCKS
    res = store.batch_get_into_layers(keys + [keys[0] + "-missing"],
                                      daddrs + [daddrs[0]], sizes + [sizes[0]],
                                      MmcCopyDirect.SMEMB_COPY_G2H.value)
    assert res == [0] * NUM_BLOCKS + [errors.MMC_UNMATCHED_KEY], res
    assert np.array_equal(src, dst)
    # A layer list of the wrong total size reads nothing into it.
    short = [[BLOCK_BYTES] * (NUM_LAYERS - 1)]
    assert store.batch_get_into_layers(keys[:1], [daddrs[0][:-1]], short,
                                       MmcCopyDirect.SMEMB_COPY_G2H.value) \
        == [errors.MMC_INVALID_PARAM]


def layerwise_path(store: RecordingStore, tag: str, groups: int) -> None:
    src, dst = _blocks(2), np.zeros((NUM_LAYERS, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    store.register_buffer(src.ctypes.data, src.nbytes)
    alloc_size = NUM_LAYERS * BLOCK_BYTES
    # Save: keys in vllm-ascend's layer-wise forms; one GVA per new key.
    if groups > 1:
        keys = ["%s@%d@%s%04x@%d" % (MODEL, b % groups, tag, b, RANK) for b in range(NUM_BLOCKS)]
    else:
        keys = ["%s@%s%04x@%d" % (MODEL, tag, b, RANK) for b in range(NUM_BLOCKS)]
    gvas = store.batch_alloc(keys, [alloc_size] * NUM_BLOCKS)
    assert all(g > 0 for g in gvas), gvas
    # batch_alloc is not idempotent: a key being written gets no second GVA.
    assert store.batch_alloc(keys[:1], [alloc_size]) == [0]
    # Per layer, every block's share is copied to gva + layer offset, split in packets.
    for layer in range(NUM_LAYERS):
        packets = [p for b in range(NUM_BLOCKS)
                   for p in _split(gvas[b] + layer * BLOCK_BYTES, src[layer, b].ctypes.data,
                                   BLOCK_BYTES)]
        g, a, n = (list(x) for x in zip(*packets))
        assert store.batch_copy(g, a, n, MmcCopyDirect.SMEMB_COPY_L2G.value) == errors.MMC_ERROR
        assert store.batch_copy(g, a, n, MmcCopyDirect.SMEMB_COPY_H2G.value) == 0
    # Nothing is visible before the write is finished.
    assert store.batch_is_exist(keys) == [0] * NUM_BLOCKS
    # The last block's copy "failed": its write is dropped, the others are published.
    results = [0] * (NUM_BLOCKS - 1) + [-1]
    assert store.batch_write_finish(keys, results) == [0] * NUM_BLOCKS
    assert store.batch_is_exist(keys) == [1] * (NUM_BLOCKS - 1) + [0]
    assert store.batch_alloc(keys[:1], [alloc_size]) == [0], "an existing key"
    # Load: GVAs from key info, a read lease, per-layer copies, the lease released.
    infos = store.batch_get_key_info(keys)
    assert [i.size() for i in infos] == [alloc_size] * (NUM_BLOCKS - 1) + [0]
    assert infos[-1].gva_list() == []
    load_keys = keys[:-1]
    load_gvas = [i.gva_list()[0] for i in infos[:-1]]
    assert all(g > 0 for g in load_gvas)
    partial = "%s@partial@req-%s@0@3@1000@%d" % (MODEL, tag, RANK)
    assert store.batch_add_lease(load_keys + [partial], 120000) \
        == [0] * len(load_keys) + [errors.MMC_UNMATCHED_KEY]
    for layer in range(NUM_LAYERS):
        packets = [p for b, gva in enumerate(load_gvas)
                   for p in _split(gva + layer * BLOCK_BYTES, dst[layer, b].ctypes.data,
                                   BLOCK_BYTES)]
        g, a, n = (list(x) for x in zip(*packets))
        assert store.batch_copy(g, a, n, MmcCopyDirect.SMEMB_COPY_G2L.value) == errors.MMC_ERROR
        assert store.batch_copy(g, a, n, MmcCopyDirect.SMEMB_COPY_G2H.value) == 0
    assert store.batch_remove_lease(load_keys) == 0
    assert np.array_equal(src[:, :NUM_BLOCKS - 1], dst[:, :NUM_BLOCKS - 1])
    # After the lease, the GVA no longer reads.
    assert store.batch_copy(load_gvas[:1], [dst[0, 0].ctypes.data], [BLOCK_BYTES],
                            MmcCopyDirect.SMEMB_COPY_G2H.value) == errors.MMC_ERROR
    # batch_copy_layers: a key's layers back to back from its GVA (write, then read).
    lkey = "%s@%s%04x@%d" % (MODEL, tag, 0xFFF, RANK)
    (lg,) = store.batch_alloc([lkey], [alloc_size])
    assert store.batch_copy_layers([lg], [_layer_addrs(src, 0)], [[BLOCK_BYTES] * NUM_LAYERS],
                                   MmcCopyDirect.SMEMB_COPY_H2G.value) == 0
    assert store.batch_write_finish([lkey], [0]) == [0]
    (info,) = store.batch_get_key_info([lkey])
    assert store.batch_add_lease([lkey]) == [0]
    out = np.zeros((NUM_LAYERS, BLOCK_BYTES), dtype=np.uint8)
    assert store.batch_copy_layers([info.gva_list()[0]],
                                   [[out[i].ctypes.data for i in range(NUM_LAYERS)]],
                                   [[BLOCK_BYTES] * NUM_LAYERS],
                                   MmcCopyDirect.SMEMB_COPY_G2H.value) == 0
    assert store.batch_remove_lease([lkey]) == 0
    assert np.array_equal(out, src[:, 0])


def run(tag: str = "a", local_rank: int = 0) -> List[Tuple[str, Any, Any]]:
    """The whole script; the recorded calls."""
    raw = DistributedObjectStore()
    store = RecordingStore(raw)
    assert store.init(local_rank, init_bm=True) == 0
    whole_block_path(store, tag)
    layerwise_path(store, tag + "1", groups=1)
    layerwise_path(store, tag + "2", groups=2)
    store.close()
    return store.calls


def main() -> int:
    calls = run()
    names: Dict[str, int] = {}
    for name, _, _ in calls:
        names[name] = names.get(name, 0) + 1
    for name, count in sorted(names.items()):
        print("%-24s %d" % (name, count))
    print("vllm-ascend-shaped run: %d calls, all as expected" % len(calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
