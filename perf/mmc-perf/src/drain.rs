//! `mmc-perf drain`: GETs one long response (by default `/get_all_keys`), optionally reading
//! it at a limited rate, and samples the resident memory of a process (the server) while it
//! streams. It answers two questions: how fast the server lists its keys, and whether it
//! buffers the listing (its RSS would then grow with the listing, most visibly when the
//! client reads slowly).
//!
//! The body is decoded (chunked, `Content-Length`, or up to the close) and its lines counted:
//! for `/get_all_keys` a line is a key.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::units::parse_bytes;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "HOST:PORT")]
    target: String,

    /// Path (and query) to GET.
    #[arg(long, default_value = "/get_all_keys", value_name = "PATH")]
    path: String,

    /// Read at most this many bytes per second (binary units allowed; 0: as fast as possible).
    #[arg(long, default_value = "0", value_name = "BYTES")]
    rate_bytes: String,

    /// Bytes asked for per read.
    #[arg(long, default_value = "16KiB", value_name = "BYTES")]
    read_bytes: String,

    /// SO_RCVBUF of the client socket (0: the kernel's autotuning). A small one keeps the
    /// bytes the client has not read yet on the server's side.
    #[arg(long, default_value = "0", value_name = "BYTES")]
    rcvbuf: String,

    /// Sample the resident set (from /proc/PID/statm) of this process during the transfer.
    #[arg(long, value_name = "PID")]
    rss_pid: Option<u32>,

    /// Period of the RSS samples, in milliseconds.
    #[arg(long, default_value_t = 1.0, value_name = "MS")]
    rss_interval_ms: f64,

    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    timeout: f64,

    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,

    /// Write report.json (the JSON figures) and charts into this directory: progress.svg
    /// (body MB received over time) and, with --rss-pid, rss.svg (the resident set over time).
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,
}

/// Decodes a chunked body incrementally.
#[derive(Debug, Default)]
pub struct Chunked {
    state: State,
    size: u64,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    /// Hex digits of a chunk size.
    #[default]
    Size,
    /// After `;`: a chunk extension, skipped up to the CR.
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// A trailer line (or the final empty line); `empty`: nothing on it yet.
    Trailer {
        empty: bool,
    },
    TrailerLf {
        empty: bool,
    },
    Done,
}

impl Chunked {
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes `input`, handing decoded body bytes to `data`. Returns the bytes consumed
    /// (less than `input.len()` only once the body is complete).
    pub fn feed(&mut self, input: &[u8], mut data: impl FnMut(&[u8])) -> Result<usize, String> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(d))
                            .ok_or("chunk size overflows")?;
                    }
                    b';' | b' ' | b'\t' => self.state = State::Extension,
                    b'\r' => self.state = State::SizeLf,
                    _ => return Err(format!("bad byte {b:#04x} in a chunk size")),
                },
                State::Extension => {
                    if b == b'\r' {
                        self.state = State::SizeLf;
                    }
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err("chunk size line without LF".into());
                    }
                    self.state = if self.size == 0 {
                        State::Trailer { empty: true }
                    } else {
                        State::Data
                    };
                }
                State::Data => {
                    let n = (self.size as usize).min(input.len() - i);
                    data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    self.state = State::Size;
                }
                State::Trailer { empty } => {
                    self.state = if b == b'\r' {
                        State::TrailerLf { empty }
                    } else {
                        State::Trailer { empty: false }
                    };
                }
                State::TrailerLf { empty } => {
                    if b != b'\n' {
                        return Err("trailer line without LF".into());
                    }
                    if empty {
                        self.state = State::Done;
                        return Ok(i + 1);
                    }
                    self.state = State::Trailer { empty: true };
                }
                State::Done => return Ok(i),
            }
            i += 1;
        }
        Ok(i)
    }
}

/// How the response body ends.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Chunked,
    Length(u64),
    Close,
}

/// Status and framing of a response head.
fn parse_head(head: &[u8]) -> Result<(u16, Framing), String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed response head".into()),
    }
    let status = resp.code.unwrap_or(0);
    let mut framing = Framing::Close;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding")
            && h.value.eq_ignore_ascii_case(b"chunked")
        {
            framing = Framing::Chunked;
        } else if h.name.eq_ignore_ascii_case("content-length") && framing == Framing::Close {
            let v = std::str::from_utf8(h.value).map_err(|_| "bad Content-Length")?;
            framing = Framing::Length(v.trim().parse().map_err(|_| "bad Content-Length")?);
        }
    }
    Ok((status, framing))
}

/// Samples the resident set of a process until stopped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(f64, u64)>>,
}

fn page_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// Resident bytes from the text of `/proc/PID/statm` (its second field, in pages).
pub fn statm_resident(text: &[u8], page: u64) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page)
}

/// Resident bytes of `pid` now.
fn rss_now(file: &std::fs::File, buf: &mut [u8], page: u64) -> Option<u64> {
    let n = file.read_at(buf, 0).ok()?;
    statm_resident(&buf[..n], page)
}

impl RssSampler {
    /// Samples (seconds since `t0`, bytes) every `every`.
    fn start(pid: u32, every: Duration, t0: Instant) -> Result<RssSampler, String> {
        let path = format!("/proc/{pid}/statm");
        let file = std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let page = page_bytes();
            let mut buf = [0u8; 256];
            let mut out = Vec::new();
            while !s.load(Relaxed) {
                if let Some(rss) = rss_now(&file, &mut buf, page) {
                    out.push((t0.elapsed().as_secs_f64(), rss));
                }
                std::thread::sleep(every);
            }
            out
        });
        Ok(RssSampler { stop, thread })
    }

    fn finish(self) -> Vec<(f64, u64)> {
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

pub struct Outcome {
    pub status: u16,
    pub body_bytes: u64,
    pub lines: u64,
    pub first_byte_s: f64,
    pub total_s: f64,
    /// (seconds since the start, body bytes received by then), after each read.
    pub progress: Vec<(f64, u64)>,
}

fn opt_bytes(name: &str, v: &str) -> Result<u64, String> {
    parse_bytes(v).map_err(|e| format!("invalid --{name}: {e}"))
}

/// The GET itself: returns once the body is complete.
fn transfer(args: &Args, t0: Instant) -> Result<Outcome, String> {
    let rate = opt_bytes("rate-bytes", &args.rate_bytes)?;
    let read_bytes = opt_bytes("read-bytes", &args.read_bytes)?.clamp(1, 16 << 20) as usize;
    let rcvbuf = opt_bytes("rcvbuf", &args.rcvbuf)?;
    let addr = crate::units::resolve_target(&args.target)?;
    let deadline = t0 + Duration::from_secs_f64(args.timeout);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| format!("socket: {e}"))?;
    if rcvbuf > 0 {
        sock.set_recv_buffer_size(rcvbuf as usize)
            .map_err(|e| format!("SO_RCVBUF: {e}"))?;
    }
    sock.connect_timeout(&addr.into(), Duration::from_secs(5))
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        args.path, args.target
    );
    let sent = Instant::now();
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = vec![0u8; read_bytes.max(16 << 10)];
    let mut pending: Vec<u8> = Vec::new();
    let mut first_byte = None;
    let mut raw = 0u64;
    let mut head: Option<(u16, Framing)> = None;
    let mut chunked = Chunked::default();
    let (mut body_bytes, mut lines) = (0u64, 0u64);
    let mut progress = Vec::new();
    loop {
        if Instant::now() >= deadline {
            return Err(format!("no complete answer within {} s", args.timeout));
        }
        let n = s
            .read(&mut buf[..read_bytes])
            .map_err(|e| format!("read: {e}"))?;
        let now = Instant::now();
        first_byte.get_or_insert(now);
        raw += n as u64;
        let mut data: &[u8] = &buf[..n];
        if head.is_none() {
            pending.extend_from_slice(data);
            let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                if n == 0 {
                    return Err("the connection closed before a response head".into());
                }
                continue;
            };
            head = Some(parse_head(&pending[..end + 4])?);
            pending.drain(..end + 4);
            data = &pending;
        }
        let mut count = |d: &[u8]| {
            body_bytes += d.len() as u64;
            lines += memchr::memchr_iter(b'\n', d).count() as u64;
        };
        let finished = match &head.as_ref().expect("head parsed").1 {
            Framing::Chunked => {
                chunked.feed(data, &mut count)?;
                if n == 0 && !chunked.done() {
                    return Err("the connection closed inside the chunked body".into());
                }
                chunked.done()
            }
            Framing::Length(len) => {
                count(data);
                if n == 0 && body_bytes < *len {
                    return Err("the connection closed before the whole body".into());
                }
                body_bytes >= *len
            }
            Framing::Close => {
                count(data);
                n == 0
            }
        };
        pending.clear();
        progress.push((now.duration_since(t0).as_secs_f64(), body_bytes));
        if finished {
            break;
        }
        if rate > 0 {
            // Hold the pace: `raw` bytes should take raw / rate seconds from the first byte.
            let due = first_byte.expect("set") + Duration::from_secs_f64(raw as f64 / rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
    }
    let end = Instant::now();
    Ok(Outcome {
        status: head.map_or(0, |h| h.0),
        body_bytes,
        lines,
        first_byte_s: first_byte.map_or(0.0, |t| t.duration_since(sent).as_secs_f64()),
        total_s: end.duration_since(sent).as_secs_f64(),
        progress,
    })
}

/// At most this many points per chart line (every k-th sample, and the last).
const MAX_POINTS: usize = 2000;

fn thin<T: Copy>(v: &[T]) -> Vec<T> {
    let step = v.len().div_ceil(MAX_POINTS).max(1);
    let mut out: Vec<T> = v.iter().copied().step_by(step).collect();
    if let Some(&last) = v.last()
        && (v.len() - 1) % step != 0
    {
        out.push(last);
    }
    out
}

/// `progress.svg`, and `rss.svg` when the resident set was sampled.
fn charts(out: &Outcome, rss: &[(f64, u64)]) -> Vec<crate::report::LineChart> {
    let mut charts = vec![crate::report::LineChart {
        file: "progress.svg".into(),
        title: "drain: body received".into(),
        x_desc: "time (s)".into(),
        y_desc: "MB".into(),
        log_x: false,
        series: vec![(
            "body MB".into(),
            thin(&out.progress)
                .iter()
                .map(|&(t, b)| (t, b as f64 / 1e6))
                .collect(),
        )],
    }];
    if !rss.is_empty() {
        charts.push(crate::report::LineChart {
            file: "rss.svg".into(),
            title: "drain: resident set of the sampled process".into(),
            x_desc: "time (s)".into(),
            y_desc: "MiB".into(),
            log_x: false,
            series: vec![(
                "RSS MiB".into(),
                thin(rss)
                    .iter()
                    .map(|&(t, b)| (t, b as f64 / 1048576.0))
                    .collect(),
            )],
        });
    }
    charts
}

pub fn main(args: &Args) -> Result<(), String> {
    if !(args.rss_interval_ms.is_finite() && args.rss_interval_ms >= 0.0) {
        return Err(format!(
            "invalid --rss-interval-ms {}",
            args.rss_interval_ms
        ));
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(format!("invalid --timeout {}", args.timeout));
    }
    let t0 = Instant::now();
    let every = Duration::from_secs_f64(args.rss_interval_ms / 1000.0);
    let (before, sampler) = match args.rss_pid {
        Some(pid) => {
            let path = format!("/proc/{pid}/statm");
            let file =
                std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
            let before = rss_now(&file, &mut [0u8; 256], page_bytes())
                .ok_or_else(|| format!("cannot read {path}"))?;
            (Some(before), Some(RssSampler::start(pid, every, t0)?))
        }
        None => (None, None),
    };
    let out = transfer(args, t0);
    let samples = sampler.map(RssSampler::finish).unwrap_or_default();
    let out = out?;
    let after = args.rss_pid.and_then(|pid| {
        let file = std::fs::File::open(format!("/proc/{pid}/statm")).ok()?;
        rss_now(&file, &mut [0u8; 256], page_bytes())
    });
    let max = samples.iter().map(|s| s.1).max();
    let growth = match (before, max) {
        (Some(b), Some(m)) => Some(m.saturating_sub(b)),
        _ => None,
    };
    let per_s = |v: u64| v as f64 / out.total_s.max(1e-9);
    let figures = json!({
        "path": args.path, "status": out.status, "body_bytes": out.body_bytes,
        "lines": out.lines, "first_byte_s": out.first_byte_s, "total_s": out.total_s,
        "lines_per_s": per_s(out.lines).round(), "body_bytes_per_s": per_s(out.body_bytes).round(),
        "rate_bytes": parse_bytes(&args.rate_bytes).unwrap_or(0),
        "rss_pid": args.rss_pid, "rss_samples": samples.len(),
        "rss_before_bytes": before, "rss_max_bytes": max, "rss_after_bytes": after,
        "rss_growth_max_bytes": growth,
    });
    if let Some(dir) = &args.report {
        crate::report::write_charts(dir, &figures, &charts(&out, &samples))?;
    }
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "{} {}: {} bytes, {} lines in {:.3} s ({:.0} lines/s, {:.1} MB/s), first byte after {:.1} ms",
            out.status,
            args.path,
            out.body_bytes,
            out.lines,
            out.total_s,
            per_s(out.lines),
            per_s(out.body_bytes) / 1e6,
            out.first_byte_s * 1e3
        );
        if let (Some(b), Some(m), Some(g)) = (before, max, growth) {
            println!(
                "rss of pid {}: {:.1} MiB before, {:.1} MiB max during ({} samples), growth {:.2} MiB, {:.1} MiB after",
                args.rss_pid.unwrap_or(0),
                b as f64 / 1048576.0,
                m as f64 / 1048576.0,
                samples.len(),
                g as f64 / 1048576.0,
                after.unwrap_or(0) as f64 / 1048576.0
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_steps(wire: &[u8], step: usize) -> (Vec<u8>, usize, bool) {
        let mut c = Chunked::default();
        let mut out = Vec::new();
        let mut used = 0;
        for part in wire.chunks(step) {
            used += c.feed(part, |d| out.extend_from_slice(d)).unwrap();
            if c.done() {
                break;
            }
        }
        (out, used, c.done())
    }

    #[test]
    fn chunked_bodies_decode_in_any_pieces() {
        let wire =
            b"5\r\nhello\r\n1;ext=1\r\n \r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 64] {
            let (out, used, done) = decode_in_steps(wire, step);
            assert!(done, "step {step}");
            assert_eq!(out, b"hello 0123456789abcdef", "step {step}");
            assert_eq!(used, wire.len() - 4, "stops before the next response");
        }
        let (out, _, done) = decode_in_steps(b"0\r\n\r\n", 1);
        assert!(done && out.is_empty());
        let (_, _, done) = decode_in_steps(b"3\r\nabc\r\n", 2);
        assert!(!done);
        for bad in [
            &b"zz\r\n"[..],
            b"3\r\nabcX\r\n",
            b"3\rX",
            b"ffffffffffffffffff\r\n",
        ] {
            let mut c = Chunked::default();
            assert!(
                c.feed(bad, |_| {}).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn heads_and_statm() {
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap(),
            (200, Framing::Chunked)
        );
        assert_eq!(
            parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\n\r\n").unwrap(),
            (404, Framing::Length(12))
        );
        assert_eq!(
            parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap(),
            (200, Framing::Close)
        );
        assert!(parse_head(b"nonsense\r\n\r\n").is_err());
        assert_eq!(
            statm_resident(b"1000 250 30 4 0 100 0\n", 4096),
            Some(250 * 4096)
        );
        assert_eq!(statm_resident(b"", 4096), None);
        let me = std::fs::File::open("/proc/self/statm").unwrap();
        assert!(rss_now(&me, &mut [0u8; 256], page_bytes()).unwrap() > 0);
    }

    #[test]
    fn drains_a_chunked_listing_at_a_limited_rate() {
        // A server that sends 2000 lines in chunks, then closes.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req).unwrap();
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for c in 0..20 {
                let text: String = (0..100).map(|i| format!("key-{c}-{i}\n")).collect();
                out.extend_from_slice(format!("{:x}\r\n{text}\r\n", text.len()).as_bytes());
            }
            out.extend_from_slice(b"0\r\n\r\n");
            s.write_all(&out).unwrap();
        });
        let args = Args {
            target: addr.to_string(),
            path: "/get_all_keys".into(),
            rate_bytes: "100KiB".into(),
            read_bytes: "1KiB".into(),
            rcvbuf: "0".into(),
            rss_pid: None,
            rss_interval_ms: 1.0,
            timeout: 10.0,
            json: true,
            report: None,
        };
        let t0 = Instant::now();
        let out = transfer(&args, t0).unwrap();
        assert_eq!(out.status, 200);
        assert_eq!(out.lines, 2000);
        // About 20 KiB of listing at 100 KiB/s: at least ~0.15 s.
        assert!(out.total_s > 0.1, "{} s", out.total_s);
        // The progress only grows, in time and bytes, and ends at the whole body.
        assert!(
            out.progress
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
        assert_eq!(out.progress.last().unwrap().1, out.body_bytes);
        let charts = charts(&out, &[(0.0, 1 << 20), (0.1, 2 << 20)]);
        assert_eq!(charts.len(), 2);
        assert!(charts[0].series[0].1.len() <= MAX_POINTS + 1);
        assert_eq!(charts[1].series[0].1[1], (0.1, 2.0));
    }
}
