"""OTLP push (ock.mmc.otlp.*): a real receiver decodes what mmc-server sends with the official
OpenTelemetry protobuf definitions (the `opentelemetry-proto` package), and checks the metric
names, kinds and resource attributes, the spans of sampled requests, and that a collector that
is down, slow or restarted costs the requests nothing and is counted on /metrics."""

import contextlib
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import Server, free_port, wait_until

CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: decodes every export with the official messages."""

    def __init__(self, port=0):
        self.metrics = []  # ExportMetricsServiceRequest, in arrival order
        self.traces = []  # ExportTraceServiceRequest
        self.headers = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.headers["Content-Type"] == "application/x-protobuf"
                if self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest()
                    req.ParseFromString(body)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                    into = receiver.metrics
                elif self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                    into = receiver.traces
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with receiver.lock:
                    into.append(req)
                    receiver.headers.append(dict(self.headers))
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def spans(self):
        with self.lock:
            return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.fixture
def started():
    servers, receivers = [], []
    yield servers, receivers
    for s in servers:
        code = s.stop()
        assert code == 0, "server exited with %s:\n%s" % (code, "".join(s.log))
    for r in receivers:
        r.close()


def otlp_server(started, endpoint, *sets, listen="127.0.0.1:0"):
    args = ["--set", "ock.mmc.otlp.endpoint=" + endpoint]
    for s in sets:
        args += ["--set", s]
    s = Server(args, driver="epoll", listen=listen)
    started[0].append(s)
    return s


def attrs(kvs):
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def scrape_families(server):
    """(name -> type) of the /metrics families that have samples."""
    text = server.get("/metrics").decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    with_samples = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[^{ ]+", line).group(0)
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                    name = name[: -len(suffix)]
            with_samples.add(name)
    return {n: types.get(n, "untyped") for n in with_samples}


def prometheus_name(m):
    """The Prometheus name of a pushed metric, as the observability text converts OTel names:
    `.` becomes `_`, the unit is appended (`s` as `seconds`), a counter gets `_total`."""
    if not m.name.startswith("lmcache_mp."):
        return m.name
    if m.name == "lmcache_mp.l2_evicted_objects":
        return "lmcache_mp_l2_evicted_chunks_total"  # the text's own exception
    name = m.name.replace(".", "_")
    unit = {"s": "seconds"}.get(m.unit, m.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if m.WhichOneof("data") == "sum" and not name.endswith("_total"):
        name += "_total"
    return name


def metric_value(server, name, labels=""):
    text = server.get("/metrics").decode()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def test_every_family_is_pushed_with_its_kind_and_the_resource(started):
    r = Receiver()
    started[1].append(r)
    s = otlp_server(started, r.url, "ock.mmc.otlp.interval_ms=200", "ock.mmc.otlp.service_instance_id=meta-under-test",
                    "ock.mmc.otlp.headers=authorization=Bearer s3cret,x-tenant=t1")
    s.put("otlp-key", b"x" * 1000)
    assert s.get("/api/v1/objects?key=otlp-key") == b"x" * 1000
    wait_until("a metrics push", lambda: len(r.metrics) >= 1)
    families = scrape_families(s)
    seen = len(r.metrics)
    wait_until("a push after the scrape", lambda: len(r.metrics) > seen + 1)
    req = r.metrics[-1]
    assert len(req.resource_metrics) == 1
    rm = req.resource_metrics[0]
    res = attrs(rm.resource.attributes)
    assert res["service.name"] == "mmc-server"
    assert res["service.instance.id"] == "meta-under-test"
    assert re.match(r"\d+\.\d+\.\d+", res["service.version"])
    assert res["mmc.role"] == "meta" and res["mmc.rank"] == 0
    pushed = {m.name: m for sm in rm.scope_metrics for m in sm.metrics}
    # The configured headers came with every push (and are never printed: see the redaction test).
    assert r.headers[-1]["authorization"] == "Bearer s3cret" and r.headers[-1]["x-tenant"] == "t1"
    by_prom = {prometheus_name(m): m for m in pushed.values()}
    missing = []
    for name, kind in families.items():
        m = by_prom.get(name)
        if m is None:
            missing.append(name)
            continue
        data = m.WhichOneof("data")
        if kind == "counter":
            assert data == "sum", name
            assert m.sum.is_monotonic and m.sum.aggregation_temporality == CUMULATIVE, name
        elif kind == "histogram":
            assert data == "histogram", name
            assert m.histogram.aggregation_temporality == CUMULATIVE, name
            for p in m.histogram.data_points:
                assert len(p.bucket_counts) == len(p.explicit_bounds) + 1, name
                assert sum(p.bucket_counts) == p.count, name
        else:
            assert data == "gauge", name
    assert not missing, "families on /metrics missing from the push: %s" % missing
    # The LMCache families carry the observability text's names and units.
    assert pushed["lmcache_mp.l1_write"].unit == "chunks"
    assert pushed["lmcache_mp.l1_write"].WhichOneof("data") == "sum"
    # A counter's value is the scrape's, cumulative since the process started.
    reqs = pushed["memcache_http_requests_total"].sum.data_points[0]
    assert reqs.as_int >= 2 and reqs.start_time_unix_nano < reqs.time_unix_nano
    # The request latency histogram has its buckets, per operation.
    h = pushed["memcache_http_request_duration_seconds"].histogram
    ops = {attrs(p.attributes).get("operation") for p in h.data_points}
    assert "put" in ops and "get" in ops, ops
    assert metric_value(s, "memcache_otlp_exports_total", '{signal="metrics"}') >= 2
    assert metric_value(s, "memcache_otlp_metric_points_exported_total") > 0
    assert not any("s3cret" in line for line in s.log)


def test_sampled_requests_have_spans_under_their_traceparent(started):
    r = Receiver()
    started[1].append(r)
    # Roots (almost) never sampled: only the traceparent's flag decides here.
    s = otlp_server(started, r.url, "ock.mmc.otlp.trace_sample_ratio=0.000001")
    trace_id = os.urandom(16).hex()
    parent = os.urandom(8).hex()
    sampled = {"traceparent": "00-%s-%s-01" % (trace_id, parent)}
    status, _, _ = s.request("PUT", "/api/v1/objects?key=traced", b"y" * 300, sampled)
    assert status == 200
    status, _, body = s.request("GET", "/api/v1/objects?key=traced", None, sampled)
    assert status == 200 and body == b"y" * 300
    unsampled_trace = os.urandom(16).hex()
    s.request("GET", "/health", None, {"traceparent": "00-%s-%s-00" % (unsampled_trace, parent)})
    s.request("GET", "/health")
    wait_until("two spans of the trace", lambda: len([x for x in r.spans() if x.trace_id.hex() == trace_id]) >= 2)
    spans = [x for x in r.spans() if x.trace_id.hex() == trace_id]
    by_name = {x.name: x for x in spans}
    put = by_name["PUT /api/v1/objects"]
    get = by_name["GET /api/v1/objects"]
    for sp in (put, get):
        assert sp.parent_span_id.hex() == parent
        assert sp.kind == trace_pb2.Span.SPAN_KIND_SERVER
        assert sp.end_time_unix_nano >= sp.start_time_unix_nano > 0
        a = attrs(sp.attributes)
        assert a["http.response.status_code"] == 200
        assert a["http.route"] == "/api/v1/objects"
        assert a["mmc.key.size"] == len("traced")
        assert 0 <= a["mmc.owner_shard"] < 2 and 0 <= a["mmc.shard"] < 2
    assert attrs(put.attributes)["http.request.body.size"] == 300
    assert attrs(get.attributes)["http.response.body.size"] == 300
    assert put.span_id != get.span_id
    res = attrs(r.traces[-1].resource_spans[0].resource.attributes)
    assert res["service.name"] == "mmc-server" and len(res["service.instance.id"]) == 36
    time.sleep(0.8)  # a batch's delay: anything else queued has gone out by now
    assert not [x for x in r.spans() if x.trace_id.hex() == unsampled_trace]
    assert metric_value(s, "memcache_otlp_spans_exported_total") >= 2


def timed_requests(server, n):
    """Answers n small put/get requests; each one's latency in seconds."""
    lat = []
    for i in range(n):
        t = time.monotonic()
        server.put("k%d" % i, b"z" * 64)
        lat.append(time.monotonic() - t)
    return lat


def baseline(started, n):
    s = Server([], driver="epoll")
    started[0].append(s)
    return timed_requests(s, n)


def p99(lat):
    return sorted(lat)[int(len(lat) * 0.99) - 1]


def test_a_down_collector_slows_nothing_and_is_counted(started):
    port = free_port()  # nothing listens there: every connect is refused
    s = otlp_server(started, "http://127.0.0.1:%d" % port, "ock.mmc.otlp.interval_ms=100",
                    "ock.mmc.otlp.trace_sample_ratio=1", "ock.mmc.otlp.queue_spans=64")
    base = baseline(started, 300)
    lat = timed_requests(s, 300)
    assert max(lat) < 0.5, max(lat)
    assert p99(lat) < max(4 * p99(base), 0.05), (p99(lat), p99(base))
    wait_until("failures counted", lambda: (metric_value(s, "memcache_otlp_export_failures_total", '{signal="metrics",cause="unreachable"}') or 0) >= 2)
    wait_until("spans dropped", lambda: (metric_value(s, "memcache_otlp_spans_dropped_total", '{reason="queue_full"}') or 0)
               + (metric_value(s, "memcache_otlp_spans_dropped_total", '{reason="export_failed"}') or 0) > 0)
    # Logged once per cause, not once per failure.
    assert sum("OTLP: metrics export failed (unreachable)" in line for line in s.log) == 1, "".join(s.log)


@contextlib.contextmanager
def hung_collector():
    """A collector that accepts connections and never answers: yields its port."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        lsock.close()
        for c in held:
            c.close()


def test_a_slow_collector_slows_nothing_and_is_counted(started):
    with hung_collector() as port:
        s = otlp_server(started, "http://127.0.0.1:%d" % port, "ock.mmc.otlp.interval_ms=100",
                        "ock.mmc.otlp.timeout_ms=300", "ock.mmc.otlp.trace_sample_ratio=1",
                        "ock.mmc.otlp.queue_spans=16")
        base = baseline(started, 300)
        t0 = time.monotonic()
        lat = timed_requests(s, 300)
        assert max(lat) < 0.5, max(lat)
        assert p99(lat) < max(4 * p99(base), 0.05), (p99(lat), p99(base))
        assert time.monotonic() - t0 < 30
        wait_until("timeouts counted", lambda: (metric_value(s, "memcache_otlp_export_failures_total", '{signal="metrics",cause="timeout"}') or 0) >= 1)
        wait_until("a full queue counted", lambda: (metric_value(s, "memcache_otlp_spans_dropped_total", '{reason="queue_full"}') or 0) > 0)
        assert metric_value(s, "memcache_otlp_span_queue_length") <= 16


def test_a_restarted_collector_gets_the_pushes_again(started):
    port = free_port()
    s = otlp_server(started, "http://127.0.0.1:%d" % port, "ock.mmc.otlp.interval_ms=100",
                    "ock.mmc.otlp.trace_sample_ratio=1")
    wait_until("failures while it is down", lambda: (metric_value(s, "memcache_otlp_export_failures_total", '{signal="metrics",cause="unreachable"}') or 0) >= 1)
    r = Receiver(port)
    started[1].append(r)
    wait_until("pushes once it is up", lambda: len(r.metrics) >= 2)
    s.put("after-restart", b"a")
    wait_until("the request's span", lambda: any(x.name == "PUT /api/v1/objects" for x in r.spans()))
    r.close()
    started[1].remove(r)
    time.sleep(0.3)
    r2 = Receiver(port)
    started[1].append(r2)
    wait_until("pushes after a restart", lambda: len(r2.metrics) >= 1)
    assert any("works again" in line for line in s.log), "".join(s.log)


def test_the_redirect_hop_and_the_chain_carry_the_trace(started):
    import requests

    import cluster_ready

    r = Receiver()
    started[1].append(r)
    otlp = ["--set", "ock.mmc.otlp.endpoint=" + r.url, "--set", "ock.mmc.otlp.trace_sample_ratio=1"]
    meta = Server(["--set", "ock.mmc.embedded.ranks=0",
                   "--set", "ock.mmc.otlp.service_instance_id=meta"] + otlp, driver="epoll")
    started[0].append(meta)
    for i in range(2):
        started[0].append(Server(["--role", "local",
                                  "--set", "ock.mmc.meta_service_url=http://%s" % meta.addr,
                                  "--set", "ock.mmc.local_service.dram.size=64MB",
                                  "--set", "ock.mmc.local_service.hbm.size=0",
                                  "--set", "ock.mmc.otlp.service_instance_id=local-%d" % i] + otlp,
                                 driver="epoll"))
    wait_until("both ranks joined", lambda: cluster_ready.ready_count(meta.get) == 2)
    trace_id = os.urandom(16).hex()
    tp = {"traceparent": "00-%s-%s-01" % (trace_id, os.urandom(8).hex())}
    base = "http://%s/api/v1/objects" % meta.addr
    with requests.Session() as s:
        got = s.put(base, params={"key": "hop", "replicas": 2}, data=b"h" * 5000, headers=tp, timeout=30)
        assert got.status_code == 200 and [h.status_code for h in got.history] == [307], got.text
        assert "traceparent=00-" + trace_id in got.history[0].headers["Location"]

    def spans_by_instance():
        out = {}
        with r.lock:
            reqs = list(r.traces)
        for req in reqs:
            for rs in req.resource_spans:
                inst = attrs(rs.resource.attributes)["service.instance.id"]
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        if sp.trace_id.hex() == trace_id:
                            out.setdefault(inst, []).append(sp)
        return out

    # The meta's 307, the first local hop under it, the second hop under the first, and the
    # first hop's commit on the meta under the first hop.
    wait_until("the hop's spans", lambda: len(spans_by_instance().get("meta", [])) >= 2
               and sum(len(v) for k, v in spans_by_instance().items() if k != "meta") >= 2)
    by = spans_by_instance()
    meta_put = [x for x in by["meta"] if x.name == "PUT /api/v1/objects"][0]
    assert attrs(meta_put.attributes)["http.response.status_code"] == 307
    assert attrs(meta_put.attributes)["mmc.redirect"].endswith("/api/v1/objects")
    local_spans = [x for k, v in by.items() if k != "meta" for x in v]
    first = [x for x in local_spans if x.parent_span_id == meta_put.span_id]
    assert len(first) == 1, local_spans
    assert [x for x in local_spans if x.parent_span_id == first[0].span_id], "the chain's next hop"
    commit = [x for x in by["meta"] if x.name.startswith("POST /cluster/v1/commit")]
    assert commit and commit[0].parent_span_id == first[0].span_id


def put_count(req):
    """The puts a metrics push counts (the request-duration histogram's `put` series)."""
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "memcache_http_request_duration_seconds":
                    for p in m.histogram.data_points:
                        if attrs(p.attributes).get("operation") == "put":
                            return p.count
    return None


def stop_timed(server, limit):
    """SIGTERM, then the exit status and how long the exit took (at most `limit` s)."""
    t = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(limit)
    return code, time.monotonic() - t


def test_a_stop_pushes_the_last_metrics_and_the_queued_spans(started):
    r = Receiver()
    started[1].append(r)
    # One push a minute: after the first (a second after the start), only the stop pushes.
    s = otlp_server(started, r.url, "ock.mmc.otlp.interval_ms=60000", "ock.mmc.otlp.trace_sample_ratio=1",
                    "ock.mmc.otlp.timeout_ms=3000", "ock.mmc.otlp.service_instance_id=stopping")
    wait_until("the first metrics push", lambda: len(r.metrics) >= 1)
    time.sleep(0.7)  # the start's own spans, if any, have gone out
    assert put_count(r.metrics[0]) == 0
    before = len(r.spans())
    n = 12
    for i in range(n):
        s.put("flush-%d" % i, b"f" * 100)
    # At once (the puts take a few tens of ms): their spans wait for their batch to fill or
    # for half a second, the metrics for a minute.
    code, took = stop_timed(s, 15)
    assert code == 0, "".join(s.log)
    assert len(r.metrics) == 2, "one push at the start, one at the stop"
    last = r.metrics[-1]
    assert put_count(last) == n
    assert attrs(last.resource_metrics[0].resource.attributes)["service.instance.id"] == "stopping"
    puts = [x for x in r.spans()[before:] if x.name == "PUT /api/v1/objects"]
    assert len(puts) == n, [x.name for x in r.spans()]
    flushed = [int(m.group(1)) for m in (re.search(r"OTLP: last export at the stop: the metrics and (\d+) spans", x)
                                          for x in s.log) if m]
    assert flushed and flushed[0] >= 1, "".join(s.log)
    assert took < 5, took


@pytest.mark.parametrize("collector", ["down", "hung"])
def test_a_stop_does_not_wait_for_a_collector_that_is_down_or_hung(started, collector):
    with contextlib.ExitStack() as stack:
        # Down: connections refused; hung: accepted, never answered.
        port = free_port() if collector == "down" else stack.enter_context(hung_collector())
        s = otlp_server(started, "http://127.0.0.1:%d" % port, "ock.mmc.otlp.interval_ms=60000",
                        "ock.mmc.otlp.trace_sample_ratio=1", "ock.mmc.otlp.timeout_ms=1000")
        time.sleep(1.2)  # the first push is under way (hung) or failed (down)
        for i in range(5):
            s.put("gone-%d" % i, b"g")
        code, took = stop_timed(s, 15)
        assert code == 0, "".join(s.log)
        # The flush is bounded by the timeout (1 s), a quarter second more to see the stop.
        assert took < 3, (took, "".join(s.log))
        assert any("OTLP: last export at the stop: the metrics not sent, 0 spans sent, 5 dropped" in line
                   for line in s.log), "".join(s.log)


def test_ssd_flushes_and_rewarms_have_spans(started, tmp_path):
    """A DRAM tier too small for the objects put: eviction flushes them to SSD (`mmc.flush`),
    and a read of one held only there brings it back (`mmc.rewarm`, or `mmc.ssd_read` when it
    is read straight from SSD); each a root INTERNAL span of this process's resource."""
    r = Receiver()
    started[1].append(r)
    size = 200 << 10
    s = otlp_server(started, r.url, "ock.mmc.otlp.trace_sample_ratio=1",
                    "ock.mmc.otlp.service_instance_id=ssd-node",
                    "ock.mmc.local_service.hbm.size=0", "ock.mmc.local_service.dram.size=2MB",
                    "ock.mmc.ssd.enable=true", "ock.mmc.ssd.path=%s" % tmp_path, "ock.mmc.ssd.size=64MB",
                    "ock.mmc.segment.run_bytes=1MB", "ock.mmc.lease_ms=100")
    for i in range(16):
        s.put("tier-%d" % i, bytes([i]) * size, "&medium=dram")

    def only_on_disk(k):
        q = s.json("GET", "/query_key?key=" + k)
        return q.get("success", True) and [b["medium"] for b in q["blobs"]] == ["SSD"]

    wait_until("an object on SSD only", lambda: only_on_disk("tier-0"))
    assert s.get("/api/v1/objects?key=tier-0") == bytes([0]) * size
    wait_until("flush and read spans", lambda: {"mmc.flush"} <= {x.name for x in r.spans()}
               and {"mmc.rewarm", "mmc.ssd_read"} & {x.name for x in r.spans()})
    spans = [x for x in r.spans() if x.name in ("mmc.flush", "mmc.rewarm", "mmc.ssd_read")]
    for sp in spans:
        a = attrs(sp.attributes)
        assert sp.kind == trace_pb2.Span.SPAN_KIND_INTERNAL, sp.name
        assert sp.parent_span_id == b"" and len(sp.trace_id) == 16, sp.name
        assert sp.end_time_unix_nano >= sp.start_time_unix_nano > 0
        assert a["mmc.bytes"] >= size and a["mmc.rank"] == 0 and a["mmc.shard"] in (0, 1), a
        assert a["mmc.outcome"] == "done", a
        assert sp.status.code != trace_pb2.Status.STATUS_CODE_ERROR
    with r.lock:
        res = [attrs(rs.resource.attributes) for req in r.traces for rs in req.resource_spans]
    assert all(x["service.instance.id"] == "ssd-node" and x["mmc.role"] == "meta" for x in res)


def test_a_leaving_ranks_drain_has_a_span_on_the_meta(started):
    """A local service stopped with SIGTERM leaves its meta, which moves the objects held only
    there to the other rank first: the meta records `mmc.drain` (always, tracing on) with the
    segments drained and the objects moved."""
    import requests

    import cluster_ready

    r = Receiver()
    started[1].append(r)
    otlp = ["--set", "ock.mmc.otlp.endpoint=" + r.url, "--set", "ock.mmc.otlp.trace_sample_ratio=0.000001"]
    meta = Server(["--set", "ock.mmc.embedded.ranks=0", "--set", "ock.mmc.otlp.service_instance_id=meta"] + otlp,
                  driver="epoll")
    started[0].append(meta)
    locals_ = []
    for i in range(2):
        locals_.append(Server(["--role", "local", "--set", "ock.mmc.meta_service_url=http://%s" % meta.addr,
                               "--set", "ock.mmc.local_service.dram.size=64MB",
                               "--set", "ock.mmc.local_service.hbm.size=0"], driver="epoll"))
        started[0].append(locals_[-1])
    wait_until("both ranks joined", lambda: cluster_ready.ready_count(meta.get) == 2)
    base = "http://%s/api/v1/objects" % meta.addr
    data = os.urandom(50_000)
    with requests.Session() as h:
        got = h.put(base, params={"key": "drained"}, data=data, timeout=30)
        assert got.status_code == 200 and [x.status_code for x in got.history] == [307], got.text
        location = got.history[0].headers["Location"]
    holder = [x for x in locals_ if location.startswith("http://%s/" % x.addr)]
    assert len(holder) == 1, (location, [x.addr for x in locals_])
    rank = meta.json("GET", "/query_key?key=drained")["blobs"][0]["rank"]
    code = holder[0].stop()
    assert code == 0, "".join(holder[0].log)
    started[0].remove(holder[0])
    wait_until("the drain's span", lambda: any(x.name == "mmc.drain" for x in r.spans()), timeout=20)
    drain = [x for x in r.spans() if x.name == "mmc.drain"]
    assert len(drain) == 1
    a = attrs(drain[0].attributes)
    assert drain[0].kind == trace_pb2.Span.SPAN_KIND_INTERNAL
    assert "rank-%d-dram" % rank in a["mmc.segments"].split(","), a
    assert a["mmc.moved_objects"] == 1, a
    with r.lock:
        res = [attrs(rs.resource.attributes) for req in r.traces for rs in req.resource_spans
               if any(x.name == "mmc.drain" for ss in rs.scope_spans for x in ss.spans)]
    assert res[0]["service.instance.id"] == "meta" and res[0]["mmc.role"] == "meta"
    with requests.Session() as h:
        got = h.get(base, params={"key": "drained"}, timeout=30)
        assert got.status_code == 200 and got.content == data


class Etcd:
    """A single-member etcd on loopback ports (Debian's etcd-server, which scripts/test.sh
    installs), its data in `work`."""

    def __init__(self, work):
        self.port, peer_port = free_port(), free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        peer = "http://127.0.0.1:%d" % peer_port
        self.proc = subprocess.Popen(
            ["etcd", "--name", "mmc-otlp", "--data-dir", os.path.join(str(work), "etcd"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "mmc-otlp=" + peer],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until("etcd answers", self.answers, timeout=15)

    def answers(self):
        body = b'{"key":"AA=="}'
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                c.sendall(b"POST /v3/kv/range HTTP/1.1\r\nHost: etcd\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (len(body), body))
                return c.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def test_a_failover_has_a_span_on_the_meta_that_takes_over(started, tmp_path):
    """HA on a real etcd: the first meta's election records `mmc.failover` (serving), and when it
    stops the standby takes over and records its own, with the leadership's view version."""
    if shutil.which("etcd") is None:
        if os.environ.get("MMC_REQUIRE_ETCD"):
            raise AssertionError("etcd is not on PATH (apt-get install etcd-server)")
        pytest.skip("etcd is not on PATH")
    etcd = Etcd(tmp_path)
    try:
        r = Receiver()
        started[1].append(r)
        metas = []
        for name in ("meta-a", "meta-b"):
            port = free_port()
            metas.append(otlp_server(started, r.url, "ock.mmc.otlp.trace_sample_ratio=0.000001",
                                     "ock.mmc.otlp.service_instance_id=" + name,
                                     "ock.mmc.meta.ha.enable=true",
                                     "ock.mmc.meta.ha.etcd_endpoints=" + etcd.endpoint,
                                     "ock.mmc.meta.ha.advertise_url=http://127.0.0.1:%d" % port,
                                     listen="127.0.0.1:%d" % port))
            if name == "meta-a":
                wait_until("meta-a leads", lambda: metas[0].json("GET", "/health").get("ha_state") == "serving",
                           timeout=20)

        def failovers():
            out = []
            with r.lock:
                reqs = list(r.traces)
            for req in reqs:
                for rs in req.resource_spans:
                    inst = attrs(rs.resource.attributes)["service.instance.id"]
                    out += [(inst, sp) for ss in rs.scope_spans for sp in ss.spans if sp.name == "mmc.failover"]
            return out

        wait_until("meta-a's span", lambda: [x for x in failovers() if x[0] == "meta-a"])
        code = metas[0].stop()
        assert code == 0, "".join(metas[0].log)
        started[0].remove(metas[0])
        wait_until("meta-b's span", lambda: [x for x in failovers() if x[0] == "meta-b"], timeout=30)
        views = []
        for inst in ("meta-a", "meta-b"):
            spans = [sp for i, sp in failovers() if i == inst]
            assert len(spans) == 1, (inst, spans)
            sp = spans[0]
            a = attrs(sp.attributes)
            assert sp.kind == trace_pb2.Span.SPAN_KIND_INTERNAL and sp.parent_span_id == b""
            assert a["mmc.ha.serving"] is True, a
            assert sp.status.code != trace_pb2.Status.STATUS_CODE_ERROR
            assert sp.end_time_unix_nano >= sp.start_time_unix_nano > 0
            views.append(a["mmc.ha.view_version"])
        assert 0 < views[0] < views[1], views
    finally:
        etcd.stop()
