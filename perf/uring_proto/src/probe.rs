//! `uring-proto probe`: what this kernel's io_uring offers the prototypes.

use io_uring::{IoUring, Probe};

const OPS: &[(u8, &str, &str)] = &[
    (13, "ACCEPT (multishot since 5.19)", "5.5"),
    (26, "SEND", "5.6"),
    (27, "RECV (multishot since 6.0)", "5.6"),
    (31, "PROVIDE_BUFFERS (legacy provided buffers)", "5.7"),
    (34, "SHUTDOWN", "5.11"),
    (46, "URING_CMD (socket options since 6.7)", "5.19"),
    (47, "SEND_ZC", "6.0"),
    (49, "READ_MULTISHOT", "6.7"),
    (54, "FIXED_FD_INSTALL (direct descriptor -> fd)", "6.8"),
    (56, "BIND", "6.11"),
    (57, "LISTEN", "6.11"),
    (58, "RECV_ZC (zero-copy receive)", "6.15"),
];

/// The raw feature bits of a ring (io_uring_params.features).
fn features() -> u32 {
    let mut params = [0u32; 30]; // struct io_uring_params: 120 bytes
    // SAFETY: io_uring_setup writes the params struct it is given (120 bytes here).
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        eprintln!("io_uring_setup: {}", std::io::Error::last_os_error());
        return 0;
    }
    // SAFETY: the fd was just returned by io_uring_setup.
    unsafe { libc::close(fd as i32) };
    params[5]
}

pub fn run() {
    let uname = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("kernel {}", uname.trim());
    let disabled =
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").unwrap_or_default();
    println!("kernel.io_uring_disabled = {}", disabled.trim());
    let mut b = IoUring::<io_uring::squeue::Entry, io_uring::cqueue::Entry>::builder();
    b.setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun();
    println!(
        "setup SINGLE_ISSUER|DEFER_TASKRUN|COOP_TASKRUN (6.1): {}",
        b.build(64)
            .map(|_| "yes".to_string())
            .unwrap_or_else(|e| e.to_string())
    );
    let f = features();
    for (bit, name) in [
        (5, "FAST_POLL (5.7)"),
        (8, "EXT_ARG (5.11)"),
        (11, "CQE_SKIP (5.17)"),
        (13, "REG_REG_RING (6.3)"),
        (14, "RECVSEND_BUNDLE (6.10)"),
        (15, "MIN_TIMEOUT (6.12)"),
        (17, "NO_IOWAIT (6.15)"),
    ] {
        println!(
            "feature {name}: {}",
            if f & (1 << bit) != 0 { "yes" } else { "no" }
        );
    }
    let ring = IoUring::new(64).expect("a plain ring");
    let mut p = Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .expect("IORING_REGISTER_PROBE");
    for (op, name, since) in OPS {
        println!(
            "op {name} ({since}): {}",
            if p.is_supported(*op) { "yes" } else { "no" }
        );
    }
    println!(
        "register files sparse (5.19): {}",
        ring.submitter()
            .register_files_sparse(16)
            .map(|_| "yes".to_string())
            .unwrap_or_else(|e| e.to_string())
    );
    let ring_mem = vec![0u64; 4096 / 8 * 2];
    let page = (ring_mem.as_ptr() as u64 + 4095) & !4095;
    // SAFETY: a page-aligned region of 16 entries (256 bytes) inside `ring_mem`, unregistered
    // (with the ring) before `ring_mem` is dropped.
    let r = unsafe { ring.submitter().register_buf_ring(page, 16, 1) };
    println!(
        "register provided buffer ring (5.19): {}",
        r.map(|_| "yes".to_string())
            .unwrap_or_else(|e| e.to_string())
    );
    let _ = ring.submitter().unregister_buf_ring(1);
    drop(ring);
}

/// Whether a `DEFER_TASKRUN` ring tells another waiter that it has work without being
/// entered: a registered eventfd, and `poll(2)` on the ring's fd. The front ring of the
/// integration plan needs one of them to wake the shard's monoio runtime.
pub fn wake_check() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let mut b = IoUring::<io_uring::squeue::Entry, io_uring::cqueue::Entry>::builder();
    b.setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun();
    let mut ring: IoUring = b.build(64).expect("a DEFER_TASKRUN ring");
    // SAFETY: plain eventfd creation.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(efd >= 0, "eventfd");
    ring.submitter()
        .register_eventfd(efd)
        .expect("register_eventfd");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (server, _) = l.accept().expect("accept");
    let mut bufs = vec![0u8; 4 * 4096];
    let e = io_uring::opcode::Recv::new(
        io_uring::types::Fd(server.as_raw_fd()),
        bufs.as_mut_ptr(),
        4096,
    )
    .build()
    .user_data(1);
    // SAFETY: `bufs` outlives the ring's use of it (the recv completes below).
    unsafe { ring.submission().push(&e).expect("sq") };
    ring.submit().expect("submit");
    let read_evfd = || {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes from our eventfd into a u64.
        let n = unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) };
        if n == 8 { v } else { 0 }
    };
    let poll_ring = || {
        let mut p = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, 100 ms.
        let n = unsafe { libc::poll(&mut p, 1, 100) };
        n == 1 && p.revents & libc::POLLIN != 0
    };
    read_evfd();
    client.write_all(b"hello").expect("write");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let signalled = read_evfd();
    let pollable = poll_ring();
    let before = ring.completion().len();
    ring.submit_and_wait(1).expect("enter");
    let after = ring.completion().len();
    println!(
        "DEFER_TASKRUN ring, a recv completed while nobody entered it: eventfd signalled: {} (value {signalled}); poll(ring fd) readable: {pollable}; CQEs before entering: {before}, after: {after}",
        signalled > 0
    );
    drop(bufs);
}
