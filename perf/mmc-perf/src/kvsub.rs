//! `mmc-perf kv-sub`: a KV-event subscriber, as a KV-aware router runs one: a ZMQ SUB socket
//! on the publisher's endpoint, every topic. It counts batches, events (from each msgpack
//! `EventBatch` header, in either wire form: the positional `[ts, events, dp_rank]` or the
//! by-name `{"ts", "events", "data_parallel_rank"}`) and bytes, and checks that sequence
//! numbers are contiguous. It stops by itself after `--secs`.

use std::time::{Duration, Instant};

use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The publisher's endpoint (`ock.mmc.kv_events.endpoint`).
    #[arg(long, default_value = "tcp://127.0.0.1:5557", value_name = "ENDPOINT")]
    endpoint: String,

    /// Listen this many seconds, then print what arrived.
    #[arg(long, value_name = "SECS")]
    secs: f64,

    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,

    /// Write report.json (the JSON figures) and events.svg (events and batches received per
    /// second over the run) into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,
}

/// What arrived.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub batches: u64,
    pub events: u64,
    pub bytes: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Sequence numbers skipped between consecutive batches.
    pub missing: u64,
    /// Messages that were not `[topic, 8-byte sequence, EventBatch]`.
    pub malformed: u64,
}

/// The number of events in an encoded `EventBatch`: positional `[ts, [events...], dp_rank]`
/// or by name `{"ts": .., "events": [events...], "data_parallel_rank": ..}` (`ts` first, as the
/// server and vLLM write it).
pub fn batch_events(payload: &[u8]) -> Option<u64> {
    let mut rd = payload;
    match rmp::decode::read_marker(&mut rd).ok()? {
        rmp::Marker::FixArray(n) if n >= 2 => {}
        rmp::Marker::FixMap(n) if n >= 2 => {
            let mut key = [0u8; 8];
            if rmp::decode::read_str(&mut rd, &mut key).ok()? != "ts" {
                return None;
            }
            rmp::decode::read_f64(&mut rd).ok()?;
            if rmp::decode::read_str(&mut rd, &mut key).ok()? != "events" {
                return None;
            }
            return Some(rmp::decode::read_array_len(&mut rd).ok()? as u64);
        }
        _ => return None,
    }
    rmp::decode::read_f64(&mut rd).ok()?;
    Some(rmp::decode::read_array_len(&mut rd).ok()? as u64)
}

impl Received {
    pub fn add(&mut self, frames: &[Vec<u8>]) {
        let (Some(seq), Some(payload)) = (frames.get(1), frames.get(2)) else {
            self.malformed += 1;
            return;
        };
        let (Ok(seq), 3, Some(events)) = (
            <[u8; 8]>::try_from(seq.as_slice()),
            frames.len(),
            batch_events(payload),
        ) else {
            self.malformed += 1;
            return;
        };
        let seq = u64::from_be_bytes(seq);
        if let Some(last) = self.last_seq
            && seq > last + 1
        {
            self.missing += seq - last - 1;
        }
        self.first_seq.get_or_insert(seq);
        self.last_seq = Some(seq);
        self.batches += 1;
        self.events += events;
        self.bytes += payload.len() as u64;
    }
}

pub fn main(args: &Args) -> Result<(), String> {
    if !(args.secs.is_finite() && args.secs > 0.0 && args.secs <= 86400.0) {
        return Err(format!("invalid --secs {}", args.secs));
    }
    let ctx = zmq::Context::new();
    let s = ctx
        .socket(zmq::SUB)
        .map_err(|e| format!("zmq socket: {e}"))?;
    let setup = || -> Result<(), zmq::Error> {
        s.set_rcvhwm(0)?;
        s.set_rcvtimeo(100)?;
        s.set_linger(0)?;
        s.set_subscribe(b"")?;
        s.connect(&args.endpoint)
    };
    setup().map_err(|e| format!("cannot subscribe to {}: {e}", args.endpoint))?;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.secs);
    let mut r = Received::default();
    let mut first_at = None;
    // (seconds since the start, events) of each well-formed batch, for the report.
    let mut arrivals: Vec<(f64, f64)> = Vec::new();
    while Instant::now() < end {
        match s.recv_multipart(0) {
            Ok(frames) => {
                let t = start.elapsed().as_secs_f64();
                first_at.get_or_insert(t);
                let events = r.events;
                let batches = r.batches;
                r.add(&frames);
                if r.batches > batches {
                    arrivals.push((t, (r.events - events) as f64));
                }
            }
            Err(zmq::Error::EAGAIN) => {}
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
    let figures = json!({
        "endpoint": args.endpoint, "secs": args.secs, "batches": r.batches,
        "events": r.events, "bytes": r.bytes, "first_seq": r.first_seq,
        "last_seq": r.last_seq, "missing": r.missing, "malformed": r.malformed,
        "first_batch_after_s": first_at,
    });
    if let Some(dir) = &args.report {
        crate::report::write_charts(dir, &figures, &[chart(&arrivals, args.secs)])?;
    }
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "kv-sub {}: {} batches, {} events, {} bytes, {}, {} missing, {} malformed",
            args.endpoint,
            r.batches,
            r.events,
            r.bytes,
            sequences(r.first_seq, r.last_seq),
            r.missing,
            r.malformed
        );
    }
    Ok(())
}

/// The sequence numbers received, as a reader wants them: `sequences 0..921`, or
/// `no sequence` when no batch came.
fn sequences(first: Option<u64>, last: Option<u64>) -> String {
    match (first, last) {
        (Some(f), Some(l)) => format!("sequences {f}..{l}"),
        _ => "no sequence".to_string(),
    }
}

/// `events.svg`: events and batches received per second over the run.
fn chart(arrivals: &[(f64, f64)], secs: f64) -> crate::report::LineChart {
    let batches: Vec<(f64, f64)> = arrivals.iter().map(|&(t, _)| (t, 1.0)).collect();
    crate::report::LineChart {
        file: "events.svg".into(),
        title: "kv-sub: KV events received".into(),
        x_desc: "time (s)".into(),
        y_desc: "per second".into(),
        log_x: false,
        series: vec![
            (
                "events/s".into(),
                crate::report::rate_over_time(arrivals, secs),
            ),
            (
                "batches/s".into(),
                crate::report::rate_over_time(&batches, secs),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use mmc::config::KvEncoding;
    use mmc::kv_events::{KvEvent, encode};

    fn batch_in(encoding: KvEncoding, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let events = vec![KvEvent::Cleared; n];
        encode::batch(&mut out, encoding, 1.5, &events, 0, 256);
        out
    }

    fn batch(n: usize) -> Vec<u8> {
        batch_in(KvEncoding::Array, n)
    }

    #[test]
    fn counts_events_in_both_wire_forms() {
        for enc in [KvEncoding::Array, KvEncoding::Map] {
            for n in [0, 3, 20] {
                assert_eq!(batch_events(&batch_in(enc, n)), Some(n as u64), "{enc:?}");
            }
        }
        assert_eq!(batch_events(b"\x01"), None);
        assert_eq!(
            batch_events(b"\x82\xa1x\x00\xa1y\x00"),
            None,
            "a map without ts"
        );
    }

    #[test]
    fn counts_batches_events_and_gaps() {
        assert_eq!(batch_events(&batch(3)), Some(3));
        assert_eq!(batch_events(b"\x01"), None);
        let mut r = Received::default();
        for seq in [0u64, 1, 2, 5] {
            r.add(&[b"kv".to_vec(), seq.to_be_bytes().to_vec(), batch(2)]);
        }
        r.add(&[b"kv".to_vec(), vec![1, 2], batch(1)]);
        r.add(&[b"kv".to_vec()]);
        assert_eq!(
            (
                r.batches,
                r.events,
                r.first_seq,
                r.last_seq,
                r.missing,
                r.malformed
            ),
            (4, 8, Some(0), Some(5), 2, 2)
        );
        assert_eq!(sequences(r.first_seq, r.last_seq), "sequences 0..5");
        assert_eq!(sequences(None, None), "no sequence");
    }
}
