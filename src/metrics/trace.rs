//! ptracer: a tracepoint per meta operation, counting BEGIN, GOOD_END and BAD_END, with the
//! latency of every end in a per-shard HDR histogram (nanoseconds, 3 significant digits).
//! `/metrics/ptracer` reads the shards' histograms as one when it is read, in place
//! (`hdr::Reading`): percentiles from the buckets, clamped to the exact minimum and maximum;
//! MAX and AVG exact.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use std::io::Write;

use super::hdr::{AtomicHdr, Reading};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tp {
    Put,
    BatchPut,
    Get,
    BatchGet,
    Alloc,
    BatchAlloc,
    UpdateState,
    BatchUpdateState,
    Remove,
    BatchRemove,
    RemoveAll,
    Exist,
    BatchExist,
    Query,
    BatchQuery,
    GetAllKeys,
    Mount,
    Unmount,
    Evict,
    Flush,
    Rewarm,
    MemoryEvict,
    MemoryPrefetch,
}

impl Tp {
    pub const ALL: [Tp; 23] = [
        Tp::Put,
        Tp::BatchPut,
        Tp::Get,
        Tp::BatchGet,
        Tp::Alloc,
        Tp::BatchAlloc,
        Tp::UpdateState,
        Tp::BatchUpdateState,
        Tp::Remove,
        Tp::BatchRemove,
        Tp::RemoveAll,
        Tp::Exist,
        Tp::BatchExist,
        Tp::Query,
        Tp::BatchQuery,
        Tp::GetAllKeys,
        Tp::Mount,
        Tp::Unmount,
        Tp::Evict,
        Tp::Flush,
        Tp::Rewarm,
        Tp::MemoryEvict,
        Tp::MemoryPrefetch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tp::Put => "TP_MMC_META_PUT",
            Tp::BatchPut => "TP_MMC_META_BATCH_PUT",
            Tp::Get => "TP_MMC_META_GET",
            Tp::BatchGet => "TP_MMC_META_BATCH_GET",
            Tp::Alloc => "TP_MMC_META_ALLOC",
            Tp::BatchAlloc => "TP_MMC_META_BATCH_ALLOC",
            Tp::UpdateState => "TP_MMC_META_UPDATE_STATE",
            Tp::BatchUpdateState => "TP_MMC_META_BATCH_UPDATE_STATE",
            Tp::Remove => "TP_MMC_META_REMOVE",
            Tp::BatchRemove => "TP_MMC_META_BATCH_REMOVE",
            Tp::RemoveAll => "TP_MMC_META_REMOVE_ALL",
            Tp::Exist => "TP_MMC_META_EXIST",
            Tp::BatchExist => "TP_MMC_META_BATCH_EXIST",
            Tp::Query => "TP_MMC_META_QUERY",
            Tp::BatchQuery => "TP_MMC_META_BATCH_QUERY",
            Tp::GetAllKeys => "TP_MMC_META_GET_ALL_KEYS",
            Tp::Mount => "TP_MMC_META_MOUNT",
            Tp::Unmount => "TP_MMC_META_UNMOUNT",
            Tp::Evict => "TP_MMC_META_EVICT",
            Tp::Flush => "TP_MMC_META_FLUSH",
            Tp::Rewarm => "TP_MMC_META_REWARM",
            Tp::MemoryEvict => "TP_MMC_META_MEMORY_EVICT",
            Tp::MemoryPrefetch => "TP_MMC_META_MEMORY_PREFETCH",
        }
    }
}

/// The most a latency sample may be (longer ones are clamped): one hour.
const MAX_NS: u64 = 3_600_000_000_000;

struct Point {
    begin: AtomicU64,
    good: AtomicU64,
    bad: AtomicU64,
    /// Recorded only by the owning shard, read by a scrape on any thread (no lock).
    latency_ns: AtomicHdr,
}

/// One shard's tracepoints.
pub struct Tracer {
    points: Box<[Point]>,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer {
            points: Tp::ALL
                .iter()
                .map(|_| Point {
                    begin: AtomicU64::new(0),
                    good: AtomicU64::new(0),
                    bad: AtomicU64::new(0),
                    latency_ns: AtomicHdr::new(MAX_NS),
                })
                .collect(),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Relaxed) + 1, Relaxed);
}

impl Tracer {
    /// Starts a span. Only the owning shard calls this.
    pub fn begin(&self, tp: Tp) -> Span<'_> {
        bump(&self.points[tp as usize].begin);
        Span {
            tracer: self,
            tp,
            start: Instant::now(),
            done: false,
        }
    }

    fn end(&self, tp: Tp, start: Instant, ok: bool) {
        let p = &self.points[tp as usize];
        bump(if ok { &p.good } else { &p.bad });
        p.latency_ns.record(start.elapsed().as_nanos() as u64);
    }
}

/// A running operation; ends as good or bad, and as bad if dropped (a cancelled request).
pub struct Span<'a> {
    tracer: &'a Tracer,
    tp: Tp,
    start: Instant,
    done: bool,
}

impl Span<'_> {
    pub fn end(mut self, ok: bool) {
        self.done = true;
        self.tracer.end(self.tp, self.start, ok);
    }
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.tracer.end(self.tp, self.start, false);
        }
    }
}

/// One tracepoint summed over shards.
#[derive(Debug, Clone, PartialEq)]
pub struct PointSnapshot {
    pub tp: Tp,
    pub begin: u64,
    pub good_end: u64,
    pub bad_end: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub avg_us: f64,
    pub max_us: f64,
}

impl PointSnapshot {
    pub fn on_fly(&self) -> u64 {
        self.begin.saturating_sub(self.good_end + self.bad_end)
    }
}

/// Merges the shards' tracepoints; only tracepoints that have been hit are returned.
pub fn snapshot<'a>(tracers: impl Iterator<Item = &'a Tracer> + Clone) -> Vec<PointSnapshot> {
    let mut out = Vec::new();
    for tp in Tp::ALL {
        let i = tp as usize;
        let (mut begin, mut good, mut bad) = (0, 0, 0);
        let mut latency = Reading::default();
        for t in tracers.clone() {
            let p = &t.points[i];
            begin += p.begin.load(Relaxed);
            good += p.good.load(Relaxed);
            bad += p.bad.load(Relaxed);
            latency.add(&p.latency_ns);
        }
        if begin == 0 {
            continue;
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let m = &latency;
        let (p50, p99, p999, avg, max) = if m.is_empty() {
            (0.0, 0.0, 0.0, 0.0, 0.0)
        } else {
            (
                us(m.quantile(0.5)),
                us(m.quantile(0.99)),
                us(m.quantile(0.999)),
                m.mean() / 1000.0,
                us(m.max()),
            )
        };
        out.push(PointSnapshot {
            tp,
            begin,
            good_end: good,
            bad_end: bad,
            p50_us: p50,
            p99_us: p99,
            p999_us: p999,
            avg_us: avg,
            max_us: max,
        });
    }
    out
}

/// The ptracer table: the seed's header and fixed-width rows (TIME 23 wide, NAME 40, each
/// number 15; the last column unpadded), appended to `out`. `filter` selects rows.
pub fn render(
    points: &[PointSnapshot],
    time: &str,
    filter: impl Fn(Tp) -> bool,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(HEADER.as_bytes());
    let mut digits = itoa::Buffer::new();
    for p in points.iter().filter(|p| filter(p.tp)) {
        padded(out, time.as_bytes(), 23);
        padded(out, p.tp.name().as_bytes(), 40);
        for n in [p.begin, p.good_end, p.bad_end, p.on_fly()] {
            padded(out, digits.format(n).as_bytes(), 15);
        }
        for v in [p.p50_us, p.p99_us, p.p999_us, p.avg_us] {
            let start = out.len();
            write_fixed3(out, v);
            let n = out.len() - start;
            out.resize(start + n.max(15), b' ');
        }
        write_fixed3(out, p.max_us);
        out.push(b'\n');
    }
}

/// `text` left-aligned in `width` columns (as `{:<width}` writes it: never cut).
fn padded(out: &mut Vec<u8>, text: &[u8], width: usize) {
    out.extend_from_slice(text);
    out.resize(out.len() + width.saturating_sub(text.len()), b' ');
}

/// `v` with 3 decimals, as `{:.3}` writes it. A value that is a whole number of thousandths
/// (below 2^40 of them) is that number as the float nearest to it, so its exact value is
/// within far less than half a thousandth of it and `{:.3}` writes exactly those digits:
/// they are written from the integer. Others (means) go through the standard formatter.
fn write_fixed3(out: &mut Vec<u8>, v: f64) {
    let n = (v * 1000.0).round();
    if v.is_sign_positive() && n < (1u64 << 40) as f64 && n / 1000.0 == v {
        let n = n as u64;
        let mut digits = itoa::Buffer::new();
        out.extend_from_slice(digits.format(n / 1000).as_bytes());
        let frac = n % 1000;
        out.extend_from_slice(&[
            b'.',
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ]);
        return;
    }
    let _ = write!(out, "{v:.3}");
}

/// The table's header line.
const HEADER: &str = "TIME                   NAME                                    BEGIN          GOOD_END       BAD_END        ON_FLY         P50(us)        P99(us)        P999(us)       AVG(us)        MAX(us)\n";

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time.
pub fn format_time(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows are written as the format string `{:<15.3}` and friends write them.
    #[test]
    fn fixed_floats_and_padding_are_what_fmt_writes() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut values = vec![
            0.0,
            -0.0,
            0.0005,
            0.0015,
            1.0,
            999.9995,
            1e300,
            -2.5,
            f64::NAN,
        ];
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push((x % 10_000_000_000) as f64 / 1000.0);
            values.push((x >> 24) as f64 / 1000.0);
            values.push((x % 1_000_003) as f64 / 7.0 / 1000.0);
            values.push(f64::from_bits(x >> 2));
        }
        for v in values {
            let mut out = Vec::new();
            write_fixed3(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{v:.3}"), "{v:e}");
        }
        for (text, width) in [("ab", 5), ("abcdef", 5), ("", 3), ("abc", 3)] {
            let mut out = Vec::new();
            padded(&mut out, text.as_bytes(), width);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{text:<width$}"));
        }
    }

    /// The header is the one the seed's format string writes.
    #[test]
    fn the_header_is_the_seeds() {
        let seed = format!(
            "{:<23}{:<40}{:<15}{:<15}{:<15}{:<15}{:<15}{:<15}{:<15}{:<15}{}\n",
            "TIME",
            "NAME",
            "BEGIN",
            "GOOD_END",
            "BAD_END",
            "ON_FLY",
            "P50(us)",
            "P99(us)",
            "P999(us)",
            "AVG(us)",
            "MAX(us)"
        );
        assert_eq!(HEADER, seed);
    }

    #[test]
    fn times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(1_767_625_023), "2026-01-05 14:57:03");
        assert_eq!(format_time(951_782_400), "2000-02-29 00:00:00");
    }

    #[test]
    fn spans_count_and_the_table_has_the_seed_layout() {
        let a = Tracer::default();
        let b = Tracer::default();
        a.begin(Tp::Put).end(true);
        a.begin(Tp::Put).end(false);
        b.begin(Tp::Put).end(true);
        drop(b.begin(Tp::Get)); // dropped: a bad end
        let _open = a.begin(Tp::Remove); // still running
        let snap = snapshot([&a, &b].into_iter());
        let put = snap.iter().find(|p| p.tp == Tp::Put).unwrap();
        assert_eq!(
            (put.begin, put.good_end, put.bad_end, put.on_fly()),
            (3, 2, 1, 0)
        );
        let rm = snap.iter().find(|p| p.tp == Tp::Remove).unwrap();
        assert_eq!(rm.on_fly(), 1);
        assert!(
            snap.iter().all(|p| p.tp != Tp::Mount),
            "untouched tracepoints are not listed"
        );
        let mut text = Vec::new();
        render(&snap, "2026-01-05 14:57:03", |_| true, &mut text);
        let text = String::from_utf8(text).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "TIME                   NAME                                    BEGIN          GOOD_END       BAD_END        ON_FLY         P50(us)        P99(us)        P999(us)       AVG(us)        MAX(us)"
        );
        let row = lines.next().unwrap();
        assert!(row.starts_with("2026-01-05 14:57:03    TP_MMC_META_PUT                         3              2              1              0              "), "{row}");
        assert_eq!(
            &row[183..184].chars().next().unwrap().is_ascii_digit(),
            &true
        );
    }

    /// One sample: every percentile, AVG and MAX are that sample, to the nanosecond (issue
    /// 27: a bucket's upper bound showed a MAX above the real maximum).
    #[test]
    fn max_and_avg_are_exact_and_percentiles_never_above_max() {
        let t = Tracer::default();
        t.points[Tp::Alloc as usize].begin.store(1, Relaxed);
        t.points[Tp::Alloc as usize].good.store(1, Relaxed);
        t.points[Tp::Alloc as usize].latency_ns.record(73_312);
        let snap = snapshot([&t].into_iter());
        let a = &snap[0];
        assert_eq!(a.tp, Tp::Alloc);
        assert_eq!(
            [a.p50_us, a.p99_us, a.p999_us, a.avg_us, a.max_us],
            [73.312; 5]
        );
        let mut row = Vec::new();
        render(&snap, "2026-01-05 14:57:03", |_| true, &mut row);
        let row = String::from_utf8(row).unwrap();
        assert!(row.trim_end().ends_with("73.312         73.312"), "{row}");
        for v in [1_000u64, 5_123, 99_999, 123_457, 1_000_001] {
            t.points[Tp::Alloc as usize].latency_ns.record(v);
        }
        let a = &snapshot([&t].into_iter())[0];
        assert_eq!(a.max_us, 1000.001);
        assert!(a.p50_us <= a.max_us && a.p99_us <= a.max_us && a.p999_us <= a.max_us);
        let sum = 73_312 + 1_000 + 5_123 + 99_999 + 123_457 + 1_000_001;
        assert!(
            (a.avg_us - sum as f64 / 6.0 / 1000.0).abs() < 1e-9,
            "{}",
            a.avg_us
        );
    }
}
