//! Query strings: `name=value&...` with percent-decoding (`%2F` → `/`) and `+` → space.

use std::borrow::Cow;

/// A query string whose escapes are malformed (`%` not followed by two hex digits).
#[derive(Debug, PartialEq, Eq)]
pub struct BadEscape;

/// The decoded value of the first parameter called `name`; `Ok(None)` when absent.
/// A parameter without `=` has the empty value.
///
/// One pass over the bytes, on every request's path: a pair's name is compared as it is when it
/// has no escape (the usual case), and decoded only when it has one.
pub fn param<'q>(query: &'q [u8], name: &str) -> Result<Option<Cow<'q, [u8]>>, BadEscape> {
    let name = name.as_bytes();
    let mut start = 0;
    while start < query.len() {
        let mut eq = None;
        let mut escaped_name = false;
        let mut end = start;
        while end < query.len() {
            match query[end] {
                b'&' => break,
                b'=' if eq.is_none() => eq = Some(end),
                b'%' | b'+' if eq.is_none() => escaped_name = true,
                _ => {}
            }
            end += 1;
        }
        let pair = start..end;
        start = end + 1;
        if pair.is_empty() {
            continue;
        }
        let (raw_name, raw_value) = match eq {
            Some(i) => (&query[pair.start..i], &query[i + 1..pair.end]),
            None => (&query[pair], &b""[..]),
        };
        let found = if escaped_name {
            decode(raw_name)?.as_ref() == name
        } else {
            raw_name == name
        };
        if found {
            return decode(raw_value).map(Some);
        }
    }
    Ok(None)
}

/// Percent-decodes `s`, borrowing when there is nothing to decode.
pub fn decode(s: &[u8]) -> Result<Cow<'_, [u8]>, BadEscape> {
    if !s.iter().any(|&b| b == b'%' || b == b'+') {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                let hi = s.get(i + 1).and_then(|&b| hex(b)).ok_or(BadEscape)?;
                let lo = s.get(i + 2).and_then(|&b| hex(b)).ok_or(BadEscape)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(Cow::Owned(out))
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_decodes() {
        let q = b"a=1&key=a%2Fb+c&key=second&flag";
        assert_eq!(param(q, "key").unwrap().unwrap().as_ref(), b"a/b c");
        assert_eq!(param(q, "a").unwrap().unwrap().as_ref(), b"1");
        assert_eq!(param(q, "flag").unwrap().unwrap().as_ref(), b"");
        assert_eq!(param(q, "missing").unwrap(), None);
        assert_eq!(param(b"", "key").unwrap(), None);
        assert_eq!(param(b"k%65y=v", "key").unwrap().unwrap().as_ref(), b"v");
        assert_eq!(
            param(b"key=%00%ff", "key").unwrap().unwrap().as_ref(),
            b"\0\xff"
        );
    }

    /// The definition `param` is written against: split at `&`, then at the first `=`, decode
    /// both halves, compare names.
    fn param_by_definition<'q>(
        query: &'q [u8],
        name: &str,
    ) -> Result<Option<Cow<'q, [u8]>>, BadEscape> {
        for pair in query.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
            let (n, v) = match pair.iter().position(|&b| b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &b""[..]),
            };
            if decode(n)?.as_ref() == name.as_bytes() {
                return decode(v).map(Some);
            }
        }
        Ok(None)
    }

    #[test]
    fn the_one_pass_agrees_with_the_definition_on_every_short_query() {
        // Every query of up to 6 bytes over an alphabet with each separator and escape, and a
        // few longer ones: the same answer, error included.
        let alphabet = b"k=&%+2a";
        let mut queries: Vec<Vec<u8>> = vec![Vec::new()];
        let mut last = vec![Vec::new()];
        for _ in 0..6 {
            let next: Vec<Vec<u8>> = last
                .iter()
                .flat_map(|q| {
                    alphabet.iter().map(move |&b| {
                        let mut q = q.clone();
                        q.push(b);
                        q
                    })
                })
                .collect();
            queries.extend(next.iter().cloned());
            last = next;
        }
        queries.extend(
            [
                &b"a=1&key=a%2Fb+c&key=second&flag"[..],
                b"x%zz=1&key=v",
                b"key=v&x%zz=1",
                b"&&key=a=b&&",
                b"=v&key",
                b"a+b=1&a%20b=2",
            ]
            .map(<[u8]>::to_vec),
        );
        for q in &queries {
            for name in ["k", "key", "a", "a b", "", "k=", "2"] {
                assert_eq!(
                    param(q, name),
                    param_by_definition(q, name),
                    "query {:?}, name {name:?}",
                    String::from_utf8_lossy(q)
                );
            }
        }
    }

    #[test]
    fn borrows_when_nothing_to_decode() {
        assert!(matches!(decode(b"plain").unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn refuses_broken_escapes() {
        for bad in [&b"key=%"[..], b"key=%2", b"key=%zz", b"key=%2g"] {
            assert_eq!(param(bad, "key"), Err(BadEscape), "{bad:?}");
        }
    }
}
