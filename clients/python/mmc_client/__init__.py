"""Python client of mmc-server (MemCache Hybrid in Rust), with upstream MemCache Hybrid's
``DistributedObjectStore`` API: code written for ``memcache_hybrid`` changes only its import.

    from mmc_client import DistributedObjectStore, LocalConfig, ReplicateConfig
"""

from . import errors
from .store import (
    G2H,
    G2L,
    H2G,
    L2G,
    MEDIA_DRAM,
    MEDIA_HBM,
    MEDIA_SSD,
    SMEMB_COPY_G2H,
    SMEMB_COPY_G2L,
    SMEMB_COPY_H2G,
    SMEMB_COPY_L2G,
    DistributedObjectStore,
    KeyInfo,
    LocalConfig,
    MmcCopyDirect,
    ReplicateConfig,
)

__version__ = "0.1.0"

__all__ = [
    "DistributedObjectStore",
    "KeyInfo",
    "LocalConfig",
    "MmcCopyDirect",
    "ReplicateConfig",
    "errors",
    "G2H",
    "G2L",
    "H2G",
    "L2G",
    "MEDIA_HBM",
    "MEDIA_DRAM",
    "MEDIA_SSD",
    "SMEMB_COPY_G2H",
    "SMEMB_COPY_G2L",
    "SMEMB_COPY_H2G",
    "SMEMB_COPY_L2G",
]
