//! Variant d: the same answers over tokio-uring 0.5 (a tokio current-thread runtime whose
//! io_uring completions are polled through tokio's epoll): one task per connection, read,
//! answer every complete request of the read, one `write_all`.

use std::io;
use std::rc::Rc;

use tokio_uring::buf::BoundedBuf;
use tokio_uring::net::{TcpListener, TcpStream};

use crate::http::{Answers, serve};

const READ_BUF: usize = 8192;

async fn conn(s: TcpStream, answers: Rc<Answers>) {
    let mut rbuf: Vec<u8> = Vec::with_capacity(READ_BUF);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if rbuf.len() == rbuf.capacity() {
            rbuf.reserve(READ_BUF);
        }
        let len = rbuf.len();
        let cap = rbuf.capacity();
        let (res, slice) = s.read(rbuf.slice(len..cap)).await;
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

pub fn run(listener: std::net::TcpListener) -> io::Result<()> {
    eprintln!("tokio-uring 0.5");
    tokio_uring::start(async move {
        let l = TcpListener::from_std(listener);
        let answers = Rc::new(Answers::new());
        loop {
            match l.accept().await {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    tokio_uring::spawn(conn(s, answers.clone()));
                }
                Err(e) => eprintln!("accept: {e}"),
            }
        }
    })
}
