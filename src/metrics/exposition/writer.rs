//! The exposition writer: the same calls write the Prometheus text format (0.0.4) or the
//! protobuf one (delimited `MetricFamily` messages, `proto.rs`).
//!
//! What never changes between scrapes is prepared once: a [`Family`]'s `# HELP` and `# TYPE`
//! lines (at compile time by [`family!`], or once per process for names made at run time),
//! and a classic histogram's sample names with their labels and bounds ([`HistogramLines`]).
//! A scrape then copies those bytes and writes the numbers after them (`itoa`, and
//! `common::fmt::write_f64` for floats, which writes exactly what `Display` writes). A
//! histogram whose figures are those it had at this thread's last scrape is copied whole
//! from that scrape's text (most operations' request durations do not move between scrapes).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::proto::{self, field};
use crate::common::fmt::write_f64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A metric family: its name, HELP text and type, and its two header lines as the text format
/// writes them.
pub(super) struct Family {
    pub name: &'static str,
    help: &'static str,
    kind: Kind,
    /// `# HELP <name> <help>\n# TYPE <name> <type>\n`.
    head: &'static str,
}

impl Family {
    /// A family written out at compile time (use [`family!`]).
    pub const fn prepared(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        head: &'static str,
    ) -> Family {
        Family {
            name,
            help,
            kind,
            head,
        }
    }

    /// A family whose name or HELP text is made at run time: its text is built here and kept
    /// for the life of the process (call it once, to fill a static table).
    pub fn leaked(name: String, help: String, kind: Kind) -> Family {
        let kind_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let head = format!("# HELP {name} {help}\n# TYPE {name} {kind_name}\n");
        Family {
            name: String::leak(name),
            help: String::leak(help),
            kind,
            head: String::leak(head),
        }
    }
}

/// `family!("name", "HELP text", counter | gauge | histogram)`: a [`Family`] whose text
/// header lines are put together by the compiler.
macro_rules! family {
    ($name:literal, $help:literal, counter) => {
        $crate::metrics::exposition::writer::Family::prepared(
            $name,
            $help,
            $crate::metrics::exposition::writer::Kind::Counter,
            concat!(
                "# HELP ",
                $name,
                " ",
                $help,
                "\n# TYPE ",
                $name,
                " counter\n"
            ),
        )
    };
    ($name:literal, $help:literal, gauge) => {
        $crate::metrics::exposition::writer::Family::prepared(
            $name,
            $help,
            $crate::metrics::exposition::writer::Kind::Gauge,
            concat!("# HELP ", $name, " ", $help, "\n# TYPE ", $name, " gauge\n"),
        )
    };
    ($name:literal, $help:literal, histogram) => {
        $crate::metrics::exposition::writer::Family::prepared(
            $name,
            $help,
            $crate::metrics::exposition::writer::Kind::Histogram,
            concat!(
                "# HELP ",
                $name,
                " ",
                $help,
                "\n# TYPE ",
                $name,
                " histogram\n"
            ),
        )
    };
}
pub(super) use family;

/// The text of one classic histogram's samples up to their values, prepared once:
/// `<name>_bucket{<labels>,le="<bound>"} ` per bucket (`+Inf` last), `<name>_sum{<labels>} `,
/// `<name>_count{<labels>} `; and the bounds as numbers, for the protobuf form.
pub(super) struct HistogramLines {
    text: Vec<u8>,
    /// Where each prefix ends in `text`: the buckets', then `_sum`'s and `_count`'s.
    ends: Vec<usize>,
    bounds: Vec<f64>,
    /// This histogram's place in each thread's [`WRITTEN`] (one per `HistogramLines` made).
    slot: usize,
}

impl HistogramLines {
    /// `les`: the finite bounds as the text shows them (`+Inf` follows).
    pub fn new(name: &str, labels: &[(&str, &str)], les: &[&str]) -> HistogramLines {
        let mut text = Vec::new();
        let mut ends = Vec::new();
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        with_le.push(("le", ""));
        for le in les.iter().copied().chain(["+Inf"]) {
            *with_le.last_mut().expect("the le label") = ("le", le);
            text.extend_from_slice(name.as_bytes());
            text.extend_from_slice(b"_bucket");
            write_labels(&mut text, &with_le);
            text.push(b' ');
            ends.push(text.len());
        }
        for suffix in ["_sum", "_count"] {
            text.extend_from_slice(name.as_bytes());
            text.extend_from_slice(suffix.as_bytes());
            write_labels(&mut text, labels);
            text.push(b' ');
            ends.push(text.len());
        }
        let bounds = les
            .iter()
            .map(|le| le.parse().expect("a bound is a number"))
            .collect();
        static SLOTS: AtomicUsize = AtomicUsize::new(0);
        let slot = SLOTS.fetch_add(1, Relaxed);
        HistogramLines {
            text,
            ends,
            bounds,
            slot,
        }
    }

    /// The text before the value of line `i` (buckets first, then `_sum`, `_count`).
    fn line(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// Buckets, `+Inf` included.
    pub fn buckets(&self) -> usize {
        self.bounds.len() + 1
    }
}

/// One histogram's text as this thread last wrote it, and the figures it was written for.
#[derive(Default)]
struct Written {
    counts: Vec<u64>,
    sum: u64,
    text: Vec<u8>,
}

thread_local! {
    /// This thread's last text of each histogram, by its lines' slot.
    static WRITTEN: RefCell<Vec<Written>> = const { RefCell::new(Vec::new()) };
    /// This thread's last text of each block of families ([`Out::block`]), by the address
    /// of the block's first family: the figures it was written for, and the text.
    static BLOCKS: RefCell<HashMap<usize, Written, foldhash::fast::RandomState>> =
        RefCell::new(HashMap::default());
}

/// A native histogram's buckets (protobuf only): `counts[i]` is bucket `first_key + i` of
/// `schema`, observations at most `zero_threshold` are `zero_count`.
pub(super) struct Native<'a> {
    pub schema: i32,
    pub zero_threshold: f64,
    pub zero_count: u64,
    pub first_key: i32,
    pub counts: &'a [u64],
}

/// Appends `s` to `buf`. Pieces of up to 128 bytes (prepared lines, names, digits) are
/// copied with a few unaligned moves of 8 to 32 bytes, the first and last ones overlapping,
/// rather than by a call to `memcpy`: a scrape appends a thousand of them.
#[inline(always)]
fn put(buf: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    if n > 128 {
        buf.extend_from_slice(s);
        return;
    }
    buf.reserve(128);
    /// Copies `N` bytes from `src` to `dst` (unaligned).
    ///
    /// SAFETY: `src` is readable and `dst` writable for `N` bytes.
    #[inline(always)]
    unsafe fn mv<const N: usize>(src: *const u8, dst: *mut u8) {
        // SAFETY: as the caller promises.
        unsafe {
            dst.cast::<[u8; N]>()
                .write_unaligned(src.cast::<[u8; N]>().read_unaligned())
        }
    }
    let src = s.as_ptr();
    // SAFETY: the buffer has room for 128 more bytes, so `dst..dst + n` is writable; every
    // move reads within `s` (the last ones end at its end) and writes within `dst..dst + n`.
    unsafe {
        let dst = buf.as_mut_ptr().add(buf.len());
        match n {
            65..=128 => {
                mv::<32>(src, dst);
                mv::<32>(src.add(32), dst.add(32));
                mv::<32>(src.add(n - 64), dst.add(n - 64));
                mv::<32>(src.add(n - 32), dst.add(n - 32));
            }
            32..=64 => {
                mv::<32>(src, dst);
                mv::<32>(src.add(n - 32), dst.add(n - 32));
            }
            16..=31 => {
                mv::<16>(src, dst);
                mv::<16>(src.add(n - 16), dst.add(n - 16));
            }
            8..=15 => {
                mv::<8>(src, dst);
                mv::<8>(src.add(n - 8), dst.add(n - 8));
            }
            4..=7 => {
                mv::<4>(src, dst);
                mv::<4>(src.add(n - 4), dst.add(n - 4));
            }
            _ => {
                for i in 0..n {
                    *dst.add(i) = *src.add(i);
                }
            }
        }
        buf.set_len(buf.len() + n);
    }
}

/// `{k="v",…}` with each value escaped (`\`, `"` and newline), nothing when there are no
/// labels.
fn write_labels(buf: &mut Vec<u8>, labels: &[(&str, &str)]) {
    let Some(((k0, v0), rest)) = labels.split_first() else {
        return;
    };
    buf.push(b'{');
    put(buf, k0.as_bytes());
    put(buf, b"=\"");
    escaped(buf, v0);
    for (k, v) in rest {
        put(buf, b"\",");
        put(buf, k.as_bytes());
        put(buf, b"=\"");
        escaped(buf, v);
    }
    put(buf, b"\"}");
}

/// A label value with `\`, `"` and newlines escaped. (These are ASCII, so a UTF-8 value is
/// escaped byte by byte.)
fn escaped(buf: &mut Vec<u8>, v: &str) {
    let v = v.as_bytes();
    if !v.iter().any(|&b| matches!(b, b'\\' | b'"' | b'\n')) {
        put(buf, v);
        return;
    }
    for &b in v {
        match b {
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b => buf.push(b),
        }
    }
}

/// Writes families and their samples into a buffer, as text or as protobuf.
pub(super) struct Out<'a> {
    buf: &'a mut Vec<u8>,
    /// The family being written: its name starts each text sample; its type says what a
    /// protobuf sample is.
    family: Option<&'static Family>,
    /// Protobuf: where the open `MetricFamily` message's fields start (`None`: text, or no
    /// family yet).
    proto: Option<Option<usize>>,
}

impl<'a> Out<'a> {
    /// The text format, appended to `buf`.
    pub fn text(buf: &'a mut Vec<u8>) -> Out<'a> {
        Out {
            buf,
            family: None,
            proto: None,
        }
    }

    /// The protobuf format, appended to `buf`; [`Out::finish`] ends it.
    pub fn protobuf(buf: &'a mut Vec<u8>) -> Out<'a> {
        Out {
            buf,
            family: None,
            proto: Some(None),
        }
    }

    /// Whether this is the protobuf format (which takes native histograms).
    pub fn is_protobuf(&self) -> bool {
        self.proto.is_some()
    }

    /// Ends the last family.
    pub fn finish(mut self) {
        self.close_family();
    }

    fn close_family(&mut self) {
        if let Some(open) = self.proto.as_mut()
            && let Some(start) = open.take()
        {
            proto::close(self.buf, start);
        }
    }

    /// Starts a family: its header lines (text) or its `MetricFamily` message (protobuf).
    pub fn family(&mut self, f: &'static Family) {
        self.family = Some(f);
        match self.proto {
            None => self.buf.extend_from_slice(f.head.as_bytes()),
            Some(_) => {
                self.close_family();
                let start = proto::open_delimited(self.buf);
                proto::bytes(self.buf, field::FAMILY_NAME, f.name.as_bytes());
                proto::bytes(self.buf, field::FAMILY_HELP, f.help.as_bytes());
                let kind = match f.kind {
                    Kind::Counter => proto::COUNTER,
                    Kind::Gauge => proto::GAUGE,
                    Kind::Histogram => proto::HISTOGRAM,
                };
                proto::uint(self.buf, field::FAMILY_TYPE, kind);
                self.proto = Some(Some(start));
            }
        }
    }

    fn name(&self) -> &'static str {
        self.family.expect("a sample follows its family").name
    }

    /// Writes a block of families whose text depends on `figures` alone (every number the
    /// block shows, and whatever decides its labels that are not fixed): the text this thread
    /// wrote for the block at its last scrape when the figures are the same, else what
    /// `write` writes from them (kept for the next scrape). `first`: the block's first
    /// family, which names it. Blocks do not nest.
    pub fn block(
        &mut self,
        first: &'static Family,
        figures: &[u64],
        write: impl FnOnce(&mut Self),
    ) {
        if self.proto.is_some() {
            return write(self);
        }
        BLOCKS.with_borrow_mut(|blocks| {
            let last = blocks.entry(first as *const _ as usize).or_default();
            if last.counts == figures && !last.text.is_empty() {
                self.buf.extend_from_slice(&last.text);
                return;
            }
            let start = self.buf.len();
            write(self);
            last.counts.clear();
            last.counts.extend_from_slice(figures);
            last.text.clear();
            last.text.extend_from_slice(&self.buf[start..]);
        });
    }

    /// A one-sample family without labels.
    pub fn single(&mut self, f: &'static Family, v: u64) {
        self.family(f);
        self.int(&[], v);
    }

    /// An integer sample of the current family.
    pub fn int(&mut self, labels: &[(&str, &str)], v: u64) {
        if self.proto.is_some() {
            return self.metric(labels, v as f64);
        }
        put(self.buf, self.name().as_bytes());
        write_labels(self.buf, labels);
        self.buf.push(b' ');
        put(self.buf, itoa::Buffer::new().format(v).as_bytes());
        self.buf.push(b'\n');
    }

    /// A float sample of the current family (shortest form that reads back the same, `0`
    /// for zero).
    pub fn float(&mut self, labels: &[(&str, &str)], v: f64) {
        if self.proto.is_some() {
            return self.metric(labels, v);
        }
        put(self.buf, self.name().as_bytes());
        write_labels(self.buf, labels);
        self.buf.push(b' ');
        write_f64(self.buf, v);
        self.buf.push(b'\n');
    }

    /// A protobuf `Metric` of a counter or gauge family.
    fn metric(&mut self, labels: &[(&str, &str)], v: f64) {
        let m = proto::open(self.buf, field::FAMILY_METRIC);
        self.label_pairs(labels);
        let value_field = match self.family.map(|f| f.kind) {
            Some(Kind::Counter) => field::METRIC_COUNTER,
            _ => field::METRIC_GAUGE,
        };
        let value = proto::open(self.buf, value_field);
        proto::double(self.buf, field::VALUE, v);
        proto::close(self.buf, value);
        proto::close(self.buf, m);
    }

    fn label_pairs(&mut self, labels: &[(&str, &str)]) {
        for (k, v) in labels {
            let pair = proto::open(self.buf, field::METRIC_LABEL);
            proto::bytes(self.buf, field::LABEL_NAME, k.as_bytes());
            proto::bytes(self.buf, field::LABEL_VALUE, v.as_bytes());
            proto::close(self.buf, pair);
        }
    }

    /// The samples of one classic histogram of the current family, its text prepared in
    /// `lines` (made with the same `labels`): `_bucket` per bound, cumulative; `+Inf`; `_sum`;
    /// `_count`. `counts` are per bucket (not cumulative), `+Inf` last. `native`: the same
    /// observations in a native histogram's buckets, sent with the protobuf form (the text
    /// format has none).
    pub fn histogram(
        &mut self,
        lines: &HistogramLines,
        labels: &[(&str, &str)],
        counts: &[u64],
        sum: f64,
        native: Option<&Native<'_>>,
    ) {
        debug_assert_eq!(counts.len(), lines.buckets());
        if self.proto.is_some() {
            return self.proto_histogram(lines, labels, counts, sum, native);
        }
        WRITTEN.with_borrow_mut(|written| {
            if written.len() <= lines.slot {
                written.resize_with(lines.slot + 1, Written::default);
            }
            let last = &mut written[lines.slot];
            if last.counts == counts && last.sum == sum.to_bits() && !last.text.is_empty() {
                self.buf.extend_from_slice(&last.text);
                return;
            }
            let start = self.buf.len();
            self.histogram_text(lines, counts, sum);
            last.counts.clear();
            last.counts.extend_from_slice(counts);
            last.sum = sum.to_bits();
            last.text.clear();
            last.text.extend_from_slice(&self.buf[start..]);
        });
    }

    fn histogram_text(&mut self, lines: &HistogramLines, counts: &[u64], sum: f64) {
        let mut cumulative = 0u64;
        let mut digits = itoa::Buffer::new();
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            put(self.buf, lines.line(i));
            put(self.buf, digits.format(cumulative).as_bytes());
            self.buf.push(b'\n');
        }
        put(self.buf, lines.line(counts.len()));
        write_f64(self.buf, sum);
        self.buf.push(b'\n');
        put(self.buf, lines.line(counts.len() + 1));
        put(self.buf, digits.format(cumulative).as_bytes());
        self.buf.push(b'\n');
    }

    fn proto_histogram(
        &mut self,
        lines: &HistogramLines,
        labels: &[(&str, &str)],
        counts: &[u64],
        sum: f64,
        native: Option<&Native<'_>>,
    ) {
        let b = &mut *self.buf;
        let m = proto::open(b, field::FAMILY_METRIC);
        self.label_pairs(labels);
        let b = &mut *self.buf;
        let h = proto::open(b, field::METRIC_HISTOGRAM);
        proto::uint(b, field::H_SAMPLE_COUNT, counts.iter().sum());
        proto::double(b, field::H_SAMPLE_SUM, sum);
        // The finite bounds; `+Inf` is the sample count.
        let mut cumulative = 0u64;
        for (c, &bound) in counts.iter().zip(&lines.bounds) {
            cumulative += c;
            let bucket = proto::open(b, field::H_BUCKET);
            proto::uint(b, field::BUCKET_CUMULATIVE_COUNT, cumulative);
            proto::double(b, field::BUCKET_UPPER_BOUND, bound);
            proto::close(b, bucket);
        }
        if let Some(n) = native {
            proto::sint(b, field::H_SCHEMA, i64::from(n.schema));
            proto::double(b, field::H_ZERO_THRESHOLD, n.zero_threshold);
            proto::uint(b, field::H_ZERO_COUNT, n.zero_count);
            proto::native_buckets(b, n.first_key, n.counts);
        }
        proto::close(b, h);
        proto::close(b, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static F: Family = family!("m_total", "Things", counter);

    #[test]
    fn text_samples_and_escaping() {
        let mut buf = Vec::new();
        let mut o = Out::text(&mut buf);
        o.family(&F);
        o.int(&[], 3);
        o.int(&[("a", "x\"y\\z\nw"), ("b", "ü")], 4);
        o.float(&[("a", "1")], 0.25);
        o.finish();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "# HELP m_total Things\n# TYPE m_total counter\nm_total 3\n\
             m_total{a=\"x\\\"y\\\\z\\nw\",b=\"ü\"} 4\nm_total{a=\"1\"} 0.25\n"
        );
    }

    #[test]
    fn pieces_of_every_length_are_appended_whole() {
        let src: Vec<u8> = (0..=255u8).collect();
        for n in 0..=200 {
            let mut buf = vec![7u8; 3];
            put(&mut buf, &src[..n]);
            put(&mut buf, &src[..n]);
            assert_eq!(buf.len(), 3 + 2 * n);
            assert_eq!(&buf[3..3 + n], &src[..n], "{n}");
            assert_eq!(&buf[3 + n..], &src[..n], "{n}");
        }
    }

    #[test]
    fn histogram_lines() {
        static H: Family = family!("h_seconds", "Times", histogram);
        let lines = HistogramLines::new("h_seconds", &[("op", "get")], &["0.5", "1"]);
        let mut buf = Vec::new();
        let mut o = Out::text(&mut buf);
        o.family(&H);
        o.histogram(&lines, &[("op", "get")], &[1, 0, 2], 3.75, None);
        let plain = HistogramLines::new("h_seconds", &[], &["0.5"]);
        o.histogram(&plain, &[], &[0, 0], 0.0, None);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "# HELP h_seconds Times\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{op=\"get\",le=\"0.5\"} 1\nh_seconds_bucket{op=\"get\",le=\"1\"} 1\n\
             h_seconds_bucket{op=\"get\",le=\"+Inf\"} 3\nh_seconds_sum{op=\"get\"} 3.75\n\
             h_seconds_count{op=\"get\"} 3\nh_seconds_bucket{le=\"0.5\"} 0\n\
             h_seconds_bucket{le=\"+Inf\"} 0\nh_seconds_sum 0\nh_seconds_count 0\n"
        );
    }
}
