"""GET /ui: the status page renders live values in headless Chromium (Debian `chromium`): the
figures, the ranks with their state and staleness, and the charts of request rate, latency and
tier usage it draws from polling; it loads nothing from outside the server, and is guarded like
the routes it reads.

A screenshot is kept under target/ (target/ui-status-page.png) as a test artifact.
"""

import http.client
import os
import re
import shutil
import subprocess
import threading

import signal

import pytest

import cluster_ready
from conftest import ROOT, Server, wait_until

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

    # Each tier's use, as the page charts it: its segments' used bytes over their total.
    usage = {}
    for seg in segments.values():
        used, total = usage.get(seg["medium"], (0, 0))
        usage[seg["medium"]] = (used + seg["used_bytes"], total + seg["total_bytes"])

    # Gets keep coming while the page loads, so that its charts have rates and latencies to
    # draw; the page refreshes every second (six times within the virtual-time budget).
    stop = threading.Event()

    def traffic():
        c = http.client.HTTPConnection(s.host, s.port, timeout=10)
        while not stop.is_set():
            c.request("GET", "/api/v1/objects/exist?key=ui-0")
            c.getresponse().read()
        c.close()

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    url = "http://%s:%d/ui?refresh=1" % (s.host, s.port)
    try:
        dom = browse(url, "--dump-dom", tmp=tmp_path / "profile-dom")
        os.makedirs(os.path.dirname(ARTIFACT), exist_ok=True)
        if os.path.exists(ARTIFACT):
            os.remove(ARTIFACT)
        browse(url, "--screenshot=%s" % ARTIFACT, tmp=tmp_path / "profile-shot")
    finally:
        stop.set()
        t.join(10)

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

    # The ranks: rank 0 with its three segments, all OK, its figures current.
    ranks = re.findall(r'<tr class="rank" data-rank="(\d+)"><td>\d+</td><td>([^<]*)</td>'
                       r'<td class="state state-(ok|bad)">([^<]*)</td><td class="figures">([^<]*)</td>', dom)
    assert ranks == [("0", "HBM, DRAM, SSD", "ok", "OK", "current")], ranks

    # The charts: inline SVG, one polyline per series, drawn from the samples the page took.
    def chart(id_):
        m = re.search(r'<svg class="chart" id="%s"[^>]*data-samples="(\d+)"[^>]*>(.*?)</svg>' % id_, dom)
        assert m, "no chart #%s in:\n%s" % (id_, dom[:4000])
        width = float(re.search(r'viewBox="0 0 ([0-9.]+) ', m.group(0)).group(1))
        lines = {}
        for attrs in re.findall(r"<polyline([^>]*)>", m.group(2)):
            a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
            points = [tuple(map(float, p.split(","))) for p in a["points"].split()]
            assert len(points) == int(a["data-points"]), a
            # Every point is drawn inside the chart, the latest at its right ("now") end.
            assert all(0 < x <= width and 0 <= y <= 140 for x, y in points), a
            assert not points or points[-1][0] > width * 0.9, a
            lines[a["data-series"]] = (len(points), a["data-last"])
        return int(m.group(1)), lines

    samples, lines = chart("rate_chart")
    assert samples >= 3, samples
    assert set(lines) == {"requests", "failed"}
    assert lines["requests"][0] >= 2 and float(lines["failed"][1]) == 0, lines
    samples, lines = chart("latency_chart")
    assert set(lines) == {"p50", "p99"}
    assert lines["p99"][0] >= 2 and 0 < float(lines["p50"][1]) <= float(lines["p99"][1]), lines
    samples, lines = chart("tiers_chart")
    assert set(lines) == {"HBM", "DRAM", "SSD"} == set(usage), (lines, usage)
    for tier, (points, value) in lines.items():
        assert points >= 3
        want = 100 * usage[tier][0] / usage[tier][1]
        assert abs(float(value) - want) < 0.01, (tier, value, want)
    assert float(lines["HBM"][1]) >= 50

    with open(ARTIFACT, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(ARTIFACT) > 10_000


def test_status_page_shows_each_rank_s_state_and_a_lost_one_s_staleness(tmp_path):
    """A meta and two local services; one is frozen until the meta declares it lost: the page
    lists the live rank OK with current figures, and the lost one (its segment dropped, its
    figures kept) as stale."""
    beat = ["--set", "ock.mmc.cluster.heartbeat_interval_ms=200"]
    meta = Server(["--set", "ock.mmc.embedded.ranks=0",
                   "--set", "ock.mmc.cluster.heartbeat_timeout_ms=1500"] + beat)
    locals_ = []
    try:
        for _ in range(2):
            locals_.append(Server(["--role", "local",
                                   "--set", "ock.mmc.meta_service_url=http://%s" % meta.addr,
                                   "--set", "ock.mmc.local_service.dram.size=16MB",
                                   "--set", "ock.mmc.local_service.hbm.size=0"] + beat))
        wait_until("both ranks joined", lambda: cluster_ready.ready_count(meta.get) == 2)
        before = set(cluster_ready.segments(meta.get))
        locals_[1].proc.send_signal(signal.SIGSTOP)
        wait_until("the frozen rank is lost", lambda: len(cluster_ready.segments(meta.get)) == 1)
        live = cluster_ready.segments(meta.get)[0]
        lost = (before - {live}).pop()
        rank = lambda seg: seg.split("-")[1]

        dom = browse("http://%s/ui?refresh=1" % meta.addr, "--dump-dom", tmp=tmp_path / "profile")
        rows = dict((r[0], r[1:]) for r in re.findall(
            r'<tr class="rank" data-rank="(\d+)"><td>\d+</td><td>([^<]*)</td>'
            r'<td class="state[^"]*">([^<]*)</td><td class="figures[^"]*">([^<]*)</td>', dom))
        assert rows[rank(live)] == ("DRAM", "OK", "current"), rows
        media, state, figures = rows[rank(lost)]
        assert media == "–" and state.startswith("no segment"), rows
        assert re.fullmatch(r"stale for \d+ s", figures), rows
        assert set(rows) == {rank(live), rank(lost)}, rows
    finally:
        if locals_ and len(locals_) > 1:
            locals_[1].proc.send_signal(signal.SIGCONT)
        for srv in locals_:
            srv.stop()
        assert meta.stop() == 0, "".join(meta.log)


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
    assert len(paths) == 7, paths
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
        assert 'get("/metrics", metricsToken)' in html
        assert 'get("/api/v1/segments/status?segment=" + ' in html
    finally:
        assert s.stop() == 0, "".join(s.log)
