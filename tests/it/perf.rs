//! `mmc-perf kvcache` against a real server (issue 19): a short run prints JSON with a hit
//! ratio and the bytes moved.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{Driver, Server, ServerBuilder};

/// The `mmc-perf` binary. It is a package of its own (`perf/mmc-perf`), so Cargo gives this
/// test no `CARGO_BIN_EXE_mmc-perf`: it is taken from `MMC_PERF_BIN`, else from the profile
/// directory this test binary runs from (`target/<profile>/mmc-perf`), where a `cargo build`
/// or `cargo test` at the root (both packages are default members) puts it. A binary older
/// than its sources is refused rather than tested: `cargo test --test it` alone does not
/// rebuild it.
fn perf_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MMC_PERF_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/it-<hash> → target/<profile>/mmc-perf
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("mmc-perf");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build the load generator first: cargo build -p mmc-perf",
                bin.display()
            )
        });
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("perf/mmc-perf/src");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let changed = std::fs::metadata(&p).unwrap().modified().unwrap();
        assert!(
            changed <= built,
            "{} is older than {}: rebuild it (cargo build -p mmc-perf) or run `cargo test` at \
             the root, which builds both packages",
            bin.display(),
            p.display()
        );
    }
    bin
}

/// Runs mmc-perf (bounded: it must end within 30 s), expecting success and one JSON object.
fn run_perf(args: &[&str]) -> serde_json::Value {
    let started = Instant::now();
    let out = Command::new(perf_bin())
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
        // No warm-up: the measured run includes the first puts (a fast machine puts the
        // whole pool within half a second).
        "--warmup",
        "0",
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
    assert_charts(dir, printed, &["latency.svg", "timeline.svg"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// DIR holds report.json with the printed figures and these SVG charts, each with lines.
fn assert_charts(dir: &std::path::Path, printed: &serde_json::Value, charts: &[&str]) {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(&r["figures"], printed);
    for &chart in charts {
        let svg = std::fs::read_to_string(dir.join(chart)).expect(chart);
        let svg = svg.trim();
        assert!(
            svg.starts_with("<svg") && svg.ends_with("</svg>"),
            "{chart}"
        );
        assert!(svg.contains("<polyline"), "{chart} draws no line");
    }
}

/// The helpers (`memcpy`, `fill`, `drain`, `kv-sub`) take `--report` too: report.json with the
/// figures they print and their own charts; `compare` draws two helper reports together.
#[test]
fn helpers_write_reports() {
    let server = Server::start(Driver::Epoll);
    let target = server.addr.to_string();
    let pid = server.pid().to_string();
    let (a, b) = (report_dir("memcpy-a"), report_dir("memcpy-b"));
    for d in [&a, &b] {
        let v = run_perf(&[
            "memcpy",
            "--sizes",
            "4KiB,64KiB",
            "--secs",
            "0.05",
            "--pool",
            "1MiB",
            "--json",
            "--report",
            d.to_str().unwrap(),
        ]);
        assert_eq!(v["sizes"].as_array().unwrap().len(), 2, "{v}");
        assert_charts(d, &v, &["bandwidth.svg"]);
    }
    let cmp = report_dir("memcpy-cmp");
    let out = Command::new(perf_bin())
        .args(["compare", a.to_str().unwrap(), b.to_str().unwrap()])
        .args(["--out", cmp.to_str().unwrap()])
        .output()
        .expect("run mmc-perf compare");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(cmp.join("bandwidth.svg")).expect("bandwidth.svg");
    for d in [&a, &b] {
        let name = d.file_name().unwrap().to_str().unwrap();
        assert!(
            svg.contains(&format!("{name}: hot")),
            "{name} in the comparison"
        );
    }
    assert!(
        !cmp.join("latency.svg").exists(),
        "no latency chart without latencies"
    );

    let dir = report_dir("fill");
    let v = run_perf(&[
        "fill",
        "--target",
        &target,
        "--keys",
        "3000",
        "--key-format",
        "fill-{i}",
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(v["ok"], v["batches"], "{v}");
    assert_charts(&dir, &v, &["fill.svg", "fill-total.svg"]);
    // The cumulative chart ends at every key stored.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let total = r["charts"][1]["series"]["keys"].as_array().unwrap();
    assert_eq!(total.last().unwrap()[1], 3000.0, "{total:?}");

    let dir = report_dir("drain");
    let v = run_perf(&[
        "drain",
        "--target",
        &target,
        "--path",
        "/get_all_keys",
        "--rss-pid",
        &pid,
        "--timeout",
        "20",
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(v["status"], 200, "{v}");
    assert!(v["lines"].as_u64().unwrap() >= 3000, "{v}");
    assert_charts(&dir, &v, &["progress.svg", "rss.svg"]);

    // No publisher at this endpoint: nothing arrives, the report still says so.
    let dir = report_dir("kvsub");
    let v = run_perf(&[
        "kv-sub",
        "--endpoint",
        "tcp://127.0.0.1:1",
        "--secs",
        "0.3",
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(v["events"], 0, "{v}");
    assert_charts(&dir, &v, &["events.svg"]);
    for d in [a, b, cmp, dir] {
        let _ = std::fs::remove_dir_all(d);
    }
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
    let out = Command::new(perf_bin())
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

/// `kv-sub --report` against a real publisher: the events of a few puts arrive, and
/// events.svg's rate over time adds up to them.
#[test]
fn kv_sub_reports_the_events_it_received() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let server = ServerBuilder::new(Driver::Epoll)
        .set("ock.mmc.kv_events.enable", "true")
        .set("ock.mmc.kv_events.endpoint", &endpoint)
        .start();
    let dir = report_dir("kvsub-events");
    let sub = Command::new(perf_bin())
        .args(["kv-sub", "--endpoint", &endpoint, "--secs", "3", "--json"])
        .args(["--report", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run mmc-perf kv-sub");
    // The subscription takes a moment (ZMQ's slow joiner): puts go on until the window ends.
    let mut c = server.client();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        let key = format!("llama3-8b@1@0@{i:016x}@bfloat16");
        let r = c.request("PUT", &format!("/api/v1/objects?key={key}"), Some(b"abcd"));
        assert_eq!(r.status, 200);
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = sub.wait_with_output().expect("kv-sub ends by itself");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let events = v["events"].as_u64().unwrap();
    assert!(events > 0, "{v}");
    assert_eq!(v["malformed"], 0, "{v}");
    assert_charts(&dir, &v, &["events.svg"]);
    // The rate over time (per second, buckets of equal width over 3 s) adds up to the events.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let pts = r["charts"][0]["series"]["events/s"].as_array().unwrap();
    let width = 3.0 / pts.len() as f64;
    let sum: f64 = pts.iter().map(|p| p[1].as_f64().unwrap() * width).sum();
    assert!((sum - events as f64).abs() < 0.5, "{sum} vs {events}");
    let _ = std::fs::remove_dir_all(&dir);
}
