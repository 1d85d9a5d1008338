//! Object keys: validation; the chunk hash inside LMCache-style keys is read by
//! [`crate::common::chunk_keys`].

pub use crate::common::chunk_keys::{KeyFormat, chunk_hash, chunk_hash_logged, parse_hex_hash};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_validation() {
        assert!(validate(b"model@1@0@ab@fp16").is_ok());
        assert!(validate("ключ".as_bytes()).is_ok());
        assert!(validate(b"a\nb").is_err());
        assert!(validate(b"\xff").is_err());
    }
}
