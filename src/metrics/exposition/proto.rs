//! The protobuf exposition (`application/vnd.google.protobuf;
//! proto=io.prometheus.client.MetricFamily; encoding=delimited`): each family one
//! `MetricFamily` message, preceded by its length as a varint. The messages are those of
//! `metrics.proto` beside this file (the subset of `io.prometheus.client` this server sends);
//! they are written by hand here, straight into the answer's buffer, field by field in field
//! number order.
//!
//! A nested message is written in place: a one-byte length is reserved before its fields and
//! filled in after them; the rare message of 128 bytes or more is moved up by the extra
//! bytes its length takes (families, histograms). Nothing is allocated.

/// `io.prometheus.client.MetricType`.
pub(super) const COUNTER: u64 = 0;
pub(super) const GAUGE: u64 = 1;
pub(super) const HISTOGRAM: u64 = 4;

/// Field numbers of the messages written (`metrics.proto`).
pub(super) mod field {
    pub const FAMILY_NAME: u32 = 1;
    pub const FAMILY_HELP: u32 = 2;
    pub const FAMILY_TYPE: u32 = 3;
    pub const FAMILY_METRIC: u32 = 4;
    pub const METRIC_LABEL: u32 = 1;
    pub const METRIC_GAUGE: u32 = 2;
    pub const METRIC_COUNTER: u32 = 3;
    pub const METRIC_HISTOGRAM: u32 = 7;
    pub const LABEL_NAME: u32 = 1;
    pub const LABEL_VALUE: u32 = 2;
    /// `Gauge.value` and `Counter.value`.
    pub const VALUE: u32 = 1;
    pub const H_SAMPLE_COUNT: u32 = 1;
    pub const H_SAMPLE_SUM: u32 = 2;
    pub const H_BUCKET: u32 = 3;
    pub const H_SCHEMA: u32 = 5;
    pub const H_ZERO_THRESHOLD: u32 = 6;
    pub const H_ZERO_COUNT: u32 = 7;
    pub const H_POSITIVE_SPAN: u32 = 12;
    pub const H_POSITIVE_DELTA: u32 = 13;
    pub const BUCKET_CUMULATIVE_COUNT: u32 = 1;
    pub const BUCKET_UPPER_BOUND: u32 = 2;
    pub const SPAN_OFFSET: u32 = 1;
    pub const SPAN_LENGTH: u32 = 2;
}

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

pub(super) fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn tag(buf: &mut Vec<u8>, field: u32, wire: u32) {
    varint(buf, u64::from(field << 3 | wire));
}

pub(super) fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
    tag(buf, field, VARINT);
    varint(buf, v);
}

/// A `sint32`/`sint64` field (zigzag).
pub(super) fn sint(buf: &mut Vec<u8>, field: u32, v: i64) {
    tag(buf, field, VARINT);
    varint(buf, ((v << 1) ^ (v >> 63)) as u64);
}

pub(super) fn double(buf: &mut Vec<u8>, field: u32, v: f64) {
    tag(buf, field, FIXED64);
    buf.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn bytes(buf: &mut Vec<u8>, field: u32, v: &[u8]) {
    tag(buf, field, LEN);
    varint(buf, v.len() as u64);
    buf.extend_from_slice(v);
}

/// Opens a nested message in `field`: its fields follow; [`close`] with what this returns.
pub(super) fn open(buf: &mut Vec<u8>, field: u32) -> usize {
    tag(buf, field, LEN);
    open_delimited(buf)
}

/// Opens a length-delimited message with no tag (a `MetricFamily` of the stream).
pub(super) fn open_delimited(buf: &mut Vec<u8>) -> usize {
    buf.push(0);
    buf.len()
}

/// Writes the length of the message opened at `start` (what [`open`] returned).
pub(super) fn close(buf: &mut Vec<u8>, start: usize) {
    let len = buf.len() - start;
    let n = varint_len(len as u64);
    if n > 1 {
        // The reserved byte holds one of the length's bytes: move the message up by the rest.
        let end = buf.len();
        buf.resize(end + n - 1, 0);
        buf.copy_within(start..end, start + n - 1);
    }
    let mut at = start - 1;
    let mut v = len;
    while v >= 0x80 {
        buf[at] = v as u8 | 0x80;
        v >>= 7;
        at += 1;
    }
    buf[at] = v as u8;
}

/// A gap of up to this many empty buckets stays inside a span (a zero delta is cheaper than a
/// new span).
const MAX_GAP: usize = 2;

/// The spans of `counts`: runs of buckets with counts, as `(start, end)` indexes, a short
/// gap of empty buckets kept inside.
fn spans(counts: &[u64]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i + counts[i..].iter().position(|&c| c > 0)?;
        let mut end = start + 1;
        while let Some(gap) = counts[end..]
            .iter()
            .position(|&c| c > 0)
            .filter(|&g| g <= MAX_GAP)
        {
            end += gap + 1;
        }
        i = end;
        Some((start, end))
    })
}

/// The positive buckets of a native histogram as spans and deltas: `counts[i]` is bucket
/// `first_key + i`. A span's offset is its first bucket's distance from the end of the span
/// before it (the first span's: its first key); a delta is a bucket's count minus the count
/// of the bucket written before it.
pub(super) fn native_buckets(buf: &mut Vec<u8>, first_key: i32, counts: &[u64]) {
    let mut prev_end = None;
    for (start, end) in spans(counts) {
        let offset = match prev_end {
            None => i64::from(first_key) + start as i64,
            Some(p) => (start - p) as i64,
        };
        let s = open(buf, field::H_POSITIVE_SPAN);
        sint(buf, field::SPAN_OFFSET, offset);
        uint(buf, field::SPAN_LENGTH, (end - start) as u64);
        close(buf, s);
        prev_end = Some(end);
    }
    let mut prev = 0i64;
    for (start, end) in spans(counts) {
        for &c in &counts[start..end] {
            sint(buf, field::H_POSITIVE_DELTA, c as i64 - prev);
            prev = c as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_lengths() {
        for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
        let mut b = Vec::new();
        varint(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
        let mut b = Vec::new();
        sint(&mut b, 1, -1);
        assert_eq!(b, [0x08, 0x01]);
    }

    /// A message of 200 bytes gets a two-byte length, its bytes moved up by one.
    #[test]
    fn a_long_message_is_moved_up() {
        let mut b = vec![7u8];
        let s = open(&mut b, 4);
        b.extend(std::iter::repeat_n(9u8, 200));
        close(&mut b, s);
        assert_eq!(&b[..4], [7, 4 << 3 | 2, 0xc8, 0x01]);
        assert_eq!(b.len(), 4 + 200);
        assert!(b[4..].iter().all(|&x| x == 9));
    }

    #[test]
    fn spans_keep_short_gaps() {
        let c = [0, 3, 0, 0, 1, 0, 0, 0, 2, 2, 0];
        assert_eq!(spans(&c).collect::<Vec<_>>(), [(1, 5), (8, 10)]);
        assert_eq!(spans(&[0, 0]).count(), 0);
    }
}
