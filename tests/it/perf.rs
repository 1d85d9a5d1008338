//! `mmc-perf kvcache` against a real server (issue 19): a short run prints JSON with a hit
//! ratio and the bytes moved.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{Driver, Server};

const PERF_BIN: &str = env!("CARGO_BIN_EXE_mmc-perf");

/// Runs mmc-perf (bounded: it must end within 30 s), expecting success and one JSON object.
fn run_perf(args: &[&str]) -> serde_json::Value {
    let started = Instant::now();
    let out = Command::new(PERF_BIN)
        .args(args)
        .output()
        .expect("run mmc-perf");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn kvcache_reports_hits_and_bytes() {
    let server = Server::start(Driver::Epoll);
    let dir = report_dir("kvcache");
    let v = run_perf(&[
        "kvcache",
        "--target",
        &server.addr.to_string(),
        "--connections",
        "2",
        "--duration",
        "3",
        "--warmup",
        "0.5",
        "--pool",
        "40",
        "--chain",
        "8",
        "--shared",
        "4",
        "--groups",
        "4",
        "--chunk-bytes",
        "16KiB",
        "--timeout",
        "3",
        "--cpu-pid",
        &server.pid().to_string(),
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["prompts"].as_u64().unwrap() > 10, "{v}");
    // 40 prompts of 8 chunks over 3 s: most lookups after the first few hit.
    let hit = v["hit_ratio"].as_f64().unwrap();
    assert!(hit > 0.5 && hit <= 1.0, "hit ratio {hit}: {v}");
    let get = v["bytes"]["get"].as_u64().unwrap();
    let put = v["bytes"]["put"].as_u64().unwrap();
    assert!(get > 0 && put > 0, "{v}");
    assert_eq!(get % (16 << 10), 0, "whole chunks read: {v}");
    assert_eq!(v["bytes"]["total"].as_u64().unwrap(), get + put);
    assert!(
        v["latency_us"]["lookup"]["p99"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(v["server_cpu_s_per_gb"].as_f64().is_some(), "{v}");
    assert_report(&dir, &v);
}

fn report_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mmc-it-perf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// DIR holds report.json with the printed figures and two SVG charts with lines.
fn assert_report(dir: &std::path::Path, printed: &serde_json::Value) {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(&r["figures"], printed);
    for chart in ["latency.svg", "timeline.svg"] {
        let svg = std::fs::read_to_string(dir.join(chart)).expect(chart);
        let svg = svg.trim();
        assert!(
            svg.starts_with("<svg") && svg.ends_with("</svg>"),
            "{chart}"
        );
        assert!(svg.contains("<polyline"), "{chart} draws no line");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn zipf_keys_with_a_report() {
    let server = Server::start(Driver::Epoll);
    let dir = report_dir("load");
    let v = run_perf(&[
        "--target",
        &server.addr.to_string(),
        "--connections",
        "2",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--keys",
        "100",
        "--preload",
        "--key-dist",
        "zipf:0.99",
        "--seed",
        "5",
        "--rate",
        "400",
        "--request",
        "GET /metadata?key={key}",
        "--timeout",
        "3",
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(v["key_dist"], "zipf:0.99");
    assert_eq!(v["requests"], 400, "every intended request: {v}");
    assert_eq!(v["status"]["200"], 400, "{v}");
    assert_report(&dir, &v);
}

#[test]
fn kvcache_help_describes_prefix_chains() {
    let out = Command::new(PERF_BIN)
        .args(["kvcache", "--help"])
        .output()
        .expect("run mmc-perf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("Prefix chains"), "{text}");
    assert!(
        text.contains("model@world_size@worker@chunk_hash@dtype"),
        "{text}"
    );
}
