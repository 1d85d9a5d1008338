//! Spans as the server records them: the W3C trace context (`traceparent`), ids, the
//! sampler, and [`SpanRecord`], what a finished span carries to the exporter.

use std::borrow::Cow;
use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// A W3C trace context (`traceparent: 00-<trace id>-<span id>-<flags>`): the trace and the
/// span that is the parent of the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// The `sampled` bit of the trace flags.
pub const SAMPLED: u8 = 1;

impl TraceContext {
    /// Reads a `traceparent` value (version `00`, or a later version's first four fields, as
    /// the W3C text asks of a reader). `None` for anything malformed, an all-zero id, or
    /// version `ff`: such a header is ignored and the request starts a trace of its own.
    pub fn parse(v: &[u8]) -> Option<TraceContext> {
        let v = v.trim_ascii();
        if v.len() < 55 || (v.len() > 55 && v[55] != b'-') {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != 55) {
            return None;
        }
        if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The `traceparent` value (version `00`).
    pub fn header(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
}

/// Two lower-case hex digits (the W3C text allows no upper case).
fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

thread_local! {
    /// This thread's id generator (xorshift64*), seeded from the time, the thread and the
    /// process at its first use.
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    unix_nanos().hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish() | 1
}

/// A random 64-bit number (not for secrets: ids and sampling only).
pub fn random_u64() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// A new, non-zero span id.
pub fn new_span_id() -> [u8; 8] {
    loop {
        let v = random_u64();
        if v != 0 {
            return v.to_be_bytes();
        }
    }
}

/// A new, non-zero trace id.
pub fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random_u64().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}

/// Wall-clock nanoseconds since the Unix epoch (a span's timestamps; its duration is
/// measured with `Instant`s).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

/// Which spans are recorded: OpenTelemetry's `parentbased_traceidratio`. A span whose parent
/// came with the request follows the parent's `sampled` flag; a root span is sampled when its
/// trace id's lower 8 bytes, read as a number, fall below `ratio × 2⁶⁴` (so every process of
/// a trace decides alike). Ratio 0 records nothing, not even under a sampled parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    /// Lower 8 bytes of a root trace id below this: sampled. `None`: tracing is off.
    bound: Option<u64>,
}

impl Sampler {
    pub fn new(ratio: f64) -> Sampler {
        let bound = if ratio <= 0.0 || ratio.is_nan() {
            None
        } else if ratio >= 1.0 {
            Some(u64::MAX)
        } else {
            Some((ratio * u64::MAX as f64) as u64)
        };
        Sampler { bound }
    }

    pub fn off() -> Sampler {
        Sampler { bound: None }
    }

    /// Records anything at all.
    pub fn on(&self) -> bool {
        self.bound.is_some()
    }

    /// The context of a new span under `parent` (the request's `traceparent`), or `None` when
    /// the span is not sampled.
    pub fn start(&self, parent: Option<&TraceContext>) -> Option<(TraceContext, Option<[u8; 8]>)> {
        let bound = self.bound?;
        let (trace_id, parent_id) = match parent {
            Some(p) if !p.sampled() => return None,
            Some(p) => (p.trace_id, Some(p.span_id)),
            None => {
                let id = new_trace_id();
                let low = u64::from_be_bytes(id[8..].try_into().expect("8 bytes"));
                if bound != u64::MAX && low >= bound {
                    return None;
                }
                (id, None)
            }
        };
        let ctx = TraceContext {
            trace_id,
            span_id: new_span_id(),
            flags: SAMPLED,
        };
        Some((ctx, parent_id))
    }
}

impl Sampler {
    /// The context of a span recorded whenever tracing is on (the background work users wait
    /// on: a drain, a failover), under `parent` when there is one.
    pub fn start_always(
        &self,
        parent: Option<&TraceContext>,
    ) -> Option<(TraceContext, Option<[u8; 8]>)> {
        self.bound?;
        let (trace_id, parent_id) = match parent {
            Some(p) => (p.trace_id, Some(p.span_id)),
            None => (new_trace_id(), None),
        };
        let ctx = TraceContext {
            trace_id,
            span_id: new_span_id(),
            flags: SAMPLED,
        };
        Some((ctx, parent_id))
    }
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Bool(bool),
    Static(&'static str),
    Text(String),
}

/// `Span.SpanKind` of a recorded span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request this server answered.
    Server,
    /// Background work (a flush, a rewarm, a drain, a failover).
    Internal,
}

/// A finished span on its way to the exporter.
#[derive(Clone, Debug)]
pub struct SpanRecord {
    pub ctx: TraceContext,
    pub parent: Option<[u8; 8]>,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The status is ERROR (a 5xx, a failed background job).
    pub error: bool,
    pub attrs: Vec<(&'static str, Attr)>,
}

impl SpanRecord {
    /// A span started now under `ctx` (from [`Sampler::start`]), to be ended with
    /// [`SpanRecord::end`].
    pub fn begin(
        ctx: TraceContext,
        parent: Option<[u8; 8]>,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
    ) -> SpanRecord {
        let now = unix_nanos();
        SpanRecord {
            ctx,
            parent,
            name: name.into(),
            kind,
            start_ns: now,
            end_ns: now,
            error: false,
            attrs: Vec::new(),
        }
    }

    pub fn attr(&mut self, key: &'static str, v: Attr) -> &mut SpanRecord {
        self.attrs.push((key, v));
        self
    }

    /// Ends the span `elapsed` after its start.
    pub fn end(&mut self, elapsed: std::time::Duration) {
        self.end_ns = self.start_ns + elapsed.as_nanos() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_reads_and_writes_back() {
        let c = TraceContext::parse(TP).unwrap();
        assert_eq!(hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
        assert!(c.sampled());
        assert_eq!(c.header().as_bytes(), TP);
        // Whitespace around the value is not part of it.
        assert_eq!(
            TraceContext::parse(b" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ")
                .unwrap()
                .flags,
            0
        );
        // A later version may add fields after a dash.
        assert!(
            TraceContext::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
                .is_some()
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            &b""[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7x01",
        ] {
            assert_eq!(
                TraceContext::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn sampling_follows_the_parent_then_the_ratio() {
        let parent = TraceContext::parse(TP).unwrap();
        let unsampled = TraceContext { flags: 0, ..parent };
        let half = Sampler::new(0.5);
        // A sampled parent: its trace, a new span under it.
        let (c, p) = half.start(Some(&parent)).unwrap();
        assert_eq!((c.trace_id, p), (parent.trace_id, Some(parent.span_id)));
        assert_ne!(c.span_id, parent.span_id);
        assert!(c.sampled());
        assert!(half.start(Some(&unsampled)).is_none());
        // Off records nothing, even under a sampled parent.
        assert!(!Sampler::new(0.0).on());
        assert!(Sampler::new(0.0).start(Some(&parent)).is_none());
        // Roots: all, none, or about the ratio.
        let all = Sampler::new(1.0);
        assert!((0..1000).all(|_| all.start(None).is_some()));
        let n = (0..20_000).filter(|_| half.start(None).is_some()).count();
        assert!((9_000..11_000).contains(&n), "{n} of 20000 sampled at 0.5");
        let tenth = Sampler::new(0.1);
        let n = (0..20_000).filter(|_| tenth.start(None).is_some()).count();
        assert!((1_600..2_400).contains(&n), "{n} of 20000 sampled at 0.1");
    }

    #[test]
    fn ids_are_not_zero_and_differ() {
        let a = new_trace_id();
        let b = new_trace_id();
        assert_ne!(a, b);
        assert_ne!(a, [0; 16]);
        assert_ne!(new_span_id(), [0; 8]);
    }
}
