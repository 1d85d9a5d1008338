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


# --- vllm-0.9: vLLM 0.9.0 - 0.10.1 -------------------------------------------------------------
class _V09Event(msgspec.Struct, array_like=True, tag=True, forbid_unknown_fields=True):
    pass


class V09BlockStored(_V09Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class V09BlockRemoved(_V09Event, tag="BlockRemoved"):
    block_hashes: list[int]


class V09AllBlocksCleared(_V09Event, tag="AllBlocksCleared"):
    pass


class V09KVEventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[V09BlockStored, V09BlockRemoved, V09AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None  # from 0.9.2; 0.9.0 ignores it


# --- array: vLLM 0.10.2 - 0.13 (llm-d, Dynamo) -------------------------------------------------
class _PositionalEvent(msgspec.Struct, array_like=True, tag=True, forbid_unknown_fields=True):
    pass


class PositionalBlockStored(_PositionalEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class PositionalBlockRemoved(_PositionalEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]


class PositionalAllBlocksCleared(_PositionalEvent, tag="AllBlocksCleared"):
    pass


class PositionalKVEventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[PositionalBlockStored, PositionalBlockRemoved, PositionalAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


# --- vllm-0.14: vLLM 0.14 - 0.23 (lora_name required; later optional fields trail) ------------
class _V014Event(msgspec.Struct, array_like=True, tag=True, forbid_unknown_fields=True):
    pass


class V014BlockStored(_V014Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None


class V014BlockRemoved(_V014Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class V014AllBlocksCleared(_V014Event, tag="AllBlocksCleared"):
    pass


class V014KVEventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[V014BlockStored, V014BlockRemoved, V014AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


# --- by-name events: vLLM 0.24 - 0.33 (positional batch) and vLLM main (batch by name) --------
class _NamedEvent(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    pass


class NamedBlockStored(_NamedEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class NamedBlockRemoved(_NamedEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class NamedAllBlocksCleared(_NamedEvent, tag="AllBlocksCleared"):
    pass


class V024KVEventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[NamedBlockStored, NamedBlockRemoved, NamedAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


class NamedKVEventBatch(msgspec.Struct, forbid_unknown_fields=True):
    ts: float
    events: list[Union[NamedBlockStored, NamedBlockRemoved, NamedAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


# --- sglang: SGLang (positional batch with attn_dp_rank, events by name) -----------------------
class _SglangEvent(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    pass


class SglangBlockStored(_SglangEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class SglangBlockRemoved(_SglangEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


class SglangAllBlocksCleared(_SglangEvent, tag="AllBlocksCleared"):
    pass


class SglangKVEventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[SglangBlockStored, SglangBlockRemoved, SglangAllBlocksCleared]]
    attn_dp_rank: Optional[int] = None


BATCH_TYPES = {
    "vllm-0.9": V09KVEventBatch,
    "array": PositionalKVEventBatch,
    "vllm-0.14": V014KVEventBatch,
    "vllm-0.24": V024KVEventBatch,
    "sglang": SglangKVEventBatch,
    "map": NamedKVEventBatch,
}
STORED = (V09BlockStored, PositionalBlockStored, V014BlockStored, NamedBlockStored,
          SglangBlockStored)
REMOVED = (V09BlockRemoved, PositionalBlockRemoved, V014BlockRemoved, NamedBlockRemoved,
           SglangBlockRemoved)
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
