"""KV-event decoders shaped like the real consumers' (our own definitions, after each
generation's `vllm/distributed/kv_events.py`, SGLang's `sglang/srt/disaggregation/kv_events.py`
and llm-d's indexer), used by test_kv_events.py. One per `ock.mmc.kv_events.encoding` value:

| encoding | consumers | batch | events |
|---|---|---|---|
| vllm-0.9 | vLLM 0.9.0 - 0.10.1 | array | arrays: BlockStored without medium, BlockRemoved hashes only |
| array | vLLM 0.10.2 - 0.13, llm-d, Dynamo | array | arrays with medium |
| vllm-0.14 | vLLM 0.14 - 0.23 | array | arrays, BlockStored with lora_name |
| vllm-0.24 | vLLM 0.24 - 0.33 | array | maps tagged by "type", lora_name required |
| sglang | SGLang | array (`attn_dp_rank`) | maps tagged by "type", its optional fields |
| map | vLLM main | map | maps tagged by "type" |

`llmd_read` is llm-d's reading of the `array` form: the batch an array, each event an array
whose element 0 is the tag and the rest its fields by position.

Every struct forbids unknown fields (for array_like structs: extra trailing elements), so a
field too many fails the decode as surely as a field missing or of the wrong type (the real
consumers ignore extra fields; these decoders are stricter, to pin each shape exactly).
"""

from typing import Optional, Union

import msgpack
import msgspec

U64 = (1 << 64) - 1


# Each generation's event fields, as field-only structs the event classes below derive from
# (the fields in each generation's order; later generations append).
class _Stored09(msgspec.Struct):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class _Stored010(_Stored09):
    medium: Optional[str]


class _Stored014(_Stored010):
    lora_name: Optional[str]  # required from vLLM 0.14
    extra_keys: Optional[list] = None  # optional from 0.17, omitted at None
    group_idx: Optional[int] = None  # optional from 0.20


class _StoredNamed(_Stored014):
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class _StoredSglang(_Stored09):
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class _Removed09(msgspec.Struct):
    block_hashes: list[int]


class _Removed010(_Removed09):
    medium: Optional[str]


class _RemovedGrouped(_Removed010):
    group_idx: Optional[int] = None


class _RemovedSglang(_Removed09):
    medium: Optional[str] = None


STRICT = {"forbid_unknown_fields": True}
POSITIONAL = {"array_like": True, **STRICT}


# vllm-0.9: vLLM 0.9.0 - 0.10.1, every event positional, no medium.
class V09BlockStored(_Stored09, tag="BlockStored", **POSITIONAL): ...
class V09BlockRemoved(_Removed09, tag="BlockRemoved", **POSITIONAL): ...
class V09AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", **POSITIONAL): ...


# array: vLLM 0.10.2 - 0.13 (llm-d, Dynamo), positional with medium.
class PositionalBlockStored(_Stored010, tag="BlockStored", **POSITIONAL): ...
class PositionalBlockRemoved(_Removed010, tag="BlockRemoved", **POSITIONAL): ...
class PositionalAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", **POSITIONAL): ...


# vllm-0.14: vLLM 0.14 - 0.23, positional with lora_name.
class V014BlockStored(_Stored014, tag="BlockStored", **POSITIONAL): ...
class V014BlockRemoved(_RemovedGrouped, tag="BlockRemoved", **POSITIONAL): ...
class V014AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", **POSITIONAL): ...


# vllm-0.24 and vLLM main: events by name (tagged by "type").
class NamedBlockStored(_StoredNamed, tag="BlockStored", **STRICT): ...
class NamedBlockRemoved(_RemovedGrouped, tag="BlockRemoved", **STRICT): ...
class NamedAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", **STRICT): ...


# sglang: events by name, SGLang's optional fields.
class SglangBlockStored(_StoredSglang, tag="BlockStored", **STRICT): ...
class SglangBlockRemoved(_RemovedSglang, tag="BlockRemoved", **STRICT): ...
class SglangAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", **STRICT): ...


def _batch(name, events, positional, dp_field="data_parallel_rank"):
    """A generation's EventBatch: ts, its events, the data-parallel rank (optional)."""
    return msgspec.defstruct(name, [("ts", float), ("events", list[events]),
                                    (dp_field, Optional[int], None)],
                             array_like=positional, forbid_unknown_fields=True)


BATCH_TYPES = {
    # vLLM 0.9.0 has no data_parallel_rank (and ignores the trailing one); 0.9.2 added it.
    "vllm-0.9": _batch("V09KVEventBatch",
                       Union[V09BlockStored, V09BlockRemoved, V09AllBlocksCleared], True),
    "array": _batch("PositionalKVEventBatch", Union[PositionalBlockStored,
                    PositionalBlockRemoved, PositionalAllBlocksCleared], True),
    "vllm-0.14": _batch("V014KVEventBatch",
                        Union[V014BlockStored, V014BlockRemoved, V014AllBlocksCleared], True),
    "vllm-0.24": _batch("V024KVEventBatch",
                        Union[NamedBlockStored, NamedBlockRemoved, NamedAllBlocksCleared], True),
    "sglang": _batch("SglangKVEventBatch", Union[SglangBlockStored, SglangBlockRemoved,
                     SglangAllBlocksCleared], True, dp_field="attn_dp_rank"),
    "map": _batch("NamedKVEventBatch",
                  Union[NamedBlockStored, NamedBlockRemoved, NamedAllBlocksCleared], False),
}
STORED = (_Stored09,)
REMOVED = (_Removed09,)
CLEARED = (V09AllBlocksCleared, PositionalAllBlocksCleared, V014AllBlocksCleared,
           NamedAllBlocksCleared, SglangAllBlocksCleared)


def decode_typed(payload, encoding):
    """`msgspec.msgpack.decode(payload, type=...)` as the consumers do; raises
    msgspec.ValidationError / DecodeError if the payload is not exactly that form."""
    return msgspec.msgpack.decode(payload, type=BATCH_TYPES[encoding])


def dp_rank(batch):
    return getattr(batch, "data_parallel_rank", getattr(batch, "attn_dp_rank", None))


def simplify_typed(ev, block_size=256):
    """An event as (kind, hashes, medium), checking the fields this server always sets. The
    medium is given in vLLM's names (SGLang's CPU_PINNED read as CPU); None for a generation
    without medium."""
    if isinstance(ev, STORED):
        assert ev.parent_block_hash is None and ev.lora_id is None, ev
        assert ev.token_ids == [] and ev.block_size == block_size, ev
        assert getattr(ev, "lora_name", None) is None, ev
        medium = getattr(ev, "medium", None)
        return ("stored", ev.block_hashes, "CPU" if medium == "CPU_PINNED" else medium)
    if isinstance(ev, REMOVED):
        medium = getattr(ev, "medium", None)
        return ("removed", ev.block_hashes, "CPU" if medium == "CPU_PINNED" else medium)
    assert isinstance(ev, CLEARED), ev
    return ("cleared",)


def _hashes(v):
    assert isinstance(v, list) and v and all(isinstance(h, int) and 0 <= h <= U64 for h in v), v
    return v


def llmd_read(payload):
    """llm-d's reading of a positional batch: (ts, events as (kind, hashes, medium), dp_rank).
    Raises AssertionError on anything else."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, raw_events, dp_rank = batch
    assert isinstance(ts, float) and isinstance(dp_rank, int), batch
    assert isinstance(raw_events, list), batch
    events = []
    for ev in raw_events:
        assert isinstance(ev, list) and ev and isinstance(ev[0], str), ev
        tag, fields = ev[0], ev[1:]
        if tag == "BlockStored":
            hashes, parent, token_ids, block_size, lora_id, medium = fields
            assert parent is None or isinstance(parent, int), ev
            assert isinstance(token_ids, list) and isinstance(block_size, int), ev
            assert lora_id is None or isinstance(lora_id, int), ev
            assert isinstance(medium, str), ev
            events.append(("stored", _hashes(hashes), medium))
        elif tag == "BlockRemoved":
            hashes, medium = fields
            assert isinstance(medium, str), ev
            events.append(("removed", _hashes(hashes), medium))
        elif tag == "AllBlocksCleared":
            assert fields == [], ev
            events.append(("cleared",))
        else:
            raise AssertionError("unknown event tag %r" % tag)
    return ts, events, dp_rank
