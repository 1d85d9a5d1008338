//! KV events follow the HA leadership, as a KV-aware router sees them: a ZMQ SUB socket (and
//! vLLM's replay protocol on a REQ socket) on the publisher that the etcd key
//! `<prefix>kv_events` names, batches decoded in the positional form (the default,
//! what Dynamo and llm-d read). The wire form itself is checked with vLLM-shaped typed
//! decoders in tests/python/test_kv_events.py; here it is the stream's semantics across a
//! failover: only the leader publishes, a new leadership opens with `AllBlocksCleared` at
//! sequence 0, and the blocks a live node still holds are re-announced after it.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::ha::{
    Etcd, TTL_MS, a_leads, free_port, ha_meta, health, is_serving_leader, local_of, url, wait_gone,
    wait_health, wait_joined,
};
use crate::harness::{Client, Driver, Server};

fn tcp(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// A meta with HA and KV events on (publisher and replay on their own ports).
fn kv_meta(etcd: &Etcd, port: u16, pub_port: u16, replay_port: u16) -> Server {
    ha_meta(Driver::Uring, &etcd.endpoint(), port)
        .set("ock.mmc.kv_events.enable", "true")
        // A wildcard bind: the advertised endpoint names the meta's host instead.
        .set("ock.mmc.kv_events.endpoint", &format!("tcp://*:{pub_port}"))
        .set("ock.mmc.kv_events.replay_endpoint", &tcp(replay_port))
        .set("ock.mmc.kv_events.replay_batches", "1000")
        .set("ock.mmc.kv_events.topic", "kv@mmc")
        .set("ock.mmc.kv_events.batch_max_delay_ms", "2")
        .start()
}

/// One key of etcd (its gateway, HTTP/1.0 so the answer is not chunked): the value and its
/// create revision.
fn etcd_get(etcd: &Etcd, key: &str) -> Option<(String, u64)> {
    let port: u16 = etcd.endpoint().rsplit(':').next()?.parse().ok()?;
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let body = format!(r#"{{"key":"{}"}}"#, B64.encode(key));
    let req = format!(
        "POST /v3/kv/range HTTP/1.0\r\nHost: etcd\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let json: serde_json::Value = serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()?;
    let kv = json.get("kvs")?.get(0)?;
    let value = String::from_utf8(B64.decode(kv["value"].as_str()?).ok()?).ok()?;
    let rev = kv["create_revision"].as_str()?.parse().ok()?;
    Some((value, rev))
}

/// The publisher the etcd key names, once it names `leader` with `view_version` (bounded).
fn discover(etcd: &Etcd, leader: SocketAddr, view_version: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((value, rev)) = etcd_get(etcd, "/mmc/kv_events") {
            let v: serde_json::Value = serde_json::from_str(&value).expect("a JSON value");
            if v["leader_address"] == url(leader) {
                assert_eq!(rev, view_version, "the key belongs to the leadership: {v}");
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "etcd never named {leader}'s KV publisher"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One event: (tag, hash, medium); the hash and medium of `AllBlocksCleared` are 0 and "".
type Ev = (String, u64, String);

/// A positional batch `[ts, events, data_parallel_rank]`, as Dynamo and llm-d read it
/// (decoded with `rmpv`, a consumer's msgpack decoder).
pub(crate) fn batch_events(mut payload: &[u8]) -> Vec<Ev> {
    use rmpv::Value;
    let v = rmpv::decode::read_value(&mut payload).expect("a msgpack batch");
    assert!(payload.is_empty(), "bytes after the batch");
    let Value::Array(batch) = &v else {
        panic!("a batch is an array: {v:?}")
    };
    let [Value::F64(_), Value::Array(events), Value::Integer(rank)] = batch.as_slice() else {
        panic!("{batch:?}")
    };
    assert!(rank.is_u64(), "{batch:?}");
    events
        .iter()
        .map(|e| {
            let Value::Array(f) = e else {
                panic!("an event is an array: {e:?}")
            };
            match (f.first().and_then(Value::as_str), f.get(1), f.last()) {
                (Some(tag), Some(Value::Array(h)), Some(medium)) => {
                    let [Value::Integer(hash)] = h.as_slice() else {
                        panic!("{e:?}")
                    };
                    let (Some(hash), Some(medium)) = (hash.as_u64(), medium.as_str()) else {
                        panic!("{e:?}")
                    };
                    (tag.to_string(), hash, medium.to_string())
                }
                (Some(tag), None, _) => (tag.to_string(), 0, String::new()),
                _ => panic!("{e:?}"),
            }
        })
        .collect()
}

/// A router's subscription to one publisher: SUB for the live stream, REQ for replay.
struct Router {
    _ctx: zmq::Context,
    sub: zmq::Socket,
    replay: Option<zmq::Socket>,
    /// What was received: (seq, events of the batch).
    batches: Vec<(u64, Vec<Ev>)>,
}

impl Router {
    fn connect(endpoint: &str, replay: &str) -> Router {
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"kv@mmc").unwrap();
        sub.connect(endpoint).unwrap();
        let replay = (!replay.is_empty()).then(|| {
            let r = ctx.socket(zmq::REQ).unwrap();
            r.set_rcvtimeo(5000).unwrap();
            r.connect(replay).unwrap();
            r
        });
        // PUB/SUB: let the subscription reach the publisher before anything is expected.
        std::thread::sleep(Duration::from_millis(300));
        Router {
            _ctx: ctx,
            sub,
            replay,
            batches: Vec::new(),
        }
    }

    /// Receives live batches for up to `ms`.
    fn pump(&mut self, ms: i64) {
        let until = Instant::now() + Duration::from_millis(ms as u64);
        loop {
            let left = until.saturating_duration_since(Instant::now()).as_millis() as i64;
            if self.sub.poll(zmq::POLLIN, left.max(0)).unwrap() == 0 {
                return;
            }
            let f = self.sub.recv_multipart(0).unwrap();
            assert_eq!(f.len(), 3, "[topic, seq, payload]");
            assert_eq!(f[0], b"kv@mmc");
            let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
            // A batch already taken from the replay is not counted twice.
            if !self.batches.iter().any(|(s, _)| *s == seq) {
                self.batches.push((seq, batch_events(&f[2])));
            }
        }
    }

    /// vLLM's replay: every kept batch from `start` (the REQ socket takes one answer per
    /// request, so it asks again from the next sequence after each).
    fn replay_from(&mut self, start: u64) {
        let r = self.replay.as_ref().expect("a replay endpoint");
        let mut next = start;
        loop {
            r.send(&next.to_be_bytes()[..], 0).unwrap();
            let f = r.recv_multipart(0).expect("a replay answer within 5 s");
            let seq = u64::from_be_bytes(f[0].as_slice().try_into().unwrap());
            if seq == u64::MAX {
                assert!(f[1].is_empty());
                return;
            }
            if !self.batches.iter().any(|(s, _)| *s == seq) {
                self.batches.push((seq, batch_events(&f[1])));
            }
            next = seq + 1;
        }
    }

    /// Every event received, in sequence order.
    fn events(&mut self) -> Vec<(u64, Ev)> {
        self.batches.sort_by_key(|(s, _)| *s);
        self.batches
            .iter()
            .flat_map(|(s, evs)| evs.iter().map(move |e| (*s, e.clone())))
            .collect()
    }

    fn stored(&mut self) -> BTreeSet<u64> {
        self.events()
            .into_iter()
            .filter(|(_, e)| e.0 == "BlockStored")
            .map(|(_, e)| e.1)
            .collect()
    }

    /// Pumps until every hash of `want` was announced stored (bounded).
    fn wait_stored(&mut self, want: &BTreeSet<u64>, limit: Duration, what: &str) {
        let deadline = Instant::now() + limit;
        while !want.is_subset(&self.stored()) {
            assert!(
                Instant::now() < deadline,
                "{what}: missing BlockStored for {:x?}; received {:?}",
                want.difference(&self.stored()).collect::<Vec<_>>(),
                self.events()
            );
            self.pump(100);
        }
    }
}

fn key(hash: u64) -> String {
    format!("llama@1@0@{hash:x}@bf16")
}

/// A put that follows one 307 (standby → leader, or meta → local service).
fn put(addr: SocketAddr, target: &str, body: &[u8]) -> serde_json::Value {
    let mut r = Client::connect(addr).request("PUT", target, Some(body));
    if r.status == 307 {
        let loc = r.header("location").unwrap().to_string();
        let rest = loc.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        r = Client::connect(host.parse().unwrap()).request("PUT", path, Some(body));
    }
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Two metas with KV events, one local service, objects on it; the leader is killed. A
/// router that subscribed to the publisher etcd named sees: nothing from the standby; after
/// the failover, etcd names the new leader's publisher, whose stream starts over at sequence
/// 0 with `AllBlocksCleared` and then re-announces (`BlockStored`) every block the live local
/// service still holds, and goes on with new puts.
///
/// The re-announcement of the local service's blocks needs the catalog hand-over (a new
/// leader adopting what live local services hold, issue 14 part 3): until that is merged the
/// last check fails, after everything before it passed.
#[test]
fn a_kv_subscriber_follows_the_failover() {
    let Some(etcd) = Etcd::start("kvfailover") else {
        return;
    };
    let ports: Vec<(u16, u16, u16)> = (0..2)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let a = kv_meta(&etcd, ports[0].0, ports[0].1, ports[0].2);
    let b = kv_meta(&etcd, ports[1].0, ports[1].1, ports[1].2);
    let ((mut leader, lp), (standby, sp)) = if a_leads(&a, &b) {
        ((a, ports[0]), (b, ports[1]))
    } else {
        ((b, ports[1]), (a, ports[0]))
    };
    let view = health(leader.addr)["view_version"].as_u64().unwrap();

    // etcd names the leader's publisher, with the wildcard bind host replaced.
    let named = discover(&etcd, leader.addr, view);
    assert_eq!(named["endpoint"], tcp(lp.1), "{named}");
    assert_eq!(named["replay_endpoint"], tcp(lp.2), "{named}");
    assert_eq!(named["topic"], "kv@mmc");
    assert_eq!(named["encoding"], "array");
    // So does HTTP: the leader answers, a standby redirects there.
    let r = leader.client().get("/kv_events/publisher");
    assert_eq!(
        r.text(),
        format!(
            r#"{{"enabled":true,"endpoint":"{}","replay_endpoint":"{}","topic":"kv@mmc","encoding":"array","leader_address":"{}","view_version":{view}}}"#,
            tcp(lp.1),
            tcp(lp.2),
            url(leader.addr)
        )
    );
    let r = standby.client().get("/kv_events/publisher");
    assert_eq!(r.status, 307);
    assert_eq!(
        r.header("location"),
        Some(format!("{}/kv_events/publisher", url(leader.addr)).as_str())
    );

    let local = local_of(Driver::Uring, &standby, &leader)
        .set("ock.mmc.local_service.rank", "5")
        .set("ock.mmc.local_service.dram.size", "32MB")
        .set("ock.mmc.cluster.heartbeat_interval_ms", "200")
        .set("ock.mmc.cluster.heartbeat_timeout_ms", "1000")
        .start();
    wait_joined(leader.addr, "rank-5-dram", &local);

    let mut router = Router::connect(named["endpoint"].as_str().unwrap(), "");
    let mut on_standby = Router::connect(&tcp(sp.1), "");
    let held: BTreeSet<u64> = (0..8u64).map(|i| 0xfeed_0000 + i).collect();
    for &h in &held {
        let j = put(
            leader.addr,
            &format!("/api/v1/objects?key={}&prefer_rank=5&medium=dram", key(h)),
            format!("object {h:x}").as_bytes(),
        );
        assert_eq!(j["success"], true, "{j}");
    }
    router.wait_stored(&held, Duration::from_secs(10), "before the failover");
    assert!(
        router
            .events()
            .iter()
            .all(|(_, e)| e.2.is_empty() || e.2 == "CPU"),
        "DRAM blocks are CPU blocks: {:?}",
        router.events()
    );
    on_standby.pump(300);
    assert!(
        on_standby.batches.is_empty(),
        "the standby published: {:?}",
        on_standby.events()
    );

    leader.kill9();
    wait_gone(leader.addr);
    let h = wait_health(
        standby.addr,
        Duration::from_millis(2 * TTL_MS + 4000),
        "the new leader",
        is_serving_leader,
    );
    let new_view = h["view_version"].as_u64().unwrap();
    assert!(new_view > view);

    // The router finds the new publisher in etcd and reads its epoch from the start.
    let named = discover(&etcd, standby.addr, new_view);
    assert_eq!(named["endpoint"], tcp(sp.1), "{named}");
    let mut router = Router::connect(
        named["endpoint"].as_str().unwrap(),
        named["replay_endpoint"].as_str().unwrap(),
    );
    router.replay_from(0);
    router.pump(200);
    let events = router.events();
    assert_eq!(
        events.first(),
        Some(&(0, ("AllBlocksCleared".to_string(), 0, String::new()))),
        "a new leadership's stream opens with AllBlocksCleared at sequence 0: {events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|(_, e)| e.0 == "AllBlocksCleared")
            .count(),
        1,
        "{events:?}"
    );

    // The stream goes on with what the new leader stores.
    wait_joined(standby.addr, "rank-5-dram", &local);
    let after: BTreeSet<u64> = [0xbeef_0001].into();
    let j = put(
        standby.addr,
        &format!(
            "/api/v1/objects?key={}&prefer_rank=5&medium=dram",
            key(0xbeef_0001)
        ),
        b"after",
    );
    assert_eq!(j["success"], true, "{j}");
    router.wait_stored(&after, Duration::from_secs(10), "a put after the failover");

    // Nothing the live local service holds vanished for the router: every block is
    // re-announced after the AllBlocksCleared, none removed.
    router.wait_stored(
        &held,
        Duration::from_secs(15),
        "the re-announcement of the local service's blocks (needs the catalog hand-over)",
    );
    let events = router.events();
    assert!(
        !events
            .iter()
            .any(|(_, e)| e.0 == "BlockRemoved" && held.contains(&e.1)),
        "{events:?}"
    );
    drop(router);
    drop(local);
    drop(standby);
}

/// A leader cut off from etcd steps down and, with nobody else leading meanwhile, leads again
/// with the objects it kept: its new epoch opens with `AllBlocksCleared` at sequence 0 and
/// re-announces every one of them, once; while it was not the leader it published nothing.
#[test]
fn a_leader_that_leads_again_re_announces_what_it_kept() {
    let Some(mut etcd) = Etcd::start("kvagain") else {
        return;
    };
    let (port, pub_port, replay_port) = (free_port(), free_port(), free_port());
    let m = kv_meta(&etcd, port, pub_port, replay_port);
    wait_health(
        m.addr,
        Duration::from_secs(10),
        "the serving leader",
        is_serving_leader,
    );
    let view = health(m.addr)["view_version"].as_u64().unwrap();
    let mut router = Router::connect(&tcp(pub_port), &tcp(replay_port));
    let kept: BTreeSet<u64> = (0..6u64).map(|i| 0xcafe_0000 + i).collect();
    for &h in &kept {
        let j = put(
            m.addr,
            &format!("/api/v1/objects?key={}&medium=dram", key(h)),
            b"kept",
        );
        assert_eq!(j["success"], true, "{j}");
    }
    // A key that names no block publishes nothing, now or later.
    put(m.addr, "/api/v1/objects?key=plain&medium=dram", b"plain");
    router.wait_stored(&kept, Duration::from_secs(10), "before etcd stopped");

    etcd.kill();
    wait_health(
        m.addr,
        Duration::from_millis(TTL_MS + 3000),
        "stepped down",
        |h| !is_serving_leader(h),
    );
    let mut quiet = Router::connect(&tcp(pub_port), "");
    quiet.pump(500);
    assert!(
        quiet.batches.is_empty(),
        "published while not the leader: {:?}",
        quiet.events()
    );

    etcd.launch();
    let h = wait_health(
        m.addr,
        Duration::from_secs(15),
        "the serving leader again",
        is_serving_leader,
    );
    assert!(h["view_version"].as_u64().unwrap() > view);
    let mut router = Router::connect(&tcp(pub_port), &tcp(replay_port));
    router.replay_from(0);
    router.pump(200);
    let events = router.events();
    assert_eq!(
        events.first(),
        Some(&(0, ("AllBlocksCleared".to_string(), 0, String::new()))),
        "{events:?}"
    );
    let stored: Vec<u64> = events
        .iter()
        .filter(|(_, e)| e.0 == "BlockStored")
        .map(|(_, e)| e.1)
        .collect();
    assert_eq!(
        stored.iter().copied().collect::<BTreeSet<_>>(),
        kept,
        "{events:?}"
    );
    assert_eq!(stored.len(), kept.len(), "each block once: {events:?}");
    assert!(
        events
            .iter()
            .skip(1)
            .all(|(_, e)| e.0 == "BlockStored" && e.2 == "CPU"),
        "{events:?}"
    );
    drop(m);
}
