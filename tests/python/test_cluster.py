"""A pure meta service and two local services, used the way Python users do: `requests`
follows the meta's 307 to the local service that holds the bytes, re-sending the body of a
put, and reads back what it put."""

import hashlib

import requests

import cluster_ready
from conftest import Server, wait_until


def test_requests_follows_redirects_to_local_services():
    meta = Server(["--set", "ock.mmc.embedded.ranks=0"])
    locals_ = []
    try:
        for _ in range(2):
            locals_.append(
                Server(
                    [
                        "--role", "local",
                        "--set", "ock.mmc.meta_service_url=http://%s" % meta.addr,
                        "--set", "ock.mmc.local_service.dram.size=64MB",
                        "--set", "ock.mmc.local_service.hbm.size=0",
                    ]
                )
            )
        wait_until("both ranks joined", lambda: cluster_ready.ready_count(meta.get) == 2)
        base = "http://%s/api/v1/objects" % meta.addr
        blobs = {}
        with requests.Session() as s:
            for i, size in enumerate([1, 1000, 300_000, 2 << 20]):
                data = hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1)
                data = data[:size]
                key = "py-%d" % i
                extra = {"replicas": 2} if i % 2 else {}
                r = s.put(base, params={"key": key, **extra}, data=data, timeout=30)
                assert r.status_code == 200, r.text
                assert r.json() == {"success": True, "key": key, "size": size}
                # The answer came from a local service, through one redirect.
                assert [h.status_code for h in r.history] == [307]
                assert r.history[0].headers["Location"].startswith("http://127.0.0.1:")
                assert r.history[0].headers["Location"] != base
                blobs[key] = data
            for key, data in blobs.items():
                r = s.get(base, params={"key": key}, timeout=30)
                assert r.status_code == 200
                assert r.content == data
                assert [h.status_code for h in r.history] == [307]
            # Straight to a local service without the meta's grant: refused.
            local = locals_[0]
            r = s.get("http://%s/api/v1/objects" % local.addr, params={"key": "py-0"}, timeout=10)
            assert r.status_code == 401
    finally:
        for srv in locals_:
            assert srv.stop() == 0, "".join(srv.log)
        assert meta.stop() == 0, "".join(meta.log)
