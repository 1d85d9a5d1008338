"""Upstream's local configuration file (``MMC_LOCAL_CONFIG_PATH``, ``key = value`` lines), read
by ``DistributedObjectStore.init()`` when ``setup()`` was not called, as upstream's binding does.

The keys this client uses:

- ``ock.mmc.meta_service_url``: upstream's ``tcp://host:port`` meta address is read as
  ``http://host:port`` (mmc-server listens there); ``http://`` URLs and comma lists (HA) too;
- ``ock.mmc.client.timeout.seconds``, ``ock.mmc.client.retry_milliseconds``;
- ``ock.mmc.local_service.rank``: what ``get_local_service_id()`` answers (this server's key for a
  local service's rank; upstream's files have none: the client then has no local service, -1);
- ``ock.mmc.client.api_token`` (an extension; env ``MMC_API_TOKEN`` otherwise).

Every other upstream key (protocol, world_size, sizes, TLS, thread pools, ...) is accepted and
ignored: this client contributes no memory and talks HTTP.
"""

from __future__ import annotations

import os
from typing import Dict

ENV = "MMC_LOCAL_CONFIG_PATH"


def parse(text: str) -> Dict[str, str]:
    """``key = value`` lines; ``#`` and ``;`` start comment lines; later keys win."""
    out: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def read(path: str) -> Dict[str, str]:
    """The file's keys; ``ValueError`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f.read())
    except OSError as e:
        raise ValueError("cannot read %s=%s: %s" % (ENV, path, e.strerror or e)) from e


def meta_urls(value: str) -> str:
    """Upstream's meta address(es) as this client's URL list."""
    urls = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("tcp://"):
            part = "http://" + part[len("tcp://"):]
        elif "://" not in part:
            part = "http://" + part
        urls.append(part)
    if not urls:
        raise ValueError("ock.mmc.meta_service_url is empty")
    return ",".join(urls)


def env_path() -> str:
    return os.environ.get(ENV, "")
