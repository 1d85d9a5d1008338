//! The request mix: `--request "METHOD PATH[?QUERY] [WEIGHT]"` lines → ready-to-send request
//! bytes, weighted choice, and `{key}` substitution.
//!
//! Each entry is pre-rendered once into the pieces of its request around every `{key}`, so
//! generating a request on the hot path is a few `extend_from_slice` calls and, for keyed
//! entries, one integer formatting.

/// One `--request` entry as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub method: String,
    /// Path with its query, as sent (may contain `{key}`).
    pub target: String,
    pub weight: u32,
}

/// The placeholder replaced by `key-<i>`.
pub const KEY_PLACEHOLDER: &str = "{key}";

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

/// An entry rendered into request bytes: `pieces[0] key pieces[1] key ... pieces[n]`.
#[derive(Debug)]
pub struct Entry {
    pub spec: Spec,
    pieces: Vec<Vec<u8>>,
    pub is_head: bool,
}

impl Entry {
    pub fn keyed(&self) -> bool {
        self.pieces.len() > 1
    }
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
}

/// Renders a request for `method target` with a `body_bytes` body (for PUT and POST), split
/// around each `{key}` of the target.
fn render(spec: &Spec, host: &str, body_bytes: usize) -> Vec<Vec<u8>> {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut first = format!("{} ", spec.method).into_bytes();
    let mut parts = spec.target.split(KEY_PLACEHOLDER);
    first.extend_from_slice(parts.next().unwrap_or("").as_bytes());
    pieces.push(first);
    for p in parts {
        pieces.push(p.as_bytes().to_vec());
    }
    let last = pieces.last_mut().expect("at least one piece");
    last.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    last.extend_from_slice(host.as_bytes());
    last.extend_from_slice(b"\r\n");
    if has_body(&spec.method) {
        last.extend_from_slice(format!("Content-Length: {body_bytes}\r\n").as_bytes());
    }
    last.extend_from_slice(b"\r\n");
    if has_body(&spec.method) {
        last.extend(body(body_bytes));
    }
    pieces
}

fn has_body(method: &str) -> bool {
    matches!(method, "PUT" | "POST")
}

/// A recognisable body: `a..z` repeated.
pub fn body(n: usize) -> impl Iterator<Item = u8> {
    (b'a'..=b'z').cycle().take(n)
}

impl Mix {
    /// `keys` is required when an entry uses `{key}` (and ignored otherwise).
    pub fn new(
        specs: Vec<Spec>,
        host: &str,
        body_bytes: usize,
        keys: Option<u64>,
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
            let pieces = render(&spec, host, body_bytes);
            entries.push(Entry {
                is_head: spec.method == "HEAD",
                pieces,
                spec,
            });
        }
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
        })
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

    /// Appends one request of entry `i` to `out`, with a random key if the entry is keyed.
    /// Returns whether it is a HEAD request (its response has no body).
    pub fn write_request(&self, i: usize, rng: &mut XorShift, out: &mut Vec<u8>) -> bool {
        let e = &self.entries[i];
        if e.keyed() {
            let k = rng.next() % self.keys;
            write_pieces(&e.pieces, k, out);
        } else {
            out.extend_from_slice(&e.pieces[0]);
        }
        e.is_head
    }

    /// The preload requests: one PUT of every key for every keyed target of the mix
    /// (distinct targets only), with a `body_bytes` body.
    pub fn preload_requests(&self, host: &str, body_bytes: usize) -> Vec<Vec<u8>> {
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
            let pieces = render(&spec, host, body_bytes);
            for k in 0..self.keys {
                let mut req = Vec::new();
                write_pieces(&pieces, k, &mut req);
                out.push(req);
            }
        }
        out
    }
}

fn write_pieces(pieces: &[Vec<u8>], k: u64, out: &mut Vec<u8>) {
    let mut num = itoa::Buffer::new();
    let num = num.format(k).as_bytes();
    out.extend_from_slice(&pieces[0]);
    for p in &pieces[1..] {
        out.extend_from_slice(b"key-");
        out.extend_from_slice(num);
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
        )
        .unwrap();
        let mut out = Vec::new();
        let mut rng = XorShift::new(1);
        assert!(!mix.write_request(0, &mut rng, &mut out));
        assert_eq!(out, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n");

        let mix = Mix::new(
            vec![parse_spec("PUT /metadata?key={key}&again={key}").unwrap()],
            "h:1",
            5,
            Some(1),
        )
        .unwrap();
        out.clear();
        mix.write_request(0, &mut rng, &mut out);
        assert_eq!(
            out,
            b"PUT /metadata?key=key-0&again=key-0 HTTP/1.1\r\nHost: h:1\r\nContent-Length: 5\r\n\r\nabcde"
        );

        let mix = Mix::new(vec![parse_spec("HEAD /health").unwrap()], "h", 0, None).unwrap();
        out.clear();
        assert!(mix.write_request(0, &mut rng, &mut out));
    }

    #[test]
    fn keyed_entries_need_keys() {
        let spec = || vec![parse_spec("GET /metadata?key={key}").unwrap()];
        assert!(Mix::new(spec(), "h", 0, None).is_err());
        assert!(Mix::new(spec(), "h", 0, Some(0)).is_err());
        let mix = Mix::new(spec(), "h", 0, Some(10)).unwrap();
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
        )
        .unwrap();
        let reqs = mix.preload_requests("h", 2);
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
