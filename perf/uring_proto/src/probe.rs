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
