"""The served OpenAPI document is true for the running server: schemathesis finds nothing
against it (a meta with no token and with tokens, and a local service joined to a meta), and
every route it marks secured answers 401 without credentials while every route it marks open
does not. The document itself is public (the gateway convention)."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import Server, wait_until

DATA_TOKEN = "data-secret-1"
METRICS_TOKEN = "scrape-secret-2"
CLUSTER_TOKEN = "cluster-secret-3"
# Every check schemathesis has (response_schema_conformance among them), but one:
# negative_data_rejection expects a 4xx for a request that violates the schema, where the
# contract answers every business error (a missing or invalid parameter included) with HTTP
# 200 and the error envelope (docs/CONTRACT-NOTES.md, "OpenAPI").
CHECKS = "all"
EXCLUDED_CHECKS = "negative_data_rejection"
# Bounds the run: a few cases per operation and phase, ~40 operations, two runs in well
# under three minutes on a busy 2-core machine.
MAX_EXAMPLES = 20
RUN_TIMEOUT_S = 150
SCHEMATHESIS = os.path.join(os.path.dirname(sys.executable), "schemathesis")


def token_args(data, metrics):
    args = []
    if data:
        args += ["--set", "ock.mmc.http.auth_token=" + data]
    if metrics:
        args += ["--set", "ock.mmc.http.metrics_token=" + metrics]
    return args


def start(data="", metrics="", driver="epoll", extra=()):
    # A server of its own: schemathesis calls every operation, destructive ones included.
    # A small DRAM segment so that puts and gets really store and read.
    return Server(token_args(data, metrics) + [
        "--set", "ock.mmc.local_service.dram.size=64MB",
    ] + list(extra), driver=driver)


def document(srv, headers=None):
    status, ctype, body = srv.request("GET", "/openapi.json", headers=headers)
    assert status == 200, (status, body)
    assert ctype == "application/json; charset=utf-8"
    return json.loads(body)


def operations(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            yield path, method.upper(), op


# Warnings that mean the run did not test what it should: a token it did not send, a schema
# it could not fully read. (A token refused, `missing_auth`, is checked after the run: the
# operations authorized by a grant the meta signs answer only 401/403 to fuzzed requests.)
FAIL_ON_WARNINGS = [
    "unused_openapi_auth",
    "validation_mismatch",
    "missing_deserializer",
    "unresolvable_reference",
    "method_not_allowed",
    "base_url_mismatch",
]


# Operations a fuzzer cannot pass: authorized by a grant the meta signs (a tier move on a
# local service, an object transfer there) or a MAC under the local service's key (a push of
# freed records), or answered by a local service only (a move or a push sent to a meta).
# They answer 401/403 to everything it sends.
GRANTED = {
    "POST /cluster/v1/move",
    "POST /cluster/v1/freed",
    "GET /api/v1/objects",
    "PUT /api/v1/objects",
    "DELETE /api/v1/objects",
}


def refused_operations(out):
    """The operations schemathesis's `missing_auth` warning names (only 401/403 answers)."""
    found, block = set(), False
    for line in out.splitlines():
        if line.startswith("Authentication failed"):
            block = True
        elif block and line.startswith("  - "):
            found.add(line[4:].strip())
        elif block and line.startswith("="):
            break
    return found


def run_schemathesis(srv, tmp_path, data="", metrics="", cluster=""):
    # The document is read as a client would (it is public) and handed over as a file, so
    # that schemathesis sends each operation the token its security requirement names, and
    # nothing to an open one.
    schema = tmp_path / "openapi.json"
    doc = document(srv)
    # A join admits a local service: fuzzed, it would mount made-up ranks at made-up URLs
    # (each resolved) and redirect the other operations' puts there. It is tested with real
    # local services (tests/it/cluster.rs, test_cluster.py). The other cluster routes answer
    # forged members and grants (409, 403) and are checked here.
    doc["paths"] = {p: v for p, v in doc["paths"].items() if p != "/cluster/v1/join"}
    schema.write_text(json.dumps(doc))
    config = tmp_path / "schemathesis.toml"
    lines = ["[warnings]", "fail-on = %s" % json.dumps(FAIL_ON_WARNINGS)]
    if data:
        lines += ["[auth.openapi.dataToken]", 'bearer = "%s"' % data]
    if metrics:
        lines += ["[auth.openapi.metricsToken]", 'bearer = "%s"' % metrics]
    if cluster:
        lines += ["[auth.openapi.clusterToken]", 'bearer = "%s"' % cluster]
    config.write_text("\n".join(lines) + "\n")
    cmd = [
        SCHEMATHESIS, "--config-file", str(config), "run", str(schema),
        "--url", "http://%s:%d" % (srv.host, srv.port),
        "--checks", CHECKS,
        "--exclude-checks", EXCLUDED_CHECKS,
        # Positive and negative inputs; the checks above judge the answers (business
        # errors are HTTP 200, as the contract says).
        "--mode", "all",
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", "11",
        # One worker: hypothesis describes its strategies with ast.parse, which CPython 3.11
        # before 3.11.8 can fail with "AST constructor recursion depth mismatch" when two
        # threads parse at once (gh-106905): a failure of the tool, not of the server.
        "--workers", "1",
        "--request-timeout", "10",
        "--generation-database", "none",
        "--no-color",
        "--continue-on-failure",
        "--output-truncate", "false",
    ]
    p = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, "schemathesis found failures:\n" + out[-20000:]
    # Every operation was really tested (not an empty selection).
    n = sum(1 for _ in operations(json.loads(schema.read_text())))
    assert "Tested: %d" % n in out, out[-5000:]
    # Every case passed (the summary says "No issues found" only without any warning).
    assert re.search(r"\b(\d+) generated, \1 passed\b", out), out[-5000:]
    refused = refused_operations(out)
    assert refused <= GRANTED, "only 401/403 answers: %s\n%s" % (refused - GRANTED, out[-5000:])


def test_schemathesis_without_token(tmp_path, monkeypatch):
    # The server runs in the test's directory: a segment mount that names a relative SSD
    # directory creates it there, not in the checkout.
    monkeypatch.chdir(tmp_path)
    srv = start()
    try:
        doc = document(srv)
        for path, method, op in operations(doc):
            assert op["security"] == [], (method, path)
            assert "401" not in op["responses"], (method, path)
        run_schemathesis(srv, tmp_path)
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_schemathesis_with_tokens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    srv = start(DATA_TOKEN, METRICS_TOKEN, driver="uring")
    try:
        run_schemathesis(srv, tmp_path, DATA_TOKEN, METRICS_TOKEN)
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_schemathesis_against_a_local_service(tmp_path, monkeypatch):
    """A local service's document (what it serves: its health, role and HA view, metrics and
    objects under grants) is true for it, with a metrics token and the cluster token; and the
    document of the pure meta it joined (whose puts are redirected to it) is true too."""
    monkeypatch.chdir(tmp_path)
    cluster = ["--set", "ock.mmc.cluster.token=" + CLUSTER_TOKEN]
    meta = start(extra=cluster + ["--set", "ock.mmc.embedded.ranks=0"])
    local = None
    try:
        local = Server(token_args("", METRICS_TOKEN) + cluster + [
            "--role", "local",
            "--set", "ock.mmc.meta_service_url=http://%s:%d" % (meta.host, meta.port),
            "--set", "ock.mmc.local_service.dram.size=16MB",
            "--set", "ock.mmc.local_service.hbm.size=0",
        ], driver="uring")
        wait_until("the local service joined", lambda: local.request("GET", "/ready")[0] == 200)
        doc = document(local)
        assert doc["info"]["title"] == "MemCache Hybrid local service"
        assert "/query_key" not in doc["paths"] and "/ha_status" in doc["paths"]
        run_schemathesis(local, tmp_path, "", METRICS_TOKEN, CLUSTER_TOKEN)
        meta_dir = tmp_path / "meta"
        meta_dir.mkdir()
        run_schemathesis(meta, meta_dir, cluster=CLUSTER_TOKEN)
    finally:
        # The meta first: the local service's leave then finds nobody to drain it. (Leaving
        # after this fuzzing, its drain and its loss on the meta raced and tripped the meta's
        # debug check that a forgotten segment holds no blobs: reported, not fixed here.)
        assert meta.stop() == 0, "".join(meta.log)
        if local is not None:
            assert local.stop() == 0, "".join(local.log)


def minimal_request(op):
    """A request that reaches the route (the answer itself does not matter here)."""
    body = None
    headers = {}
    rb = op.get("requestBody", {}).get("content", {})
    if rb:
        ctype = next(iter(rb))
        headers["Content-Type"] = "application/json" if "json" in ctype else ctype.replace("*/*", "application/octet-stream")
        body = b"{}" if "json" in ctype else b""
    return body, headers


@pytest.mark.parametrize("data,metrics", [("", ""), (DATA_TOKEN, ""), ("", METRICS_TOKEN), (DATA_TOKEN, METRICS_TOKEN)])
def test_documented_security_is_enforced(data, metrics):
    """Secured in the document ⇔ 401 without credentials; a secured route accepts its token."""
    srv = start(data, metrics)
    try:
        # Public whatever the tokens.
        doc = document(srv)
        schemes = doc.get("components", {}).get("securitySchemes", {})
        tokens = {"dataToken": data, "metricsToken": metrics}
        assert set(schemes) == {k for k, v in tokens.items() if v}
        secured_seen = open_seen = 0
        for path, method, op in operations(doc):
            body, headers = minimal_request(op)
            status, _, answer = srv.request(method, path, body=body, headers=headers)
            if op["security"]:
                secured_seen += 1
                [req] = op["security"]
                [scheme] = req
                assert status == 401, (method, path, status, answer)
                assert "401" in op["responses"], (method, path)
                headers["Authorization"] = "Bearer " + tokens[scheme]
                status, _, answer = srv.request(method, path, body=body, headers=headers)
                assert status != 401, (method, path, answer)
            else:
                open_seen += 1
                assert status != 401, (method, path, answer)
                assert "401" not in op["responses"], (method, path)
        total = secured_seen + open_seen
        assert total >= 40
        # The cluster-internal routes take the cluster token, not these two: open here.
        cluster = sum(1 for path, _, _ in operations(doc) if path.startswith("/cluster/"))
        if data:
            assert secured_seen >= total - 6 - cluster
        if not data and not metrics:
            assert secured_seen == 0
        if metrics and not data:
            assert secured_seen == 4
        # With auth_token set, the scrape routes need a bearer too (the metrics token when
        # one is set, else the data token): nothing but /healthz, /ready, /openapi.json is open.
        scrape = ["/metrics", "/metrics/summary", "/metrics/ptracer",
                  "/api/v1/analysis/alloc_free_latency"]
        for path in scrape:
            [op] = doc["paths"][path].values()
            want = [{"metricsToken": []}] if metrics else [{"dataToken": []}] if data else []
            assert op["security"] == want, (path, op["security"])
        assert doc["paths"]["/openapi.json"]["get"]["security"] == []
    finally:
        assert srv.stop() == 0, "".join(srv.log)
