//! The front ring (`--io-driver auto`, the default, and `ring`): a per-shard io_uring of our
//! own for the shard's plain-TCP listener and its connections, beside the shard's monoio
//! runtime, which stays the executor (handlers, timers, cross-shard inboxes, TLS, same-host
//! sockets, SSD files).
//! [docs/io-uring.md](../../../docs/io-uring.md) (*Integration plan*, steps 1-2) says why.
//!
//! - One multishot accept on the listener; one multishot receive per connection into the
//!   provided buffer ring (`bufring.rs`), whose bytes are copied to the connection at once and
//!   the buffer given back; the answers a pass collected leave in one `SEND` per connection.
//! - A monoio task, the *pump* ([`FrontRing::pump`]), owns the ring: each pass pushes the
//!   sends, publishes the returned buffers, and enters the ring once (`GETEVENTS`, which also
//!   runs `DEFER_TASKRUN` work), then hands the completions to the connections and yields to
//!   the other tasks. A pass that finds nothing parks on an eventfd registered with the ring,
//!   read through monoio; a connection that writes while the pump is parked kicks it.
//! - A connection is a [`RingStream`] (`stream.rs`), monoio's `AsyncReadRent +
//!   AsyncWriteRent`, so `conn::run` serves it unchanged (without `direct`: its answers go
//!   through the batched send). `conns.rs` holds a connection's state on the ring.
//!
//! Registered files, not direct descriptors: each accepted socket is also put in the ring's
//! registered file table (at its slab key's slot), and its receives and sends name the slot,
//! which spares the kernel a descriptor look-up per operation; the descriptor stays open for
//! the connection code and the housekeeping tick (`shutdown`, `TCP_CORK`). Each feature the
//! kernel may lack falls back and logs: `DEFER_TASKRUN` → `COOP_TASKRUN` → no setup flags (each
//! kept only if a completion signals the ring's eventfd, `probe.rs`; none → monoio's driver); no
//! file table → plain descriptors; no multishot receive (< 6.0) or buffer ring (< 5.19) → the
//! shard serves on monoio's io_uring driver as before.

mod bufring;
mod conns;
mod probe;
mod stream;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use io_uring::{IoUring, opcode, squeue, types};
use slab::Slab;

use super::Front;
use bufring::BufRing;
use conns::Conn;
pub use stream::RingStream;

/// Submission queue entries of a front ring (the completion queue has eight times as many:
/// every connection's receive may complete in the same pass).
const ENTRIES: u32 = 1024;

/// Busy passes in a row after which the pump parks all the same (having signalled its own
/// eventfd, so the park ends at once): monoio then parks too, which is when it fires its
/// timers and reaps its own ring (cross-shard wakes, TLS, same-host sockets, SSD files).
const BUSY_PASSES_BEFORE_PARK: u32 = 8;

/// Slots of a front ring's registered file table: a connection whose slab key is below it
/// has its socket registered there (the others, past 16 384 connections on one shard, use
/// their descriptor).
const FILES: u32 = 16_384;

/// `user_data` kinds: the kind in the high half, the connection's slab key in the low one.
const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const CANCEL: u64 = 4;
/// The accept's back-off timer ran out: accept again.
const ACCEPT_RETRY: u64 = 5;
/// A large write sent from its caller's buffer (`conns::Direct`).
const SEND_DIRECT: u64 = 6;
/// A large read received in place (`conns::DirectRead`).
const RECV_DIRECT: u64 = 7;

/// How long an accept that failed (out of descriptors or memory) waits before the next, as
/// the monoio front's accept loop does (`http/mod.rs`): a connection left in the backlog
/// would otherwise fail the re-armed accept at once, again and again.
static ACCEPT_BACKOFF: types::Timespec = types::Timespec::new().nsec(20_000_000);

fn ud(kind: u64, key: usize) -> u64 {
    (kind << 32) | key as u64
}

/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: u32 = 1;

/// The ring and what its pass works on; borrowed by the pump and by the streams, never across
/// an await.
pub(super) struct Inner {
    /// Declared before `bufs`: dropped first, so the buffers outlive the registration.
    ring: IoUring,
    bufs: BufRing,
    conns: Slab<Conn>,
    /// Connections with answers to send at the next pass.
    dirty: Vec<usize>,
    /// Connections whose receive is to be armed (again) at the next pass.
    rearm: Vec<usize>,
    /// Streams dropped: closed once nothing of theirs is in flight.
    closing: Vec<usize>,
    /// Connections accepted in this pass, to be spawned once the borrow ends.
    accepted: Vec<usize>,
    listener: Option<std::net::TcpListener>,
    accept_armed: bool,
    accept_cancelled: bool,
    /// An accept failed since the last was armed: the next waits [`ACCEPT_BACKOFF`].
    accept_failed: bool,
    /// When an accept failure was last logged (at most one a second).
    accept_logged: Option<std::time::Instant>,
    cqes: Vec<(u64, i32, u32)>,
    shard: usize,
    /// Slots of the registered file table (0: the kernel refused one; plain descriptors).
    files: u32,
}

/// A shard's front ring, shared by its pump and its connections' streams.
pub struct FrontRing {
    inner: RefCell<Inner>,
    /// The eventfd registered with the ring (non-blocking), and monoio's handle on it (made
    /// by the pump: monoio's runtime must be running).
    eventfd_owned: RefCell<Option<OwnedFd>>,
    eventfd: std::cell::OnceCell<Rc<monoio::fs::File>>,
    eventfd_raw: RawFd,
    /// The pending read of the eventfd while the pump is parked (kept across a kick).
    wait: RefCell<Option<Pin<Box<dyn Future<Output = ()>>>>>,
    parked: Cell<bool>,
    kicked: Cell<bool>,
    pump_waker: RefCell<Option<Waker>>,
    draining: Cell<bool>,
}

/// The front ring, with the setup flags it took (for the log line) and the eventfd registered
/// with it, whose signal wakes the parked pump. Each setup is tried in turn, `DEFER_TASKRUN` →
/// `COOP_TASKRUN` → none, and kept only if a completion signals its eventfd (`probe.rs`: not
/// every kernel does for `DEFER_TASKRUN`); `None` when none does (the shard then serves on
/// monoio's driver), `Err` when the kernel refuses them all.
fn build_ring() -> std::io::Result<Option<(IoUring, String, OwnedFd)>> {
    let cq = ENTRIES * 8;
    type Setup = fn(&mut io_uring::Builder);
    let setups: [(&str, Setup); 3] = [
        ("single_issuer+defer_taskrun+coop_taskrun", |b| {
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_coop_taskrun();
        }),
        ("single_issuer+coop_taskrun", |b| {
            b.setup_single_issuer().setup_coop_taskrun();
        }),
        ("no setup flags", |_| {}),
    ];
    let mut refused = Vec::new();
    let mut last_err = None;
    for (name, flags) in setups {
        let mut b = IoUring::builder();
        flags(&mut b);
        b.setup_cqsize(cq);
        let mut ring = match b.build(ENTRIES) {
            Ok(r) => r,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        // SAFETY: plain eventfd creation.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just created and is owned by nothing else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        ring.submitter().register_eventfd(efd.as_raw_fd())?;
        // Test hook: `MMC_FAULT_URING=front-signal` fails the probe of `DEFER_TASKRUN`, as
        // on a kernel whose signal comes late, to test the fallback where it does not.
        let injected = std::env::var("MMC_FAULT_URING").ok().as_deref() == Some("front-signal")
            && name.contains("defer");
        let probed = match probe::signals_eventfd(&mut ring, efd.as_raw_fd()) {
            Ok(s) => s && !injected,
            // No loopback to probe with (a namespace whose `lo` is down): `DEFER_TASKRUN` is
            // not taken on trust; the others' completions are posted by this thread's task
            // work, which signals from here.
            Err(e) => {
                log::warn!("front ring: cannot probe {name} ({e})");
                !name.contains("defer")
            }
        };
        match probed {
            true if refused.is_empty() => return Ok(Some((ring, name.to_string(), efd))),
            true => {
                let name = format!(
                    "{name}; {} did not signal its eventfd at once",
                    refused.join(", ")
                );
                return Ok(Some((ring, name, efd)));
            }
            false => refused.push(name),
        }
    }
    match last_err {
        Some(e) if refused.is_empty() => Err(e),
        _ => Ok(None),
    }
}

/// Whether the running kernel is at least `major.minor` (`/proc/sys/kernel/osrelease`).
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

impl FrontRing {
    /// Sets up shard `shard`'s front ring on `listener`, on the shard's thread (the ring is
    /// `SINGLE_ISSUER`). On a kernel without what it needs, the listener comes back with the
    /// reason, for the shard to serve it on monoio.
    pub fn new(
        shard: usize,
        listener: std::net::TcpListener,
    ) -> Result<Rc<FrontRing>, (String, std::net::TcpListener)> {
        // Test hook, as `MMC_FAULT_URING` in `shards::runtime`: the fallback on this kernel.
        if std::env::var("MMC_FAULT_URING").ok().as_deref() == Some("front") {
            return Err(("injected fault (MMC_FAULT_URING=front)".into(), listener));
        }
        if !kernel_at_least(6, 0) {
            return Err((
                "kernel older than 6.0 (no multishot receive)".into(),
                listener,
            ));
        }
        let (ring, flags, owned) = match build_ring() {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err((
                    "no io_uring setup signals its eventfd on a completion".into(),
                    listener,
                ));
            }
            Err(e) => return Err((format!("io_uring setup: {e}"), listener)),
        };
        let bufs = match BufRing::new(&ring) {
            Ok(b) => b,
            Err(e) => return Err((format!("provided buffer ring refused: {e}"), listener)),
        };
        let efd = owned.as_raw_fd();
        let (files, table) = match ring.submitter().register_files_sparse(FILES) {
            Ok(()) => (FILES, format!("registered files ({FILES} slots)")),
            Err(e) => (
                0,
                format!("plain descriptors (no registered file table: {e})"),
            ),
        };
        log::info!(
            "shard {shard}: front ring ({flags}, {ENTRIES} entries): multishot accept and receive, provided buffers {} x {} KiB, {table}",
            bufring::COUNT,
            bufring::SIZE / 1024
        );
        let fr = FrontRing {
            inner: RefCell::new(Inner {
                ring,
                bufs,
                conns: Slab::new(),
                dirty: Vec::new(),
                rearm: Vec::new(),
                closing: Vec::new(),
                accepted: Vec::new(),
                listener: Some(listener),
                accept_armed: false,
                accept_cancelled: false,
                accept_failed: false,
                accept_logged: None,
                cqes: Vec::with_capacity(256),
                shard,
                files,
            }),
            eventfd_raw: efd,
            eventfd_owned: RefCell::new(Some(owned)),
            eventfd: std::cell::OnceCell::new(),
            wait: RefCell::new(None),
            parked: Cell::new(false),
            kicked: Cell::new(false),
            pump_waker: RefCell::new(None),
            draining: Cell::new(false),
        };
        fr.inner.borrow_mut().arm_accept();
        Ok(Rc::new(fr))
    }

    /// Stops accepting (the server drains); connections are served until they close.
    pub fn begin_drain(&self) {
        self.draining.set(true);
        self.kick();
    }

    /// Wakes the pump if it is parked: a stream has something for the next pass.
    fn kick(&self) {
        if self.parked.get() && !self.kicked.replace(true) {
            if let Some(w) = self.pump_waker.borrow().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// The pump: runs the ring's passes for as long as the shard runs.
    pub async fn pump(self: Rc<Self>, front: Rc<Front>) {
        let owned = self.eventfd_owned.borrow_mut().take();
        match owned.map(|fd| monoio::fs::File::from_std(std::fs::File::from(fd))) {
            Some(Ok(f)) => {
                let _ = self.eventfd.set(Rc::new(f));
            }
            Some(Err(e)) => {
                log::error!("front ring: cannot read its eventfd through monoio: {e}");
                return;
            }
            None => return,
        }
        let mut busy = 0;
        loop {
            let reaped = self.pass(&front);
            if reaped == 0 {
                busy = 0;
                self.park(false).await;
            } else if busy >= BUSY_PASSES_BEFORE_PARK {
                busy = 0;
                self.park(true).await;
            } else {
                busy += 1;
                yield_now().await;
            }
        }
    }

    /// One pass: sends, buffers, receives to arm, one `io_uring_enter`, the completions.
    /// Returns how many completions it handled.
    fn pass(self: &Rc<Self>, front: &Rc<Front>) -> usize {
        let reaped = {
            let mut inner = self.inner.borrow_mut();
            if self.draining.get() {
                inner.stop_accepting();
            }
            inner.prepare();
            inner.enter();
            inner.reap()
        };
        self.spawn_accepted(front);
        reaped
    }

    fn spawn_accepted(self: &Rc<Self>, front: &Rc<Front>) {
        let accepted = std::mem::take(&mut self.inner.borrow_mut().accepted);
        let max_conns = front.config().http.max_connections_per_shard as usize;
        for &key in &accepted {
            let stats = front.shard().stats();
            stats.connections_accepted.inc();
            let stream = RingStream::new(self.clone(), key);
            let fd = stream.fd();
            if front.connection_count() >= max_conns || self.draining.get() {
                stats.connections_rejected.inc();
                monoio::spawn(super::refuse(front.clone(), stream));
                continue;
            }
            monoio::spawn(super::conn::run(front.clone(), stream, fd, false, None));
        }
        let mut inner = self.inner.borrow_mut();
        if inner.accepted.is_empty() {
            let mut accepted = accepted;
            accepted.clear();
            inner.accepted = accepted;
        }
    }

    /// Parks until the ring signals its eventfd or a stream kicks. `now`: signal it first
    /// (a busy pump letting monoio park once).
    async fn park(&self, now: bool) {
        if now {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe { libc::write(self.eventfd_raw, (&one as *const u64).cast(), 8) };
        }
        if self.wait.borrow().is_none() {
            if !now {
                // Signals left over from busy passes would end this park at once: drop them,
                // then look once more (what completed meanwhile signals again from here on).
                let mut v: u64 = 0;
                // SAFETY: reading 8 bytes from our non-blocking eventfd into a u64.
                unsafe { libc::read(self.eventfd_raw, (&mut v as *mut u64).cast(), 8) };
                let mut inner = self.inner.borrow_mut();
                inner.enter();
                if !inner.ring.completion().is_empty() {
                    return;
                }
            }
            let file = self.eventfd.get().expect("set by the pump").clone();
            *self.wait.borrow_mut() = Some(Box::pin(async move {
                let _ = file.read_at(vec![0u8; 8], 0).await;
            }));
        }
        self.parked.set(true);
        std::future::poll_fn(|cx| {
            if self.kicked.replace(false) {
                return Poll::Ready(());
            }
            let mut wait = self.wait.borrow_mut();
            if let Some(f) = wait.as_mut()
                && f.as_mut().poll(cx).is_ready()
            {
                *wait = None;
                return Poll::Ready(());
            }
            let mut w = self.pump_waker.borrow_mut();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        self.parked.set(false);
    }
}

/// Lets every other ready task run once before the pump's next pass.
fn yield_now() -> impl Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
}

impl Inner {
    fn push(&mut self, e: squeue::Entry) {
        // SAFETY: every buffer an entry points to (a connection's `sending`) stays in place
        // until its completion: it is not touched while its send is in flight.
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            self.enter();
        }
    }

    /// Submits what is queued and reaps what completed (runs `DEFER_TASKRUN` work).
    fn enter(&mut self) {
        let n = self.ring.submission().len() as u32;
        loop {
            // SAFETY: no argument; the flags are the plain GETEVENTS.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(n, 0, ENTER_GETEVENTS, None)
            };
            match r {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // The completion queue is full: make room, then submit again.
                    self.reap();
                    continue;
                }
                _ => return,
            }
        }
    }

    /// Registers connection `key`'s socket in the file table, at slot `key`, if the table has
    /// that slot; else (or if the kernel refuses) the connection keeps using its descriptor.
    fn register_file(&mut self, key: usize) {
        if key >= self.files as usize {
            return;
        }
        let c = &mut self.conns[key];
        match self
            .ring
            .submitter()
            .register_files_update(key as u32, &[c.fd])
        {
            Ok(_) => c.slot = Some(key as u32),
            Err(e) => log::debug!("front ring: socket not registered, plain descriptor: {e}"),
        }
    }

    /// Empties slot `slot` of the file table (its socket closes with its descriptor).
    pub(super) fn unregister_file(&mut self, slot: u32) {
        if let Err(e) = self.ring.submitter().register_files_update(slot, &[-1]) {
            log::warn!("front ring: registered file slot {slot} not emptied: {e}");
        }
    }

    fn arm_accept(&mut self) {
        let Some(fd) = self.listener.as_ref().map(|l| l.as_raw_fd()) else {
            return;
        };
        let e = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build()
            .user_data(ud(ACCEPT, 0));
        self.push(e);
        self.accept_armed = true;
    }

    fn stop_accepting(&mut self) {
        if self.accept_armed && !self.accept_cancelled {
            self.accept_cancelled = true;
            let e = opcode::AsyncCancel::new(ud(ACCEPT, 0))
                .build()
                .user_data(ud(CANCEL, 0));
            self.push(e);
        } else if !self.accept_armed {
            self.listener = None;
        }
    }

    /// Before entering: the buffers given back, the receives to arm, the sends.
    fn prepare(&mut self) {
        self.bufs.publish();
        let rearm = std::mem::take(&mut self.rearm);
        for &key in &rearm {
            self.arm_recv(key);
        }
        self.rearm = rearm;
        self.rearm.clear();
        let dirty = std::mem::take(&mut self.dirty);
        for &key in &dirty {
            self.start_send(key);
        }
        self.dirty = dirty;
        self.dirty.clear();
        let closing = std::mem::take(&mut self.closing);
        for &key in &closing {
            self.close_when_idle(key);
        }
        self.closing = closing;
        self.closing.clear();
    }

    /// Hands every completion to its connection. Returns how many there were.
    fn reap(&mut self) -> usize {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(u, res, flags) in &cqes {
            let key = (u & 0xffff_ffff) as usize;
            match u >> 32 {
                ACCEPT => self.accepted(res, flags),
                ACCEPT_RETRY if !self.accept_armed && !self.accept_cancelled => self.arm_accept(),
                RECV => self.received(key, res, flags),
                SEND => self.sent(key, res),
                SEND_DIRECT => self.sent_direct(key, res),
                RECV_DIRECT => self.received_direct(key, res),
                _ => {}
            }
        }
        let n = cqes.len();
        cqes.clear();
        self.cqes = cqes;
        n
    }

    fn accepted(&mut self, res: i32, flags: u32) {
        if res >= 0 {
            if self.accept_cancelled {
                // SAFETY: the descriptor was just accepted and is ours alone.
                unsafe { libc::close(res) };
            } else {
                let key = self.conns.insert(Conn::new(res));
                self.register_file(key);
                self.arm_recv(key);
                self.accepted.push(key);
            }
        } else if res != -libc::ECANCELED {
            // Out of descriptors or memory: logged at most once a second; the next accept
            // waits (the server keeps serving what it has).
            self.accept_failed = true;
            let now = std::time::Instant::now();
            if self
                .accept_logged
                .is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(1))
            {
                self.accept_logged = Some(now);
                log::warn!(
                    "shard {}: front ring: accept failed: {}",
                    self.shard,
                    std::io::Error::from_raw_os_error(-res)
                );
            }
        }
        if !io_uring::cqueue::more(flags) {
            self.accept_armed = false;
            if self.accept_cancelled {
                self.listener = None;
            } else if std::mem::take(&mut self.accept_failed) {
                let e = opcode::Timeout::new(&ACCEPT_BACKOFF)
                    .build()
                    .user_data(ud(ACCEPT_RETRY, 0));
                self.push(e);
            } else {
                self.arm_accept();
            }
        }
    }
}
