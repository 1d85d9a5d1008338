//! Client bandwidth metrics: the data plane's own traffic per rank and operation (the seed's
//! `memcache_bandwidth_*` and `memcache_metric_stale` families). Every shard keeps its own,
//! merged when scraped: window sums over the last `ock.mmc.metrics.window_secs`, cumulative
//! totals, and latency quantiles from HDR histograms of the current and previous window.
//!
//! Two times are recorded per operation: the *transfer* time (how long the operation's bytes
//! took: a get's body copied out and handed to the socket, a put's body received and written
//! into its blobs), behind the `duration_ms` families and bytes per second; and the *latency*
//! of the whole operation (microseconds), behind the latency quantiles. Transfer times are
//! kept in nanoseconds and converted to (fractional) milliseconds only when shown, so a
//! transfer shorter than a millisecond (a 4 KiB copy takes well under a microsecond) still
//! counts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use hdrhistogram::Histogram;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientOp {
    BatchPut,
    BatchGet,
    BatchExist,
}

impl ClientOp {
    pub const ALL: [ClientOp; 3] = [ClientOp::BatchPut, ClientOp::BatchGet, ClientOp::BatchExist];

    pub fn name(self) -> &'static str {
        match self {
            ClientOp::BatchPut => "batch_put",
            ClientOp::BatchGet => "batch_get",
            ClientOp::BatchExist => "batch_exist",
        }
    }

    /// Whether the operation moves bytes (exist does not: no byte series for it).
    pub fn moves_bytes(self) -> bool {
        self != ClientOp::BatchExist
    }
}

const MAX_LATENCY_US: u64 = 3_600_000_000;

struct OpWindow {
    /// Per-window-index sums: (index, bytes, transfer_ns, ops) for the current and previous
    /// window.
    cur: (u64, u64, u64, u64),
    prev: (u64, u64, u64, u64),
    cum_bytes: u64,
    cum_duration_ns: u64,
    lat_cur: Histogram<u64>,
    lat_prev: Histogram<u64>,
}

impl OpWindow {
    fn new() -> OpWindow {
        let h = || Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid bounds");
        OpWindow {
            cur: (0, 0, 0, 0),
            prev: (0, 0, 0, 0),
            cum_bytes: 0,
            cum_duration_ns: 0,
            lat_cur: h(),
            lat_prev: h(),
        }
    }

    /// Moves to window `idx`, shifting or dropping older windows.
    fn roll(&mut self, idx: u64) {
        if self.cur.0 == idx {
            return;
        }
        if self.cur.0 + 1 == idx {
            self.prev = self.cur;
            std::mem::swap(&mut self.lat_prev, &mut self.lat_cur);
        } else {
            self.prev = (idx.saturating_sub(1), 0, 0, 0);
            self.lat_prev.reset();
        }
        self.lat_cur.reset();
        self.cur = (idx, 0, 0, 0);
    }
}

/// One shard's client metrics.
pub struct ClientStats {
    origin: Instant,
    window_secs: u64,
    per: Mutex<HashMap<(u32, ClientOp), OpWindow>>,
}

/// The merged view of one (rank, operation) over the last full window and the current one.
#[derive(Debug, Clone, PartialEq)]
pub struct OpView {
    pub rank: u32,
    pub op: ClientOp,
    pub bytes: u64,
    /// Transfer time in the window, nanoseconds.
    pub duration_ns: u64,
    pub ops: u64,
    pub cum_bytes: u64,
    /// Transfer time since start, nanoseconds.
    pub cum_duration_ns: u64,
    /// Seconds: P50, P90, P99, average.
    pub latency: [f64; 4],
}

impl ClientStats {
    pub fn new(origin: Instant, window_secs: u64) -> ClientStats {
        ClientStats {
            origin,
            window_secs: window_secs.max(1),
            per: Mutex::new(HashMap::new()),
        }
    }

    fn window_index(&self) -> u64 {
        self.origin.elapsed().as_secs() / self.window_secs
    }

    /// Records one data-plane operation of `bytes` whose bytes took `transfer_ns` to move and
    /// which took `latency_us` in all.
    pub fn record(&self, rank: u32, op: ClientOp, bytes: u64, transfer_ns: u64, latency_us: u64) {
        let idx = self.window_index();
        let Ok(mut per) = self.per.lock() else { return };
        let w = per.entry((rank, op)).or_insert_with(OpWindow::new);
        w.roll(idx);
        w.cur.1 += bytes;
        w.cur.2 += transfer_ns;
        w.cur.3 += 1;
        w.cum_bytes += bytes;
        w.cum_duration_ns += transfer_ns;
        let _ = w.lat_cur.record(latency_us.clamp(1, MAX_LATENCY_US));
    }

    /// Drops everything recorded for `rank` (its last segment was unmounted: its series go
    /// with it, and a rank mounted again later starts from zero).
    pub fn forget_rank(&self, rank: u32) {
        if let Ok(mut per) = self.per.lock() {
            per.retain(|&(r, _), _| r != rank);
        }
    }

    /// Adds this shard's figures into `acc` (keyed by rank and operation).
    pub fn merge_into(&self, acc: &mut HashMap<(u32, ClientOp), (OpView, Histogram<u64>)>) {
        let idx = self.window_index();
        let Ok(mut per) = self.per.lock() else { return };
        for (&(rank, op), w) in per.iter_mut() {
            w.roll(idx);
            let (v, h) = acc.entry((rank, op)).or_insert_with(|| {
                (
                    OpView {
                        rank,
                        op,
                        bytes: 0,
                        duration_ns: 0,
                        ops: 0,
                        cum_bytes: 0,
                        cum_duration_ns: 0,
                        latency: [0.0; 4],
                    },
                    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid bounds"),
                )
            });
            v.bytes += w.cur.1 + w.prev.1;
            v.duration_ns += w.cur.2 + w.prev.2;
            v.ops += w.cur.3 + w.prev.3;
            v.cum_bytes += w.cum_bytes;
            v.cum_duration_ns += w.cum_duration_ns;
            let _ = h.add(&w.lat_cur);
            let _ = h.add(&w.lat_prev);
        }
    }
}

impl OpView {
    /// An operation of a rank with nothing recorded (the contract keeps such series as 0).
    pub fn empty(rank: u32, op: ClientOp) -> OpView {
        OpView {
            rank,
            op,
            bytes: 0,
            duration_ns: 0,
            ops: 0,
            cum_bytes: 0,
            cum_duration_ns: 0,
            latency: [0.0; 4],
        }
    }

    /// The window's transfer rate: bytes over the time they took, 0 when nothing moved.
    pub fn bytes_per_sec(&self) -> u64 {
        if self.duration_ns == 0 {
            return 0;
        }
        (self.bytes as u128 * 1_000_000_000 / self.duration_ns as u128) as u64
    }
}

/// Finishes merged views: latency quantiles in seconds.
pub fn finish(acc: HashMap<(u32, ClientOp), (OpView, Histogram<u64>)>) -> Vec<OpView> {
    let mut out: Vec<OpView> = acc
        .into_values()
        .map(|(mut v, h)| {
            if !h.is_empty() {
                let s = |us: u64| us as f64 / 1e6;
                v.latency = [
                    s(h.value_at_quantile(0.5)),
                    s(h.value_at_quantile(0.9)),
                    s(h.value_at_quantile(0.99)),
                    h.mean() / 1e6,
                ];
            }
            v
        })
        .collect();
    out.sort_by_key(|v| (v.rank, v.op));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merge_across_shards() {
        let a = ClientStats::new(Instant::now(), 10);
        let b = ClientStats::new(Instant::now(), 10);
        a.record(0, ClientOp::BatchPut, 1000, 1_500_000, 2000);
        b.record(0, ClientOp::BatchPut, 3000, 500_000, 4000);
        b.record(1, ClientOp::BatchGet, 10, 100_000, 100);
        let mut acc = HashMap::new();
        a.merge_into(&mut acc);
        b.merge_into(&mut acc);
        let v = finish(acc);
        assert_eq!(v.len(), 2);
        let put = &v[0];
        assert_eq!(
            (
                put.rank,
                put.op,
                put.bytes,
                put.duration_ns,
                put.ops,
                put.cum_bytes
            ),
            (0, ClientOp::BatchPut, 4000, 2_000_000, 2, 4000)
        );
        // 4000 bytes in 2 ms of transfer.
        assert_eq!(put.bytes_per_sec(), 2_000_000);
        assert!(
            (put.latency[3] - 0.003).abs() < 1e-4,
            "avg {}",
            put.latency[3]
        );
        assert!(put.latency[0] > 0.0019 && put.latency[2] < 0.0041);
    }

    #[test]
    fn old_windows_drop_out() {
        let s = ClientStats::new(Instant::now() - std::time::Duration::from_secs(100), 10);
        s.record(0, ClientOp::BatchGet, 5, 5, 5);
        {
            let mut per = s.per.lock().unwrap();
            let w = per.get_mut(&(0, ClientOp::BatchGet)).unwrap();
            w.cur.0 -= 5; // pretend it was recorded five windows ago
        }
        let mut acc = HashMap::new();
        s.merge_into(&mut acc);
        let v = finish(acc);
        assert_eq!(
            (v[0].bytes, v[0].cum_bytes),
            (0, 5),
            "the window is empty, the total is not"
        );
    }

    #[test]
    fn sub_microsecond_transfers_keep_their_time() {
        let s = ClientStats::new(Instant::now(), 10);
        for _ in 0..4 {
            s.record(0, ClientOp::BatchGet, 32 << 20, 700_000, 900);
        }
        s.record(0, ClientOp::BatchPut, 4096, 300, 1);
        let mut acc = HashMap::new();
        s.merge_into(&mut acc);
        let v = finish(acc);
        assert_eq!(
            (v[1].duration_ns, v[1].cum_duration_ns),
            (2_800_000, 2_800_000)
        );
        assert_eq!(
            v[1].bytes_per_sec(),
            (128u64 << 20) * 1_000_000_000 / 2_800_000
        );
        // 4 KiB copied in 300 ns: far under a microsecond, still a rate.
        assert_eq!(v[0].bytes_per_sec(), 4096 * 1_000_000_000 / 300);
        assert_eq!(OpView::empty(3, ClientOp::BatchPut).bytes_per_sec(), 0);
    }

    #[test]
    fn a_forgotten_rank_has_no_view() {
        let s = ClientStats::new(Instant::now(), 10);
        s.record(0, ClientOp::BatchGet, 5, 5, 5);
        s.record(1, ClientOp::BatchGet, 5, 5, 5);
        s.forget_rank(1);
        let mut acc = HashMap::new();
        s.merge_into(&mut acc);
        let ranks: Vec<u32> = finish(acc).iter().map(|v| v.rank).collect();
        assert_eq!(ranks, [0]);
    }
}
