"""pytest plugin: runs LMCache's own L2-adapter tests against a live mmc-server.

LMCache's ``tests/v1/distributed/test_native_connector_l2_adapter.py`` drives its
``NativeConnectorL2Adapter`` over ``MockNativeConnector`` (an in-memory dict), and
``test_distributed_storage_manager.py`` gives its ``StorageManager`` a ``MockL2Adapter``. This
plugin swaps those stand-ins, after LMCache's modules are imported and before any test runs, for
``mmc_client.lmcache.MmcL2Connector`` against the server at ``MMC_LMCACHE_URL``:

- ``MockNativeConnector`` (and the class LMCache's tests derive from it, which records buffer
  lengths) becomes a connector with a fresh key prefix per instance, so every test starts from
  an empty key space as it did with a new dict;
- ``MockL2AdapterConfig(...)`` becomes a ``native_plugin`` config naming
  ``mmc_client.lmcache.MmcL2Connector``: the storage manager builds its L2 adapter through
  LMCache's own factory (importlib, the interface check, ``NativeConnectorL2Adapter``);
- ``debug_has_key`` (the mock adapter's test hook) asks the server.

The storage-manager module skips itself at import when no accelerator runtime is present;
its tests run on the CPU all the same, so that one check answers True while the module is
imported. Nothing else of LMCache's is changed. scripts/lmcache_tests.sh runs it.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Dict, Iterator, List

import pytest

from mmc_client.lmcache import MmcL2Connector

_ADAPTER_TESTS = "test_native_connector_l2_adapter.py"
_STORAGE_TESTS = "test_distributed_storage_manager.py"
# What was swapped, per test module (checked at the end of collection: a new LMCache release
# that renamed a stand-in fails the run instead of quietly testing the mock).
_swapped: Dict[str, List[str]] = {}


def _url() -> str:
    url = os.environ.get("MMC_LMCACHE_URL")
    if not url:
        raise RuntimeError("MMC_LMCACHE_URL is not set (scripts/lmcache_tests.sh sets it)")
    return url


def _fresh_prefix() -> str:
    return "lmc-%s/" % uuid.uuid4().hex[:12]


class LiveMmcConnector(MmcL2Connector):
    """Takes ``MockNativeConnector``'s place: built without arguments, a key space of its own."""

    def __init__(self) -> None:
        super().__init__(url=_url(), key_prefix=_fresh_prefix())


def live_l2_adapter_config(max_size_gb: float = 0, **_ignored: Any) -> Any:
    """Takes ``MockL2AdapterConfig``'s place: the same capacity, over mmc-server."""
    from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
        NativePluginL2AdapterConfig,
    )

    return NativePluginL2AdapterConfig.from_dict({
        "type": "native_plugin",
        "module_path": "mmc_client.lmcache",
        "class_name": "MmcL2Connector",
        "adapter_params": {"url": _url(), "key_prefix": _fresh_prefix()},
        "max_capacity_gb": max_size_gb,
    })


def _debug_has_key(self: Any, key: Any) -> bool:
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (
        _object_key_to_string,
    )

    return bool(self._client.exists([_object_key_to_string(key)])[0])


def pytest_configure(config: pytest.Config) -> None:
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (
        NativeConnectorL2Adapter,
    )

    _url()
    NativeConnectorL2Adapter.debug_has_key = _debug_has_key  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """While the storage-manager module is imported, the CPU counts as the device."""
    if not (isinstance(collector, pytest.Module) and collector.path.name == _STORAGE_TESTS):
        yield
        return
    import lmcache

    device = lmcache.torch_dev
    original = device.is_available
    device.is_available = lambda: True
    try:
        yield
    finally:
        device.is_available = original


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    modules = {}
    for item in items:
        mod = getattr(item, "module", None)
        if mod is not None:
            modules[mod.__name__] = mod
    for name, mod in modules.items():
        base = name.rsplit(".", 1)[-1] + ".py"
        done = _swapped.setdefault(base, [])
        if base == _ADAPTER_TESTS:
            mock = mod.MockNativeConnector
            for attr in list(vars(mod)):
                obj = getattr(mod, attr)
                if isinstance(obj, type) and obj is not mock and mock in obj.__bases__:
                    obj.__bases__ = tuple(LiveMmcConnector if b is mock else b
                                          for b in obj.__bases__)
                    done.append(attr)
            mod.MockNativeConnector = LiveMmcConnector
            done.append("MockNativeConnector")
        elif base == _STORAGE_TESTS:
            assert hasattr(mod, "MockL2AdapterConfig")
            mod.MockL2AdapterConfig = live_l2_adapter_config
            done.append("MockL2AdapterConfig")


def pytest_report_collectionfinish(config: pytest.Config) -> List[str]:
    lines = []
    for base, names in sorted(_swapped.items()):
        if base in (_ADAPTER_TESTS, _STORAGE_TESTS) and not names:
            raise pytest.UsageError("%s: nothing was swapped for mmc-server" % base)
        lines.append("mmc-server swap in %s: %s -> mmc_client.lmcache" % (base, ", ".join(names)))
    lines.append("mmc-server: %s" % _url())
    return lines
