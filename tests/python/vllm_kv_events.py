"""KV-event decoders shaped like the real consumers' (our own definitions, after vLLM's
`vllm.distributed.kv_events` and llm-d's indexer), used by test_kv_events.py.

- Positional form (vLLM up to 0.11, llm-d, Dynamo): msgspec Structs with `array_like=True,
  tag=True`, fields in vLLM's order; the batch `[ts, events, data_parallel_rank]`.
- By-name form (current vLLM): msgspec Structs with `tag=True` (tag field "type"), the batch a
  map `{"ts", "events", "data_parallel_rank"}`.
- `llmd_read`: llm-d's reading of the positional form: the batch an array, each event an array
  whose element 0 is the tag and the rest its fields by position.

Every struct forbids unknown fields (for array_like structs: extra trailing elements), so a
field too many fails the decode as surely as a field missing or of the wrong type.
"""

from typing import Optional, Union

import msgpack
import msgspec

U64 = (1 << 64) - 1


# Positional (array_like) generation.
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


# By-name generation.
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


class NamedBlockRemoved(_NamedEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]


class NamedAllBlocksCleared(_NamedEvent, tag="AllBlocksCleared"):
    pass


class NamedKVEventBatch(msgspec.Struct, forbid_unknown_fields=True):
    ts: float
    events: list[Union[NamedBlockStored, NamedBlockRemoved, NamedAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


BATCH_TYPES = {"array": PositionalKVEventBatch, "map": NamedKVEventBatch}

STORED = (PositionalBlockStored, NamedBlockStored)
REMOVED = (PositionalBlockRemoved, NamedBlockRemoved)
CLEARED = (PositionalAllBlocksCleared, NamedAllBlocksCleared)


def decode_typed(payload, encoding):
    """`msgspec.msgpack.decode(payload, type=...)` as vLLM's subscriber does; raises
    msgspec.ValidationError / DecodeError if the payload is not exactly that form."""
    return msgspec.msgpack.decode(payload, type=BATCH_TYPES[encoding])


def simplify_typed(ev, block_size=256):
    """An event as (kind, hashes, medium), checking the fields this server always sets."""
    if isinstance(ev, STORED):
        assert ev.parent_block_hash is None and ev.lora_id is None, ev
        assert ev.token_ids == [] and ev.block_size == block_size, ev
        if isinstance(ev, NamedBlockStored):
            assert ev.lora_name is None, ev
        return ("stored", ev.block_hashes, ev.medium)
    if isinstance(ev, REMOVED):
        return ("removed", ev.block_hashes, ev.medium)
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
