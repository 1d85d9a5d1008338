"""GET /ui: the status page renders live values in headless Chromium (Debian `chromium`), loads
nothing from outside the server, and is guarded like the routes it reads.

A screenshot is kept under target/ (target/ui-status-page.png) as a test artifact.
"""

import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, Server

ARTIFACT = os.path.join(ROOT, "target", "ui-status-page.png")
MB = 1 << 20


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is needed (scripts/test.sh installs the Debian package)"
    return exe


def browse(url, *mode, tmp):
    """Runs headless Chromium on `url` with a virtual-time budget (the page's timers run, and
    virtual time waits for its fetches), returning stdout."""
    cmd = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", "--user-data-dir=%s" % tmp, "--window-size=1280,1000",
        "--virtual-time-budget=6000", *mode, url,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.fixture
def busy_server(tmp_path):
    s = Server([
        "--set", "ock.mmc.local_service.hbm.size=8MB",
        "--set", "ock.mmc.local_service.dram.size=8MB",
        "--set", "ock.mmc.ssd.enable=true", "--set", "ock.mmc.ssd.path=%s" % tmp_path,
        "--set", "ock.mmc.ssd.size=16MB",
    ])
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_status_page_renders_live_values(busy_server, tmp_path):
    s = busy_server
    for i in range(5):
        s.put("ui-%d" % i, os.urandom(MB))
    for i in range(5):
        assert s.request("GET", "/api/v1/objects?key=ui-%d" % i)[0] == 200
    segments = {x["segment_name"]: x for x in s.json("GET", "/api/v1/capacity/segment_remaining")["segments"]}
    assert set(segments) == {"rank-0-hbm", "rank-0-dram", "rank-0-ssd"}

    url = "http://%s:%d/ui" % (s.host, s.port)
    dom = browse(url, "--dump-dom", tmp=tmp_path / "profile-dom")

    def text(id_):
        m = re.search(r'id="%s"[^>]*>([^<]*)<' % id_, dom)
        assert m, "no #%s in:\n%s" % (id_, dom[:4000])
        return m.group(1)

    assert text("error") == "", text("error")
    assert text("keys") == "5"
    assert text("role") == "leader" and text("ha_state") == "serving" and text("status") == "ok"
    assert text("get_req") == "5" and text("hit_dram") == "100.0 %"
    assert text("updated") != "never"
    # One row per segment, with the server's own used-byte figures and a bar as wide as the usage.
    rows = re.findall(
        r'<tr class="segment"><td class="name">([^<]+)</td>.*?width: ([0-9.]+)%.*?data-bytes="(\d+)"', dom)
    assert {r[0] for r in rows} == set(segments), rows
    for name, width, used in rows:
        assert int(used) == segments[name]["used_bytes"], (name, used)
        assert abs(float(width) - 100 * int(used) / segments[name]["total_bytes"]) < 0.01
    assert int(dict((r[0], r[2]) for r in rows)["rank-0-hbm"]) >= 4 * MB
    # Request counts per operation and latency percentiles from the HDR histograms.
    assert re.search(r"<tr><td>get</td><td class=\"n rate\">[0-9.]+</td><td class=\"n\">5</td>", dom), dom
    lat = re.search(r"<tr><td>META_PUT</td><td class=\"n\">5</td><td class=\"n\">([0-9.]+)</td><td class=\"n\">([0-9.]+)</td>", dom)
    assert lat and 0 < float(lat.group(1)) <= float(lat.group(2)), dom
    assert re.search(r"<td>dropped events</td><td class=\"n\">0</td>", dom)

    os.makedirs(os.path.dirname(ARTIFACT), exist_ok=True)
    if os.path.exists(ARTIFACT):
        os.remove(ARTIFACT)
    browse(url, "--screenshot=%s" % ARTIFACT, tmp=tmp_path / "profile-shot")
    with open(ARTIFACT, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(ARTIFACT) > 10_000


def test_status_page_loads_nothing_from_outside(busy_server):
    status, ctype, body = busy_server.request("GET", "/ui")
    assert status == 200 and ctype == "text/html; charset=utf-8"
    html = body.decode()
    assert html.startswith("<!DOCTYPE html>")
    # No absolute URL at all, and every src/href/fetch target is a path on this server.
    assert not re.search(r"(?i)(https?|wss?):/", html), re.findall(r"(?i)\S*(?:https?|wss?):/\S*", html)
    assert not re.search(r'(?i)(src|href|action)\s*=\s*["\']?\s*//', html)
    for target in re.findall(r'(?i)(?:src|href)\s*=\s*"([^"]*)"', html):
        assert target.startswith("/") and not target.startswith("//"), target
    # Every request goes through the page's one fetch helper, with literal same-origin paths.
    assert html.count("fetch(") == 1 and "XMLHttpRequest" not in html and "WebSocket" not in html
    paths = re.findall(r'(?<![.\w])get\("([^"]*)"', html)
    assert len(paths) == 5, paths
    for target in paths:
        assert target.startswith("/") and not target.startswith("//"), target
    assert "<link" not in html and "@import" not in html and "url(" not in html
    # And the browser is told so: nothing but this origin may be fetched.
    assert "default-src 'none'" in html and "connect-src 'self'" in html


def test_status_page_is_guarded_like_the_routes_it_reads():
    s = Server(["--set", "ock.mmc.http.auth_token=data-secret",
                "--set", "ock.mmc.http.metrics_token=metrics-secret"])
    try:
        assert s.request("GET", "/ui")[0] == 401
        assert s.request("GET", "/ui", headers={"Authorization": "Bearer metrics-secret"})[0] == 401
        status, ctype, body = s.request("GET", "/ui", headers={"Authorization": "Bearer data-secret"})
        assert status == 200 and b"mmc-server" in body
        # The page sends the data token to the data routes and the metrics token to /metrics/*.
        html = body.decode()
        assert 'get("/health", dataToken)' in html
        assert 'get("/metrics/summary", metricsToken)' in html
    finally:
        assert s.stop() == 0, "".join(s.log)
