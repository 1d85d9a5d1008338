//! `mmc-perf`: a fixed-concurrency, keep-alive HTTP/1.1 load generator for `mmc-server`.
//!
//! `--connections` connections spread over `--threads` load threads, each thread one monoio
//! runtime (io_uring, epoll fallback) driving all its connections; every connection keeps
//! `--pipeline` requests in flight, drawn from a weighted mix of `--request` lines. Latencies
//! go to an HDR histogram (µs, 3 significant digits); responses completed during the warm-up
//! are not counted. With `--cpu-pid` the server's utime+stime is read from `/proc/PID/stat`
//! at the start and end of the measured window, giving its CPU µs per request.
//!
//! The run is bounded: it ends by itself at warm-up + duration; a connection that makes no
//! progress for `--timeout` seconds is shut down, counted as an error and reopened.
//!
//! Subcommands serve the scenarios of `perf/scenarios.sh`: `memcpy` (this machine's copy
//! bandwidth), `fill` (store many small objects through batch_put), `drain` (read one long
//! response, e.g. `/get_all_keys`, at a limited rate while sampling the server's RSS) and
//! `kv-sub` (a KV-event subscriber that counts what it receives). `kvcache` is a KV-cache
//! workload of LMCache prefix chains (`kvcache.rs`); `--report DIR` writes the figures and SVG
//! charts and `compare` draws several reports together (`report.rs`). With `--rate` the
//! latencies are corrected for coordinated omission (from each request's intended start).

mod drain;
mod fill;
mod kvcache;
mod kvsub;
mod load;
mod memcpy;
mod mix;
mod procstat;
mod report;
mod response;
mod units;
mod zipf;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use load::{DriverChoice, Plan, Stats};
use mix::Mix;

#[derive(Parser, Debug)]
#[command(
    name = "mmc-perf",
    version,
    about = "Keep-alive HTTP/1.1 load generator for mmc-server (fixed concurrency, HDR latencies, \
             server CPU per request)",
    after_help = "Example:\n  mmc-perf --target 127.0.0.1:8000 --connections 64 --duration 8 \\\n    \
                  --request \"GET /metadata?key={key} 9\" --request \"PUT /metadata?key={key} 1\" \\\n    \
                  --keys 1000 --preload --body-bytes 16 --cpu-pid $SERVER_PID --pin 1 --json",
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    tool: Option<Tool>,

    /// Server address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "HOST:PORT")]
    target: String,

    /// Open connections (fixed concurrency).
    #[arg(long, default_value_t = 64, value_name = "N")]
    connections: usize,

    /// Measured duration in seconds (fractions allowed).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    duration: f64,

    /// Warm-up in seconds before the measured window (not counted).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    warmup: f64,

    /// Load threads; connections are spread over them.
    #[arg(long, default_value_t = 1, value_name = "T")]
    threads: usize,

    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1, value_name = "D")]
    pipeline: usize,

    /// Report the CPU µs per request of this process (the server), from /proc/PID/stat.
    #[arg(long, value_name = "PID")]
    cpu_pid: Option<u32>,

    /// Pin the load threads to this CPU.
    #[arg(long, value_name = "CPU")]
    pin: Option<usize>,

    /// Print one JSON object instead of the readable summary.
    #[arg(long)]
    json: bool,

    /// A request of the mix: "METHOD PATH[?QUERY] [WEIGHT]"; repeatable. Default: "GET /health".
    #[arg(long = "request", value_name = "SPEC")]
    requests: Vec<String>,

    /// Body size of PUT and POST requests.
    #[arg(long, default_value_t = 0, value_name = "N")]
    body_bytes: usize,

    /// Distinct keys: `{key}` in a path becomes key-<i>, i in 0..N drawn by --key-dist.
    #[arg(long, value_name = "N")]
    keys: Option<u64>,

    /// Before the run, PUT every key once on every keyed path of the mix (so GETs hit).
    /// The value is --body-bytes long (16 bytes when --body-bytes is 0).
    #[arg(long)]
    preload: bool,

    /// io driver of the load threads.
    #[arg(
        long = "io-driver",
        default_value = "auto",
        value_name = "auto|uring|epoll"
    )]
    io_driver: String,

    /// Connect, read and write timeout in seconds (no progress for this long is an error).
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    timeout: f64,

    /// Total requests per second, spread evenly over the connections: each connection has a
    /// fixed schedule of intended starts, one per interval; no slot is skipped, a connection
    /// behind its schedule (a late answer) sends its overdue requests at once, and latency is
    /// measured from the intended start (corrected for coordinated omission, as wrk2 does;
    /// the uncorrected latencies, from the actual send, are reported beside). The requests
    /// due in the measured window are counted, answered up to --timeout after it. Needs
    /// --pipeline 1. Default: each connection sends as soon as it has its answer (closed loop).
    #[arg(long, value_name = "REQ/S")]
    rate: Option<f64>,

    /// Popularity of the `{key}` indices: uniform, or zipf:S (Zipf with exponent S, e.g.
    /// zipf:0.99: key-0 the most popular, P(key-i) ∝ (i+1)^-S).
    #[arg(long, default_value = "uniform", value_name = "uniform|zipf:S")]
    key_dist: String,

    /// Seed of the key and mix choices (each connection draws from its own stream derived
    /// from it): the same seed gives the same sequence of requests per connection.
    #[arg(long, default_value_t = 0, value_name = "N")]
    seed: u64,

    /// Write the JSON figures (report.json) and SVG charts (latency.svg: latency by
    /// percentile; timeline.svg: throughput and p99 over time) into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,

    /// The first number that `{seq}` in a path becomes (then +1 per request, over all threads).
    #[arg(long, default_value_t = 0, value_name = "N")]
    seq_start: u64,

    /// A header line every request carries after `Host` ("Name: value"); repeatable (e.g.
    /// "Accept: application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
    /// encoding=delimited" for the protobuf `/metrics`).
    #[arg(long = "header", value_name = "LINE")]
    headers: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum Tool {
    /// Measure this machine's memcpy bandwidth for the given sizes (one thread).
    Memcpy(memcpy::Args),
    /// Store many small objects through POST /api/v1/objects/batch_put.
    Fill(fill::Args),
    /// GET one long response (e.g. /get_all_keys), optionally reading it slowly, while
    /// sampling the resident memory of a process (the server).
    Drain(drain::Args),
    /// Subscribe to the KV events of a server and count what arrives.
    KvSub(kvsub::Args),
    /// A KV-cache workload: prompts as prefix chains of LMCache chunk keys, looked up
    /// (batch_exist), their longest hit prefix read (batch_get), the rest stored (batch_put).
    #[command(after_help = kvcache::HELP)]
    Kvcache(kvcache::Args),
    /// Draw the reports of two or more runs (their --report directories) on one chart each.
    Compare(CompareArgs),
}

#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// Report directories of the runs (each with its report.json).
    #[arg(required = true, num_args = 2.., value_name = "DIR")]
    dirs: Vec<std::path::PathBuf>,

    /// Where to write compare.json, latency.svg and timeline.svg.
    #[arg(long, value_name = "DIR")]
    out: std::path::PathBuf,
}

/// Largest accepted values, so a typo cannot exhaust memory or descriptors.
const MAX_CONNECTIONS: usize = 100_000;
const MAX_PIPELINE: usize = 4096;
const MAX_BODY_BYTES: usize = 64 << 20;
const MAX_SECONDS: f64 = 24.0 * 3600.0;

fn seconds(name: &str, v: f64, allow_zero: bool) -> Result<Duration, String> {
    let ok = v.is_finite() && v <= MAX_SECONDS && (v > 0.0 || (allow_zero && v == 0.0));
    if !ok {
        return Err(format!(
            "invalid --{name} {v}: expected {} seconds up to {MAX_SECONDS}",
            if allow_zero {
                "0 or more"
            } else {
                "more than 0"
            }
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

struct Config {
    addr: SocketAddr,
    threads: usize,
    duration: Duration,
    warmup: Duration,
    io_timeout: Duration,
    driver: DriverChoice,
    mix: Arc<Mix>,
    /// Per connection, with `--rate`.
    interval: Option<Duration>,
}

fn validate(args: &Args) -> Result<Config, String> {
    let addr = crate::units::resolve_target(&args.target)?;
    if args.connections == 0 || args.connections > MAX_CONNECTIONS {
        return Err(format!(
            "invalid --connections {}: expected 1 to {MAX_CONNECTIONS}",
            args.connections
        ));
    }
    if args.threads == 0 {
        return Err("invalid --threads 0: expected at least 1".into());
    }
    if args.pipeline == 0 || args.pipeline > MAX_PIPELINE {
        return Err(format!(
            "invalid --pipeline {}: expected 1 to {MAX_PIPELINE}",
            args.pipeline
        ));
    }
    if args.body_bytes > MAX_BODY_BYTES {
        return Err(format!(
            "invalid --body-bytes {}: at most {MAX_BODY_BYTES}",
            args.body_bytes
        ));
    }
    let specs = if args.requests.is_empty() {
        mix::default_specs()
    } else {
        args.requests
            .iter()
            .map(|s| mix::parse_spec(s))
            .collect::<Result<Vec<_>, _>>()?
    };
    if let Some(bad) = args
        .headers
        .iter()
        .find(|h| !h.contains(':') || h.contains(['\r', '\n']))
    {
        return Err(format!(
            "invalid --header {bad:?}: one \"Name: value\" line"
        ));
    }
    // The extra header lines follow the Host line's value, each on its own line.
    let host = std::iter::once(args.target.as_str())
        .chain(args.headers.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("\r\n");
    let mix = Mix::new(specs, &host, args.body_bytes, args.keys, args.seq_start)?
        .with_key_dist(&zipf::KeyDist::parse(&args.key_dist)?);
    if args.preload && mix.keys == 0 {
        return Err("--preload needs a --request path with {key} (and --keys N)".into());
    }
    let interval = match args.rate {
        None => None,
        Some(r) if !(r.is_finite() && r > 0.0 && r <= 10_000_000.0) => {
            return Err(format!(
                "invalid --rate {r}: expected more than 0 and at most 10000000 requests per second"
            ));
        }
        Some(_) if args.pipeline != 1 => {
            return Err("--rate needs --pipeline 1".into());
        }
        Some(r) => Some(Duration::from_secs_f64(args.connections as f64 / r)),
    };
    Ok(Config {
        addr,
        threads: args.threads.min(args.connections),
        duration: seconds("duration", args.duration, false)?,
        warmup: seconds("warmup", args.warmup, true)?,
        io_timeout: seconds("timeout", args.timeout, false)?,
        driver: DriverChoice::parse(&args.io_driver).map_err(|allowed| {
            format!(
                "invalid --io-driver {:?}: expected {allowed}",
                args.io_driver
            )
        })?,
        mix: Arc::new(mix),
        interval,
    })
}

type ThreadResult = Result<(Stats, &'static str), String>;

/// Waits until `t`, but returns at once with the error of a load thread that failed to start
/// (e.g. `--pin` refused, io_uring forced but unavailable). Results of threads that finished
/// early are kept in `early`.
fn wait_until(
    t: Instant,
    rx: &mpsc::Receiver<ThreadResult>,
    early: &mut Vec<(Stats, &'static str)>,
) -> Result<(), String> {
    loop {
        let left = t.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        match rx.recv_timeout(left) {
            Ok(Ok(r)) => early.push(r),
            Ok(Err(e)) => return Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => return Ok(()),
            // Every thread has reported already.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(left);
                return Ok(());
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(tool) = &args.tool {
        let out = match tool {
            Tool::Memcpy(a) => memcpy::main(a),
            Tool::Fill(a) => fill::main(a),
            Tool::Drain(a) => drain::main(a),
            Tool::KvSub(a) => kvsub::main(a),
            Tool::Kvcache(a) => kvcache::run(a).map(|_| ()),
            Tool::Compare(a) => report::compare(&a.dirs, &a.out),
        };
        return match out {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mmc-perf: {e}");
                // Argument errors are found before anything runs.
                if e.starts_with("invalid ") {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                }
            }
        };
    }
    let cfg = match validate(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mmc-perf: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args, cfg) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmc-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the load, prints the summary (or JSON) and returns the JSON figures.
fn run(args: &Args, cfg: Config) -> Result<Value, String> {
    let preload = if args.preload {
        let value_bytes = if args.body_bytes == 0 {
            16
        } else {
            args.body_bytes
        };
        let reqs = cfg.mix.preload_requests(&args.target, value_bytes);
        let n = reqs.requests.len();
        let started = Instant::now();
        let p = load::preload(
            cfg.addr,
            reqs,
            args.connections.min(16),
            cfg.driver,
            cfg.io_timeout,
            started + Duration::from_secs(300),
        )?;
        debug_assert_eq!(p.requests, n as u64);
        if !args.json {
            println!(
                "preload: {} PUTs, {} ok ({} business failures), {} failed, {:.2} s",
                p.requests,
                p.ok,
                p.business_failures,
                p.failed,
                started.elapsed().as_secs_f64()
            );
        }
        Some(p)
    } else {
        None
    };

    let start = Instant::now();
    let warm = start + cfg.warmup;
    let end = warm + cfg.duration;
    let plan = Arc::new(Plan {
        addr: cfg.addr,
        mix: cfg.mix.clone(),
        pipeline: args.pipeline,
        warm,
        end,
        io_timeout: cfg.io_timeout,
        driver: cfg.driver,
        interval: cfg.interval,
        start,
        stop: if cfg.interval.is_some() {
            end + cfg.io_timeout
        } else {
            end
        },
        connections: args.connections,
        seed: args.seed,
    });

    let (tx, rx) = mpsc::channel();
    let per = args.connections / cfg.threads;
    let extra = args.connections % cfg.threads;
    let mut first = 0;
    for t in 0..cfg.threads {
        let n = per + usize::from(t < extra);
        let (plan, tx, pin) = (plan.clone(), tx.clone(), args.pin);
        std::thread::Builder::new()
            .name(format!("load-{t}"))
            .spawn(move || {
                let _ = tx.send(load::run_thread(plan, first, n, pin));
            })
            .map_err(|e| format!("cannot start a load thread: {e}"))?;
        first += n;
    }
    drop(tx);

    // CPU time of the server and of this process over the measured window.
    let pid = args.cpu_pid.map(|p| p.to_string());
    let mut early = Vec::new();
    wait_until(warm, &rx, &mut early)?;
    let server0 = pid.as_deref().map(procstat::cpu_ticks).transpose()?;
    let self0 = procstat::cpu_ticks("self").ok();
    wait_until(end, &rx, &mut early)?;
    let server1 = match pid.as_deref().map(procstat::cpu_ticks).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("mmc-perf: {e} (did the server exit during the run?)");
            None
        }
    };
    let self1 = procstat::cpu_ticks("self").ok();

    // Collect the threads; never wait past the I/O timeout plus slack.
    let give_up = end + cfg.io_timeout + Duration::from_secs(2);
    let mut total = Stats::new();
    let mut drivers: Vec<&'static str> = Vec::new();
    let mut missing = cfg.threads;
    for (stats, driver) in early {
        total.merge(&stats);
        if !drivers.contains(&driver) {
            drivers.push(driver);
        }
        missing -= 1;
    }
    while missing > 0 {
        let left = give_up.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok((stats, driver))) => {
                total.merge(&stats);
                if !drivers.contains(&driver) {
                    drivers.push(driver);
                }
                missing -= 1;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                eprintln!("mmc-perf: {missing} load thread(s) did not finish in time");
                break;
            }
        }
    }

    let secs = cfg.duration.as_secs_f64();
    let server_us = match (server0, server1) {
        (Some(a), Some(b)) => procstat::us_per_request(b.saturating_sub(a), total.requests),
        _ => None,
    };
    let client_us = match (self0, self1) {
        (Some(a), Some(b)) => procstat::us_per_request(b.saturating_sub(a), total.requests),
        _ => None,
    };
    let report = Report {
        args,
        cfg: &cfg,
        stats: &total,
        secs,
        server_us,
        client_us,
        drivers: drivers.join("+"),
        preload,
    };
    let figures = report.json();
    if let Some(dir) = &args.report {
        let curves: Vec<(String, &Histogram<u64>)> = if report.corrected() {
            vec![
                ("corrected".into(), &total.hist),
                ("uncorrected".into(), &total.hist_sent),
            ]
        } else {
            vec![("latency".into(), &total.hist)]
        };
        let empty = report::Timeline::new(warm, cfg.duration);
        let timeline = total.timeline.as_ref().unwrap_or(&empty);
        report::write(dir, &figures, &curves, timeline)?;
    }
    if args.json {
        println!("{figures}");
    } else {
        print!("{}", report.text());
    }
    Ok(figures)
}

struct Report<'a> {
    args: &'a Args,
    cfg: &'a Config,
    stats: &'a Stats,
    secs: f64,
    server_us: Option<f64>,
    client_us: Option<f64>,
    drivers: String,
    preload: Option<load::Preload>,
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// p50, p90, p99, p99.9, max and mean of `h` (µs), or None without responses.
fn latency_of(h: &Histogram<u64>, requests: u64) -> Option<[(&'static str, f64); 6]> {
    (requests > 0).then(|| {
        [
            ("p50", h.value_at_quantile(0.50) as f64),
            ("p90", h.value_at_quantile(0.90) as f64),
            ("p99", h.value_at_quantile(0.99) as f64),
            ("p999", h.value_at_quantile(0.999) as f64),
            ("max", h.max() as f64),
            ("mean", round2(h.mean())),
        ]
    })
}

fn latency_json(l: Option<[(&'static str, f64); 6]>) -> Value {
    match l {
        Some(l) => Value::Object(
            l.iter()
                .map(|(k, v)| {
                    let v = if *k == "mean" {
                        json!(v)
                    } else {
                        json!(*v as u64)
                    };
                    (k.to_string(), v)
                })
                .collect(),
        ),
        None => Value::Null,
    }
}

impl Report<'_> {
    fn rps(&self) -> f64 {
        self.stats.requests as f64 / self.secs
    }

    fn status_codes(&self) -> BTreeMap<usize, u64> {
        self.stats
            .status
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c, *n))
            .collect()
    }

    fn status_classes(&self) -> [(String, u64); 5] {
        let sum = |lo: usize| self.stats.status[lo..lo + 100].iter().sum::<u64>();
        [
            ("1xx".into(), sum(100)),
            ("2xx".into(), sum(200)),
            ("3xx".into(), sum(300)),
            ("4xx".into(), sum(400)),
            ("5xx".into(), sum(500)),
        ]
    }

    /// Latencies are measured from the intended start (corrected) with `--rate`.
    fn corrected(&self) -> bool {
        self.cfg.interval.is_some()
    }

    fn latency_basis(&self) -> &'static str {
        if self.corrected() {
            "intended start (corrected for coordinated omission)"
        } else {
            "send (closed loop: no schedule, nothing to correct)"
        }
    }

    fn latency(&self) -> Option<[(&'static str, f64); 6]> {
        latency_of(&self.stats.hist, self.stats.requests)
    }

    fn latency_uncorrected(&self) -> Option<[(&'static str, f64); 6]> {
        latency_of(&self.stats.hist_sent, self.stats.requests)
    }

    fn json(&self) -> Value {
        let e = &self.stats.errors;
        let status: serde_json::Map<String, Value> = self
            .status_codes()
            .into_iter()
            .map(|(c, n)| (c.to_string(), json!(n)))
            .collect();
        let classes: serde_json::Map<String, Value> = self
            .status_classes()
            .into_iter()
            .map(|(c, n)| (c, json!(n)))
            .collect();
        let mix: Vec<Value> = self
            .cfg
            .mix
            .entries
            .iter()
            .map(|e| {
                json!({
                    "method": e.spec.method,
                    "path": e.spec.target,
                    "weight": e.spec.weight,
                })
            })
            .collect();
        json!({
            "target": self.args.target,
            "connections": self.args.connections,
            "threads": self.cfg.threads,
            "pipeline": self.args.pipeline,
            "io_driver": self.drivers,
            "warmup_s": self.cfg.warmup.as_secs_f64(),
            "duration_s": self.secs,
            "requests": self.stats.requests,
            "errors": e.total(),
            "errors_detail": {
                "connect": e.connect,
                "read": e.read,
                "write": e.write,
                "eof": e.eof,
                "timeout": e.timeout,
                "parse": e.parse,
            },
            "unanswered": self.stats.unanswered,
            "connects": self.stats.connects,
            "business_failures": self.stats.business_failures,
            "rps": round2(self.rps()),
            "rate": self.args.rate,
            "body_bytes_per_s": {
                "sent": round2(self.stats.sent_body_bytes as f64 / self.secs),
                "received": round2(self.stats.received_body_bytes as f64 / self.secs),
            },
            "status": status,
            "status_class": classes,
            "latency_us": latency_json(self.latency()),
            "latency_basis": self.latency_basis(),
            "latency_uncorrected_us": latency_json(self.latency_uncorrected()),
            "server_cpu_pid": self.args.cpu_pid,
            "server_cpu_us_per_req": self.server_us.map(round2),
            "client_cpu_us_per_req": self.client_us.map(round2),
            "keys": self.args.keys,
            "key_dist": self.args.key_dist,
            "seed": self.args.seed,
            "body_bytes": self.args.body_bytes,
            "preload": self.preload.map(|p| json!({
                "requests": p.requests, "ok": p.ok, "failed": p.failed,
                "business_failures": p.business_failures,
            })),
            "mix": mix,
        })
    }

    fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let e = &self.stats.errors;
        let _ = writeln!(
            s,
            "target {}: {} connections on {} thread(s) ({}), pipeline {}, {:.1} s measured after {:.1} s warm-up",
            self.args.target,
            self.args.connections,
            self.cfg.threads,
            self.drivers,
            self.args.pipeline,
            self.secs,
            self.cfg.warmup.as_secs_f64()
        );
        let mix: Vec<String> = self
            .cfg
            .mix
            .entries
            .iter()
            .map(|e| format!("{} {} x{}", e.spec.method, e.spec.target, e.spec.weight))
            .collect();
        let _ = writeln!(s, "mix      {}", mix.join(", "));
        let _ = writeln!(
            s,
            "requests {} ({:.1} req/s), errors {} (connect {}, read {}, write {}, eof {}, timeout {}, parse {})",
            self.stats.requests,
            self.rps(),
            e.total(),
            e.connect,
            e.read,
            e.write,
            e.eof,
            e.timeout,
            e.parse
        );
        let codes: Vec<String> = self
            .status_codes()
            .into_iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect();
        let _ = writeln!(
            s,
            "status   {} (business failures: {})",
            codes.join(", "),
            self.stats.business_failures
        );
        let _ = writeln!(
            s,
            "bodies   sent {:.1} MB/s, received {:.1} MB/s",
            self.stats.sent_body_bytes as f64 / self.secs / 1e6,
            self.stats.received_body_bytes as f64 / self.secs / 1e6
        );
        match (self.latency(), self.latency_uncorrected()) {
            (Some(l), Some(u)) => {
                let parts = |l: &[(&str, f64)]| {
                    l.iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join("  ")
                };
                let _ = writeln!(
                    s,
                    "latency  (µs, from {}) {}",
                    self.latency_basis(),
                    parts(&l)
                );
                if self.corrected() {
                    let _ = writeln!(s, "  uncorrected (µs, from the actual send) {}", parts(&u));
                }
            }
            _ => {
                let _ = writeln!(s, "latency  (no responses)");
            }
        }
        if let Some(pid) = self.args.cpu_pid {
            match self.server_us {
                Some(us) => {
                    let _ = writeln!(s, "server   {us:.2} µs CPU per request (pid {pid})");
                }
                None => {
                    let _ = writeln!(
                        s,
                        "server   CPU per request unknown (no requests, or the process exited)"
                    );
                }
            }
        }
        if let Some(us) = self.client_us {
            let _ = writeln!(s, "client   {us:.2} µs CPU per request (mmc-perf itself)");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["mmc-perf"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).expect("arguments parse")
    }

    #[test]
    fn defaults() {
        let a = args(&[]);
        assert_eq!(a.connections, 64);
        assert_eq!(a.duration, 10.0);
        assert_eq!(a.warmup, 1.0);
        assert_eq!(a.threads, 1);
        assert_eq!(a.pipeline, 1);
        let c = validate(&a).unwrap();
        assert_eq!(c.mix.entries.len(), 1);
        assert_eq!(c.mix.entries[0].spec.target, "/health");
    }

    #[test]
    fn validation() {
        assert!(validate(&args(&["--duration", "0.5", "--warmup", "0"])).is_ok());
        for bad in [
            &["--connections", "0"][..],
            &["--duration", "0"],
            &["--duration=-1"],
            &["--warmup=-1"],
            &["--pipeline", "0"],
            &["--threads", "0"],
            &["--target", "nowhere"],
            &["--request", "GET nopath"],
            &["--request", "GET /m?key={key}"],
            &["--preload"],
            &["--io-driver", "kqueue"],
            &["--rate", "0"],
            &["--rate", "100", "--pipeline", "2"],
            &["--rate", "inf"],
            &["--key-dist", "zipf:0"],
            &["--key-dist", "pareto"],
        ] {
            assert!(validate(&args(bad)).is_err(), "{bad:?} should be refused");
        }
        let c = validate(&args(&["--connections", "2", "--threads", "8"])).unwrap();
        assert_eq!(c.threads, 2);
        let c = validate(&args(&["--connections", "4", "--rate", "40"])).unwrap();
        assert_eq!(c.interval, Some(Duration::from_millis(100)));
    }

    /// A tiny HTTP server that answers `ok` at once, except that it stalls once: every answer
    /// due between 2 s and 3 s after its first request waits until 3 s.
    fn stalling_server() -> SocketAddr {
        use std::io::{Read, Write};
        use std::sync::OnceLock;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let first: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                let first = first.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let t0 = *first.get_or_init(Instant::now);
                            let (from, to) =
                                (t0 + Duration::from_secs(2), t0 + Duration::from_secs(3));
                            let now = Instant::now();
                            if now >= from && now < to {
                                std::thread::sleep(to - now);
                            }
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            if s.write_all(ok).is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk) {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                });
            }
        });
        addr
    }

    /// Coordinated omission: a 1 s stall at 1000 req/s delays ~1000 intended requests by up
    /// to a second; the corrected p99 shows it and every intended request is sent.
    #[test]
    fn a_stall_shows_in_the_corrected_latencies() {
        let addr = stalling_server().to_string();
        let a = args(&[
            "--target",
            &addr,
            "--rate",
            "1000",
            "--duration",
            "5",
            "--warmup",
            "0",
            "--connections",
            "16",
            "--timeout",
            "3",
            "--json",
        ]);
        let cfg = validate(&a).unwrap();
        let started = Instant::now();
        let out = run(&a, cfg).unwrap();
        assert!(started.elapsed() < Duration::from_secs(12));
        assert_eq!(
            out["requests"], 5000,
            "every intended request is sent: {out}"
        );
        assert_eq!(out["errors"], 0, "{out}");
        let p99 = out["latency_us"]["p99"].as_u64().unwrap();
        let raw_p99 = out["latency_uncorrected_us"]["p99"].as_u64().unwrap();
        assert!(p99 >= 500_000, "corrected p99 {p99} µs: {out}");
        assert!(p99 < 1_500_000, "corrected p99 {p99} µs: {out}");
        // Only the one request per connection in flight during the stall waited from its send.
        assert!(raw_p99 < 100_000, "uncorrected p99 {raw_p99} µs: {out}");
        assert!(out["latency_basis"].as_str().unwrap().contains("corrected"));
    }

    #[test]
    fn subcommands_parse() {
        let a = args(&["memcpy", "--sizes", "64KiB,1MiB", "--secs", "0.5"]);
        assert!(matches!(a.tool, Some(Tool::Memcpy(_))));
        let a = args(&["fill", "--keys", "10"]);
        assert!(matches!(a.tool, Some(Tool::Fill(_))));
        let a = args(&["drain", "--path", "/get_all_keys", "--rate-bytes", "4MiB"]);
        assert!(matches!(a.tool, Some(Tool::Drain(_))));
        let a = args(&[
            "kv-sub",
            "--endpoint",
            "tcp://127.0.0.1:5557",
            "--secs",
            "1",
        ]);
        assert!(matches!(a.tool, Some(Tool::KvSub(_))));
        // Load options belong to the load run, not to a subcommand.
        assert!(Args::try_parse_from(["mmc-perf", "--connections", "2", "memcpy"]).is_err());
    }
}
