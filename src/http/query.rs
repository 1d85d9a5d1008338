//! Query strings: `name=value&...` with percent-decoding (`%2F` → `/`) and `+` → space.

use std::borrow::Cow;

/// A query string whose escapes are malformed (`%` not followed by two hex digits).
#[derive(Debug, PartialEq, Eq)]
pub struct BadEscape;

/// The decoded value of the first parameter called `name`; `Ok(None)` when absent.
/// A parameter without `=` has the empty value.
pub fn param<'q>(query: &'q [u8], name: &str) -> Result<Option<Cow<'q, [u8]>>, BadEscape> {
    for pair in query.split(|&b| b == b'&') {
        if pair.is_empty() {
            continue;
        }
        let (raw_name, raw_value) = match memchr::memchr(b'=', pair) {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        if decode(raw_name)?.as_ref() == name.as_bytes() {
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
