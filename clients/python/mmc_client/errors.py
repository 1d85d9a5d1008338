"""Upstream MemCache Hybrid's return codes (``MmcErrorCode``) and how this client maps the
server's answers onto them. The table is in clients/python/README.md.

An error answer of mmc-server says its kind in the ``X-MMC-Error-Code`` header (docs/api.md,
*Errors*): :func:`from_answer` maps that kind. The text of ``error_message`` (:func:`from_message`)
and the HTTP status (:func:`from_status`) are read only when the header is absent: a server
from before the header, or a kind this client does not know. A batch's per-key results carry
their kind in ``error_code`` (:func:`from_item`)."""

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

#: The header an error answer's kind comes in.
ERROR_CODE_HEADER = "x-mmc-error-code"

#: The server's error kinds (``src/common/error_kind.rs``) -> upstream's codes.
KINDS: Dict[str, int] = {
    "invalid_param": MMC_INVALID_PARAM,
    "key_not_found": MMC_UNMATCHED_KEY,
    "duplicated_object": MMC_DUPLICATED_OBJECT,
    "no_space": MMC_NOT_ENOUGH_MEMORY,
    "overloaded": MMC_TIMEOUT,
    "timeout": MMC_TIMEOUT,
    "unavailable": MMC_NOT_CONNET_META,
    "unauthorized": MMC_ERROR,
    "not_found": MMC_ERROR,
    "unsupported": MMC_ERROR,
    "write_revoked": MMC_ERROR,
    "failed": MMC_ERROR,
}


def from_kind(kind: Optional[str]) -> Optional[int]:
    """An ``X-MMC-Error-Code`` value -> code; None for no header or a kind this client does
    not know (a newer server's), so that the caller falls back."""
    if not kind:
        return None
    return KINDS.get(kind.strip())


def from_item(item: Any) -> int:
    """The code of a failed item of a batch's ``results``: its ``error_code`` kind; without one,
    its ``error_message``."""
    if not isinstance(item, dict):
        return MMC_ERROR
    code = from_kind(item.get("error_code"))
    return code if code is not None else from_message(item.get("error_message"))


def from_answer(resp: Any, message: Optional[str] = None) -> int:
    """The code of an error answer (``resp`` has ``status`` and ``header(name)``): its
    ``X-MMC-Error-Code`` kind; without one, ``message`` (a business error's text) for an
    HTTP 200, else the status."""
    code = from_kind(resp.header(ERROR_CODE_HEADER))
    if code is not None:
        return code
    if resp.status == 200:
        return from_message(message)
    return from_status(resp.status)


def from_message(message: Optional[str]) -> int:
    """A business error's ``error_message`` -> code: the fallback for answers without an
    ``X-MMC-Error-Code`` kind."""
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
