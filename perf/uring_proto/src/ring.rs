//! Variant a: a loop of our own over `io-uring`.
//!
//! - one multishot accept on the listener; with registered (direct) descriptors the kernel
//!   installs each connection in a free slot of the ring's file table and no fd exists;
//! - one multishot recv per connection, into buffers the kernel picks from a provided buffer
//!   ring; a buffer goes back to the ring as soon as the requests in it are answered (a request
//!   cut at the end of a buffer is copied to the connection's own buffer first);
//! - the answers of a loop iteration accumulate in the connection's output buffer and leave in
//!   one send per connection per iteration (a second buffer takes the next answers while a
//!   send is in flight);
//! - one `submit_and_wait(1)` per iteration submits everything and reaps the completions.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::http::{Answers, serve};

const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const CLOSE: u64 = 4;
const SHUTDOWN: u64 = 5;

const FILE_SLOTS: u32 = 4096;
const BGID: u16 = 7;

fn ud(kind: u64, id: u32) -> u64 {
    (kind << 32) | id as u64
}

/// What the setup could have; each is given up (and logged) when the kernel refuses it.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    pub defer_taskrun: bool,
    pub coop_taskrun: bool,
    pub fixed_files: bool,
    pub buf_count: u16,
    pub buf_size: u32,
}

/// The provided buffer ring: `count` buffers of `size` bytes, and the ring of their
/// descriptors the kernel takes them from. Both live in anonymous page-aligned mappings.
struct BufRing {
    ring: *mut types::BufRingEntry,
    bufs: *mut u8,
    count: u16,
    size: u32,
    /// Our tail: entries up to it are written; the kernel sees them once `publish`ed.
    tail: u16,
    published: u16,
}

fn map(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh anonymous private mapping, no file, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

impl BufRing {
    fn new(ring: &IoUring, count: u16, size: u32) -> io::Result<Self> {
        assert!(count.is_power_of_two());
        let entries = map(count as usize * std::mem::size_of::<types::BufRingEntry>())?;
        let bufs = map(count as usize * size as usize)?;
        let mut br = BufRing {
            ring: entries.cast(),
            bufs,
            count,
            size,
            tail: 0,
            published: 0,
        };
        // SAFETY: the ring memory is page aligned, `count` entries long, and outlives the
        // registration (the mappings are never unmapped; the process serves until it exits).
        unsafe {
            ring.submitter()
                .register_buf_ring(entries as u64, count, BGID)?
        };
        for bid in 0..count {
            br.give(bid);
        }
        br.publish();
        Ok(br)
    }

    /// Puts buffer `bid` at our tail (the kernel sees it at the next `publish`).
    fn give(&mut self, bid: u16) {
        let slot = (self.tail & (self.count - 1)) as usize;
        // SAFETY: slot < count; the kernel does not read entries past the published tail.
        let e = unsafe { &mut *self.ring.add(slot) };
        e.set_addr(self.bufs as u64 + bid as u64 * self.size as u64);
        e.set_len(self.size);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the given buffers visible to the kernel: one release store of the tail.
    fn publish(&mut self) {
        if self.published == self.tail {
            return;
        }
        // SAFETY: the tail field overlays the first entry's reserved half-word, u16 aligned.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.ring) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
        self.published = self.tail;
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        debug_assert!(bid < self.count && len <= self.size as usize);
        // SAFETY: the kernel wrote `len` bytes into buffer `bid` and handed it to us; it is
        // not given back before this borrow ends.
        unsafe { std::slice::from_raw_parts(self.bufs.add(bid as usize * self.size as usize), len) }
    }
}

#[derive(Default)]
struct Conn {
    /// The start of a request that is still arriving.
    partial: Vec<u8>,
    /// Answers not yet handed to a send.
    out: Vec<u8>,
    /// The answers of the send in flight, and how many of them were sent.
    sending: Vec<u8>,
    sent: usize,
    in_flight: bool,
    /// Queued in `dirty` for the end-of-iteration flush.
    queued: bool,
    /// Receiving has ended (EOF, error, malformed request): close once nothing is in flight.
    closing: bool,
    recv_armed: bool,
}

struct Loop {
    ring: IoUring,
    fixed: bool,
    listener: RawFd,
    bufs: BufRing,
    conns: Vec<Option<Box<Conn>>>,
    answers: Answers,
    dirty: Vec<u32>,
    rearm: Vec<u32>,
    cqes: Vec<(u64, i32, u32)>,
}

fn build_ring(opts: &mut Opts) -> io::Result<IoUring> {
    let entries = 1024;
    if opts.defer_taskrun {
        let mut b = IoUring::builder();
        b.setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .setup_cqsize(entries * 8);
        match b.build(entries) {
            Ok(r) => {
                eprintln!("ring: SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN");
                return Ok(r);
            }
            Err(e) => {
                eprintln!("ring: SINGLE_ISSUER | DEFER_TASKRUN refused ({e}); trying COOP_TASKRUN");
                opts.defer_taskrun = false;
            }
        }
    }
    if opts.coop_taskrun {
        let mut b = IoUring::builder();
        b.setup_single_issuer()
            .setup_coop_taskrun()
            .setup_cqsize(entries * 8);
        match b.build(entries) {
            Ok(r) => {
                eprintln!("ring: SINGLE_ISSUER | COOP_TASKRUN");
                return Ok(r);
            }
            Err(e) => eprintln!("ring: COOP_TASKRUN refused ({e}); plain setup"),
        }
    }
    let mut b = IoUring::builder();
    b.setup_cqsize(entries * 8);
    let r = b.build(entries)?;
    eprintln!("ring: plain setup (no taskrun flags)");
    Ok(r)
}

pub fn run(listener: std::net::TcpListener, mut opts: Opts) -> io::Result<()> {
    let ring = build_ring(&mut opts)?;
    let lfd = listener.as_raw_fd();
    let mut fixed = false;
    if opts.fixed_files {
        let sub = ring.submitter();
        match sub
            .register_files_sparse(FILE_SLOTS)
            .and_then(|_| sub.register_files_update(0, &[lfd]))
        {
            Ok(_) => {
                fixed = true;
                eprintln!(
                    "ring: registered file table of {FILE_SLOTS} slots, listener in slot 0; connections as direct descriptors"
                );
            }
            Err(e) => eprintln!("ring: registered files refused ({e}); plain descriptors"),
        }
    }
    let bufs = BufRing::new(&ring, opts.buf_count, opts.buf_size)?;
    eprintln!(
        "ring: provided buffer ring of {} x {} bytes (group {BGID})",
        opts.buf_count, opts.buf_size
    );
    let mut lp = Loop {
        ring,
        fixed,
        listener: if fixed { 0 } else { lfd },
        bufs,
        conns: Vec::new(),
        answers: Answers::new(),
        dirty: Vec::new(),
        rearm: Vec::new(),
        cqes: Vec::with_capacity(1024),
    };
    lp.arm_accept();
    let r = lp.serve();
    drop(listener);
    r
}

impl Loop {
    fn push(&mut self, e: squeue::Entry) {
        // SAFETY: every buffer an entry points to (the send buffers of a connection) stays
        // in place until its completion: `sending` is not touched while `in_flight`.
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            self.ring
                .submit()
                .expect("submit with a full submission queue");
        }
    }

    /// Descriptor operands are slots of the registered table when it exists.
    fn ff(&self) -> squeue::Flags {
        if self.fixed {
            squeue::Flags::FIXED_FILE
        } else {
            squeue::Flags::empty()
        }
    }

    fn arm_accept(&mut self) {
        let e = opcode::AcceptMulti::new(types::Fd((self.listener as u32) as RawFd))
            .allocate_file_index(self.fixed)
            .build()
            .flags(self.ff())
            .user_data(ud(ACCEPT, 0));
        self.push(e);
    }

    fn arm_recv(&mut self, id: u32) {
        let e = opcode::RecvMulti::new(types::Fd(id as RawFd), BGID)
            .build()
            .flags(self.ff())
            .user_data(ud(RECV, id));
        self.push(e);
        if let Some(c) = self.conn(id) {
            c.recv_armed = true;
        }
    }

    fn conn(&mut self, id: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(id as usize)
            .and_then(|c| c.as_deref_mut())
    }

    fn serve(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
            let mut cqes = std::mem::take(&mut self.cqes);
            cqes.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for &(u, res, flags) in &cqes {
                self.complete(u, res, flags);
            }
            cqes.clear();
            self.cqes = cqes;
            // Buffers answered in this iteration go back to the kernel in one store, before
            // the recvs that ran out of buffers are armed again.
            self.bufs.publish();
            for i in 0..self.rearm.len() {
                let id = self.rearm[i];
                self.arm_recv(id);
            }
            self.rearm.clear();
            for i in 0..self.dirty.len() {
                let id = self.dirty[i];
                self.flush(id);
            }
            self.dirty.clear();
        }
    }

    fn complete(&mut self, u: u64, res: i32, flags: u32) {
        let id = u as u32;
        match u >> 32 {
            ACCEPT => {
                if res >= 0 {
                    let slot = res as usize;
                    if self.conns.len() <= slot {
                        self.conns.resize_with(slot + 1, || None);
                    }
                    self.conns[slot] = Some(Box::default());
                    self.arm_recv(res as u32);
                } else {
                    eprintln!("accept: {}", io::Error::from_raw_os_error(-res));
                }
                if !cqueue::more(flags) {
                    self.arm_accept();
                }
            }
            RECV => self.received(id, res, flags),
            SEND => self.sent(id, res),
            CLOSE | SHUTDOWN => {}
            _ => unreachable!("user data {u:#x}"),
        }
    }

    fn received(&mut self, id: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let ff = self.ff();
        let Some(c) = self
            .conns
            .get_mut(id as usize)
            .and_then(|c| c.as_deref_mut())
        else {
            if let Some(bid) = cqueue::buffer_select(flags) {
                self.bufs.give(bid);
            }
            return;
        };
        if !more {
            c.recv_armed = false;
        }
        if res > 0 {
            let bid = cqueue::buffer_select(flags).expect("a recv with data names its buffer");
            let data = self.bufs.data(bid, res as usize);
            let ok = if c.partial.is_empty() {
                match serve(&self.answers, data, &mut c.out) {
                    Ok(n) => {
                        c.partial.extend_from_slice(&data[n..]);
                        true
                    }
                    Err(_) => false,
                }
            } else {
                c.partial.extend_from_slice(data);
                match serve(&self.answers, &c.partial, &mut c.out) {
                    Ok(n) => {
                        c.partial.drain(..n);
                        true
                    }
                    Err(_) => false,
                }
            };
            self.bufs.give(bid);
            if !c.out.is_empty() && !c.queued {
                c.queued = true;
                self.dirty.push(id);
            }
            if !ok && !c.closing {
                // Stop receiving: the recv ends with EOF, then the connection is closed.
                c.closing = true;
                let e = opcode::Shutdown::new(types::Fd(id as RawFd), libc::SHUT_RDWR)
                    .build()
                    .flags(ff)
                    .user_data(ud(SHUTDOWN, id));
                self.push(e);
            }
            if !more && !c_closing(&self.conns, id) {
                self.rearm.push(id);
            }
            if !more && c_closing(&self.conns, id) {
                self.close_when_idle(id);
            }
            return;
        }
        if res == -libc::ENOBUFS {
            // The buffer ring ran dry; answered buffers are published at the end of this
            // iteration, and the recv is armed again after that.
            if !more {
                self.rearm.push(id);
            }
            return;
        }
        // EOF or an error: this recv has ended (no more completions for it).
        c.closing = true;
        self.close_when_idle(id);
    }

    fn close_when_idle(&mut self, id: u32) {
        let Some(c) = self.conn(id) else { return };
        if c.in_flight || c.recv_armed {
            return;
        }
        self.conns[id as usize] = None;
        if self.fixed {
            let e = opcode::Close::new(types::Fixed(id))
                .build()
                .user_data(ud(CLOSE, id));
            self.push(e);
        } else {
            // SAFETY: the descriptor is ours and nothing in flight uses it.
            unsafe { libc::close(id as RawFd) };
        }
    }

    fn flush(&mut self, id: u32) {
        let ff = self.ff();
        let Some(c) = self.conn(id) else { return };
        c.queued = false;
        if c.in_flight || c.out.is_empty() {
            return;
        }
        std::mem::swap(&mut c.out, &mut c.sending);
        c.sent = 0;
        c.in_flight = true;
        let (ptr, len) = (c.sending.as_ptr(), c.sending.len() as u32);
        let e = opcode::Send::new(types::Fd(id as RawFd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .flags(ff)
            .user_data(ud(SEND, id));
        self.push(e);
    }

    fn sent(&mut self, id: u32, res: i32) {
        let ff = self.ff();
        let Some(c) = self.conn(id) else { return };
        if res < 0 {
            c.in_flight = false;
            c.sending.clear();
            c.out.clear();
            if !c.closing {
                c.closing = true;
                let e = opcode::Shutdown::new(types::Fd(id as RawFd), libc::SHUT_RDWR)
                    .build()
                    .flags(ff)
                    .user_data(ud(SHUTDOWN, id));
                self.push(e);
            }
            self.close_when_idle(id);
            return;
        }
        c.sent += res as usize;
        if c.sent < c.sending.len() {
            let rest = &c.sending[c.sent..];
            let (ptr, len) = (rest.as_ptr(), rest.len() as u32);
            let e = opcode::Send::new(types::Fd(id as RawFd), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .flags(ff)
                .user_data(ud(SEND, id));
            self.push(e);
            return;
        }
        c.in_flight = false;
        c.sending.clear();
        if c.closing {
            self.close_when_idle(id);
        } else if !c.out.is_empty() && !c.queued {
            c.queued = true;
            self.dirty.push(id);
        }
    }
}

fn c_closing(conns: &[Option<Box<Conn>>], id: u32) -> bool {
    conns
        .get(id as usize)
        .and_then(|c| c.as_deref())
        .is_some_and(|c| c.closing)
}
