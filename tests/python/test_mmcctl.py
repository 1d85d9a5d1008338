"""The mmcctl console script against a real mmc-server: tables, --json, MMC_URL / MMC_API_TOKEN,
and one clear line with a non-zero exit for a dead server or a failed request."""

import json
import os
import subprocess
import sys

import pytest

from conftest import Server, free_port

MMCCTL = os.path.join(os.path.dirname(sys.executable), "mmcctl")


@pytest.fixture(scope="module")
def server():
    s = Server([])
    s.put("ctl/a", b"hello")
    s.put("ctl/b", b"x" * 5000, "&medium=dram")
    s.put("other/c", b"c")
    yield s
    assert s.stop() == 0, "".join(s.log)


def run(*args, env=None, url=None, timeout=30):
    assert os.path.exists(MMCCTL), "mmcctl is not installed in this virtualenv (pip install ./clients/python)"
    cmd = [MMCCTL] + (["--url", url] if url else []) + list(args)
    e = dict(os.environ)
    e.pop("MMC_URL", None)
    e.pop("MMC_API_TOKEN", None)
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr


def ok(server, *args):
    code, out, err = run(*args, url="http://%s" % server.addr)
    assert code == 0, (args, out, err)
    assert err == ""
    return out


def test_tables(server):
    out = ok(server, "health")
    assert "role" in out and "leader" in out and "service_ready" in out
    out = ok(server, "segments")
    assert out.splitlines()[0].split() == ["SEGMENT", "MEDIUM", "STATUS", "TOTAL", "USED",
                                          "FREE", "USED%"]
    assert "rank-0-hbm" in out and "rank-0-dram" in out and "OK" in out
    out = ok(server, "capacity")
    assert out.splitlines()[0].split()[0] == "TIER" and "GiB" in out
    out = ok(server, "keys")
    assert "ctl/a" in out and "other/c" in out and "(3 keys)" in out
    out = ok(server, "keys", "--prefix", "ctl/")
    assert "ctl/a" in out and "ctl/b" in out and "other/c" not in out
    out = ok(server, "keys", "--prefix", "ctl/", "--limit", "1")
    assert "(1 keys)" in out
    out = ok(server, "key", "ctl/b")
    assert "5000" in out and "DRAM" in out and "LEASE_MS" in out and "readable" in out
    out = ok(server, "summary")
    assert "keys" in out and "get_req" in out
    out = ok(server, "kv-events")
    assert "enabled" in out and "queue_capacity" in out
    out = ok(server, "evict", "00ff", "--location", "LocalCPUBackend")
    assert "num_evicted" in out
    out = ok(server, "prefetch", "00ff", "0abc")
    assert "num_chunks" in out and "2" in out


def test_json(server):
    v = json.loads(ok(server, "--json", "health"))
    assert v["status"] == "ok"
    v = json.loads(ok(server, "--json", "segments"))
    names = [s["segment_name"] for s in v["segments"]]
    assert names == ["rank-0-hbm", "rank-0-dram"]
    assert all(s["status"] == "OK" for s in v["segments"])
    v = json.loads(ok(server, "--json", "capacity"))
    assert v["cpu"]["total_bytes"] > 0
    v = json.loads(ok(server, "--json", "keys", "--prefix", "ctl/"))
    assert sorted(v["keys"]) == ["ctl/a", "ctl/b"] and v["count"] == 2
    v = json.loads(ok(server, "--json", "key", "ctl/a"))
    assert v["size"] == 5 and v["blobs"][0]["rank"] == 0
    v = json.loads(ok(server, "--json", "summary"))
    assert v["keys"] == 3 and isinstance(v["get_req"], int)
    v = json.loads(ok(server, "--json", "kv-events"))
    assert v["enabled"] is False
    v = json.loads(ok(server, "--json", "evict", "00ff"))
    assert v["status"] == "success"
    v = json.loads(ok(server, "--json", "prefetch", "00ff"))
    assert v["num_chunks"] == 1


def test_watch_is_bounded(server):
    out = ok(server, "watch", "--count", "2", "--interval", "0.05")
    assert out.count("hit ratio") == 2 and "PER_SEC" in out and "TIER" in out
    out = ok(server, "--json", "watch", "--count", "3", "--interval", "0.05")
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 3
    assert frames[0]["rates_per_sec"]["get"] is None
    assert frames[2]["rates_per_sec"]["get"] is not None
    assert "capacity" in frames[1] and "summary" in frames[1]


def test_url_from_environment(server):
    code, out, err = run("--json", "health", env={"MMC_URL": "http://%s" % server.addr})
    assert code == 0 and json.loads(out)["status"] == "ok", err


def assert_one_line_failure(code, out, err):
    assert code != 0
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mmcctl: ")
    assert "Traceback" not in err


@pytest.mark.parametrize("cmd", [["health"], ["segments"], ["capacity"], ["keys"], ["key", "k"],
                                 ["summary"], ["kv-events"], ["evict", "1"], ["prefetch", "1"],
                                 ["watch", "--count", "1"], ["--json", "health"]])
def test_dead_url(cmd):
    code, out, err = run(*cmd, url="http://127.0.0.1:%d" % free_port())
    assert_one_line_failure(code, out, err)
    assert "Connection refused" in err


def test_failures_are_one_line(server):
    url = "http://%s" % server.addr
    code, out, err = run("key", "ctl/missing", url=url)
    assert_one_line_failure(code, out, err)
    assert "Key not found" in err
    code, out, err = run("health", url="ftp://nowhere")
    assert_one_line_failure(code, out, err)


def test_token(server_factory):
    srv = server_factory(["--set", "ock.mmc.http.auth_token=ctl-token"])
    url = "http://%s" % srv.addr
    code, out, err = run("health", url=url)
    assert_one_line_failure(code, out, err)
    assert "401" in err
    code, out, err = run("--json", "health", url=url, env={"MMC_API_TOKEN": "ctl-token"})
    assert code == 0 and json.loads(out)["status"] == "ok", err
    code, out, err = run("--token", "ctl-token", "keys", url=url)
    assert code == 0 and "(0 keys)" in out, err
