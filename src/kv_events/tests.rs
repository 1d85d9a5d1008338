//! Unit tests of the KV-event queue and publisher.

use super::*;

fn cfg(soft: u64, hard: u64) -> KvEventsConfig {
    KvEventsConfig {
        enable: true,
        encoding: KvEncoding::Array,
        endpoint: "inproc://t".into(),
        replay_endpoint: String::new(),
        topic: String::new(),
        queue_capacity: soft,
        hard_capacity: hard,
        batch_max_events: 4,
        batch_max_delay_ms: 1,
        data_parallel_rank: 0,
        replay_batches: 0,
        block_size: 256,
        key_format: Default::default(),
    }
}

/// The eventfd's counter: how many signals since the last read.
fn signals(q: &KvQueue) -> u64 {
    let mut counter = [0u8; 8];
    // SAFETY: reading 8 bytes from our non-blocking eventfd into a local buffer.
    let n = unsafe { libc::read(q.wake.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
    if n == 8 {
        u64::from_ne_bytes(counter)
    } else {
        0
    }
}

#[test]
fn producers_signal_when_the_queue_leaves_empty_or_fills_a_batch() {
    let stats = Arc::new(KvEventStats::default());
    let q = KvQueue::new(&cfg(100, 100), stats.clone()).unwrap();
    let ev = Event::Stored {
        chunk: Some(7),
        medium: Medium::Hbm,
        size: 1,
    };
    for _ in 0..10 {
        q.produce(0, &ev);
    }
    // Batches of 4: the first event and the fourth signal, the others do not.
    assert_eq!(signals(&q), 2);
    while q.pop().is_some() {}
    q.produce(0, &ev);
    assert_eq!(signals(&q), 1, "an empty queue signals again");
    assert_eq!(stats.wakeups(), 3);
}

#[test]
fn a_steady_stream_wakes_the_publisher_about_once_per_batch() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = cfg(100_000, 100_000);
    c.endpoint = format!("tcp://127.0.0.1:{port}");
    c.batch_max_events = 64;
    c.batch_max_delay_ms = 5;
    let stats = Arc::new(KvEventStats::default());
    let p = KvPublisher::start(c, stats.clone()).unwrap();
    // 2000 events over about 200 ms: 10 per millisecond, so a 5 ms batch delay sees about
    // 50 events; with a wake-up per event this would be ~2000.
    for i in 0..2000u64 {
        p.queue.produce(
            0,
            &Event::Removed {
                chunk: Some(i),
                medium: Medium::Dram,
                size: 1,
            },
        );
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.published_events.get() < 2000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    p.stop();
    assert_eq!(stats.published_events.get(), 2000, "every event is sent");
    let batches = stats.published_batches.get();
    let wakeups = stats.wakeups();
    assert!(
        wakeups <= 2 * batches + 10,
        "{wakeups} wake-ups for {batches} batches"
    );
    assert!(
        batches <= 2000 / 10,
        "events are batched: {batches} batches"
    );
}

/// The events of one positional batch: ("stored" | "removed" | "cleared", hash).
fn batch_events(payload: &[u8]) -> Vec<(String, u64)> {
    use encode::V;
    let V::A(batch) = encode::decode_value(payload) else {
        panic!("not an array")
    };
    let V::A(events) = &batch[1] else {
        panic!("no events")
    };
    events
        .iter()
        .map(|e| {
            let V::A(f) = e else { panic!("{e:?}") };
            let V::S(tag) = &f[0] else { panic!("{e:?}") };
            let hash = match f.get(1) {
                Some(V::A(h)) => match h[0] {
                    V::U(h) => h,
                    _ => panic!("{e:?}"),
                },
                _ => 0,
            };
            (tag.clone(), hash)
        })
        .collect()
}

/// A follower of the publisher: SUB on `pub_ep`, REQ on `replay_ep`.
struct Follower {
    _ctx: zmq::Context,
    sub: zmq::Socket,
    replay: zmq::Socket,
}

impl Follower {
    fn new(pub_ep: &str, replay_ep: &str) -> Follower {
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.set_rcvtimeo(5000).unwrap();
        sub.connect(pub_ep).unwrap();
        let replay = ctx.socket(zmq::REQ).unwrap();
        replay.set_rcvtimeo(5000).unwrap();
        replay.connect(replay_ep).unwrap();
        Follower {
            _ctx: ctx,
            sub,
            replay,
        }
    }

    /// The next published batch: (seq, events).
    fn next(&self) -> (u64, Vec<(String, u64)>) {
        let f = self.sub.recv_multipart(0).expect("a batch within 5 s");
        let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
        (seq, batch_events(&f[2]))
    }

    /// Nothing arrives within `ms`.
    fn quiet(&self, ms: i64) -> bool {
        self.sub.poll(zmq::POLLIN, ms).unwrap() == 0
    }

    /// Every kept batch from `start`, as vLLM's replay client reads them.
    fn replay(&self, start: u64) -> Vec<(u64, Vec<(String, u64)>)> {
        self.replay.send(&start.to_be_bytes()[..], 0).unwrap();
        let mut out = Vec::new();
        loop {
            let f = self.replay.recv_multipart(0).expect("a replay answer");
            let seq = u64::from_be_bytes(f[0].as_slice().try_into().unwrap());
            if seq == u64::MAX {
                assert!(f[1].is_empty());
                return out;
            }
            out.push((seq, batch_events(&f[1])));
            // REQ takes one reply per request: the server sends the batches as separate
            // messages, so ask again from the next one.
            self.replay.send(&(seq + 1).to_be_bytes()[..], 0).unwrap();
        }
    }
}

fn stored(hash: u64) -> Event {
    Event::Stored {
        chunk: Some(hash),
        medium: Medium::Dram,
        size: 1,
    }
}

fn ev(tag: &str, hash: u64) -> (String, u64) {
    (tag.to_string(), hash)
}

fn free_tcp() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("tcp://127.0.0.1:{port}")
}

/// HA: nothing is published outside a leadership; each leadership starts the stream over
/// (sequence 0, an `AllBlocksCleared` first, a fresh replay buffer); events queued when a
/// leadership ends are not sent.
#[test]
fn each_leadership_is_an_epoch_that_starts_with_all_blocks_cleared() {
    let mut c = cfg(1000, 1000);
    c.endpoint = free_tcp();
    c.replay_endpoint = free_tcp();
    c.replay_batches = 100;
    c.batch_max_events = 64;
    c.batch_max_delay_ms = 5;
    let stats = Arc::new(KvEventStats::default());
    let p = KvPublisher::start(c.clone(), stats.clone()).unwrap();
    let q = p.queue.clone();
    // HA on: idle until a leadership is won.
    q.end_epoch();
    assert_eq!(q.leadership(), (0, false));
    let f = Follower::new(&c.endpoint, &c.replay_endpoint);
    // Let the subscription reach the publisher (nothing is sent meanwhile to probe it).
    std::thread::sleep(Duration::from_millis(300));
    q.produce(0, &stored(1));
    assert!(f.quiet(200), "a standby publishes nothing");
    assert_eq!(stats.published_batches.get(), 0);

    // Won: epoch 1, batch 0 = AllBlocksCleared, then what the leadership stores.
    assert_eq!(q.begin_epoch(), 1);
    q.produce(0, &stored(2));
    q.produce(0, &stored(3));
    let mut got = Vec::new();
    let (seq, events) = f.next();
    assert_eq!(seq, 0);
    got.extend(events);
    while got.len() < 3 {
        got.extend(f.next().1);
    }
    assert_eq!(
        got,
        vec![
            ev("AllBlocksCleared", 0),
            ev("BlockStored", 2),
            ev("BlockStored", 3)
        ]
    );

    // Lost: what is queued then is not sent.
    q.end_epoch();
    q.produce(0, &stored(4));
    assert!(f.quiet(200), "nothing after the leadership ended");

    // Won again: the stream starts over, and the replay buffer holds only this epoch.
    assert_eq!(q.begin_epoch(), 2);
    q.produce(0, &stored(5));
    let mut got = Vec::new();
    let (seq, events) = f.next();
    assert_eq!(seq, 0, "a new epoch restarts the sequence");
    got.extend(events);
    while got.len() < 2 {
        got.extend(f.next().1);
    }
    assert_eq!(got, vec![ev("AllBlocksCleared", 0), ev("BlockStored", 5)]);
    let replayed: Vec<_> = f.replay(0).into_iter().flat_map(|(_, e)| e).collect();
    assert_eq!(replayed, got, "replay from 0 is this epoch from its start");
    p.stop();
    assert_eq!(stats.epochs.get(), 2);
    assert_eq!(
        stats.produced(),
        stats.published_events.get() + stats.dropped_events() + stats.discarded_not_leader.get(),
        "every produced event is published, dropped or discarded"
    );
}

/// Events queued (not yet due) when the leadership ends are dropped, not sent; so is a
/// whole epoch that began and ended before the publisher looked.
#[test]
fn what_an_ended_leadership_left_queued_is_not_sent() {
    let mut c = cfg(1000, 1000);
    c.endpoint = free_tcp();
    c.batch_max_events = 64;
    c.batch_max_delay_ms = 400;
    let stats = Arc::new(KvEventStats::default());
    let p = KvPublisher::start(c.clone(), stats.clone()).unwrap();
    let q = p.queue.clone();
    q.end_epoch();
    let f = Follower::new(&c.endpoint, &free_tcp());
    std::thread::sleep(Duration::from_millis(300));
    // Epoch 1 begins and ends with three events queued, before its batch is due.
    q.begin_epoch();
    for h in 1..=3 {
        q.produce(0, &stored(h));
    }
    q.end_epoch();
    // Epoch 2 begins and ends at once; epoch 3 is the live one.
    q.begin_epoch();
    q.produce(0, &stored(4));
    q.end_epoch();
    assert_eq!(q.begin_epoch(), 3);
    q.produce(0, &stored(5));
    let (seq, events) = f.next();
    assert_eq!(seq, 0);
    assert_eq!(
        events,
        vec![ev("AllBlocksCleared", 0), ev("BlockStored", 5)]
    );
    assert!(f.quiet(600), "nothing else is sent");
    p.stop();
    assert_eq!(stats.published_batches.get(), 1);
    // Four events and two epoch openings were never sent.
    assert_eq!(stats.discarded_not_leader.get(), 6);
    assert_eq!(
        stats.produced(),
        stats.published_events.get() + stats.dropped_events() + stats.discarded_not_leader.get()
    );
}

#[test]
fn stored_events_drop_first_and_every_drop_is_counted() {
    let stats = Arc::new(KvEventStats::default());
    let q = KvQueue::new(&cfg(2, 3), stats.clone()).unwrap();
    let removed = Event::Removed {
        chunk: Some(1),
        medium: Medium::Dram,
        size: 1,
    };
    q.produce(0, &stored(1));
    q.produce(0, &stored(1));
    q.produce(0, &stored(1)); // over the soft limit: dropped
    q.produce(0, &removed); // high priority: fits under the hard limit
    q.produce(0, &removed); // over the hard limit: dropped
    q.produce(
        0,
        &Event::Stored {
            chunk: None,
            medium: Medium::Dram,
            size: 1,
        },
    ); // unparsed
    q.produce(
        0,
        &Event::Read {
            medium: Medium::Dram,
            bytes: 1,
        },
    ); // not a KV event
    let g = |c: &std::sync::atomic::AtomicU64| c.load(Relaxed);
    assert_eq!(stats.produced(), 5);
    assert_eq!(
        (
            stats.dropped_events(),
            stats.dropped_stored(),
            stats.dropped_high_priority()
        ),
        (2, 1, 1)
    );
    assert_eq!(stats.skipped_unparsed_keys(), 1);
    assert_eq!(g(&stats.queue_size), 3);
    let mut popped = 0;
    while q.pop().is_some() {
        popped += 1;
    }
    assert_eq!(popped, 3);
    assert_eq!(stats.produced(), popped + stats.dropped_events());
}
