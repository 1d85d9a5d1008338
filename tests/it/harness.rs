//! Test harness: a real `mmc-server` process on 127.0.0.1 and a raw HTTP/1.1 client that sees
//! the exact bytes on the wire.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const SERVER_BIN: &str = env!("CARGO_BIN_EXE_mmc-server");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Uring,
    Epoll,
}

impl Driver {
    /// The `--io-driver` value. `MMC_IT_URING_DRIVER=ring` runs every io_uring test on the
    /// front ring instead (`--io-driver ring`), so the suite covers it without a third variant.
    pub fn arg(self) -> &'static str {
        match self {
            Driver::Uring => uring_arg(),
            Driver::Epoll => "epoll",
        }
    }
}

fn uring_arg() -> &'static str {
    static ARG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ARG.get_or_init(|| std::env::var("MMC_IT_URING_DRIVER").unwrap_or_else(|_| "uring".into()))
}

/// Generates one `#[test]` per io driver for a function `fn name(driver: Driver)`.
#[macro_export]
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn uring() {
                    super::$name($crate::harness::Driver::Uring);
                }
                #[test]
                fn epoll() {
                    super::$name($crate::harness::Driver::Epoll);
                }
            }
        )*
    };
}

pub struct ServerBuilder {
    args: Vec<String>,
    envs: Vec<(String, String)>,
    nofile: Option<u64>,
}

impl ServerBuilder {
    pub fn new(driver: Driver) -> ServerBuilder {
        ServerBuilder {
            args: vec![
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--io-driver".into(),
                driver.arg().into(),
                "--shards".into(),
                "2".into(),
            ],
            envs: Vec::new(),
            nofile: None,
        }
    }

    /// Starts the server with at most `n` open descriptors (its `RLIMIT_NOFILE`, soft and
    /// hard, set in the child before it runs).
    pub fn nofile(mut self, n: u64) -> Self {
        self.nofile = Some(n);
        self
    }

    pub fn shards(mut self, n: usize) -> Self {
        let i = self.args.iter().position(|a| a == "--shards").unwrap();
        self.args[i + 1] = n.to_string();
        self
    }

    /// Replaces the io driver argument (`auto`, `uring`, `epoll`).
    pub fn io_driver(mut self, d: &str) -> Self {
        let i = self.args.iter().position(|a| a == "--io-driver").unwrap();
        self.args[i + 1] = d.to_string();
        self
    }

    /// Replaces the listen address.
    pub fn listen(mut self, addr: &str) -> Self {
        let i = self.args.iter().position(|a| a == "--listen").unwrap();
        self.args[i + 1] = addr.to_string();
        self
    }

    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.args.push("--set".into());
        self.args.push(format!("{key}={value}"));
        self
    }

    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    pub fn start(self) -> Server {
        let mut cmd = Command::new(SERVER_BIN);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.env_remove("RUST_LOG");
        // The debug server re-checks its store's invariants on every housekeeping tick.
        cmd.env("MMC_DEBUG_CHECK", "1");
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe; the closure allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn mmc-server");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                {
                    let mut l = log2.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                // Announce the address only once its line is in the log.
                if let Some(rest) = line
                    .split("listening on http")
                    .nth(1)
                    .and_then(|r| r.split("://").nth(1))
                {
                    let addr = rest.split_whitespace().next().unwrap().to_string();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not start; log:\n{}", log.lock().unwrap());
            }
        };
        Server {
            child: Some(child),
            addr,
            log,
        }
    }
}

pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(driver: Driver) -> Server {
        ServerBuilder::new(driver).start()
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.stop_within(Duration::from_secs(15))
    }

    /// [`stop`](Self::stop) for a server with more to do before it exits (a drain of many
    /// objects), failing only after `limit`.
    pub fn stop_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        match self.wait_exit(limit) {
            Some(status) => status,
            None => {
                // Fail, but leave no server behind.
                let mut child = self.child.take().unwrap();
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not exit after SIGTERM; log:\n{}", self.log());
            }
        }
    }

    /// SIGKILL, and returns as soon as the process is reaped (no polling delay: a restart
    /// test races what the dead process leaves behind).
    pub fn kill9(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child.take();
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if std::thread::panicking() {
            // The test already failed: do not fail again inside the unwinding.
            eprintln!("server log:\n{}", self.log());
            let mut child = self.child.take().unwrap();
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        // Every test ends with a graceful stop: a server that crashed or hangs fails the test.
        let status = self.stop();
        assert!(
            status.success(),
            "server exited with {status}; log:\n{}",
            self.log()
        );
        let log = self.log();
        assert!(!log.contains("panicked at"), "server panicked; log:\n{log}");
    }
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The exact bytes received for this response.
    pub raw: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }

    pub fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or("")
    }

    /// Asserts the contract's error envelope with this message and a current timestamp.
    #[track_caller]
    pub fn assert_error(&self, status: u16, message: &str) {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.content_type(), "application/json; charset=utf-8");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let v = self.json();
        let obj = v.as_object().unwrap();
        let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            ["success", "error_message", "timestamp"],
            "field order"
        );
        assert_eq!(v["success"], false);
        assert_eq!(v["error_message"], message);
        let ts = v["timestamp"].as_u64().expect("integer timestamp");
        assert!(
            ts + 5 >= now && ts <= now + 5,
            "timestamp {ts} is not now ({now})"
        );
    }
}

pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn try_connect(addr: SocketAddr) -> Option<Client> {
        let stream = TcpStream::connect(addr).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Some(Client {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Sends a request and reads its response.
    pub fn request(&mut self, method: &str, target: &str, body: Option<&[u8]>) -> Response {
        self.request_with(method, target, &[], body)
    }

    pub fn get(&mut self, target: &str) -> Response {
        self.request("GET", target, None)
    }

    pub fn request_with(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Response {
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        if let Some(b) = body {
            bytes.extend_from_slice(b);
        }
        self.send(&bytes);
        self.read_response(method == "HEAD")
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n
            }
            Err(e) => panic!("read failed: {e}"),
        }
    }

    /// Reads one response (`head_only`: the request was HEAD, so no body follows).
    pub fn read_response(&mut self, head_only: bool) -> Response {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.fill() == 0 {
                panic!(
                    "connection closed before a response head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
            }
        };
        let head = String::from_utf8(self.buf[..head_end].to_vec()).expect("ASCII head");
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        let mut parts = status_line.splitn(3, ' ');
        assert_eq!(
            parts.next(),
            Some("HTTP/1.1"),
            "status line {status_line:?}"
        );
        let status: u16 = parts.next().unwrap().parse().unwrap();
        let reason = parts.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').expect("header line");
                (k.to_string(), v.trim().to_string())
            })
            .collect();
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        if chunked && !head_only {
            return self.read_chunked(status, reason, headers, head_end);
        }
        let len: usize = if head_only || status == 100 || status == 204 {
            0
        } else {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.parse().unwrap())
                .expect("every response has Content-Length or is chunked")
        };
        while self.buf.len() < head_end + len {
            if self.fill() == 0 {
                panic!("connection closed inside a body");
            }
        }
        let raw: Vec<u8> = self.buf.drain(..head_end + len).collect();
        let body = raw[head_end..].to_vec();
        Response {
            status,
            reason,
            headers,
            body,
            raw,
        }
    }

    fn read_chunked(
        &mut self,
        status: u16,
        reason: String,
        headers: Vec<(String, String)>,
        head_end: usize,
    ) -> Response {
        let mut pos = head_end;
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf[pos..].windows(2).position(|w| w == b"\r\n") {
                    break pos + i;
                }
                assert!(self.fill() > 0, "connection closed inside a chunked body");
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.buf[pos..line_end]).unwrap(), 16)
                    .expect("hex chunk size");
            let data_start = line_end + 2;
            while self.buf.len() < data_start + size + 2 {
                assert!(self.fill() > 0, "connection closed inside a chunk");
            }
            body.extend_from_slice(&self.buf[data_start..data_start + size]);
            assert_eq!(&self.buf[data_start + size..data_start + size + 2], b"\r\n");
            pos = data_start + size + 2;
            if size == 0 {
                break;
            }
        }
        let raw: Vec<u8> = self.buf.drain(..pos).collect();
        Response {
            status,
            reason,
            headers,
            body,
            raw,
        }
    }

    /// Reads until the server closes the connection (an HTTP/1.0 close-delimited body).
    pub fn read_to_close(&mut self) -> Vec<u8> {
        while self.fill() > 0 {}
        std::mem::take(&mut self.buf)
    }

    /// True when the server closed the connection (EOF) within `limit`.
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        self.stream.set_read_timeout(Some(limit)).unwrap();
        let mut b = [0u8; 1024];
        let r = loop {
            match self.stream.read(&mut b) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        r
    }
}

/// A process's resident set in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Percent-encodes every byte that is not unreserved.
pub fn pct(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// A test certificate authority: its parameters and key (sign leaves with
/// `rcgen::Issuer::from_params`).
pub fn test_ca(name: &str) -> (rcgen::CertificateParams, rcgen::KeyPair) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p, key)
}

/// A certificate for `names` (the first is its common name) signed by `issuer`, for the
/// extended key `uses`: (certificate PEM, key PEM).
pub fn test_leaf(
    issuer: &rcgen::Issuer<'_, &rcgen::KeyPair>,
    names: &[&str],
    serial: u64,
    uses: Vec<rcgen::ExtendedKeyUsagePurpose>,
) -> (String, String) {
    use rcgen::{CertificateParams, DnType, KeyPair, SerialNumber};
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.serial_number = Some(SerialNumber::from(serial));
    p.distinguished_name.push(DnType::CommonName, names[0]);
    p.extended_key_usages = uses;
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}
