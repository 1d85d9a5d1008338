//! KV-event publisher throughput: events per second from the shards' queue through batching,
//! msgpack encoding and a ZMQ PUB socket to a subscriber on loopback TCP, and what producing
//! one event costs a shard.
//!
//! `cargo bench --bench kv_events` measures (figures in perf/RESULTS.md); under `cargo test`
//! (no `--bench` argument) it runs a small smoke pass that checks every event arrives.
//! Pin it for stable figures: `taskset -c 1 cargo bench --bench kv_events`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mmc::common::event::Event;
use mmc::common::medium::Medium;
use mmc::config::KvEventsConfig;
use mmc::kv_events::KvPublisher;
use mmc::metrics::kv_events::KvEventStats;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(port: u16, batch_max_events: u64) -> KvEventsConfig {
    KvEventsConfig {
        enable: true,
        encoding: mmc::config::KvEncoding::Array,
        endpoint: format!("tcp://127.0.0.1:{port}"),
        replay_endpoint: String::new(),
        topic: "kv".into(),
        queue_capacity: 65536,
        hard_capacity: 131072,
        batch_max_events,
        batch_max_delay_ms: 5,
        data_parallel_rank: 0,
        replay_batches: 10000,
        block_size: 256,
        key_format: Default::default(),
    }
}

struct Outcome {
    events_per_s: f64,
    batches: u64,
    received_batches: u64,
    received_bytes: u64,
    dropped: u64,
}

/// Pushes `n` stored events as fast as the queue takes them without drops (a producer that
/// finds the queue past half its soft capacity yields), and waits until all are published.
fn run(n: u64, batch_max_events: u64) -> Outcome {
    let port = free_port();
    let stats = Arc::new(KvEventStats::default());
    let publisher = KvPublisher::start(config(port, batch_max_events), stats.clone())
        .expect("publisher starts");
    let received_batches = Arc::new(AtomicU64::new(0));
    let received_bytes = Arc::new(AtomicU64::new(0));
    let connected = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let sub = {
        let (rb, rbytes, connected, done) = (
            received_batches.clone(),
            received_bytes.clone(),
            connected.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let ctx = zmq::Context::new();
            let s = ctx.socket(zmq::SUB).unwrap();
            s.set_rcvhwm(0).unwrap();
            s.set_rcvtimeo(100).unwrap();
            s.set_subscribe(b"").unwrap();
            s.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
            connected.store(true, Relaxed);
            while !done.load(Relaxed) {
                match s.recv_multipart(0) {
                    Ok(frames) => {
                        assert_eq!(frames.len(), 3, "topic, sequence, batch");
                        rb.fetch_add(1, Relaxed);
                        rbytes.fetch_add(frames[2].len() as u64, Relaxed);
                    }
                    Err(zmq::Error::EAGAIN) => {}
                    Err(e) => panic!("recv: {e}"),
                }
            }
        })
    };
    while !connected.load(Relaxed) {
        std::thread::yield_now();
    }
    // ZMQ's slow joiner: a subscription takes a moment to reach the publisher.
    std::thread::sleep(Duration::from_millis(300));

    let queue = publisher.queue.clone();
    let start = Instant::now();
    for i in 0..n {
        while stats.queue_size.load(Relaxed) > 32768 {
            std::thread::yield_now();
        }
        queue.produce(
            0,
            &Event::Stored {
                chunk: Some(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                medium: Medium::Dram,
                size: 64 << 10,
            },
        );
    }
    while stats.published_events.get() + stats.dropped_events() < n {
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = start.elapsed();
    let batches = stats.published_batches.get();
    let deadline = Instant::now() + Duration::from_secs(5);
    while received_batches.load(Relaxed) < batches && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    done.store(true, Relaxed);
    sub.join().unwrap();
    publisher.stop();
    Outcome {
        events_per_s: n as f64 / elapsed.as_secs_f64(),
        batches,
        received_batches: received_batches.load(Relaxed),
        received_bytes: received_bytes.load(Relaxed),
        dropped: stats.dropped_events(),
    }
}

/// The shard's side alone: nanoseconds per `produce` into a queue with room (the publisher is
/// running and draining meanwhile, as in the server).
fn produce_cost(n: u64) -> f64 {
    let stats = Arc::new(KvEventStats::default());
    let publisher = KvPublisher::start(config(free_port(), 256), stats.clone()).unwrap();
    let queue = publisher.queue.clone();
    let mut best = f64::MAX;
    for round in 0..5 {
        while stats.queue_size.load(Relaxed) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let start = Instant::now();
        for i in 0..n {
            queue.produce(
                0,
                &Event::Removed {
                    chunk: Some(i + round * n),
                    medium: Medium::Hbm,
                    size: 4096,
                },
            );
        }
        best = best.min(start.elapsed().as_nanos() as f64 / n as f64);
    }
    publisher.stop();
    best
}

fn main() {
    let measure = std::env::args().any(|a| a == "--bench");
    let n = if measure { 2_000_000 } else { 20_000 };
    println!("kv_events: {n} BlockStored events per run, subscriber on loopback TCP");
    for batch in [64, 256, 1024] {
        let o = run(n, batch);
        assert_eq!(o.dropped, 0, "a paced producer never overflows the queue");
        assert_eq!(
            o.received_batches, o.batches,
            "the subscriber receives every published batch"
        );
        println!(
            "  batch_max_events={batch:>5}: {:>9.0} events/s, {} batches, {:.1} bytes/event on the wire",
            o.events_per_s,
            o.batches,
            o.received_bytes as f64 / n as f64
        );
    }
    let ns = produce_cost(if measure { 60_000 } else { 5_000 });
    println!("  produce() on a shard: {ns:.1} ns/event (queue with room, best of 5)");
}
