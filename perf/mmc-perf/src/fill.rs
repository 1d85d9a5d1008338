//! `mmc-perf fill`: stores N small objects through `POST /api/v1/objects/batch_put`, as many
//! keys per request as the server's limits allow (4096 keys, an 8 KiB request target), over a
//! few pipelined keep-alive connections. Used to put a million keys in a server before
//! listing or scraping it.

use std::fmt::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::load::{self, DriverChoice};
use crate::mix::{Preloads, body};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "HOST:PORT")]
    target: String,

    /// Objects to store.
    #[arg(long, value_name = "N")]
    keys: u64,

    /// Index of the first object.
    #[arg(long, default_value_t = 0, value_name = "I")]
    first: u64,

    /// Key of object i: `{i}` becomes i in decimal, `{hex}` i as 16 hex digits (so the
    /// default is an LMCache key whose chunk hash is i).
    #[arg(
        long,
        default_value = "llama3-8b@1@0@{hex}@bfloat16",
        value_name = "FORMAT"
    )]
    key_format: String,

    /// Bytes of each object.
    #[arg(long, default_value_t = 16, value_name = "N")]
    value_bytes: usize,

    /// `medium=` of the puts (hbm or dram); default: the server's.
    #[arg(long, value_name = "MEDIUM")]
    medium: Option<String>,

    /// Connections (each pipelines up to 32 batches).
    #[arg(long, default_value_t = 4, value_name = "N")]
    connections: usize,

    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    timeout: f64,

    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,

    /// Write report.json (the JSON figures) and fill.svg (keys stored per second over the
    /// run, and in all) into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,
}

/// The server's limits on one batch (`src/limits.rs`: `MAX_URI_BYTES`; README: 4096 keys).
const MAX_TARGET_BYTES: usize = 8 * 1024;
const MAX_BATCH_KEYS: usize = 4096;
const MAX_VALUE_BYTES: usize = 1 << 20;

/// Percent-encodes a key for a `keys=` list: everything but letters, digits and `-._~@:`.
fn encode_key(key: &str, out: &mut String) {
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~@:".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// Key `i` from the format.
pub fn key(format: &str, i: u64) -> String {
    format
        .replace("{i}", &i.to_string())
        .replace("{hex}", &format!("{i:016x}"))
}

/// The batch_put requests for keys `first..first + n`: each target at most
/// [`MAX_TARGET_BYTES`], at most [`MAX_BATCH_KEYS`] keys.
pub fn requests(
    host: &str,
    format: &str,
    first: u64,
    n: u64,
    value_bytes: usize,
    medium: Option<&str>,
) -> Result<Vec<Vec<u8>>, String> {
    let value: Vec<u8> = body(value_bytes).collect();
    let size = value_bytes.to_string();
    let suffix = medium.map(|m| format!("&medium={m}")).unwrap_or_default();
    let mut out = Vec::new();
    let mut i = first;
    let end = first + n;
    while i < end {
        let mut keys = String::from("/api/v1/objects/batch_put?keys=");
        let mut sizes = String::from("&sizes=");
        let mut count = 0usize;
        while i < end && count < MAX_BATCH_KEYS {
            let mut k = String::new();
            encode_key(&key(format, i), &mut k);
            let grown = keys.len() + k.len() + 1 + sizes.len() + size.len() + 1 + suffix.len();
            if grown > MAX_TARGET_BYTES {
                if count == 0 {
                    return Err(format!("invalid --key-format: key {i} alone is too long"));
                }
                break;
            }
            if count > 0 {
                keys.push(',');
                sizes.push(',');
            }
            keys.push_str(&k);
            sizes.push_str(&size);
            count += 1;
            i += 1;
        }
        let mut req = format!(
            "POST {keys}{sizes}{suffix} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n",
            count * value_bytes
        )
        .into_bytes();
        for _ in 0..count {
            req.extend_from_slice(&value);
        }
        out.push(req);
    }
    Ok(out)
}

pub fn main(args: &Args) -> Result<(), String> {
    let addr = crate::units::resolve_target(&args.target)?;
    if args.value_bytes > MAX_VALUE_BYTES {
        return Err(format!(
            "invalid --value-bytes {}: at most {MAX_VALUE_BYTES}",
            args.value_bytes
        ));
    }
    if args.connections == 0 || args.connections > 1024 {
        return Err("invalid --connections: expected 1 to 1024".into());
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(format!("invalid --timeout {}", args.timeout));
    }
    let reqs = requests(
        &args.target,
        &args.key_format,
        args.first,
        args.keys,
        args.value_bytes,
        args.medium.as_deref(),
    )?;
    let batches = reqs.len();
    let keys_of: Vec<u64> = reqs.iter().map(|r| batch_keys(r)).collect();
    let started = Instant::now();
    let (p, trace) = load::preload_traced(
        addr,
        Preloads {
            requests: reqs,
            body_rest: None,
        },
        args.connections,
        DriverChoice::Auto,
        Duration::from_secs(10),
        started + Duration::from_secs_f64(args.timeout),
    )?;
    let secs = started.elapsed().as_secs_f64();
    let clean = p.ok == p.requests && p.business_failures == 0;
    let figures = json!({
        "keys": args.keys, "batches": batches, "ok": p.ok, "failed": p.failed,
        "business_failures": p.business_failures, "secs": (secs * 1000.0).round() / 1000.0,
        "keys_per_s": (args.keys as f64 / secs).round(),
    });
    if let Some(dir) = &args.report {
        let stored: Vec<(f64, f64)> = trace
            .iter()
            .map(|&(t, i)| {
                let t = t.saturating_duration_since(started).as_secs_f64();
                (t, keys_of.get(i).copied().unwrap_or(0) as f64)
            })
            .collect();
        crate::report::write_charts(dir, &figures, &chart(&stored, secs))?;
    }
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "fill: {} keys in {batches} batches, {:.2} s ({:.0} keys/s); batches ok {}, failed {}, with a failed key {}",
            args.keys,
            secs,
            args.keys as f64 / secs,
            p.ok,
            p.failed,
            p.business_failures
        );
    }
    if clean {
        Ok(())
    } else {
        Err(not_stored(p.business_failures, &args.target))
    }
}

/// Why a fill stored less than it was asked to, and what to do. A batch with a refused key is
/// most often one whose keys are in the server already (a second fill of the same keys): a
/// put never overwrites ("Duplicated object: key already exists").
fn not_stored(batches_refusing_a_key: u64, target: &str) -> String {
    if batches_refusing_a_key == 0 {
        return "some keys were not stored (batches failed: see the figures above)".into();
    }
    format!(
        "some keys were not stored: {batches_refusing_a_key} batches had keys the server refused, \
         most often because they exist already (a put never overwrites: \"Duplicated object: key \
         already exists\"); fill other keys (--first, --key-format) or remove these first \
         (curl -X DELETE http://{target}/all_keys removes every key)"
    )
}

/// Keys in a batch_put request (the `keys=` list of its target).
fn batch_keys(req: &[u8]) -> u64 {
    let line = req.split(|&b| b == b'\r').next().unwrap_or_default();
    let Some(at) = line.windows(5).position(|w| w == b"keys=") else {
        return 0;
    };
    let list = line[at + 5..].split(|&b| b == b'&' || b == b' ').next();
    list.map_or(0, |l| l.split(|&b| b == b',').count() as u64)
}

/// `fill.svg`: keys stored per second over the run (from the answers of their batches), and
/// `fill-total.svg`: keys stored in all.
fn chart(stored: &[(f64, f64)], secs: f64) -> Vec<crate::report::LineChart> {
    let mut sorted = stored.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut cumulative = vec![(0.0, 0.0)];
    for (t, k) in sorted {
        total += k;
        cumulative.push((t, total));
    }
    vec![
        crate::report::LineChart {
            file: "fill.svg".into(),
            title: "fill: keys stored per second".into(),
            x_desc: "time (s)".into(),
            y_desc: "keys/s".into(),
            log_x: false,
            series: vec![("keys/s".into(), crate::report::rate_over_time(stored, secs))],
        },
        crate::report::LineChart {
            file: "fill-total.svg".into(),
            title: "fill: keys stored".into(),
            x_desc: "time (s)".into(),
            y_desc: "keys".into(),
            log_x: false,
            series: vec![("keys".into(), cumulative)],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_key_is_explained() {
        let e = not_stored(3, "127.0.0.1:8000");
        assert!(e.contains("3 batches had keys the server refused"), "{e}");
        assert!(e.contains("exist already"), "{e}");
        assert!(e.contains("http://127.0.0.1:8000/all_keys"), "{e}");
        assert!(!not_stored(0, "h:1").contains("exist"));
    }

    #[test]
    fn keys_from_the_format() {
        assert_eq!(key("k{i}", 42), "k42");
        assert_eq!(key("m@1@0@{hex}@bf16", 255), "m@1@0@00000000000000ff@bf16");
    }

    #[test]
    fn batches_respect_the_server_limits() {
        let reqs = requests(
            "h",
            "llama3-8b@1@0@{hex}@bfloat16",
            0,
            1000,
            4,
            Some("dram"),
        )
        .unwrap();
        let mut seen = 0;
        for r in &reqs {
            let text = String::from_utf8_lossy(r);
            let line = text.lines().next().unwrap();
            let target = line.split(' ').nth(1).unwrap();
            assert!(target.len() <= MAX_TARGET_BYTES, "{}", target.len());
            assert!(target.ends_with("&medium=dram"));
            let keys = target
                .strip_prefix("/api/v1/objects/batch_put?keys=")
                .unwrap()
                .split('&')
                .next()
                .unwrap()
                .split(',')
                .count();
            let sizes = target
                .split("&sizes=")
                .nth(1)
                .unwrap()
                .split('&')
                .next()
                .unwrap();
            assert_eq!(sizes.split(',').count(), keys);
            assert!(sizes.split(',').all(|s| s == "4"));
            let head_end = r.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert_eq!(r.len() - head_end, keys * 4);
            assert!(text.contains(&format!("Content-Length: {}\r\n", keys * 4)));
            seen += keys;
        }
        assert_eq!(seen, 1000);
        assert!(reqs.len() < 10, "about 180 keys per batch: {}", reqs.len());
        let first = String::from_utf8_lossy(&reqs[0]);
        assert!(first.contains(
            "keys=llama3-8b@1@0@0000000000000000@bfloat16,llama3-8b@1@0@0000000000000001@bfloat16,"
        ));
        // Reserved characters are percent-encoded; a key too long for any batch is refused.
        let odd = requests("h", "a,b {i}", 7, 1, 1, None).unwrap();
        assert!(String::from_utf8_lossy(&odd[0]).contains("keys=a%2Cb%207&"));
        assert!(requests("h", &"x".repeat(9000), 0, 1, 1, None).is_err());
        // Many tiny keys: at most 4096 per batch.
        let tiny = requests("h", "{i}", 0, 5000, 0, None).unwrap();
        assert!(tiny.len() >= 2);
    }
}
