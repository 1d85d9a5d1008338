"""vllm-ascend's memcache surface on host memory: tests/python/vllm_ascend_shaped.py (the calls
vllm-ascend's memcache backend makes, recorded) against a real server found only through
MMC_LOCAL_CONFIG_PATH, in-process and as a separate script; and upstream's local configuration
file as init() reads it."""

import os
import subprocess
import sys

import pytest

from conftest import Server
from mmc_client import DistributedObjectStore, LocalConfig, MmcCopyDirect, errors

HERE = os.path.dirname(os.path.abspath(__file__))

# The store calls vllm-ascend's memcache backend and layer-wise path make (its source), and
# upstream's layered batch_copy_layers.
VLLM_ASCEND_CALLS = {
    "init", "register_buffer", "batch_is_exist", "batch_put_from_layers",
    "batch_get_into_layers", "batch_get_key_info", "batch_alloc", "batch_copy",
    "batch_write_finish", "batch_add_lease", "batch_remove_lease", "batch_copy_layers",
}


def upstream_local_conf(path, server, rank=None):
    """An upstream mmc-local.conf: its tcp:// meta address, and keys this client ignores."""
    lines = [
        "# upstream's local service configuration",
        "ock.mmc.meta_service_url = tcp://%s:%d" % (server.host, server.port),
        "ock.mmc.local_service.config_store_url = tcp://127.0.0.1:6000",
        "ock.mmc.local_service.world_size = 4",
        "ock.mmc.local_service.protocol = host_rdma",
        "ock.mmc.local_service.dram.size = 0",
        "ock.mmc.local_service.hbm.size = 209715200",
        "; a comment",
        "ock.mmc.client.timeout.seconds = 30",
        "ock.mmc.client.retry_milliseconds = 500",
    ]
    if rank is not None:
        lines.append("ock.mmc.local_service.rank = %d" % rank)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def server():
    s = Server([], driver="epoll")
    yield s
    assert s.stop() == 0


def test_vllm_ascend_shaped_run_in_process(server, tmp_path, monkeypatch):
    import vllm_ascend_shaped

    monkeypatch.setenv("MMC_LOCAL_CONFIG_PATH", upstream_local_conf(tmp_path / "l.conf", server))
    calls = vllm_ascend_shaped.run(tag="p")
    assert {name for name, _, _ in calls} - {"close"} == VLLM_ASCEND_CALLS
    # Each batch call answered one result per key.
    for name, n, result in calls:
        if n is not None and isinstance(result, list):
            assert len(result) == n, (name, n, result)


def test_vllm_ascend_shaped_script_with_only_the_config_path(server, tmp_path):
    conf = upstream_local_conf(tmp_path / "l.conf", server)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMC_")}
    env["MMC_LOCAL_CONFIG_PATH"] = conf
    r = subprocess.run([sys.executable, os.path.join(HERE, "vllm_ascend_shaped.py")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all as expected" in r.stdout


def test_local_config_file_is_read_by_init(server, tmp_path, monkeypatch):
    path = upstream_local_conf(tmp_path / "l.conf", server, rank=3)
    c = LocalConfig.from_local_config(path)
    assert c.meta_service_url == "http://%s:%d" % (server.host, server.port)
    assert (c.client_timeout_seconds, c.client_retry_milliseconds) == (30.0, 500)
    monkeypatch.setenv("MMC_LOCAL_CONFIG_PATH", path)
    s = DistributedObjectStore()
    assert s.init(0, init_bm=False) == 0
    assert s.get_local_service_id() == 3
    assert s.put("vac/x", b"1") == 0 and s.get("vac/x") == b"1"
    s.close()
    # Without the rank key the client has no local service: -1, and a preference for it is
    # no preference.
    monkeypatch.setenv("MMC_LOCAL_CONFIG_PATH", upstream_local_conf(tmp_path / "m.conf", server))
    s = DistributedObjectStore()
    assert s.init() == 0 and s.get_local_service_id() == -1
    from mmc_client import ReplicateConfig

    rc = ReplicateConfig(preferredLocalServiceIDs=[s.get_local_service_id()])
    assert s.put("vac/y", b"2", rc) == 0
    s.close()
    # setup() wins over the file; an unreadable file is a ValueError from init().
    monkeypatch.setenv("MMC_LOCAL_CONFIG_PATH", str(tmp_path / "missing.conf"))
    with pytest.raises(ValueError):
        DistributedObjectStore().init()
    cfg = LocalConfig()
    cfg.meta_service_url = "http://%s:%d" % (server.host, server.port)
    s = DistributedObjectStore()
    assert s.setup(cfg) == 0 and s.init() == 0
    s.close()


def test_layers_arguments_as_upstream(server):
    cfg = LocalConfig()
    cfg.meta_service_url = "http://%s:%d" % (server.host, server.port)
    s = DistributedObjectStore()
    assert s.setup(cfg) == 0 and s.init() == 0
    a, b = bytearray(b"a" * 10), bytearray(b"b" * 20)
    H2G, G2H = MmcCopyDirect.SMEMB_COPY_H2G, MmcCopyDirect.SMEMB_COPY_G2H
    assert s.put_from_layers("lay/1", [a, b], [10, 20], H2G) == 0
    assert s.get("lay/1") == b"a" * 10 + b"b" * 20
    x, y = bytearray(10), bytearray(20)
    assert s.get_into_layers("lay/1", [x, y], [10, 20], G2H) == 0 and x == a and y == b
    # Another split of the same 30 bytes reads as well; another total does not.
    z = bytearray(30)
    assert s.get_into_layers("lay/1", [z], [30], G2H) == 0 and z == a + b
    assert s.get_into_layers("lay/1", [x, y], [10, 19], G2H) == errors.MMC_INVALID_PARAM
    # Invalid parameters: -1 as upstream (no layer, more than 255, sizes of another length,
    # a device direction); wrong types raise TypeError.
    assert s.put_from_layers("lay/2", [], [], H2G) == errors.MMC_ERROR
    assert s.put_from_layers("lay/2", [a] * 256, [1] * 256, H2G) == errors.MMC_ERROR
    assert s.put_from_layers("lay/2", [a, b], [10], H2G) == errors.MMC_ERROR
    assert s.put_from_layers("lay/2", [a], [10], MmcCopyDirect.SMEMB_COPY_L2G) == errors.MMC_ERROR
    assert s.put_from_layers("lay/2", [a], [10], 7) == errors.MMC_ERROR
    with pytest.raises(TypeError):
        s.put_from_layers("lay/2", a, [10], H2G)
    with pytest.raises(TypeError):
        s.put_from_layers("lay/2", ["x"], [10], H2G)
    # Batches answer key by key.
    codes = s.batch_put_from_layers(["lay/3", "", "lay/4"], [[a], [a], [a, b]],
                                    [[10], [10], [10, 20]], H2G)
    assert codes == [0, errors.MMC_INVALID_PARAM, 0]
    assert s.batch_put_from_layers(["lay/5", "lay/6"], [[a], []], [[10], []], H2G) \
        == [0, errors.MMC_ERROR]
    x2 = bytearray(10)
    assert s.batch_get_into_layers(["lay/3", "lay/missing"], [[x2], [x2]], [[10], [10]], G2H) \
        == [0, errors.MMC_UNMATCHED_KEY]
    s.close()
