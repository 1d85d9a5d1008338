//! Object keys: validation, and the chunk hash inside LMCache-style keys.

/// Why an object key is refused (the error message for the client).
pub fn validate(key: &[u8]) -> Result<(), &'static str> {
    if std::str::from_utf8(key).is_err() {
        return Err("Invalid key: not valid UTF-8");
    }
    if key.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err("Invalid key: control characters are not allowed");
    }
    Ok(())
}

/// The 64-bit chunk hash of an LMCache key `model@world_size@worker_id@chunk_hash@dtype`
/// (at least five `@`-separated parts; the fourth is the hash in hex, possibly with a leading
/// `-` or `0x`; a longer digest keeps its low 64 bits). `None` when the key does not parse.
pub fn chunk_hash(key: &[u8]) -> Option<u64> {
    let mut parts = key.split(|&b| b == b'@');
    let hash = parts.nth(3)?;
    parts.next()?; // a fifth part (the dtype) must exist
    parse_hex_hash(hash)
}

/// Parses a chunk hash as written in keys and in `/memory/*` requests.
pub fn parse_hex_hash(s: &[u8]) -> Option<u64> {
    let (negative, s) = match s.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let s = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    if s.is_empty() || !s.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let low = &s[s.len().saturating_sub(16)..];
    let mut v = 0u64;
    for &b in low {
        v = v << 4 | (b as char).to_digit(16)? as u64;
    }
    Some(if negative { v.wrapping_neg() } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lmcache_keys() {
        assert_eq!(chunk_hash(b"llama@1@0@abc123@bfloat16"), Some(0xabc123));
        assert_eq!(chunk_hash(b"m@8@3@0x00ff@fp16"), Some(0xff));
        assert_eq!(chunk_hash(b"m@8@3@-1@fp16"), Some(u64::MAX));
        assert_eq!(
            chunk_hash(b"m@8@3@1234567890abcdef1122@fp16"),
            Some(0x5678_90ab_cdef_1122)
        );
        assert_eq!(chunk_hash(b"m@1@0@abc"), None, "four parts");
        assert_eq!(chunk_hash(b"m@1@0@xyz@fp16"), None, "not hex");
        assert_eq!(chunk_hash(b"plain_key"), None);
    }

    #[test]
    fn key_validation() {
        assert!(validate(b"model@1@0@ab@fp16").is_ok());
        assert!(validate("ключ".as_bytes()).is_ok());
        assert!(validate(b"a\nb").is_err());
        assert!(validate(b"\xff").is_err());
    }
}
