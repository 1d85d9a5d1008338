//! Variants b and c: the same answers served by monoio 0.2.4, on its io_uring driver or on its
//! epoll (legacy) driver: one task per connection, read, answer every complete request of the
//! read, one `write_all` of the answers.

use std::io;
use std::rc::Rc;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use crate::http::{Answers, serve};

const READ_BUF: usize = 8192;

async fn conn(mut s: TcpStream, answers: Rc<Answers>) {
    let mut rbuf: Vec<u8> = Vec::with_capacity(READ_BUF);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if rbuf.len() == rbuf.capacity() {
            rbuf.reserve(READ_BUF);
        }
        let len = rbuf.len();
        let (res, slice) = s.read(rbuf.slice_mut(len..)).await;
        rbuf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(n) = serve(&answers, &rbuf, &mut out) else {
            return;
        };
        rbuf.drain(..n);
        if !out.is_empty() {
            let (res, o) = s.write_all(out).await;
            out = o;
            out.clear();
            if res.is_err() {
                return;
            }
        }
    }
}

async fn accept_loop(listener: TcpListener) {
    let answers = Rc::new(Answers::new());
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                monoio::spawn(conn(s, answers.clone()));
            }
            Err(e) => eprintln!("accept: {e}"),
        }
    }
}

pub fn run_uring(listener: std::net::TcpListener, tuned: bool) -> io::Result<()> {
    let mut urb = io_uring::IoUring::builder();
    if tuned {
        urb.setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun();
    }
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(1024)
        .uring_builder(urb)
        .build()?;
    eprintln!(
        "monoio IoUringDriver{}",
        if tuned {
            " (COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN, as mmc-server)"
        } else {
            ""
        }
    );
    rt.block_on(async move {
        accept_loop(TcpListener::from_std(listener)?).await;
        Ok(())
    })
}

pub fn run_epoll(listener: std::net::TcpListener) -> io::Result<()> {
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .with_entries(1024)
        .build()?;
    eprintln!("monoio LegacyDriver (epoll)");
    rt.block_on(async move {
        accept_loop(TcpListener::from_std(listener)?).await;
        Ok(())
    })
}
