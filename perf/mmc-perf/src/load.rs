//! The load itself: one monoio runtime per load thread, many keep-alive connections per
//! runtime, each keeping `pipeline` requests in flight.
//!
//! Hot path per response: frame it in the read buffer, take the send time of the oldest
//! request in flight, record the latency. Time is read once per write and once per read.
//! There is no timer per read: a watchdog task per thread shuts down the socket of a
//! connection that has waited longer than the I/O timeout (which completes its pending read or
//! write on either io driver) and, at the end of the run, of every connection.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use mmc::shards::runtime;
pub use mmc::shards::runtime::DriverChoice;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::mix::{Mix, Preloads, XorShift};
use crate::response::{self, Framed};

/// Latency histogram bounds: 1 µs to 60 s, 3 significant digits.
pub const HIST_MAX_US: u64 = 60_000_000;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds")
}

/// Runs the future made by `make` on a fresh monoio runtime of this thread, built the way the
/// server builds its shards' (io_uring with `COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN`,
/// else plain io_uring, else epoll, unless the choice forbids it). Returns the output and the
/// driver's name.
pub fn block_on<F, Fut>(
    choice: DriverChoice,
    make: F,
) -> Result<(Fut::Output, &'static str), String>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    runtime::run_shard(choice, 1024, 0, |kind| {
        let fut = make();
        async move { (fut.await, kind.name()) }
    })
}

/// What every load thread shares.
pub struct Plan {
    pub addr: SocketAddr,
    pub mix: Arc<Mix>,
    pub pipeline: usize,
    /// Responses completed in `[warm, end)` are counted.
    pub warm: Instant,
    pub end: Instant,
    pub io_timeout: Duration,
    pub driver: DriverChoice,
    /// `--rate`: each connection has one request due every interval (pipeline 1), on a fixed
    /// schedule from `start`; responses are counted by their intended start, and latency is
    /// measured from it (corrected for coordinated omission).
    pub interval: Option<Duration>,
    /// Where the paced schedule begins (the run's start, before the warm-up).
    pub start: Instant,
    /// Hard end: `end` for a closed loop; for a paced run `end` plus the I/O timeout, so the
    /// requests due before `end` that a stalled server delayed are still sent and answered.
    pub stop: Instant,
    /// Connections in the whole run (to spread paced connections over one interval).
    pub connections: usize,
    /// `--seed`: connection i draws its keys and mix entries from stream `seed`, `i`.
    pub seed: u64,
}

/// Failures, each counted once per event (the connection is then reopened).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Errors {
    pub connect: u64,
    pub read: u64,
    pub write: u64,
    /// The server closed the connection with requests in flight, without `Connection: close`.
    pub eof: u64,
    /// No progress for the I/O timeout (connect, read or write).
    pub timeout: u64,
    /// A response that could not be framed.
    pub parse: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.eof + self.timeout + self.parse
    }

    pub fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.read += o.read;
        self.write += o.write;
        self.eof += o.eof;
        self.timeout += o.timeout;
        self.parse += o.parse;
    }
}

#[derive(Clone, Copy, Debug)]
enum ErrorKind {
    Connect,
    Read,
    Write,
    Eof,
    Timeout,
    Parse,
}

/// The measured results of one thread (or, merged, of the run).
pub struct Stats {
    /// The headline latencies: from each request's intended start with `--rate` (corrected
    /// for coordinated omission), else from its send (a closed loop has no schedule).
    pub hist: Histogram<u64>,
    /// Latencies from the actual send (what a load generator without correction reports).
    pub hist_sent: Histogram<u64>,
    pub requests: u64,
    /// Responses by exact status code (index = code, 0..1000).
    pub status: Vec<u64>,
    pub errors: Errors,
    /// Requests in flight on a connection the server closed with `Connection: close`.
    pub unanswered: u64,
    /// Connections opened (including reconnects), during the whole run.
    pub connects: u64,
    /// Counted responses that are business failures of mmc-server (HTTP 200 with
    /// `{"success":false`, or a batch answer with a failed item).
    pub business_failures: u64,
    /// Request body bytes of the counted responses' requests.
    pub sent_body_bytes: u64,
    /// Response body bytes of the counted responses.
    pub received_body_bytes: u64,
    /// Responses and headline latencies per time bucket (`--report`).
    pub timeline: Option<crate::report::Timeline>,
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            hist: new_histogram(),
            hist_sent: new_histogram(),
            requests: 0,
            status: vec![0; 1000],
            errors: Errors::default(),
            unanswered: 0,
            connects: 0,
            business_failures: 0,
            sent_body_bytes: 0,
            received_body_bytes: 0,
            timeline: None,
        }
    }

    pub fn merge(&mut self, o: &Stats) {
        self.hist
            .add(&o.hist)
            .expect("histograms with equal bounds");
        self.hist_sent
            .add(&o.hist_sent)
            .expect("histograms with equal bounds");
        self.requests += o.requests;
        for (a, b) in self.status.iter_mut().zip(&o.status) {
            *a += b;
        }
        self.errors.add(&o.errors);
        self.unanswered += o.unanswered;
        self.connects += o.connects;
        self.business_failures += o.business_failures;
        self.sent_body_bytes += o.sent_body_bytes;
        self.received_body_bytes += o.received_body_bytes;
        match (&mut self.timeline, &o.timeline) {
            (Some(a), Some(b)) => a.merge(b),
            (None, Some(b)) => self.timeline = Some(b.clone()),
            _ => {}
        }
    }
}

/// A connection as the watchdog sees it.
struct Slot {
    /// The open socket, or -1 between connections.
    fd: Cell<RawFd>,
    /// Blocked in a read or write.
    waiting: Cell<bool>,
    /// Last write or read completion.
    progress: Cell<Instant>,
    /// Set by the watchdog when it shut the socket down for lack of progress.
    timed_out: Cell<bool>,
}

struct Ctx {
    plan: Arc<Plan>,
    stats: RefCell<Stats>,
    slots: RefCell<Vec<Rc<Slot>>>,
    live: Cell<usize>,
}

impl Ctx {
    fn in_window(&self, t: Instant) -> bool {
        t >= self.plan.warm && t < self.plan.end
    }

    fn error(&self, kind: ErrorKind) {
        if !self.in_window(Instant::now()) {
            return;
        }
        let mut s = self.stats.borrow_mut();
        let e = &mut s.errors;
        match kind {
            ErrorKind::Connect => e.connect += 1,
            ErrorKind::Read => e.read += 1,
            ErrorKind::Write => e.write += 1,
            ErrorKind::Eof => e.eof += 1,
            ErrorKind::Timeout => e.timeout += 1,
            ErrorKind::Parse => e.parse += 1,
        }
    }
}

/// Runs `conns` connections (global indices `first..first + conns`) on this thread until the
/// end of the plan. Returns the thread's stats and the io driver used.
pub fn run_thread(
    plan: Arc<Plan>,
    first: usize,
    conns: usize,
    pin: Option<usize>,
) -> Result<(Stats, &'static str), String> {
    if let Some(cpu) = pin {
        runtime::pin_to(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    }
    let driver = plan.driver;
    block_on(driver, move || async move {
        let mut stats = Stats::new();
        stats.timeline = Some(crate::report::Timeline::new(
            plan.warm,
            plan.end.saturating_duration_since(plan.warm),
        ));
        let ctx = Rc::new(Ctx {
            plan,
            stats: RefCell::new(stats),
            slots: RefCell::new(Vec::with_capacity(conns)),
            live: Cell::new(conns),
        });
        let mut handles = Vec::with_capacity(conns);
        for c in 0..conns {
            let slot = Rc::new(Slot {
                fd: Cell::new(-1),
                waiting: Cell::new(false),
                progress: Cell::new(Instant::now()),
                timed_out: Cell::new(false),
            });
            ctx.slots.borrow_mut().push(slot.clone());
            handles.push(monoio::spawn(connection(
                ctx.clone(),
                slot,
                (first + c) as u64,
            )));
        }
        let dog = monoio::spawn(watchdog(ctx.clone()));
        for h in handles {
            h.await;
        }
        dog.await;
        ctx.stats.replace(Stats::new())
    })
}

/// Shuts down sockets that made no progress for the I/O timeout, and every socket at the end.
async fn watchdog(ctx: Rc<Ctx>) {
    let plan = ctx.plan.clone();
    loop {
        let now = Instant::now();
        let next = if now < plan.stop {
            (now + Duration::from_millis(50)).min(plan.stop)
        } else {
            now + Duration::from_millis(20)
        };
        monoio::time::sleep_until(monoio::time::Instant::from_std(next)).await;
        if ctx.live.get() == 0 {
            return;
        }
        let now = Instant::now();
        let ending = now >= plan.stop;
        for slot in ctx.slots.borrow().iter() {
            let fd = slot.fd.get();
            if fd < 0 {
                continue;
            }
            let stalled =
                slot.waiting.get() && now.duration_since(slot.progress.get()) >= plan.io_timeout;
            if ending || stalled {
                if stalled && !ending {
                    slot.timed_out.set(true);
                }
                // Completes the pending read or write with end-of-file or an error; the
                // connection task then drops (closes) the socket.
                // SAFETY: `fd` is the open socket of a live connection: the slot is reset to
                // -1 before its stream is dropped, and nothing awaits in between.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        }
    }
}

enum Outcome {
    /// The run is over.
    Done,
    /// The server closed after a `Connection: close` response: reconnect, no error.
    Reconnect,
    Failed(ErrorKind),
}

async fn connection(ctx: Rc<Ctx>, slot: Rc<Slot>, seed: u64) {
    let plan = ctx.plan.clone();
    // Seed 0 gives connection i the stream of seed i, as before --seed existed.
    let mut rng = XorShift::new(plan.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed);
    let mut rbuf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut wbuf: Vec<u8> = Vec::with_capacity(4096);
    let mut inflight: VecDeque<InFlight> = VecDeque::with_capacity(plan.pipeline);
    let mut backoff = Duration::from_millis(10);
    // Paced connections' schedules are spread over one interval, not all at once.
    let mut next_due = plan.interval.map(|iv| {
        let share = (seed as usize % plan.connections.max(1)) as u32;
        plan.start + iv / plan.connections.max(1) as u32 * share
    });
    loop {
        let now = Instant::now();
        if plan.finished(now, next_due) {
            break;
        }
        let deadline = (now + plan.io_timeout).min(plan.stop);
        let connect = monoio::time::timeout_at(
            monoio::time::Instant::from_std(deadline),
            TcpStream::connect_addr(plan.addr),
        )
        .await;
        let mut stream = match connect {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => {
                ctx.error(ErrorKind::Connect);
                // Do not spin on a refused port: back off, up to half a second.
                let wake = (Instant::now() + backoff).min(plan.stop);
                monoio::time::sleep_until(monoio::time::Instant::from_std(wake)).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
            Err(_) => {
                ctx.error(ErrorKind::Timeout);
                continue;
            }
        };
        backoff = Duration::from_millis(10);
        let _ = stream.set_nodelay(true);
        ctx.stats.borrow_mut().connects += 1;
        slot.fd.set(stream.as_raw_fd());
        slot.timed_out.set(false);
        rbuf.clear();
        wbuf.clear();
        inflight.clear();
        let outcome = drive(
            &ctx,
            &slot,
            &mut stream,
            &mut rng,
            &mut rbuf,
            &mut wbuf,
            &mut inflight,
            &mut next_due,
        )
        .await;
        slot.fd.set(-1);
        slot.waiting.set(false);
        drop(stream);
        match outcome {
            Outcome::Done => break,
            Outcome::Reconnect => {
                ctx.stats.borrow_mut().unanswered += inflight.len() as u64;
            }
            Outcome::Failed(kind) => {
                let kind = if slot.timed_out.get() {
                    ErrorKind::Timeout
                } else {
                    kind
                };
                ctx.error(kind);
            }
        }
    }
    ctx.live.set(ctx.live.get() - 1);
}

/// A request sent and not yet answered.
struct InFlight {
    /// When it was due (`--rate`), else when it was sent.
    intended: Instant,
    sent: Instant,
    /// It was a HEAD (its response has no body).
    head: bool,
    body_bytes: usize,
}

/// Writes `wbuf` (emptied, its capacity kept) and then `rest`, if any.
async fn send(
    slot: &Slot,
    stream: &mut TcpStream,
    wbuf: &mut Vec<u8>,
    rest: Option<Bytes>,
) -> std::io::Result<()> {
    slot.progress.set(Instant::now());
    slot.waiting.set(true);
    let (res, mut buf) = stream.write_all(std::mem::take(wbuf)).await;
    buf.clear();
    *wbuf = buf;
    let res = match (res, rest) {
        (Ok(_), Some(rest)) => stream.write_all(rest).await.0.map(|_| ()),
        (res, _) => res.map(|_| ()),
    };
    slot.waiting.set(false);
    res
}

/// Sends and reads on one open connection until the run ends or the connection fails.
#[allow(clippy::too_many_arguments)]
async fn drive(
    ctx: &Ctx,
    slot: &Slot,
    stream: &mut TcpStream,
    rng: &mut XorShift,
    rbuf: &mut Vec<u8>,
    wbuf: &mut Vec<u8>,
    inflight: &mut VecDeque<InFlight>,
    next_due: &mut Option<Instant>,
) -> Outcome {
    let plan = &*ctx.plan;
    let mix = &*plan.mix;
    let mut pos = 0usize;
    let mut t_read = Instant::now();
    loop {
        let mut now = Instant::now();
        if plan.finished(now, *next_due) {
            return Outcome::Done;
        }
        // Paced: wait for this connection's next slot. The schedule is fixed: no slot is
        // skipped, and a connection that fell behind (a late answer) sends its overdue
        // requests at once, one after the other, each measured from when it was due; so a
        // stall of the server shows in the histogram as the wait its users would have had.
        // The timer wakes up to a millisecond late; that lateness is made up by the following
        // slots, so intervals under a millisecond still give the asked rate.
        let mut intended = now;
        if let (Some(iv), Some(due)) = (plan.interval, *next_due) {
            if due > now {
                monoio::time::sleep_until(monoio::time::Instant::from_std(due)).await;
                now = Instant::now();
            }
            intended = due;
            *next_due = Some(due + iv);
        }
        // Refill the pipeline. A large body's shared rest goes out right after its head.
        while inflight.len() < plan.pipeline {
            let i = mix.choose(rng);
            let w = mix.write_request(i, rng, wbuf);
            inflight.push_back(InFlight {
                intended,
                sent: now,
                head: w.is_head,
                body_bytes: mix.entries[i].body_bytes,
            });
            if w.body_rest.is_some() && send(slot, stream, wbuf, w.body_rest).await.is_err() {
                return ended_or(plan, ErrorKind::Write);
            }
        }
        if !wbuf.is_empty() && send(slot, stream, wbuf, None).await.is_err() {
            return ended_or(plan, ErrorKind::Write);
        }
        // Read until at least one response is complete.
        let mut completed = false;
        loop {
            let mut want = 0;
            while let Some(f) = inflight.front() {
                match response::frame(&rbuf[pos..], f.head) {
                    Framed::Complete {
                        status,
                        len,
                        head_len,
                        close,
                        interim,
                    } => {
                        let body = &rbuf[pos + head_len..pos + len];
                        pos += len;
                        if interim {
                            continue;
                        }
                        // Paced requests count by when they were due, so that every slot of
                        // the window is in, however late its answer came.
                        let counted = if plan.interval.is_some() {
                            ctx.in_window(f.intended)
                        } else {
                            ctx.in_window(t_read)
                        };
                        if counted {
                            let us = t_read.duration_since(f.intended).as_micros() as u64;
                            let sent_us = t_read.duration_since(f.sent).as_micros() as u64;
                            let mut s = ctx.stats.borrow_mut();
                            s.hist.saturating_record(us.max(1));
                            s.hist_sent.saturating_record(sent_us.max(1));
                            if let Some(tl) = &mut s.timeline {
                                tl.record(t_read, us);
                            }
                            s.requests += 1;
                            s.status[(status as usize).min(999)] += 1;
                            s.business_failures += u64::from(response::business_failure(body));
                            s.sent_body_bytes += f.body_bytes as u64;
                            s.received_body_bytes += body.len() as u64;
                        }
                        inflight.pop_front();
                        completed = true;
                        if close {
                            return Outcome::Reconnect;
                        }
                    }
                    Framed::Partial { total } => {
                        want = total.unwrap_or(0).saturating_sub(rbuf.len() - pos);
                        break;
                    }
                    Framed::Invalid(_) => return Outcome::Failed(ErrorKind::Parse),
                }
            }
            if inflight.is_empty() && pos < rbuf.len() {
                // Bytes nobody asked for.
                return Outcome::Failed(ErrorKind::Parse);
            }
            if pos == rbuf.len() {
                rbuf.clear();
                pos = 0;
            } else if pos > 0 {
                rbuf.drain(..pos);
                pos = 0;
            }
            if completed {
                break;
            }
            rbuf.reserve(want.max(8 * 1024));
            let len = rbuf.len();
            slot.waiting.set(true);
            let (res, slice) = stream.read(std::mem::take(rbuf).slice_mut(len..)).await;
            slot.waiting.set(false);
            *rbuf = slice.into_inner();
            t_read = Instant::now();
            slot.progress.set(t_read);
            match res {
                Ok(0) => return ended_or(plan, ErrorKind::Eof),
                Ok(_) => {}
                Err(_) => return ended_or(plan, ErrorKind::Read),
            }
        }
    }
}

impl Plan {
    /// The run is over for a connection: a closed loop at `end`; a paced connection once its
    /// last slot before `end` is answered (between requests), or at the hard `stop`.
    fn finished(&self, now: Instant, next_due: Option<Instant>) -> bool {
        match next_due {
            Some(due) if self.interval.is_some() => due >= self.end || now >= self.stop,
            _ => now >= self.end,
        }
    }
}

fn ended_or(plan: &Plan, kind: ErrorKind) -> Outcome {
    if Instant::now() >= plan.stop {
        Outcome::Done
    } else {
        Outcome::Failed(kind)
    }
}

/// Result of `--preload`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Preload {
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    /// Of the `ok` answers, business failures of mmc-server (`{"success":false`, or a batch
    /// answer with a failed item).
    pub business_failures: u64,
}

/// Requests pipelined per batch, and the bytes a batch stops growing at.
const PRELOAD_BATCH: usize = 32;
const PRELOAD_BATCH_BYTES: usize = 1 << 20;

/// Sends every request of `reqs` once over `conns` connections (batches of up to 32 pipelined
/// requests or about 1 MiB), before `deadline`. A 2xx answer is `ok`; anything else, or no
/// answer, `failed`.
pub fn preload(
    addr: SocketAddr,
    reqs: Preloads,
    conns: usize,
    driver: DriverChoice,
    io_timeout: Duration,
    deadline: Instant,
) -> Result<Preload, String> {
    preload_traced(addr, reqs, conns, driver, io_timeout, deadline).map(|(p, _)| p)
}

/// [`preload`], with when each 2xx answer arrived: (time, index of its request).
pub fn preload_traced(
    addr: SocketAddr,
    reqs: Preloads,
    conns: usize,
    driver: DriverChoice,
    io_timeout: Duration,
    deadline: Instant,
) -> Result<(Preload, Vec<(Instant, usize)>), String> {
    let Preloads {
        requests: reqs,
        body_rest,
    } = reqs;
    let conns = conns.clamp(1, reqs.len().max(1));
    let per = reqs.len().div_ceil(conns).max(1);
    let reqs = Rc::new(reqs);
    let (out, _) = block_on(driver, move || async move {
        let total = Rc::new(RefCell::new(Preload {
            requests: reqs.len() as u64,
            ..Preload::default()
        }));
        let trace = Rc::new(RefCell::new(Vec::new()));
        let mut handles = Vec::new();
        for c in 0..conns {
            let (lo, hi) = ((c * per).min(reqs.len()), ((c + 1) * per).min(reqs.len()));
            let (reqs, total, rest) = (reqs.clone(), total.clone(), body_rest.clone());
            let trace = trace.clone();
            handles.push(monoio::spawn(async move {
                let answered = |i: usize| trace.borrow_mut().push((Instant::now(), lo + i));
                let (ok, business) =
                    preload_conn(addr, &reqs[lo..hi], rest, io_timeout, deadline, answered).await;
                let mut t = total.borrow_mut();
                t.ok += ok;
                t.failed += (hi - lo) as u64 - ok;
                t.business_failures += business;
            }));
        }
        for h in handles {
            h.await;
        }
        let t = *total.borrow();
        (t, trace.take())
    })?;
    Ok(out)
}

/// Returns (2xx answers, business failures among them).
async fn preload_conn(
    addr: SocketAddr,
    reqs: &[Vec<u8>],
    body_rest: Option<Bytes>,
    io_timeout: Duration,
    deadline: Instant,
    mut answered_ok: impl FnMut(usize),
) -> (u64, u64) {
    let step_deadline =
        || monoio::time::Instant::from_std((Instant::now() + io_timeout).min(deadline));
    let mut ok = 0u64;
    let mut business = 0u64;
    let rest_len = body_rest.as_ref().map_or(0, Bytes::len);
    let mut done = 0usize;
    let mut stream = None;
    let mut rbuf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut wbuf: Vec<u8> = Vec::new();
    let mut retries = 0;
    while done < reqs.len() && Instant::now() < deadline && retries < 3 {
        if stream.is_none() {
            match monoio::time::timeout_at(step_deadline(), TcpStream::connect_addr(addr)).await {
                Ok(Ok(s)) => stream = Some(s),
                _ => {
                    retries += 1;
                    continue;
                }
            }
        }
        let s = stream.as_mut().expect("connected");
        let mut n = 0;
        let mut bytes = 0;
        while done + n < reqs.len() && n < PRELOAD_BATCH && (n == 0 || bytes < PRELOAD_BATCH_BYTES)
        {
            bytes += reqs[done + n].len() + rest_len;
            n += 1;
        }
        let batch = &reqs[done..done + n];
        let mut written = true;
        wbuf.clear();
        for (i, r) in batch.iter().enumerate() {
            wbuf.extend_from_slice(r);
            let last = i + 1 == batch.len();
            if body_rest.is_none() && !last {
                continue;
            }
            let write =
                monoio::time::timeout_at(step_deadline(), s.write_all(std::mem::take(&mut wbuf)))
                    .await;
            match write {
                Ok((Ok(_), mut b)) => {
                    b.clear();
                    wbuf = b;
                }
                _ => {
                    written = false;
                    break;
                }
            }
            if let Some(rest) = &body_rest {
                let write =
                    monoio::time::timeout_at(step_deadline(), s.write_all(rest.clone())).await;
                if !matches!(write, Ok((Ok(_), _))) {
                    written = false;
                    break;
                }
            }
        }
        if !written {
            // The batch is lost; count it as failed and go on with a new connection.
            done += batch.len();
            stream = None;
            retries += 1;
            continue;
        }
        let mut answered = 0;
        let mut pos = 0;
        rbuf.clear();
        let mut broken = false;
        while answered < batch.len() {
            match response::frame(&rbuf[pos..], false) {
                Framed::Complete {
                    status,
                    len,
                    head_len,
                    close,
                    interim,
                } => {
                    let failed = response::business_failure(&rbuf[pos + head_len..pos + len]);
                    pos += len;
                    if interim {
                        continue;
                    }
                    answered += 1;
                    if (200..300).contains(&status) {
                        ok += 1;
                        business += u64::from(failed);
                        answered_ok(done + answered - 1);
                    }
                    if close {
                        broken = true;
                        break;
                    }
                    continue;
                }
                Framed::Partial { .. } => {}
                Framed::Invalid(_) => {
                    broken = true;
                    break;
                }
            }
            rbuf.reserve(16 * 1024);
            let len = rbuf.len();
            let read = monoio::time::timeout_at(
                step_deadline(),
                s.read(std::mem::take(&mut rbuf).slice_mut(len..)),
            )
            .await;
            match read {
                Ok((Ok(n), slice)) if n > 0 => rbuf = slice.into_inner(),
                _ => {
                    broken = true;
                    break;
                }
            }
        }
        done += batch.len();
        if broken {
            stream = None;
            retries += 1;
        }
    }
    (ok, business)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener};

    use super::*;
    use crate::mix::parse_spec;

    /// Takes the first whole request (head and `Content-Length` body) off `buf`.
    fn next_request(buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
        if buf.len() < end + 4 + len {
            return None;
        }
        let body = buf[end + 4..end + 4 + len].to_vec();
        buf.drain(..end + 4 + len);
        Some((head, body))
    }

    /// A tiny blocking HTTP server for the tests: answers `ok` (no body for HEAD), and every
    /// `close_every`-th response on a connection carries `Connection: close` and ends it.
    fn test_server(close_every: usize) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let mut served = 0;
                    loop {
                        while let Some((head, _)) = next_request(&mut buf) {
                            served += 1;
                            let close = close_every > 0 && served % close_every == 0;
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n{}\r\n{}",
                                if close { "Connection: close\r\n" } else { "" },
                                if head.starts_with("HEAD ") { "" } else { "ok" }
                            );
                            if s.write_all(resp.as_bytes()).is_err() {
                                return;
                            }
                            if close {
                                // Linger until the client closes, so no reset destroys the answer.
                                let _ = s.shutdown(Shutdown::Write);
                                while matches!(s.read(&mut chunk), Ok(n) if n > 0) {}
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

    fn plan(addr: SocketAddr, pipeline: usize, secs: f64) -> Arc<Plan> {
        plan_on(addr, pipeline, secs, DriverChoice::Auto)
    }

    fn plan_on(addr: SocketAddr, pipeline: usize, secs: f64, driver: DriverChoice) -> Arc<Plan> {
        let mix = Mix::new(
            vec![
                parse_spec("GET /metadata?key={key} 3").unwrap(),
                parse_spec("PUT /metadata?key={key} 1").unwrap(),
                parse_spec("HEAD /health 1").unwrap(),
            ],
            "test",
            10,
            Some(50),
            0,
        )
        .unwrap();
        let start = Instant::now();
        let warm = start + Duration::from_millis(50);
        let end = warm + Duration::from_secs_f64(secs);
        Arc::new(Plan {
            addr,
            mix: Arc::new(mix),
            pipeline,
            warm,
            end,
            start,
            stop: end,
            io_timeout: Duration::from_secs(2),
            driver,
            interval: None,
            connections: 4,
            seed: 0,
        })
    }

    #[test]
    fn pipelined_mix_with_server_closes() {
        let addr = test_server(7);
        for driver in [DriverChoice::Auto, DriverChoice::Epoll] {
            let p = plan_on(addr, 3, 0.3, driver);
            let started = Instant::now();
            let (stats, name) = run_thread(p, 0, 4, None).unwrap();
            assert!(started.elapsed() < Duration::from_secs(2));
            assert!(stats.requests > 20, "{name}: {} requests", stats.requests);
            assert_eq!(stats.errors, Errors::default(), "{name}");
            assert_eq!(stats.status[200], stats.requests);
            assert_eq!(stats.hist.len(), stats.requests);
            assert!(
                stats.connects > 4,
                "the server's closes made the client reconnect"
            );
            assert!(stats.unanswered > 0);
        }
    }

    /// A server that checks every request body is `abc...z` repeated and answers
    /// `{"success":true}`, or `{"success":false}` when the path starts with `/fail`
    /// (400 for a wrong body).
    fn checking_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = vec![0u8; 1 << 16];
                    loop {
                        while let Some((head, body)) = next_request(&mut buf) {
                            let good = body.iter().copied().eq(crate::mix::body(body.len()));
                            let answer: &str = if !good {
                                "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
                            } else if head.split(' ').nth(1).unwrap().starts_with("/fail") {
                                "HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{\"success\":false}"
                            } else {
                                "HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n{\"success\":true}"
                            };
                            if s.write_all(answer.as_bytes()).is_err() {
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

    fn plan_with(addr: SocketAddr, specs: &[&str], body_bytes: usize, secs: f64) -> Plan {
        let mix = Mix::new(
            specs.iter().map(|s| parse_spec(s).unwrap()).collect(),
            "test",
            body_bytes,
            None,
            0,
        )
        .unwrap();
        let start = Instant::now();
        let warm = start + Duration::from_millis(50);
        let end = warm + Duration::from_secs_f64(secs);
        Plan {
            addr,
            mix: Arc::new(mix),
            pipeline: 1,
            warm,
            end,
            start,
            stop: end,
            io_timeout: Duration::from_secs(2),
            driver: DriverChoice::Auto,
            interval: None,
            connections: 2,
            seed: 0,
        }
    }

    #[test]
    fn large_bodies_arrive_whole_and_failures_are_counted() {
        let addr = checking_server();
        let n = crate::mix::INLINE_BODY_BYTES + 100_000;
        let mut p = plan_with(addr, &["PUT /ok?k={seq} 1", "PUT /fail?k={seq} 1"], n, 0.4);
        p.pipeline = 2;
        let (stats, _) = run_thread(Arc::new(p), 0, 2, None).unwrap();
        assert!(stats.requests > 4, "{} requests", stats.requests);
        assert_eq!(stats.errors, Errors::default());
        assert_eq!(
            stats.status[200], stats.requests,
            "every body arrived intact"
        );
        assert_eq!(stats.sent_body_bytes, stats.requests * n as u64);
        assert!(
            stats.business_failures > 0 && stats.business_failures < stats.requests,
            "{} of {}",
            stats.business_failures,
            stats.requests
        );
        let oks = stats.requests - stats.business_failures;
        assert_eq!(
            stats.received_body_bytes,
            oks * 16 + stats.business_failures * 17
        );
    }

    /// Requests answered in `secs` over two connections, each paced one per `interval`.
    fn paced_requests(interval: Duration, secs: f64) -> u64 {
        let addr = checking_server();
        let mut p = plan_with(addr, &["GET /ok"], 0, secs);
        p.interval = Some(interval);
        p.stop = p.end + Duration::from_secs(1);
        let (stats, _) = run_thread(Arc::new(p), 0, 2, None).unwrap();
        assert_eq!(stats.errors, Errors::default());
        stats.requests
    }

    #[test]
    fn rate_paces_each_connection() {
        // 100 requests per second over 2 connections: one every 20 ms each.
        let n = paced_requests(Duration::from_millis(20), 0.6);
        assert!((40..=75).contains(&n), "{n} requests in 0.6 s at 100/s");
    }

    #[test]
    fn rate_holds_with_intervals_under_the_timer_granularity() {
        // 10 000 requests per second over 2 connections: one every 200 us each, below the
        // timer's millisecond. Pacing by the timer alone gave ~800 in 0.5 s; the lower bound
        // leaves room for a busy machine (tests run in parallel).
        let n = paced_requests(Duration::from_micros(200), 0.5);
        assert!(
            (2500..=5600).contains(&n),
            "{n} requests in 0.5 s at 10 000/s"
        );
    }

    #[test]
    fn a_dead_server_is_errors_not_a_hang() {
        // A port that was just free: connections are refused.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let started = Instant::now();
        let (stats, _) = run_thread(plan(addr, 1, 0.3), 0, 2, None).unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(stats.requests, 0);
        assert!(stats.errors.connect > 0);
    }

    #[test]
    fn a_silent_server_times_out() {
        // Accepted by the kernel (backlog), never answered.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut p = plan(addr, 1, 1.5);
        Arc::get_mut(&mut p).unwrap().io_timeout = Duration::from_millis(300);
        let started = Instant::now();
        let (stats, _) = run_thread(p, 0, 2, None).unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(stats.requests, 0);
        assert!(stats.errors.timeout > 0, "{:?}", stats.errors);
        drop(listener);
    }

    #[test]
    fn preload_counts_answers() {
        let addr = test_server(0);
        let reqs: Vec<Vec<u8>> = (0..100)
            .map(|i| {
                format!("PUT /m?key=key-{i} HTTP/1.1\r\nContent-Length: 1\r\n\r\nv").into_bytes()
            })
            .collect();
        let reqs = Preloads {
            requests: reqs,
            body_rest: None,
        };
        let p = preload(
            addr,
            reqs,
            3,
            DriverChoice::Auto,
            Duration::from_secs(2),
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!((p.requests, p.ok, p.failed), (100, 100, 0));
    }
}
