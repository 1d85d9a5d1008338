//! TLS between the cluster's roles: a meta service and local services all listening with mTLS
//! (`ock.mmc.metrics.tls.*`). A local service joins an `https://` meta, verifying it against
//! its CA and presenting its own certificate; it advertises an `https://` URL, so redirects
//! and the meta's own calls to it (batch reads, replica chains) go over TLS; a local service
//! that does not trust the meta, or that the meta does not trust, is refused and exits 1.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rcgen::{ExtendedKeyUsagePurpose, Issuer};

use crate::harness::{Driver, Server, ServerBuilder, test_ca, test_leaf};
use crate::store::temp_dir;

/// A cluster CA and another one, each with a node certificate (server and client use, for
/// 127.0.0.1) and a client certificate for curl.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = temp_dir("cluster-pki");
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        for prefix in ["", "other-"] {
            let (params, key) = test_ca(&format!("{prefix}cluster CA"));
            write(
                &format!("{prefix}ca.pem"),
                &params.self_signed(&key).unwrap().pem(),
            );
            let issuer = Issuer::from_params(&params, &key);
            let both = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let (c, k) = test_leaf(&issuer, &["localhost", "127.0.0.1"], 1, both);
            write(&format!("{prefix}node.pem"), &c);
            write(&format!("{prefix}node.key"), &k);
            let client = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let (c, k) = test_leaf(&issuer, &["curl"], 2, client);
            write(&format!("{prefix}client.pem"), &c);
            write(&format!("{prefix}client.key"), &k);
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// A server listening with mTLS, its node certificate from our CA.
    fn server(&self) -> ServerBuilder {
        ServerBuilder::new(Driver::Uring)
            .set("ock.mmc.metrics.tls.enable", "true")
            .set("ock.mmc.metrics.tls.ca.path", &self.path("ca.pem"))
            .set("ock.mmc.metrics.tls.cert.path", &self.path("node.pem"))
            .set("ock.mmc.metrics.tls.key.path", &self.path("node.key"))
    }

    fn meta(&self) -> Server {
        self.server().set("ock.mmc.embedded.ranks", "0").start()
    }

    fn local(&self, meta: &Server, extra: &[(&str, &str)]) -> ServerBuilder {
        let mut b = self
            .server()
            .shards(1)
            .arg("--role")
            .arg("local")
            .set(
                "ock.mmc.meta_service_url",
                &format!("https://{}", meta.addr),
            )
            .set("ock.mmc.local_service.dram.size", "64MB")
            .set("ock.mmc.local_service.hbm.size", "0");
        for (k, v) in extra {
            b = b.set(k, v);
        }
        b
    }

    /// curl with our CA and a client certificate, bounded in time.
    fn curl(&self, args: &[&str]) -> Output {
        Command::new("curl")
            .args(["-s", "--max-time", "20", "--cacert"])
            .arg(self.path("ca.pem"))
            .arg("--cert")
            .arg(self.path("client.pem"))
            .arg("--key")
            .arg(self.path("client.key"))
            .args(args)
            .output()
            .expect("curl")
    }

    fn get(&self, meta: &Server, target: &str) -> Vec<u8> {
        let out = self.curl(&["-L", &format!("https://{}{target}", meta.addr)]);
        assert!(out.status.success(), "curl {target}: {out:?}");
        out.stdout
    }

    fn segments(&self, meta: &Server) -> Vec<String> {
        String::from_utf8(self.get(meta, "/get_all_segments"))
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Waits (bounded) until the meta lists `n` segments, all OK.
    fn wait_segments(&self, meta: &Server, n: usize) -> Vec<String> {
        let get = |p: &str| String::from_utf8(self.get(meta, p)).unwrap();
        crate::cluster::wait_ready(Duration::from_secs(10), get, |s| s.len() == n).unwrap_or_else(
            || {
                panic!(
                    "expected {n} segments, all OK; have {:?}",
                    self.segments(meta)
                )
            },
        )
    }
}

fn object(i: usize) -> Vec<u8> {
    let len = 1024 + (i * 300_007) % (2 << 20);
    (0..len).map(|j| (j * 13 + i * 5) as u8).collect()
}

/// Waits (bounded) for a refused local service to exit, and for `line` in its log.
fn refused(mut local: Server, line: &str) {
    let status = local
        .wait_exit(Duration::from_secs(15))
        .expect("refused, it stops");
    assert_eq!(status.code(), Some(1), "{}", local.log());
    let deadline = Instant::now() + Duration::from_secs(3);
    while !local.log().contains(line) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(local.log().contains(line), "{}", local.log());
}

#[test]
fn tls_between_roles_join_redirect_and_read_back() {
    let pki = Pki::new();
    let meta = pki.meta();
    assert!(
        meta.log().contains("listening on https://"),
        "{}",
        meta.log()
    );
    let _a = pki.local(&meta, &[]).start();
    let _b = pki.local(&meta, &[]).start();
    let segs = pki.wait_segments(&meta, 2);
    let rank = |s: &str| -> u32 {
        s.strip_prefix("rank-")
            .and_then(|r| r.split('-').next())
            .unwrap()
            .parse()
            .unwrap()
    };
    let (ra, rb) = (rank(&segs[0]), rank(&segs[1]));

    // The redirect names the local service's https URL.
    let file = pki.dir.join("obj");
    std::fs::write(&file, object(0)).unwrap();
    let url = |key: &str, q: &str| format!("https://{}/api/v1/objects?key={key}{q}", meta.addr);
    let out = pki.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "-T",
        file.to_str().unwrap(),
        &url("probe", &format!("&prefer_rank={ra}")),
    ]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.starts_with("307 https://127.0.0.1:"), "{said}");

    // Puts through redirects (the local service commits with the meta over TLS), one chain
    // of two replicas (a local service hands the bytes to the next over TLS), and reads back.
    for (i, q) in [
        (1, format!("&prefer_rank={ra}")),
        (2, format!("&prefer_rank={rb}")),
        (3, "&replicas=2".to_string()),
    ] {
        let data = object(i);
        std::fs::write(&file, &data).unwrap();
        let out = pki.curl(&[
            "-L",
            "-T",
            file.to_str().unwrap(),
            &url(&format!("obj-{i}"), &q),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("\"success\":true"),
            "put obj-{i}: {text} {out:?}"
        );
        let back = pki.get(&meta, &format!("/api/v1/objects?key=obj-{i}"));
        assert!(back == data, "obj-{i} reads back intact over TLS");
    }
    let q = pki.get(&meta, "/query_key?key=obj-3");
    let q: serde_json::Value = serde_json::from_slice(&q).unwrap();
    assert_eq!(q["blobs"].as_array().unwrap().len(), 2, "{q}");

    // A batch read: the meta fetches each object from its rank over TLS.
    let body = pki.get(&meta, "/api/v1/objects/batch_get?keys=obj-1,obj-2,missing");
    let mut at = 0;
    for want in [Some(object(1)), Some(object(2)), None] {
        let len = u64::from_be_bytes(body[at..at + 8].try_into().unwrap());
        at += 8;
        match want {
            Some(w) => {
                assert_eq!(len as usize, w.len());
                assert!(body[at..at + w.len()] == w[..], "batch_get over TLS");
                at += w.len();
            }
            None => assert_eq!(len, u64::MAX),
        }
    }
    assert!(
        !meta.log().contains("TLS peer not trusted"),
        "{}",
        meta.log()
    );
}

#[test]
fn a_local_service_and_a_meta_that_do_not_trust_each_other_are_refused() {
    let pki = Pki::new();
    let meta = pki.meta();
    // The local service checks the meta against another CA.
    let other_ca = pki.path("other-ca.pem");
    let local = pki
        .local(&meta, &[("ock.mmc.cluster.tls.ca.path", &other_ca)])
        .start();
    refused(local, "do not trust each other's TLS certificates");
    // The meta does not know the CA of the certificate the local service presents.
    let (cert, key) = (pki.path("other-node.pem"), pki.path("other-node.key"));
    let local = pki
        .local(
            &meta,
            &[
                ("ock.mmc.cluster.tls.cert.path", &cert),
                ("ock.mmc.cluster.tls.key.path", &key),
            ],
        )
        .start();
    refused(local, "do not trust each other's TLS certificates");
    assert!(pki.segments(&meta).is_empty(), "neither joined");
    // A plain-http URL for a meta listening with TLS never joins either (no answer).
    let _plain = pki
        .local(
            &meta,
            &[("ock.mmc.meta_service_url", &format!("http://{}", meta.addr))],
        )
        .start();
    std::thread::sleep(Duration::from_secs(2));
    assert!(pki.segments(&meta).is_empty());
}

#[test]
fn a_meta_without_a_ca_refuses_a_local_service_that_listens_with_tls() {
    let pki = Pki::new();
    let meta = ServerBuilder::new(Driver::Uring)
        .set("ock.mmc.embedded.ranks", "0")
        .start();
    let local = pki
        .local(
            &meta,
            &[("ock.mmc.meta_service_url", &format!("http://{}", meta.addr))],
        )
        .start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !local.log().contains("has no CA to verify it") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        local.log().contains("has no CA to verify it"),
        "{}",
        local.log()
    );
    let segs = meta.client().get("/get_all_segments");
    assert_eq!(segs.status, 200);
    assert!(segs.text().trim().is_empty(), "{}", segs.text());
}
