//! `mmc-perf kvcache`: a KV-cache workload shaped like LMCache's traffic.
//!
//! A pool of prompts, each a chain of chunk keys in LMCache's form
//! `model@world_size@worker@chunk_hash@dtype`, where a chunk's hash covers every chunk before
//! it (a prefix hash), so prompts that start alike share their first keys. Prompts belong to
//! `--groups` groups; the first `--shared` chunks of a prompt are its group's (the same keys
//! for every prompt of the group, like a shared system prompt), the rest its own. Each request
//! draws a prompt (Zipf by default) and does what a serving engine does on a prefill:
//!
//! 1. lookup: `POST /api/v1/objects/batch_exist` with the chain's keys;
//! 2. get the longest hit prefix: `POST /api/v1/objects/batch_get`;
//! 3. put the chunks after it: `POST /api/v1/objects/batch_put` (split so each target fits).
//!
//! One blocking keep-alive connection per worker thread. With `--rate` each worker has a fixed
//! schedule of intended starts and the latencies are measured from them (coordinated omission
//! corrected); without it each worker starts its next prompt when the last is done.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::load::new_histogram;
use crate::mix::XorShift;
use crate::report::{self, Timeline};
use crate::response::{self, Framed};
use crate::zipf::{KeyDist, Sampler};
use crate::{procstat, units};

pub const HELP: &str = "\
Prefix chains: every prompt of the pool is a chain of --chain chunk keys in LMCache's form
model@world_size@worker@chunk_hash@dtype, each chunk's hash covering the chunks before it (a
prefix hash). Prompts fall into --groups groups; a prompt's first --shared chunks are its
group's (the same keys for every prompt of the group, like a shared system prompt), the rest
are its own. Per request a prompt is drawn (--prompt-dist, Zipf by default), its chain looked up
(batch_exist), the longest prefix of hits read (batch_get) and the chunks after it stored
(batch_put). Reported: chunk hit ratio, lookup / transfer / request latencies (from the
intended start with --rate: corrected for coordinated omission), bytes moved per second,
server CPU per request and per GB (--cpu-pid).

Example:
  mmc-perf kvcache --target 127.0.0.1:8000 --connections 4 --duration 10 \\
    --pool 1000 --chain 16 --shared 8 --chunk-bytes 256KiB --cpu-pid $SERVER_PID --json";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "HOST:PORT")]
    target: String,

    /// Concurrent clients (one thread and keep-alive connection each).
    #[arg(long, default_value_t = 4, value_name = "N")]
    connections: usize,

    /// Measured seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    duration: f64,

    /// Seconds before the measured window (not counted).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    warmup: f64,

    /// Prompts per second over all connections (fixed schedule, corrected latencies);
    /// default: closed loop.
    #[arg(long, value_name = "REQ/S")]
    rate: Option<f64>,

    /// Prompts in the pool.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pool: u64,

    /// Chunks per prompt.
    #[arg(long, default_value_t = 16, value_name = "N")]
    chain: usize,

    /// Leading chunks a prompt shares with its group (default: half the chain).
    #[arg(long, value_name = "N")]
    shared: Option<usize>,

    /// Prompt groups (prompt p is in group p mod G).
    #[arg(long, default_value_t = 16, value_name = "G")]
    groups: u64,

    /// Bytes per chunk, 16KiB to 2MiB.
    #[arg(long, default_value = "256KiB", value_name = "BYTES")]
    chunk_bytes: String,

    /// Popularity of the prompts: uniform or zipf:S.
    #[arg(long, default_value = "zipf:0.99", value_name = "uniform|zipf:S")]
    prompt_dist: String,

    /// Seed of the prompt choices.
    #[arg(long, default_value_t = 0, value_name = "N")]
    seed: u64,

    /// Model name in the keys.
    #[arg(long, default_value = "llama3-8b", value_name = "NAME")]
    model: String,

    /// Report the CPU of this process (the server) per request and per GB moved.
    #[arg(long, value_name = "PID")]
    cpu_pid: Option<u32>,

    /// Connect, read and write timeout in seconds.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    timeout: f64,

    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,

    /// Write the JSON figures and SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<std::path::PathBuf>,
}

const MIN_CHUNK: u64 = 16 << 10;
const MAX_CHUNK: u64 = 2 << 20;
const MAX_CHAIN: usize = 4096;
/// A batch_put's request target stays under the server's 8 KiB; its body under 64 MiB.
const PUT_TARGET_BYTES: usize = 7000;
const PUT_BODY_BYTES: u64 = 64 << 20;

/// The chain of chunk keys of prompt `p`.
pub fn chain_keys(model: &str, p: u64, chain: usize, shared: usize, groups: u64) -> Vec<String> {
    let g = p % groups.max(1);
    let mut h: u64 = 0;
    (0..chain)
        .map(|j| {
            // The group's chunks for the shared prefix, the prompt's own after it.
            let (owner, tag) = if j < shared { (g, 0u8) } else { (p, 1u8) };
            let mut buf = [0u8; 25];
            buf[..8].copy_from_slice(&h.to_le_bytes());
            buf[8..16].copy_from_slice(&owner.to_le_bytes());
            buf[16..24].copy_from_slice(&(j as u64).to_le_bytes());
            buf[24] = tag;
            h = xxhash_rust::xxh3::xxh3_64(&buf);
            format!("{model}@1@0@{h:016x}@bfloat16")
        })
        .collect()
}

struct Setup {
    addr: SocketAddr,
    host: String,
    model: String,
    chain: usize,
    shared: usize,
    groups: u64,
    chunk: Arc<Vec<u8>>,
    sampler: Sampler,
    seed: u64,
    start: Instant,
    warm: Instant,
    end: Instant,
    stop: Instant,
    interval: Option<Duration>,
    connections: usize,
    timeout: Duration,
}

#[derive(Default)]
struct Counts {
    prompts: u64,
    chunks: u64,
    hits: u64,
    full_hits: u64,
    get_bytes: u64,
    put_bytes: u64,
    /// batch_get answered a looked-up key as missing (evicted in between).
    get_missing: u64,
    /// Put items refused because another client stored the key first.
    duplicates: u64,
    put_failures: u64,
    errors: u64,
}

struct Stats {
    c: Counts,
    lookup: Histogram<u64>,
    lookup_sent: Histogram<u64>,
    transfer: Histogram<u64>,
    request: Histogram<u64>,
    request_sent: Histogram<u64>,
    timeline: Option<Timeline>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            c: Counts::default(),
            lookup: new_histogram(),
            lookup_sent: new_histogram(),
            transfer: new_histogram(),
            request: new_histogram(),
            request_sent: new_histogram(),
            timeline: None,
        }
    }

    fn merge(&mut self, o: &Stats) {
        let (a, b) = (&mut self.c, &o.c);
        a.prompts += b.prompts;
        a.chunks += b.chunks;
        a.hits += b.hits;
        a.full_hits += b.full_hits;
        a.get_bytes += b.get_bytes;
        a.put_bytes += b.put_bytes;
        a.get_missing += b.get_missing;
        a.duplicates += b.duplicates;
        a.put_failures += b.put_failures;
        a.errors += b.errors;
        for (x, y) in [
            (&mut self.lookup, &o.lookup),
            (&mut self.lookup_sent, &o.lookup_sent),
            (&mut self.transfer, &o.transfer),
            (&mut self.request, &o.request),
            (&mut self.request_sent, &o.request_sent),
        ] {
            x.add(y).expect("equal bounds");
        }
        match (&mut self.timeline, &o.timeline) {
            (Some(a), Some(b)) => a.merge(b),
            (None, Some(b)) => self.timeline = Some(b.clone()),
            _ => {}
        }
    }
}

fn us(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// One keep-alive connection with blocking I/O.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr, timeout: Duration) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Sends `head` and the `body` pieces; returns (status, body) of the answer.
    fn call(&mut self, head: &[u8], body: &[&[u8]]) -> Result<(u16, Vec<u8>), String> {
        self.s.write_all(head).map_err(|e| e.to_string())?;
        for b in body {
            self.s.write_all(b).map_err(|e| e.to_string())?;
        }
        self.buf.clear();
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            match response::frame(&self.buf, false) {
                Framed::Complete {
                    status,
                    len,
                    head_len,
                    interim,
                    ..
                } => {
                    if interim {
                        self.buf.drain(..len);
                        continue;
                    }
                    let body = self.buf[head_len..len].to_vec();
                    self.buf.drain(..len);
                    return Ok((status, body));
                }
                Framed::Partial { .. } => {}
                Framed::Invalid(e) => return Err(format!("bad response: {e:?}")),
            }
            let n = self.s.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn json_post(host: &str, path: &str, keys: &[String]) -> Vec<u8> {
    let body = json!({ "keys": keys }).to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The outcome of one prompt.
struct Done {
    chunks: u64,
    hits: u64,
    get_bytes: u64,
    put_bytes: u64,
    get_missing: u64,
    duplicates: u64,
    put_failures: u64,
    lookup_done: Instant,
}

fn prompt(conn: &mut Conn, st: &Setup, keys: &[String]) -> Result<Done, String> {
    let (status, body) = conn.call(
        &json_post(&st.host, "/api/v1/objects/batch_exist", keys),
        &[],
    )?;
    let lookup_done = Instant::now();
    if status != 200 {
        return Err(format!("batch_exist answered {status}"));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("batch_exist: {e}"))?;
    let exists = v["exists"]
        .as_array()
        .ok_or_else(|| format!("batch_exist: no exists in {v}"))?;
    let hit = exists
        .iter()
        .take_while(|e| e.as_bool() == Some(true))
        .count();
    let mut d = Done {
        chunks: keys.len() as u64,
        hits: hit as u64,
        get_bytes: 0,
        put_bytes: 0,
        get_missing: 0,
        duplicates: 0,
        put_failures: 0,
        lookup_done,
    };
    if hit > 0 {
        let (status, body) = conn.call(
            &json_post(&st.host, "/api/v1/objects/batch_get", &keys[..hit]),
            &[],
        )?;
        if status != 200 {
            return Err(format!("batch_get answered {status}"));
        }
        let mut pos = 0;
        while pos + 8 <= body.len() {
            let n = u64::from_be_bytes(body[pos..pos + 8].try_into().expect("8 bytes"));
            pos += 8;
            if n == u64::MAX {
                d.get_missing += 1;
            } else {
                pos += n as usize;
                d.get_bytes += n;
            }
        }
    }
    // Put the chunks after the hit prefix, as few requests as the limits allow.
    let chunk = st.chunk.len();
    let mut i = hit;
    while i < keys.len() {
        let mut target = String::from("/api/v1/objects/batch_put?keys=");
        let mut sizes = String::new();
        let first = i;
        while i < keys.len()
            && (i == first
                || (target.len() + sizes.len() + keys[i].len() < PUT_TARGET_BYTES
                    && ((i - first + 1) * chunk) as u64 <= PUT_BODY_BYTES))
        {
            if i > first {
                target.push(',');
                sizes.push(',');
            }
            target.push_str(&keys[i]);
            sizes.push_str(&chunk.to_string());
            i += 1;
        }
        let n = i - first;
        let head = format!(
            "POST {target}&sizes={sizes} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
            st.host,
            n * chunk
        );
        let pieces: Vec<&[u8]> = (0..n).map(|_| st.chunk.as_slice()).collect();
        let (status, body) = conn.call(head.as_bytes(), &pieces)?;
        if status != 200 {
            return Err(format!("batch_put answered {status}"));
        }
        let text = String::from_utf8_lossy(&body);
        let dup = text.matches("Duplicated").count() as u64;
        let failed = text.matches("\"success\":false").count() as u64;
        d.duplicates += dup;
        d.put_failures += failed.saturating_sub(dup);
        d.put_bytes += ((n as u64).saturating_sub(failed)) * chunk as u64;
    }
    Ok(d)
}

fn worker(st: Arc<Setup>, w: usize) -> Stats {
    let mut stats = Stats::new();
    stats.timeline = Some(Timeline::new(st.warm, st.end - st.warm));
    let mut rng = XorShift::new(st.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ w as u64);
    let mut next_due = st
        .interval
        .map(|iv| st.start + iv / st.connections as u32 * w as u32);
    let mut conn: Option<Conn> = None;
    loop {
        let now = Instant::now();
        match next_due {
            Some(due) if due >= st.end || now >= st.stop => break,
            None if now >= st.end => break,
            _ => {}
        }
        let mut intended = now;
        if let (Some(iv), Some(due)) = (st.interval, next_due) {
            if due > now {
                std::thread::sleep(due - now);
            }
            intended = due;
            next_due = Some(due + iv);
        }
        let p = st.sampler.sample(&mut rng);
        let keys = chain_keys(&st.model, p, st.chain, st.shared, st.groups);
        if conn.is_none() {
            match Conn::open(st.addr, st.timeout) {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    if Instant::now() >= st.warm {
                        stats.c.errors += 1;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
        }
        let sent = Instant::now();
        let out = prompt(conn.as_mut().expect("open"), &st, &keys);
        let t = Instant::now();
        let counted = if st.interval.is_some() {
            intended >= st.warm && intended < st.end
        } else {
            t >= st.warm && t < st.end
        };
        match out {
            Ok(d) => {
                if counted {
                    let c = &mut stats.c;
                    c.prompts += 1;
                    c.chunks += d.chunks;
                    c.hits += d.hits;
                    c.full_hits += u64::from(d.hits == d.chunks);
                    c.get_bytes += d.get_bytes;
                    c.put_bytes += d.put_bytes;
                    c.get_missing += d.get_missing;
                    c.duplicates += d.duplicates;
                    c.put_failures += d.put_failures;
                    stats.lookup.saturating_record(us(d.lookup_done - intended));
                    stats
                        .lookup_sent
                        .saturating_record(us(d.lookup_done - sent));
                    stats.transfer.saturating_record(us(t - d.lookup_done));
                    stats.request.saturating_record(us(t - intended));
                    stats.request_sent.saturating_record(us(t - sent));
                    if let Some(tl) = &mut stats.timeline {
                        tl.record(t, us(t - intended));
                    }
                }
            }
            Err(_) => {
                if counted {
                    stats.c.errors += 1;
                }
                conn = None;
            }
        }
    }
    stats
}

fn pcts(h: &Histogram<u64>, n: u64) -> Value {
    if n == 0 {
        return Value::Null;
    }
    json!({
        "p50": h.value_at_quantile(0.5),
        "p90": h.value_at_quantile(0.9),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
        "mean": (h.mean() * 100.0).round() / 100.0,
    })
}

fn secs(name: &str, v: f64, zero_ok: bool) -> Result<Duration, String> {
    if !(v.is_finite() && v <= 86_400.0 && (v > 0.0 || (zero_ok && v == 0.0))) {
        return Err(format!(
            "invalid --{name} {v}: expected seconds up to 86400"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Runs the workload, prints the figures (and writes the report) and returns them.
pub fn run(a: &Args) -> Result<Value, String> {
    let addr = units::resolve_target(&a.target)?;
    let chunk_bytes = units::parse_bytes(&a.chunk_bytes)?;
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_bytes) {
        return Err(format!(
            "invalid --chunk-bytes {}: expected 16KiB to 2MiB",
            a.chunk_bytes
        ));
    }
    if a.connections == 0 || a.connections > 1024 {
        return Err("invalid --connections: expected 1 to 1024".into());
    }
    if a.chain == 0 || a.chain > MAX_CHAIN {
        return Err(format!(
            "invalid --chain {}: expected 1 to {MAX_CHAIN}",
            a.chain
        ));
    }
    let shared = a.shared.unwrap_or(a.chain / 2);
    if shared > a.chain {
        return Err(format!(
            "invalid --shared {shared}: at most --chain {}",
            a.chain
        ));
    }
    if a.pool == 0 || a.groups == 0 {
        return Err("invalid --pool or --groups: expected at least 1".into());
    }
    let dist =
        KeyDist::parse(&a.prompt_dist).map_err(|e| e.replace("--key-dist", "--prompt-dist"))?;
    let duration = secs("duration", a.duration, false)?;
    let warmup = secs("warmup", a.warmup, true)?;
    let timeout = secs("timeout", a.timeout, false)?;
    let interval = match a.rate {
        None => None,
        Some(r) if r.is_finite() && r > 0.0 && r <= 1e6 => {
            Some(Duration::from_secs_f64(a.connections as f64 / r))
        }
        Some(r) => {
            return Err(format!(
                "invalid --rate {r}: expected more than 0 and at most 1000000"
            ));
        }
    };
    let start = Instant::now();
    let warm = start + warmup;
    let end = warm + duration;
    let st = Arc::new(Setup {
        addr,
        host: a.target.clone(),
        model: a.model.clone(),
        chain: a.chain,
        shared,
        groups: a.groups,
        chunk: Arc::new((0..chunk_bytes).map(|i| (i % 251) as u8).collect()),
        sampler: dist.sampler(a.pool),
        seed: a.seed,
        start,
        warm,
        end,
        stop: if interval.is_some() {
            end + timeout
        } else {
            end
        },
        interval,
        connections: a.connections,
        timeout,
    });
    let handles: Vec<_> = (0..a.connections)
        .map(|w| {
            let st = st.clone();
            std::thread::Builder::new()
                .name(format!("kvcache-{w}"))
                .spawn(move || worker(st, w))
                .map_err(|e| format!("cannot start a worker: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let pid = a.cpu_pid.map(|p| p.to_string());
    std::thread::sleep(warm.saturating_duration_since(Instant::now()));
    let cpu0 = pid.as_deref().map(procstat::cpu_ticks).transpose()?;
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    let cpu1 = pid
        .as_deref()
        .map(procstat::cpu_ticks)
        .transpose()
        .ok()
        .flatten();
    let mut total = Stats::new();
    for h in handles {
        let s = h.join().map_err(|_| "a worker panicked".to_string())?;
        total.merge(&s);
    }
    let c = &total.c;
    let secs = duration.as_secs_f64();
    let bytes = c.get_bytes + c.put_bytes;
    let cpu_s = match (cpu0, cpu1) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 / procstat::clk_tck() as f64),
        _ => None,
    };
    let r2 = |v: f64| (v * 100.0).round() / 100.0;
    let figures = json!({
        "mode": "kvcache",
        "target": a.target,
        "connections": a.connections,
        "rate": a.rate,
        "warmup_s": warmup.as_secs_f64(),
        "duration_s": secs,
        "pool": a.pool,
        "chain": a.chain,
        "shared": shared,
        "groups": a.groups,
        "chunk_bytes": chunk_bytes,
        "prompt_dist": a.prompt_dist,
        "seed": a.seed,
        "prompts": c.prompts,
        "prompts_per_s": r2(c.prompts as f64 / secs),
        "chunks_looked_up": c.chunks,
        "chunks_hit": c.hits,
        "hit_ratio": if c.chunks > 0 { (c.hits as f64 / c.chunks as f64 * 1e4).round() / 1e4 } else { 0.0 },
        "full_hit_prompts": c.full_hits,
        "bytes": { "get": c.get_bytes, "put": c.put_bytes, "total": bytes },
        "bytes_per_s": r2(bytes as f64 / secs),
        "get_missing": c.get_missing,
        "put_duplicates": c.duplicates,
        "put_failures": c.put_failures,
        "errors": c.errors,
        "latency_basis": if interval.is_some() {
            "intended start (corrected for coordinated omission)"
        } else {
            "start of the prompt (closed loop: nothing to correct)"
        },
        "latency_us": {
            "lookup": pcts(&total.lookup, c.prompts),
            "transfer": pcts(&total.transfer, c.prompts),
            "request": pcts(&total.request, c.prompts),
        },
        "latency_uncorrected_us": {
            "lookup": pcts(&total.lookup_sent, c.prompts),
            "request": pcts(&total.request_sent, c.prompts),
        },
        "server_cpu_pid": a.cpu_pid,
        "server_cpu_us_per_req": cpu_s.filter(|_| c.prompts > 0).map(|s| r2(s * 1e6 / c.prompts as f64)),
        "server_cpu_s_per_gb": cpu_s.filter(|_| bytes > 0).map(|s| (s / (bytes as f64 / 1e9) * 1e4).round() / 1e4),
    });
    if a.json {
        println!("{figures}");
    } else {
        println!(
            "kvcache {}: {} connections, {:.1} s: {} prompts ({:.1}/s), hit ratio {:.3}, {:.1} MB/s (get {:.1}, put {:.1}), errors {}",
            a.target,
            a.connections,
            secs,
            c.prompts,
            c.prompts as f64 / secs,
            figures["hit_ratio"].as_f64().unwrap_or(0.0),
            bytes as f64 / secs / 1e6,
            c.get_bytes as f64 / secs / 1e6,
            c.put_bytes as f64 / secs / 1e6,
            c.errors
        );
        println!(
            "latency (µs, from {}): lookup {}  transfer {}  request {}",
            figures["latency_basis"].as_str().unwrap_or(""),
            figures["latency_us"]["lookup"],
            figures["latency_us"]["transfer"],
            figures["latency_us"]["request"]
        );
        if let (Some(us), Some(gb)) = (
            figures["server_cpu_us_per_req"].as_f64(),
            figures["server_cpu_s_per_gb"].as_f64(),
        ) {
            println!("server {us:.1} µs CPU per prompt, {gb:.3} CPU s per GB moved");
        }
    }
    if let Some(dir) = &a.report {
        let empty = Timeline::new(warm, duration);
        report::write(
            dir,
            &figures,
            &[
                ("lookup".into(), &total.lookup),
                ("transfer".into(), &total.transfer),
                ("request".into(), &total.request),
            ],
            total.timeline.as_ref().unwrap_or(&empty),
        )?;
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_share_their_group_prefix() {
        let a = chain_keys("m", 1, 6, 3, 4);
        let b = chain_keys("m", 5, 6, 3, 4); // same group (5 mod 4 = 1)
        let c = chain_keys("m", 2, 6, 3, 4);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        assert_ne!(a[0], c[0]);
        assert_eq!(a, chain_keys("m", 1, 6, 3, 4));
        let parts: Vec<&str> = a[0].split('@').collect();
        assert_eq!(parts.len(), 5, "{}", a[0]);
        assert_eq!(
            (parts[0], parts[1], parts[2], parts[4]),
            ("m", "1", "0", "bfloat16")
        );
        assert_eq!(parts[3].len(), 16);
    }
}
