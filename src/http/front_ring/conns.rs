//! A connection on the front ring: the bytes received for its stream to read, the answers
//! its stream wrote for the next pass to send, and its receive's and send's states, which
//! decide when the descriptor can close.

use std::os::fd::RawFd;
use std::task::Waker;

use io_uring::{cqueue, opcode, types};

use super::{CANCEL, Inner, RECV, RECV_DIRECT, SEND, SEND_DIRECT, bufring, ud};

/// `$op` built on connection `$c`'s socket: its registered slot when it has one (`$t` is a
/// `types::Fixed`), else its descriptor (`types::Fd`). The operation builders take either, but
/// not a value that could be one or the other.
macro_rules! on_socket {
    ($c:expr, |$t:ident| $op:expr) => {
        match $c.slot {
            Some(slot) => {
                let $t = types::Fixed(slot);
                $op
            }
            None => {
                let $t = types::Fd($c.fd);
                $op
            }
        }
    };
}

/// Received bytes a connection may hold unread before its receive is cancelled (resumed
/// when its stream has read them): past it the client waits on TCP's flow control, as it
/// would on a socket nobody reads.
pub const RX_PAUSE_BYTES: usize = 32 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Recv {
    /// No receive in flight.
    Idle,
    Armed,
    /// A one-shot receive into a large read's buffer is in flight (`Conn::rdirect`).
    Direct,
    /// A cancel was pushed; the final completion is still to come.
    Cancelling,
}

/// A large write on its way from the caller's buffer (no copy into `out`): the
/// `SENDMSG`'s message and vectors, which the kernel reads until it completes (boxed: the
/// slab may move the connection meanwhile).
pub struct Direct {
    pub iov: Vec<libc::iovec>,
    pub msg: libc::msghdr,
    /// The caller's buffer, when its write was dropped before the send completed: it lives
    /// until the kernel is done with it.
    pub keep: Option<Box<dyn std::any::Any>>,
    /// The send's result (bytes or `-errno`) once it completed.
    pub done: Option<i32>,
}

/// A large read received in place: the kernel writes into the reader's buffer at `ptr` with a
/// one-shot `RECV`, the multishot receive cancelled meanwhile.
pub struct DirectRead {
    pub ptr: *mut u8,
    /// The reader's buffer, when its read was dropped before the receive completed: it lives
    /// until the kernel is done with it, and what landed in it goes to `rx`.
    pub keep: Option<Box<dyn std::any::Any>>,
    /// The receive's result (bytes or `-errno`) once it completed.
    pub done: Option<i32>,
}

/// A waiting reader's buffer: where, its size, and how much of it is filled.
pub struct Dst {
    pub ptr: *mut u8,
    pub len: usize,
    pub filled: usize,
}

pub struct Conn {
    pub fd: RawFd,
    /// The connection's slot in the ring's registered file table (its slab key), when it has
    /// one: its receives and sends name the slot, which spares the kernel a descriptor look-up
    /// per operation. The descriptor stays open beside it for the connection code.
    pub slot: Option<u32>,
    /// Received and not yet read by the stream: `rx[rx_at..]`.
    pub rx: Vec<u8>,
    pub rx_at: usize,
    /// The client closed its side (or the socket was shut down): reads return 0 once `rx` is
    /// read.
    pub eof: bool,
    /// The receive or a send failed (errno): the stream's reads and writes fail.
    pub error: Option<i32>,
    pub recv: Recv,
    /// Receiving was cancelled because `rx` is full (`RX_PAUSE_BYTES`).
    pub paused: bool,
    /// Answers written by the stream, not yet handed to a send.
    pub out: Vec<u8>,
    /// The bytes of the send in flight, and how many of them the kernel took so far.
    pub sending: Vec<u8>,
    pub sent: usize,
    /// A send is in flight: of `sending`, or of `direct`.
    pub in_flight: bool,
    pub direct: Option<Box<Direct>>,
    /// In `Inner::dirty` for the next pass.
    pub queued: bool,
    /// The stream waiting to read, and the one waiting for its answers to leave (a full
    /// `out`, a flush).
    pub reader: Option<Waker>,
    /// The waiting reader's buffer (`stream::ReadInto`): received bytes are copied straight
    /// there while nothing is unread in `rx`, instead of into `rx` and then again.
    pub dst: Option<Dst>,
    /// A reader waits to receive in place: the multishot receive is not re-armed meanwhile.
    pub want_direct: bool,
    /// The connection streams large bodies (a large read came since the last two small reads
    /// in a row): its small reads are one-shot receives into the reader's buffer too, so the
    /// multishot receive does not take a body's first hundreds of KiB into provided buffers
    /// (a completion and two copies per 8 KiB) before the body's large read cancels it.
    pub bulk: bool,
    /// The last read was small (for `bulk`).
    pub small_before: bool,
    pub rdirect: Option<Box<DirectRead>>,
    pub writer: Option<Waker>,
    /// The stream is gone: the connection closes once nothing of it is in flight.
    pub dropped: bool,
}

impl Conn {
    pub fn new(fd: RawFd) -> Conn {
        Conn {
            fd,
            slot: None,
            rx: Vec::new(),
            rx_at: 0,
            eof: false,
            error: None,
            recv: Recv::Idle,
            paused: false,
            out: Vec::new(),
            sending: Vec::new(),
            sent: 0,
            in_flight: false,
            direct: None,
            queued: false,
            reader: None,
            dst: None,
            want_direct: false,
            bulk: false,
            small_before: false,
            rdirect: None,
            writer: None,
            dropped: false,
        }
    }

    pub fn unread(&self) -> usize {
        self.rx.len() - self.rx_at
    }

    /// Puts `got` before the unread received bytes: bytes that landed in the buffer of a read
    /// that was dropped are the stream's next ones.
    pub fn unread_first(&mut self, got: &[u8]) {
        let mut rx = got.to_vec();
        rx.extend_from_slice(&self.rx[self.rx_at..]);
        self.rx = rx;
        self.rx_at = 0;
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    pub(super) fn wake_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }

    /// Nothing of the connection is in flight and nothing is left to send.
    fn idle(&self) -> bool {
        self.recv == Recv::Idle && !self.in_flight && (self.out.is_empty() || self.error.is_some())
    }
}

impl Inner {
    pub(super) fn arm_recv(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.recv != Recv::Idle
            || c.eof
            || c.error.is_some()
            || c.dropped
            || c.paused
            || c.want_direct
        {
            return;
        }
        c.recv = Recv::Armed;
        let e = on_socket!(c, |t| opcode::RecvMulti::new(t, bufring::GROUP).build())
            .user_data(ud(RECV, key));
        self.push(e);
    }

    pub(super) fn cancel_recv(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        let kind = match c.recv {
            Recv::Armed => RECV,
            Recv::Direct => RECV_DIRECT,
            _ => return,
        };
        c.recv = Recv::Cancelling;
        let e = opcode::AsyncCancel::new(ud(kind, key))
            .build()
            .user_data(ud(CANCEL, key));
        self.push(e);
    }

    pub(super) fn received(&mut self, key: usize, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        let Some(c) = self.conns.get_mut(key) else {
            if let Some(bid) = bid {
                self.bufs.give(bid);
            }
            return;
        };
        if !more {
            c.recv = Recv::Idle;
            if c.want_direct {
                // A large read waited for this end to receive in place.
                c.wake_reader();
            }
        }
        let mut pause = false;
        if res > 0 {
            let bid = bid.expect("a receive with data names its buffer");
            if !c.dropped {
                if c.rx_at == c.rx.len() {
                    c.rx.clear();
                    c.rx_at = 0;
                }
                let mut data = self.bufs.data(bid, res as usize);
                if let Some(d) = c.dst.as_mut().filter(|_| c.rx.is_empty()) {
                    let take = data.len().min(d.len - d.filled);
                    // SAFETY: `d` is the buffer of a read that is waiting (its future is alive:
                    // its drop takes `dst` back), `len` bytes long; the source is a provided
                    // buffer of ours; they do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data.as_ptr(), d.ptr.add(d.filled), take)
                    };
                    d.filled += take;
                    data = &data[take..];
                }
                c.rx.extend_from_slice(data);
                c.wake_reader();
                pause = c.unread() >= RX_PAUSE_BYTES;
            }
            self.bufs.give(bid);
        } else if res == 0 {
            c.eof = true;
            c.wake_reader();
        } else if res == -libc::ENOBUFS {
            // The buffers ran out in this pass; they are back by the next one.
        } else if res != -libc::ECANCELED {
            c.error = Some(-res);
            c.wake_reader();
            c.wake_writer();
        }
        let c = &mut self.conns[key];
        if pause && !c.paused {
            c.paused = true;
            if more {
                self.cancel_recv(key);
            }
        }
        if !more {
            if self.conns[key].dropped {
                self.close_when_idle(key);
            } else {
                self.rearm.push(key);
            }
        }
    }

    /// Hands the connection's answers to a send, unless one is in flight.
    pub(super) fn start_send(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        c.queued = false;
        if c.in_flight || c.out.is_empty() || c.error.is_some() {
            return;
        }
        std::mem::swap(&mut c.out, &mut c.sending);
        c.sent = 0;
        c.in_flight = true;
        self.push_send(key);
    }

    fn push_send(&mut self, key: usize) {
        let c = &self.conns[key];
        let rest = &c.sending[c.sent..];
        let (ptr, len) = (rest.as_ptr(), rest.len() as u32);
        let e = on_socket!(c, |t| opcode::Send::new(t, ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build())
        .user_data(ud(SEND, key));
        self.push(e);
    }

    /// Receives into `ptr..ptr + len` (a large read's buffer, which outlives the receive:
    /// `DirectRead::keep`) with one `RECV`; the multishot receive is not armed (the stream
    /// waited for that).
    pub(super) fn start_direct_recv(&mut self, key: usize, ptr: *mut u8, len: usize) {
        let c = &mut self.conns[key];
        debug_assert!(c.recv == Recv::Idle && c.rdirect.is_none());
        c.recv = Recv::Direct;
        c.paused = false;
        c.rdirect = Some(Box::new(DirectRead {
            ptr,
            keep: None,
            done: None,
        }));
        let len = len.min(u32::MAX as usize) as u32;
        let e = on_socket!(c, |t| opcode::Recv::new(t, ptr, len).build())
            .user_data(ud(RECV_DIRECT, key));
        self.push(e);
    }

    pub(super) fn received_direct(&mut self, key: usize, res: i32) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        c.recv = Recv::Idle;
        if res == 0 {
            c.eof = true;
        } else if res < 0 && res != -libc::ECANCELED {
            c.error = Some(-res);
            c.wake_writer();
        }
        match c.rdirect.as_mut() {
            // The read was dropped: what landed in its buffer is the stream's next bytes.
            Some(d) if d.keep.is_some() => {
                if res > 0 {
                    // SAFETY: the kernel wrote `res` bytes at `ptr`, in the kept buffer.
                    let got = unsafe { std::slice::from_raw_parts(d.ptr, res as usize) };
                    c.unread_first(got);
                }
                c.rdirect = None;
            }
            Some(d) => d.done = Some(res),
            None => {}
        }
        c.wake_reader();
        if self.conns[key].dropped {
            self.close_when_idle(key);
        }
    }

    /// Sends `iov` (the caller's buffer, which outlives the send: `Direct::keep`) with one
    /// `SENDMSG`, once nothing else is in flight or queued (the stream waited for that).
    pub(super) fn start_direct(&mut self, key: usize, iov: Vec<libc::iovec>) {
        let c = &mut self.conns[key];
        debug_assert!(!c.in_flight && c.out.is_empty());
        let mut d = Box::new(Direct {
            iov,
            // SAFETY: an all-zero msghdr is valid (no name, no control data).
            msg: unsafe { std::mem::zeroed() },
            keep: None,
            done: None,
        });
        let d_ref = &mut *d;
        d_ref.msg.msg_iov = d_ref.iov.as_mut_ptr();
        d_ref.msg.msg_iovlen = d_ref.iov.len() as _;
        let m: *const libc::msghdr = &d_ref.msg;
        c.in_flight = true;
        let e = on_socket!(c, |t| opcode::SendMsg::new(t, m)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build())
        .user_data(ud(SEND_DIRECT, key));
        c.direct = Some(d);
        self.push(e);
    }

    pub(super) fn sent_direct(&mut self, key: usize, res: i32) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        c.in_flight = false;
        if res < 0 {
            c.error = Some(-res);
            c.out.clear();
            c.wake_reader();
        }
        match c.direct.as_mut() {
            // The write was dropped: its buffer can go now.
            Some(d) if d.keep.is_some() => c.direct = None,
            Some(d) => d.done = Some(res),
            None => {}
        }
        if !c.out.is_empty() && !c.queued && c.error.is_none() {
            c.queued = true;
            self.dirty.push(key);
        }
        c.wake_writer();
        if self.conns[key].dropped {
            self.close_when_idle(key);
        }
    }

    pub(super) fn sent(&mut self, key: usize, res: i32) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if res < 0 {
            c.in_flight = false;
            c.sending.clear();
            c.out.clear();
            c.error = Some(-res);
            c.wake_reader();
            c.wake_writer();
        } else {
            c.sent += res as usize;
            if c.sent < c.sending.len() {
                self.push_send(key);
                return;
            }
            c.in_flight = false;
            c.sending.clear();
            if !c.out.is_empty() && !c.queued {
                c.queued = true;
                self.dirty.push(key);
            }
            c.wake_writer();
        }
        if self.conns[key].dropped {
            self.close_when_idle(key);
        }
    }

    /// Closes a dropped stream's connection once nothing of it is in flight (its receive
    /// cancelled first: an armed receive would hold the socket open).
    pub(super) fn close_when_idle(&mut self, key: usize) {
        let Some(c) = self.conns.get(key) else {
            return;
        };
        if !c.dropped {
            return;
        }
        if matches!(c.recv, Recv::Armed | Recv::Direct)
            && (c.out.is_empty() || c.error.is_some())
            && !c.in_flight
        {
            self.cancel_recv(key);
            return;
        }
        if !c.idle() {
            return;
        }
        let c = self.conns.remove(key);
        if let Some(slot) = c.slot {
            // The table's reference would keep the socket open after `close`.
            self.unregister_file(slot);
        }
        // SAFETY: the descriptor is this connection's, and nothing in flight uses it.
        unsafe { libc::close(c.fd) };
    }
}
