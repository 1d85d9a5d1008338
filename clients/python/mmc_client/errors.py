"""Upstream MemCache Hybrid's return codes (``MmcErrorCode``) and how this client maps the
server's answers onto them. The table is in clients/python/README.md."""

import json
from typing import Any, Dict, Optional

MMC_OK = 0
MMC_ERROR = -1
MMC_INVALID_PARAM = -3000
MMC_MALLOC_FAILED = -3001
MMC_NOT_STARTED = -3003
MMC_TIMEOUT = -3004
MMC_DUPLICATED_OBJECT = -3006
MMC_OBJECT_NOT_EXISTS = -3007
MMC_NOT_INITIALIZED = -3008
MMC_EXCEED_CAPACITY = -3013
MMC_NOT_ENOUGH_MEMORY = -3016
MMC_NOT_CONNET_META = -3017
MMC_CLIENT_NOT_INIT = -3019
MMC_UNMATCHED_KEY = -3102

NAMES: Dict[int, str] = {v: k for k, v in dict(globals()).items() if k.startswith("MMC_")}


def from_message(message: Optional[str]) -> int:
    """A business error's ``error_message`` -> code."""
    m = message or ""
    if m == "Key not found":
        return MMC_UNMATCHED_KEY
    if m.startswith("Duplicated object"):
        return MMC_DUPLICATED_OBJECT
    if m.startswith("No space"):
        return MMC_NOT_ENOUGH_MEMORY
    if m.startswith("Server overloaded"):
        return MMC_TIMEOUT
    if m.startswith(("Invalid", "Missing", "Duplicated key in batch", "Body length", "Key ",
                     "'keys'", "Too many")):
        # Key validation texts ("Key too long", "Key contains control characters", ...).
        if m.startswith("Key was removed"):
            return MMC_ERROR
        return MMC_INVALID_PARAM
    return MMC_ERROR


def from_status(status: int) -> int:
    """A protocol error's HTTP status -> code."""
    if status in (400, 411, 413, 414, 415, 431):
        return MMC_INVALID_PARAM
    if status in (408, 429):
        return MMC_TIMEOUT
    if status == 503:
        return MMC_NOT_CONNET_META
    return MMC_ERROR


def message_of(body: Any) -> str:
    """The ``error_message`` of an error envelope's body (bytes), or the body's text."""
    try:
        raw = bytes(body or b"")
    except TypeError:
        return ""
    try:
        v = json.loads(raw)
        if isinstance(v, dict) and isinstance(v.get("error_message"), str):
            return str(v["error_message"])
    except ValueError:
        pass
    return raw[:200].decode("utf-8", "replace")
