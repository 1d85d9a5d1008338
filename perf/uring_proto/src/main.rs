//! Issue 33 prototypes: one fixed `GET /metadata` answer, served over a raw io_uring loop
//! (`ring`), monoio's io_uring driver (`monoio-uring`, `monoio-uring-tuned`) or monoio's epoll
//! driver (`monoio-epoll`). One thread; pin it with taskset.
//!
//! Usage: uring-proto probe
//!        uring-proto MODE [--port P] [--max-secs S] [--no-fixed] [--no-defer] [--plain]
//!        [--plain] [--bufs N] [--buf-size B]
//! --no-defer: SINGLE_ISSUER | COOP_TASKRUN without DEFER_TASKRUN; --plain: no setup flags.

mod http;
mod mono;
mod probe;
mod ring;
#[cfg(feature = "tokio-uring")]
mod tok;

use std::net::TcpListener;
use std::time::Duration;

fn listener(port: u16) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(("127.0.0.1", port))?;
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux: direct descriptors
    // have no fd to set it on.
    let one: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option value.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&l),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        eprintln!(
            "TCP_NODELAY on the listener: {}",
            std::io::Error::last_os_error()
        );
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().cloned().unwrap_or_default();
    if mode == "probe" {
        probe::run();
        probe::wake_check();
        return;
    }
    let mut port = 19500u16;
    let mut max_secs = 1800u64;
    let mut opts = ring::Opts {
        defer_taskrun: true,
        coop_taskrun: true,
        fixed_files: true,
        buf_count: 512,
        buf_size: 4096,
    };
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().expect("a value after the flag").clone();
        match a.as_str() {
            "--port" => port = val().parse().expect("--port"),
            "--max-secs" => max_secs = val().parse().expect("--max-secs"),
            "--no-fixed" => opts.fixed_files = false,
            "--no-defer" => opts.defer_taskrun = false,
            "--plain" => {
                opts.defer_taskrun = false;
                opts.coop_taskrun = false;
            }
            "--bufs" => opts.buf_count = val().parse().expect("--bufs"),
            "--buf-size" => opts.buf_size = val().parse().expect("--buf-size"),
            other => panic!("unknown argument {other}"),
        }
    }
    // Whoever started it, the server stops by itself.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(max_secs));
        eprintln!("--max-secs {max_secs} reached: exiting");
        std::process::exit(0);
    });
    // SAFETY: ignoring SIGPIPE at start-up, before any other thread writes to a socket.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let l = listener(port).expect("bind 127.0.0.1:port");
    eprintln!("{mode}: listening on 127.0.0.1:{port}");
    let r = match mode.as_str() {
        "ring" => ring::run(l, opts),
        "monoio-uring" => mono::run_uring(l, false),
        "monoio-uring-tuned" => mono::run_uring(l, true),
        "monoio-epoll" => mono::run_epoll(l),
        #[cfg(feature = "tokio-uring")]
        "tokio-uring" => tok::run(l),
        _ => {
            eprintln!(
                "usage: uring-proto probe|ring|monoio-uring|monoio-uring-tuned|monoio-epoll [--port P] [--max-secs S] [--no-fixed] [--no-defer] [--plain] [--bufs N] [--buf-size B]"
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("{mode}: {e}");
        std::process::exit(1);
    }
}
