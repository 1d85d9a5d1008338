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

use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicU16, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

use super::counter::Counter;
use super::hdr::{AtomicHdr, Reading};
use crate::common::clock::Clock;

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

/// Distinct (rank, operation) pairs one shard keeps figures for; past it a pair's operations
/// go unrecorded (ranks are devices: a few dozen in practice).
pub const MAX_PAIRS: usize = 1024;

/// One window's sums. `stamp` is the window's index plus one (0: never written).
#[derive(Default)]
struct WindowSums {
    stamp: AtomicU64,
    bytes: Counter,
    transfer_ns: Counter,
    ops: Counter,
}

/// The figures of one (rank, operation) on one shard. Written only by the owning shard
/// (relaxed loads and stores); read by a scrape on any thread. Windows alternate between two
/// slots by the parity of their index, so the current and the previous window are always
/// both there and rolling over clears only the slot the new window takes.
struct OpWindow {
    rank: u32,
    op: ClientOp,
    sums: [WindowSums; 2],
    latency_us: [AtomicHdr; 2],
    cum_bytes: Counter,
    cum_duration_ns: Counter,
    /// Bumped by [`ClientStats::forget_rank`] (any thread); the owning shard clears the
    /// figures when it sees `forgotten != cleared`, and a scrape shows nothing meanwhile.
    forgotten: AtomicU64,
    cleared: AtomicU64,
}

impl OpWindow {
    fn new(rank: u32, op: ClientOp) -> OpWindow {
        OpWindow {
            rank,
            op,
            sums: Default::default(),
            latency_us: [
                AtomicHdr::new(MAX_LATENCY_US),
                AtomicHdr::new(MAX_LATENCY_US),
            ],
            cum_bytes: Counter::default(),
            cum_duration_ns: Counter::default(),
            forgotten: AtomicU64::new(0),
            cleared: AtomicU64::new(0),
        }
    }

    /// Owner only: clears everything if the rank was forgotten since the last clear.
    fn clear_if_forgotten(&self) {
        let f = self.forgotten.load(Acquire);
        if f == self.cleared.load(Relaxed) {
            return;
        }
        for (s, h) in self.sums.iter().zip(&self.latency_us) {
            s.stamp.store(0, Relaxed);
            h.reset();
        }
        self.cum_bytes.set(0);
        self.cum_duration_ns.set(0);
        self.cleared.store(f, Release);
    }

    /// Owner only: the slot of window `idx`, cleared if it held an older window.
    fn slot(&self, idx: u64) -> usize {
        let p = (idx % 2) as usize;
        let s = &self.sums[p];
        if s.stamp.load(Relaxed) != idx + 1 {
            s.stamp.store(0, Release);
            s.bytes.set(0);
            s.transfer_ns.set(0);
            s.ops.set(0);
            self.latency_us[p].reset();
            s.stamp.store(idx + 1, Release);
        }
        p
    }

    fn record(&self, idx: u64, bytes: u64, transfer_ns: u64, latency_us: u64) {
        self.clear_if_forgotten();
        let p = self.slot(idx);
        let s = &self.sums[p];
        s.bytes.add(bytes);
        s.transfer_ns.add(transfer_ns);
        s.ops.inc();
        self.cum_bytes.add(bytes);
        self.cum_duration_ns.add(transfer_ns);
        self.latency_us[p].record(latency_us);
    }

    /// Any thread: whether the figures stand (not forgotten since recorded).
    fn live(&self) -> bool {
        self.forgotten.load(Acquire) == self.cleared.load(Acquire)
    }

    /// Any thread: adds window `idx` and the one before it into `v` and `h`.
    fn add_windows<'a>(&'a self, idx: u64, v: &mut OpView, h: &mut Reading<'a>) {
        for (s, lat) in self.sums.iter().zip(&self.latency_us) {
            let stamp = s.stamp.load(Acquire);
            if stamp == 0 || !(stamp == idx + 1 || stamp == idx) {
                continue;
            }
            v.bytes += s.bytes.get();
            v.duration_ns += s.transfer_ns.get();
            v.ops += s.ops.get();
            h.add(lat);
        }
    }
}

/// One shard's client metrics: a fixed table of (rank, operation) slots, each filled once by
/// the owning shard and never moved, so recording takes no lock. (A `OnceLock` is
/// initialised only by the owner, so no thread ever waits on one; readers use `get`.)
pub struct ClientStats {
    clock: Clock,
    window_secs: u64,
    pairs: Box<[OnceLock<OpWindow>]>,
    /// The slots of `pairs` taken so far, in the order they were (the first `taken`): a
    /// scrape visits these, not every slot.
    used: Box<[AtomicU16]>,
    taken: AtomicUsize,
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
    pub fn new(clock: Clock, window_secs: u64) -> ClientStats {
        ClientStats {
            clock,
            window_secs: window_secs.max(1),
            pairs: (0..MAX_PAIRS).map(|_| OnceLock::new()).collect(),
            used: (0..MAX_PAIRS).map(|_| AtomicU16::new(0)).collect(),
            taken: AtomicUsize::new(0),
        }
    }

    fn window_index(&self) -> u64 {
        self.clock.now_secs() / self.window_secs
    }

    /// The slot of (rank, op), taken on first use (owner only). Open addressing from a hash
    /// of the pair; slots are never freed, so a probe stops at the first empty one.
    fn pair(&self, rank: u32, op: ClientOp) -> Option<&OpWindow> {
        let start = (rank as usize).wrapping_mul(3).wrapping_add(op as usize) % MAX_PAIRS;
        for i in 0..MAX_PAIRS {
            let at = (start + i) % MAX_PAIRS;
            let slot = &self.pairs[at];
            let w = match slot.get() {
                Some(w) => w,
                None => {
                    let w = slot.get_or_init(|| OpWindow::new(rank, op));
                    // Listed once the slot is set, so a reader finds it filled.
                    let n = self.taken.load(Relaxed);
                    self.used[n].store(at as u16, Relaxed);
                    self.taken.store(n + 1, Release);
                    w
                }
            };
            if w.rank == rank && w.op == op {
                return Some(w);
            }
        }
        None
    }

    /// Any thread: the slots taken so far.
    fn taken(&self) -> impl Iterator<Item = &OpWindow> {
        let n = self.taken.load(Acquire);
        self.used[..n]
            .iter()
            .filter_map(|at| self.pairs[at.load(Relaxed) as usize].get())
    }

    /// Records one data-plane operation of `bytes` whose bytes took `transfer_ns` to move and
    /// which took `latency_us` in all. Only the owning shard calls this.
    pub fn record(&self, rank: u32, op: ClientOp, bytes: u64, transfer_ns: u64, latency_us: u64) {
        let idx = self.window_index();
        if let Some(w) = self.pair(rank, op) {
            w.record(idx, bytes, transfer_ns, latency_us);
        }
    }

    /// Records one operation whose bytes came from (or went to) several ranks: each rank's
    /// bytes are booked to that rank, as one operation there, with the share of the transfer
    /// time its bytes took (in proportion to them) and the whole operation's latency. Only
    /// the owning shard calls this.
    pub fn record_ranks(
        &self,
        ranks: &[(u32, u64)],
        op: ClientOp,
        transfer_ns: u64,
        latency_us: u64,
    ) {
        let total: u128 = ranks.iter().map(|&(_, b)| u128::from(b)).sum();
        for &(rank, bytes) in ranks {
            let share = match total {
                0 => transfer_ns / ranks.len().max(1) as u64,
                t => (u128::from(transfer_ns) * u128::from(bytes) / t) as u64,
            };
            self.record(rank, op, bytes, share, latency_us);
        }
    }

    /// Drops everything recorded for `rank` (its last segment was unmounted: its series go
    /// with it, and a rank mounted again later starts from zero). Any thread may call this.
    pub fn forget_rank(&self, rank: u32) {
        for w in self.taken() {
            if w.rank == rank {
                w.forgotten.fetch_add(1, Release);
            }
        }
    }

    /// Adds this shard's figures into `acc` (one entry per rank and operation; its latency
    /// histograms are read in place, nothing is copied).
    pub fn merge_into<'a>(&'a self, acc: &mut Vec<(OpView, Reading<'a>)>) {
        let idx = self.window_index();
        for w in self.taken() {
            if !w.live() {
                continue;
            }
            let at = match acc
                .iter()
                .position(|(v, _)| (v.rank, v.op) == (w.rank, w.op))
            {
                Some(at) => at,
                None => {
                    acc.push((OpView::empty(w.rank, w.op), Reading::default()));
                    acc.len() - 1
                }
            };
            let (v, h) = &mut acc[at];
            w.add_windows(idx, v, h);
            v.cum_bytes += w.cum_bytes.get();
            v.cum_duration_ns += w.cum_duration_ns.get();
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

    /// Adds `other`'s figures of the same rank and operation (another process's record of
    /// it: a remote rank's local service reports what it moved). The latency quantiles are
    /// those of the side with more operations in the window (quantiles do not add up; the
    /// two sides record different operations of the rank, so one of them is usually empty).
    pub fn absorb(&mut self, other: &OpView) {
        if other.ops > self.ops {
            self.latency = other.latency;
        }
        self.bytes += other.bytes;
        self.duration_ns += other.duration_ns;
        self.ops += other.ops;
        self.cum_bytes += other.cum_bytes;
        self.cum_duration_ns += other.cum_duration_ns;
    }

    /// The window's transfer rate: bytes over the time they took, 0 when nothing moved.
    pub fn bytes_per_sec(&self) -> u64 {
        if self.duration_ns == 0 {
            return 0;
        }
        (self.bytes as u128 * 1_000_000_000 / self.duration_ns as u128) as u64
    }
}

#[cfg(test)]
impl OpView {
    /// A view of `rank` and `op` with every figure set (tests).
    pub(crate) fn sample(rank: u32, op: ClientOp) -> OpView {
        OpView {
            rank,
            op,
            bytes: 100,
            duration_ns: 2_500,
            ops: 1,
            cum_bytes: 300,
            cum_duration_ns: 7_000,
            latency: [0.001, 0.002, 0.003, 0.0015],
        }
    }
}

/// Adds `bytes` for `rank` to a per-rank tally (ranks in order of first appearance): the
/// bytes of one operation over several ranks, for [`ClientStats::record_ranks`].
pub fn tally<A: smallvec::Array<Item = (u32, u64)>>(
    ranks: &mut smallvec::SmallVec<A>,
    rank: u32,
    bytes: u64,
) {
    match ranks.iter_mut().find(|(r, _)| *r == rank) {
        Some((_, b)) => *b += bytes,
        None => ranks.push((rank, bytes)),
    }
}

/// Finishes merged views, by rank and operation: latency quantiles in seconds (what an
/// `hdrhistogram` of the windows' latencies answers).
pub fn finish(acc: Vec<(OpView, Reading<'_>)>) -> Vec<OpView> {
    let mut out: Vec<OpView> = acc
        .into_iter()
        .map(|(mut v, h)| {
            if !h.is_empty() {
                let s = |us: u64| us as f64 / 1e6;
                v.latency = [
                    s(h.bucket_quantile(0.5)),
                    s(h.bucket_quantile(0.9)),
                    s(h.bucket_quantile(0.99)),
                    h.bucket_mean() / 1e6,
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
    use std::time::Instant;

    #[test]
    fn records_merge_across_shards() {
        let a = ClientStats::new(Clock::start(), 10);
        let b = ClientStats::new(Clock::start(), 10);
        a.record(0, ClientOp::BatchPut, 1000, 1_500_000, 2000);
        b.record(0, ClientOp::BatchPut, 3000, 500_000, 4000);
        b.record(1, ClientOp::BatchGet, 10, 100_000, 100);
        let mut acc = Vec::new();
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
        let s = ClientStats::new(
            Clock::since(Instant::now() - std::time::Duration::from_secs(100)),
            10,
        );
        s.record(0, ClientOp::BatchGet, 5, 5, 5);
        // Pretend it was recorded five windows ago.
        let w = s.pair(0, ClientOp::BatchGet).unwrap();
        let stamp = &w
            .sums
            .iter()
            .find(|x| x.stamp.load(Relaxed) != 0)
            .unwrap()
            .stamp;
        stamp.store(stamp.load(Relaxed) - 5, Relaxed);
        let mut acc = Vec::new();
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
        let s = ClientStats::new(Clock::start(), 10);
        for _ in 0..4 {
            s.record(0, ClientOp::BatchGet, 32 << 20, 700_000, 900);
        }
        s.record(0, ClientOp::BatchPut, 4096, 300, 1);
        let mut acc = Vec::new();
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

    /// A batch spanning ranks books each rank's bytes to it, one operation each, the
    /// transfer time shared in proportion to the bytes.
    #[test]
    fn an_operation_over_several_ranks_books_each_ranks_bytes() {
        let s = ClientStats::new(Clock::start(), 10);
        s.record_ranks(&[(0, 300), (2, 100)], ClientOp::BatchGet, 4000, 7);
        let mut acc = Vec::new();
        s.merge_into(&mut acc);
        let v = finish(acc);
        let got: Vec<(u32, u64, u64, u64)> = v
            .iter()
            .map(|v| (v.rank, v.bytes, v.duration_ns, v.ops))
            .collect();
        assert_eq!(got, [(0, 300, 3000, 1), (2, 100, 1000, 1)]);
        assert_eq!(v[0].bytes_per_sec(), v[1].bytes_per_sec());
    }

    #[test]
    fn a_reported_view_adds_to_the_own_one() {
        let mut own = OpView::empty(3, ClientOp::BatchGet);
        let reported = OpView::sample(3, ClientOp::BatchGet);
        own.absorb(&reported);
        assert_eq!(own, reported);
        let again = own.clone();
        own.absorb(&again);
        assert_eq!((own.bytes, own.ops, own.cum_bytes), (200, 2, 600));
        assert_eq!(own.latency, reported.latency);
    }

    #[test]
    fn a_forgotten_rank_has_no_view() {
        let s = ClientStats::new(Clock::start(), 10);
        s.record(0, ClientOp::BatchGet, 5, 5, 5);
        s.record(1, ClientOp::BatchGet, 5, 5, 5);
        s.forget_rank(1);
        let mut acc = Vec::new();
        s.merge_into(&mut acc);
        let ranks: Vec<u32> = finish(acc).iter().map(|v| v.rank).collect();
        assert_eq!(ranks, [0]);
    }

    #[test]
    fn a_scrape_on_another_thread_sees_what_the_owner_records() {
        let s = std::sync::Arc::new(ClientStats::new(Clock::start(), 3600));
        let owner = {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    s.record((i % 3) as u32, ClientOp::BatchGet, 10, 100, 1 + i % 1000);
                }
            })
        };
        // Scrapes while the owner records: figures only grow.
        let mut last = 0;
        while !owner.is_finished() {
            let mut acc = Vec::new();
            s.merge_into(&mut acc);
            let ops: u64 = finish(acc).iter().map(|v| v.ops).sum();
            assert!(ops >= last, "{ops} < {last}");
            last = ops;
        }
        owner.join().unwrap();
        let mut acc = Vec::new();
        s.merge_into(&mut acc);
        let v = finish(acc);
        assert_eq!(v.iter().map(|v| v.ops).sum::<u64>(), 20_000);
        assert_eq!(v.iter().map(|v| v.cum_bytes).sum::<u64>(), 200_000);
        // Forgetting from another thread hides the rank at once; the owner clears it.
        s.forget_rank(1);
        let mut acc = Vec::new();
        s.merge_into(&mut acc);
        assert_eq!(
            finish(acc).iter().map(|v| v.rank).collect::<Vec<_>>(),
            [0, 2]
        );
        s.record(1, ClientOp::BatchGet, 5, 5, 5);
        let mut acc = Vec::new();
        s.merge_into(&mut acc);
        let again = finish(acc);
        assert_eq!((again[1].rank, again[1].ops, again[1].cum_bytes), (1, 1, 5));
    }
}
