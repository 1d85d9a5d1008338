//! Micro-benchmarks of the HTTP front end's per-request work: head parsing, routing, query
//! decoding. Each group is kept short (0.5 s warm-up, 2 s measurement, 30 samples) so that
//! `cargo bench --bench http` finishes in well under a minute.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use mmc::http::parse::{Parsed, parse_head};
use mmc::http::query::param;
use mmc::http::router::{ROUTES, lookup};

/// What wrk sends for `GET /metadata?key=bench` (the request of perf/compare_nginx.sh).
const GET_WRK: &[u8] = b"GET /metadata?key=bench HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n";

/// A typical client GET with 4 headers.
const GET_4_HEADERS: &[u8] = b"GET /metadata?key=llm-kv-block-000123 HTTP/1.1\r\n\
Host: 127.0.0.1:8000\r\n\
User-Agent: mmc-perf/0.1\r\n\
Accept: */*\r\n\
X-Request-ID: req-0000000042\r\n\
\r\n";

/// A PUT with a Content-Length body (the head is parsed; the body follows it in the buffer).
const PUT_CONTENT_LENGTH: &[u8] = b"PUT /metadata?key=llm-kv-block-000123 HTTP/1.1\r\n\
Host: 127.0.0.1:8000\r\n\
User-Agent: mmc-perf/0.1\r\n\
Content-Type: application/octet-stream\r\n\
Content-Length: 16\r\n\
\r\n\
0123456789abcdef";

fn many_headers(n: usize) -> Vec<u8> {
    let mut r =
        b"GET /metadata?key=llm-kv-block-000123 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n".to_vec();
    for i in 1..n {
        r.extend_from_slice(
            format!("X-Custom-Header-{i:02}: value-{i:04}-abcdefgh\r\n").as_bytes(),
        );
    }
    r.extend_from_slice(b"\r\n");
    r
}

fn head_len(req: &[u8]) -> usize {
    match parse_head(req) {
        Parsed::Complete(h) => h.len,
        other => panic!("benchmark request must parse: {other:?}"),
    }
}

fn parse(c: &mut Criterion) {
    let forty = many_headers(40);
    let cases: [(&str, &[u8]); 4] = [
        ("get_wrk_1_header", GET_WRK),
        ("get_metadata_4_headers", GET_4_HEADERS),
        ("put_content_length", PUT_CONTENT_LENGTH),
        ("get_40_headers", &forty),
    ];
    let mut g = c.benchmark_group("parse_head");
    for (name, req) in cases {
        // Check once that the benchmark measures the success path.
        assert!(head_len(req) > 0);
        g.bench_function(name, |b| {
            b.iter(|| match parse_head(black_box(req)) {
                Parsed::Complete(h) => h.len,
                _ => 0,
            })
        });
    }
    g.finish();
}

fn route(c: &mut Criterion) {
    let mut paths: Vec<&[u8]> = ROUTES.iter().map(|r| r.path.as_bytes()).collect();
    paths.push(b"/metadata/nope");
    for p in &paths[..ROUTES.len()] {
        assert!(lookup(p).is_some());
    }
    let mut g = c.benchmark_group("router_lookup");
    g.bench_function(format!("all_{}_routes_and_a_miss", ROUTES.len()), |b| {
        b.iter(|| {
            let mut found = 0usize;
            for p in &paths {
                found += lookup(black_box(p)).is_some() as usize;
            }
            found
        })
    });
    g.bench_function("metadata", |b| b.iter(|| lookup(black_box(b"/metadata"))));
    g.bench_function("miss", |b| b.iter(|| lookup(black_box(b"/metadata/nope"))));
    g.finish();
}

fn query(c: &mut Criterion) {
    let plain: &[u8] = b"key=llm-kv-block-000123";
    let encoded: &[u8] = b"key=llm%2Fkv%2Fblock+000123&tier=dram";
    assert_eq!(
        param(encoded, "key").unwrap().unwrap().as_ref(),
        b"llm/kv/block 000123"
    );
    let mut g = c.benchmark_group("query_param");
    g.bench_function("plain", |b| {
        b.iter(|| param(black_box(plain), "key").map(|v| v.map(|v| v.len())))
    });
    g.bench_function("percent_encoded", |b| {
        b.iter(|| param(black_box(encoded), "key").map(|v| v.map(|v| v.len())))
    });
    g.bench_function("third_of_three", |b| {
        b.iter(|| {
            param(
                black_box(&b"tier=dram&rank=0&key=llm-kv-block-000123"[..]),
                "key",
            )
            .map(|v| v.map(|v| v.len()))
        })
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = parse, route, query
}
criterion_main!(benches);
