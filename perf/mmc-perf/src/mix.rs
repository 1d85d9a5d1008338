//! The request mix: `--request "METHOD PATH[?QUERY] [WEIGHT]"` lines → ready-to-send request
//! bytes, weighted choice, and `{key}` / `{seq}` substitution.
//!
//! Each entry is pre-rendered once into the pieces of its request around every placeholder, so
//! generating a request on the hot path is a few `extend_from_slice` calls and, for entries
//! with placeholders, an integer formatting. A body longer than [`INLINE_BODY_BYTES`] is not
//! copied per request: its first part is rendered with the head and the rest is one shared
//! buffer that the connection writes after it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;

use crate::zipf::{KeyDist, Sampler};

/// One `--request` entry as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub method: String,
    /// Path with its query, as sent (may contain `{key}`).
    pub target: String,
    pub weight: u32,
}

/// The placeholder replaced by `key-<i>`, i uniform in `0..--keys`.
pub const KEY_PLACEHOLDER: &str = "{key}";

/// The placeholder replaced by a number unique within the process and increasing (shared by
/// all load threads, from `--seq-start`): every request gets the next one, so puts of
/// `key=obj-{seq}` never hit an existing key. Every `{seq}` of one request gets the same number.
pub const SEQ_PLACEHOLDER: &str = "{seq}";

/// Body bytes rendered into each request's buffer; the rest of a longer body is written from
/// one shared buffer (so a 16 MiB put costs the client no 16 MiB copy per request, and the
/// head still leaves in the same segment as the start of the body).
pub const INLINE_BODY_BYTES: usize = 64 * 1024;

/// What a placeholder becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hole {
    Key,
    Seq,
}

/// Splits a target at its placeholders: `parts.len() == holes.len() + 1`.
fn split_holes(target: &str) -> (Vec<&str>, Vec<Hole>) {
    let mut parts = Vec::new();
    let mut holes = Vec::new();
    let mut rest = target;
    loop {
        let key = rest
            .find(KEY_PLACEHOLDER)
            .map(|i| (i, Hole::Key, KEY_PLACEHOLDER.len()));
        let seq = rest
            .find(SEQ_PLACEHOLDER)
            .map(|i| (i, Hole::Seq, SEQ_PLACEHOLDER.len()));
        let next = match (key, seq) {
            (Some(k), Some(s)) => Some(if s.0 < k.0 { s } else { k }),
            (k, s) => k.or(s),
        };
        let Some((at, hole, len)) = next else {
            parts.push(rest);
            return (parts, holes);
        };
        parts.push(&rest[..at]);
        holes.push(hole);
        rest = &rest[at + len..];
    }
}

/// Parses `"METHOD PATH[?QUERY] [WEIGHT]"`.
pub fn parse_spec(s: &str) -> Result<Spec, String> {
    let mut it = s.split_whitespace();
    let (Some(method), Some(target)) = (it.next(), it.next()) else {
        return Err(format!(
            "invalid --request {s:?}: expected \"METHOD PATH[?QUERY] [WEIGHT]\""
        ));
    };
    let weight = match it.next() {
        None => 1,
        Some(w) => match w.parse::<u32>() {
            Ok(w) if w > 0 => w,
            _ => {
                return Err(format!(
                    "invalid --request {s:?}: weight {w:?} must be a positive integer"
                ));
            }
        },
    };
    if it.next().is_some() {
        return Err(format!(
            "invalid --request {s:?}: too many fields (expected \"METHOD PATH[?QUERY] [WEIGHT]\")"
        ));
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "invalid --request {s:?}: method {method:?} must be upper-case letters"
        ));
    }
    if !target.starts_with('/') {
        return Err(format!(
            "invalid --request {s:?}: path {target:?} must start with '/'"
        ));
    }
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "invalid --request {s:?}: path must not contain spaces or control bytes"
        ));
    }
    Ok(Spec {
        method: method.to_string(),
        target: target.to_string(),
        weight,
    })
}

/// The default mix when no `--request` is given.
pub fn default_specs() -> Vec<Spec> {
    vec![Spec {
        method: "GET".into(),
        target: "/health".into(),
        weight: 1,
    }]
}

/// An entry rendered into request bytes: `pieces[0] holes[0] pieces[1] ... pieces[n]`; the
/// last piece ends with the head and the inline part of the body.
#[derive(Debug)]
pub struct Entry {
    pub spec: Spec,
    pieces: Vec<Vec<u8>>,
    holes: Vec<Hole>,
    pub is_head: bool,
    /// Bytes of the request body (PUT and POST: `--body-bytes`; else 0).
    pub body_bytes: usize,
}

impl Entry {
    pub fn keyed(&self) -> bool {
        self.holes.contains(&Hole::Key)
    }

    fn has_seq(&self) -> bool {
        self.holes.contains(&Hole::Seq)
    }
}

/// What [`Mix::write_request`] appended, and what must follow it on the wire.
#[derive(Debug)]
pub struct Written {
    /// The request is a HEAD (its response has no body).
    pub is_head: bool,
    /// The rest of the body, to write right after the appended bytes.
    pub body_rest: Option<Bytes>,
}

/// Requests for `--preload`: each is complete except for `body_rest`, which follows each one.
#[derive(Debug)]
pub struct Preloads {
    pub requests: Vec<Vec<u8>>,
    pub body_rest: Option<Bytes>,
}

/// The whole mix, shared read-only by every load thread.
#[derive(Debug)]
pub struct Mix {
    pub entries: Vec<Entry>,
    /// Cumulative weights, for the weighted choice.
    cumulative: Vec<u64>,
    total_weight: u64,
    /// Number of distinct keys for `{key}`, 0 when no entry uses it.
    pub keys: u64,
    /// The next `{seq}` number.
    seq: AtomicU64,
    /// The body beyond [`INLINE_BODY_BYTES`], shared by every request with a body.
    body_rest: Option<Bytes>,
    /// Picks the index of `{key}` (`--key-dist`; uniform by default).
    sampler: Sampler,
}

/// Renders a request for `method target` with a `body_bytes` body (for PUT and POST), split
/// around each placeholder of the target; at most [`INLINE_BODY_BYTES`] of the body are
/// rendered (the caller writes the rest, [`body_rest`]).
fn render(spec: &Spec, host: &str, body_bytes: usize) -> (Vec<Vec<u8>>, Vec<Hole>) {
    let (parts, holes) = split_holes(&spec.target);
    let mut pieces: Vec<Vec<u8>> = parts.iter().map(|p| p.as_bytes().to_vec()).collect();
    let mut first = format!("{} ", spec.method).into_bytes();
    first.extend_from_slice(&pieces[0]);
    pieces[0] = first;
    let last = pieces.last_mut().expect("at least one piece");
    last.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    last.extend_from_slice(host.as_bytes());
    last.extend_from_slice(b"\r\n");
    if has_body(&spec.method) {
        last.extend_from_slice(format!("Content-Length: {body_bytes}\r\n").as_bytes());
    }
    last.extend_from_slice(b"\r\n");
    if has_body(&spec.method) {
        last.extend(body(body_bytes.min(INLINE_BODY_BYTES)));
    }
    (pieces, holes)
}

/// The part of a `body_bytes` body that [`render`] leaves out, if any.
fn body_rest(body_bytes: usize) -> Option<Bytes> {
    (body_bytes > INLINE_BODY_BYTES).then(|| {
        let all: Vec<u8> = body(body_bytes).collect();
        Bytes::from(all).slice(INLINE_BODY_BYTES..)
    })
}

fn has_body(method: &str) -> bool {
    matches!(method, "PUT" | "POST")
}

/// A recognisable body: `a..z` repeated.
pub fn body(n: usize) -> impl Iterator<Item = u8> {
    (b'a'..=b'z').cycle().take(n)
}

impl Mix {
    /// `keys` is required when an entry uses `{key}` (and ignored otherwise); `{seq}` counts
    /// from `seq_start`.
    pub fn new(
        specs: Vec<Spec>,
        host: &str,
        body_bytes: usize,
        keys: Option<u64>,
        seq_start: u64,
    ) -> Result<Mix, String> {
        if specs.is_empty() {
            return Err("the request mix is empty".into());
        }
        let mut entries = Vec::with_capacity(specs.len());
        let mut cumulative = Vec::with_capacity(specs.len());
        let mut total = 0u64;
        for spec in specs {
            total += spec.weight as u64;
            cumulative.push(total);
            let (pieces, holes) = render(&spec, host, body_bytes);
            entries.push(Entry {
                is_head: spec.method == "HEAD",
                body_bytes: if has_body(&spec.method) {
                    body_bytes
                } else {
                    0
                },
                pieces,
                holes,
                spec,
            });
        }
        let any_body = entries.iter().any(|e| has_body(&e.spec.method));
        let keyed = entries.iter().any(Entry::keyed);
        let keys = match (keyed, keys) {
            (false, _) => 0,
            (true, None) => {
                return Err(format!(
                    "a --request path uses {KEY_PLACEHOLDER}: give --keys N"
                ));
            }
            (true, Some(0)) => return Err("--keys must be at least 1".into()),
            (true, Some(n)) => n,
        };
        Ok(Mix {
            entries,
            cumulative,
            total_weight: total,
            keys,
            seq: AtomicU64::new(seq_start),
            sampler: KeyDist::Uniform.sampler(keys),
            body_rest: if any_body {
                body_rest(body_bytes)
            } else {
                None
            },
        })
    }

    /// `{key}` indices follow `dist` (key-0 the most popular under Zipf).
    pub fn with_key_dist(mut self, dist: &KeyDist) -> Mix {
        self.sampler = dist.sampler(self.keys);
        self
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Picks an entry by weight.
    pub fn choose(&self, rng: &mut XorShift) -> usize {
        if self.entries.len() == 1 {
            return 0;
        }
        let r = rng.next() % self.total_weight;
        self.cumulative
            .iter()
            .position(|&c| r < c)
            .unwrap_or(self.entries.len() - 1)
    }

    /// Appends one request of entry `i` to `out`, with a random key if the entry is keyed and
    /// the next sequence number if it has `{seq}`.
    pub fn write_request(&self, i: usize, rng: &mut XorShift, out: &mut Vec<u8>) -> Written {
        let e = &self.entries[i];
        if e.holes.is_empty() {
            out.extend_from_slice(&e.pieces[0]);
        } else {
            let key = if e.keyed() {
                self.sampler.sample(rng)
            } else {
                0
            };
            let seq = if e.has_seq() { self.next_seq() } else { 0 };
            write_pieces(&e.pieces, &e.holes, key, seq, out);
        }
        Written {
            is_head: e.is_head,
            body_rest: if e.body_bytes > 0 {
                self.body_rest.clone()
            } else {
                None
            },
        }
    }

    /// The preload requests: one PUT of every key for every keyed target of the mix
    /// (distinct targets only), with a `body_bytes` body.
    pub fn preload_requests(&self, host: &str, body_bytes: usize) -> Preloads {
        let mut targets: Vec<&str> = Vec::new();
        for e in self.entries.iter().filter(|e| e.keyed()) {
            if !targets.contains(&e.spec.target.as_str()) {
                targets.push(&e.spec.target);
            }
        }
        let mut out = Vec::with_capacity(targets.len() * self.keys as usize);
        for t in targets {
            let spec = Spec {
                method: "PUT".into(),
                target: t.to_string(),
                weight: 1,
            };
            let (pieces, holes) = render(&spec, host, body_bytes);
            for k in 0..self.keys {
                let mut req = Vec::new();
                let seq = if holes.contains(&Hole::Seq) {
                    self.next_seq()
                } else {
                    0
                };
                write_pieces(&pieces, &holes, k, seq, &mut req);
                out.push(req);
            }
        }
        Preloads {
            requests: out,
            body_rest: body_rest(body_bytes),
        }
    }
}

fn write_pieces(pieces: &[Vec<u8>], holes: &[Hole], key: u64, seq: u64, out: &mut Vec<u8>) {
    let mut key_buf = itoa::Buffer::new();
    let key = key_buf.format(key).as_bytes();
    let mut seq_buf = itoa::Buffer::new();
    let seq = seq_buf.format(seq).as_bytes();
    out.extend_from_slice(&pieces[0]);
    for (hole, p) in holes.iter().zip(&pieces[1..]) {
        match hole {
            Hole::Key => {
                out.extend_from_slice(b"key-");
                out.extend_from_slice(key);
            }
            Hole::Seq => out.extend_from_slice(seq),
        }
        out.extend_from_slice(p);
    }
}

/// xorshift64*: a tiny, fast, good-enough generator for picking entries and keys.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // splitmix64 of the seed, so that consecutive seeds give unrelated streams; never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        XorShift(if z == 0 { 1 } else { z })
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!(
            parse_spec("GET /metadata?key=k1 9").unwrap(),
            Spec {
                method: "GET".into(),
                target: "/metadata?key=k1".into(),
                weight: 9
            }
        );
        let s = parse_spec("  PUT   /metadata?key={key}  ").unwrap();
        assert_eq!((s.method.as_str(), s.weight), ("PUT", 1));
        assert_eq!(s.target, "/metadata?key={key}");
        for bad in [
            "",
            "GET",
            "get /x",
            "GET x",
            "GET /x 0",
            "GET /x -1",
            "GET /x abc",
            "GET /x 1 2",
        ] {
            assert!(parse_spec(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn renders_requests() {
        let mix = Mix::new(
            vec![parse_spec("GET /health").unwrap()],
            "127.0.0.1:8000",
            0,
            None,
            0,
        )
        .unwrap();
        let mut out = Vec::new();
        let mut rng = XorShift::new(1);
        let w = mix.write_request(0, &mut rng, &mut out);
        assert!(!w.is_head && w.body_rest.is_none());
        assert_eq!(out, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n");

        let mix = Mix::new(
            vec![parse_spec("PUT /metadata?key={key}&again={key}").unwrap()],
            "h:1",
            5,
            Some(1),
            0,
        )
        .unwrap();
        out.clear();
        assert!(mix.write_request(0, &mut rng, &mut out).body_rest.is_none());
        assert_eq!(
            out,
            b"PUT /metadata?key=key-0&again=key-0 HTTP/1.1\r\nHost: h:1\r\nContent-Length: 5\r\n\r\nabcde"
        );

        let mix = Mix::new(vec![parse_spec("HEAD /health").unwrap()], "h", 0, None, 0).unwrap();
        out.clear();
        assert!(mix.write_request(0, &mut rng, &mut out).is_head);
    }

    #[test]
    fn seq_is_unique_and_increasing_across_entries() {
        let mix = Mix::new(
            vec![
                parse_spec("PUT /api/v1/objects?key=m@1@0@{seq}@bf16&x={seq} 1").unwrap(),
                parse_spec("GET /api/v1/objects?key={key}-{seq} 1").unwrap(),
            ],
            "h",
            3,
            Some(5),
            100,
        )
        .unwrap();
        let mut rng = XorShift::new(3);
        let mut out = Vec::new();
        mix.write_request(0, &mut rng, &mut out);
        assert_eq!(
            out,
            b"PUT /api/v1/objects?key=m@1@0@100@bf16&x=100 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
        );
        out.clear();
        mix.write_request(1, &mut rng, &mut out);
        let s = String::from_utf8(out.clone()).unwrap();
        assert!(s.starts_with("GET /api/v1/objects?key=key-"), "{s}");
        assert!(s.contains("-101 HTTP/1.1\r\n"), "{s}");
        assert!(!s.contains("Content-Length"), "a GET has no body: {s}");
        // Shared by threads: every number is handed out once.
        let mix = std::sync::Arc::new(
            Mix::new(
                vec![parse_spec("PUT /o?key=k{seq}").unwrap()],
                "h",
                0,
                None,
                0,
            )
            .unwrap(),
        );
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mix = mix.clone();
                std::thread::spawn(move || {
                    let mut rng = XorShift::new(t);
                    (0..1000)
                        .map(|_| {
                            let mut out = Vec::new();
                            mix.write_request(0, &mut rng, &mut out);
                            let s = String::from_utf8(out).unwrap();
                            s["PUT /o?key=k".len()..]
                                .split(' ')
                                .next()
                                .unwrap()
                                .parse::<u64>()
                                .unwrap()
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = Vec::new();
        for t in threads {
            let seen = t.join().unwrap();
            assert!(
                seen.windows(2).all(|w| w[0] < w[1]),
                "increasing per thread"
            );
            all.extend(seen);
        }
        all.sort_unstable();
        assert_eq!(all, (0..4000).collect::<Vec<u64>>());
    }

    #[test]
    fn large_bodies_are_split_not_copied() {
        let n = INLINE_BODY_BYTES + 1000;
        let mix = Mix::new(
            vec![
                parse_spec("PUT /o?key=a{seq} 1").unwrap(),
                parse_spec("GET /o?key=a0 1").unwrap(),
            ],
            "h",
            n,
            None,
            0,
        )
        .unwrap();
        let mut rng = XorShift::new(1);
        let mut out = Vec::new();
        let w = mix.write_request(0, &mut rng, &mut out);
        let rest = w.body_rest.expect("the rest of the body");
        let head = format!("PUT /o?key=a0 HTTP/1.1\r\nHost: h\r\nContent-Length: {n}\r\n\r\n");
        assert_eq!(out.len(), head.len() + INLINE_BODY_BYTES);
        assert_eq!(rest.len(), 1000);
        let mut wire = out[head.len()..].to_vec();
        wire.extend_from_slice(&rest);
        assert_eq!(
            wire,
            body(n).collect::<Vec<u8>>(),
            "inline part + rest = the body"
        );
        out.clear();
        assert!(mix.write_request(1, &mut rng, &mut out).body_rest.is_none());
        // Preload requests split the same way, for their own value size.
        let p = Mix::new(
            vec![parse_spec("GET /o?key={key}").unwrap()],
            "h",
            0,
            Some(2),
            0,
        )
        .unwrap()
        .preload_requests("h", n);
        assert_eq!(p.requests.len(), 2);
        assert_eq!(p.body_rest.map(|b| b.len()), Some(1000));
    }

    #[test]
    fn keyed_entries_need_keys() {
        let spec = || vec![parse_spec("GET /metadata?key={key}").unwrap()];
        assert!(Mix::new(spec(), "h", 0, None, 0).is_err());
        assert!(Mix::new(spec(), "h", 0, Some(0), 0).is_err());
        let mix = Mix::new(spec(), "h", 0, Some(10), 0).unwrap();
        let mut rng = XorShift::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let mut out = Vec::new();
            mix.write_request(0, &mut rng, &mut out);
            let s = String::from_utf8(out).unwrap();
            let k: usize = s
                .strip_prefix("GET /metadata?key=key-")
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            seen[k] = true;
        }
        assert!(seen.iter().all(|&s| s), "every key is drawn: {seen:?}");
    }

    #[test]
    fn weights_are_respected() {
        let mix = Mix::new(
            vec![
                parse_spec("GET /a 9").unwrap(),
                parse_spec("GET /b 1").unwrap(),
            ],
            "h",
            0,
            None,
            0,
        )
        .unwrap();
        let mut rng = XorShift::new(42);
        let mut counts = [0u32; 2];
        for _ in 0..100_000 {
            counts[mix.choose(&mut rng)] += 1;
        }
        let share = counts[0] as f64 / 100_000.0;
        assert!((0.88..0.92).contains(&share), "{counts:?}");
    }

    #[test]
    fn preload_puts_every_key_once_per_target() {
        let mix = Mix::new(
            vec![
                parse_spec("GET /metadata?key={key} 9").unwrap(),
                parse_spec("PUT /metadata?key={key} 1").unwrap(),
                parse_spec("GET /health").unwrap(),
            ],
            "h",
            0,
            Some(3),
            0,
        )
        .unwrap();
        let p = mix.preload_requests("h", 2);
        assert!(p.body_rest.is_none());
        let reqs = p.requests;
        assert_eq!(reqs.len(), 3);
        assert_eq!(
            reqs[2],
            b"PUT /metadata?key=key-2 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nab"
        );
    }

    #[test]
    fn xorshift_is_never_stuck() {
        let mut r = XorShift::new(0);
        let a = r.next();
        let b = r.next();
        assert_ne!(a, b);
        assert_ne!(XorShift::new(1).next(), XorShift::new(2).next());
    }
}
