//! Query strings (`mmc::http::query::{param, decode}`) and object keys
//! (`mmc::shards::store::keys::{chunk_hash, parse_hex_hash, validate}`).
//!
//! Input: `NAME\nQUERY` (the parameter name to look up, then the query string); without a
//! newline the whole input is the query and the name is `key`.
//!
//! Properties: no panic; `decode` of input without `%` and `+` succeeds and returns the input
//! unchanged (borrowed); a decoded string is never longer than its input; `param` finds a value
//! only when `decode` accepts it; a parsed chunk hash prints back to the same value.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use mmc::http::query::{decode, param};
use mmc::shards::store::keys::{chunk_hash, parse_hex_hash, validate};

fuzz_target!(|data: &[u8]| {
    let (name, query) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (String::from_utf8_lossy(&data[..i]), &data[i + 1..]),
        None => (Cow::Borrowed("key"), data),
    };

    match decode(query) {
        Ok(out) => {
            assert!(out.len() <= query.len());
            if !query.iter().any(|&b| b == b'%' || b == b'+') {
                assert_eq!(out.as_ref(), query);
                assert!(matches!(out, Cow::Borrowed(_)));
            }
        }
        Err(_) => assert!(query.contains(&b'%'), "only a % can be a bad escape"),
    }
    if let Ok(Some(v)) = param(query, &name) {
        assert!(v.len() <= query.len());
    }
    // Every pair of a query that decodes as a whole decodes alone.
    if decode(query).is_ok() {
        assert!(param(query, &name).is_ok());
    }

    let _ = validate(query);
    if validate(query).is_ok() {
        assert!(std::str::from_utf8(query).is_ok());
    }
    for s in [query, name.as_bytes()] {
        if let Some(v) = parse_hex_hash(s) {
            assert_eq!(parse_hex_hash(format!("{v:x}").as_bytes()), Some(v));
            assert_eq!(parse_hex_hash(format!("0x{v:016X}").as_bytes()), Some(v));
        }
        if let Some(v) = chunk_hash(s) {
            let key = format!("m@1@0@{v:x}@fp16");
            assert_eq!(chunk_hash(key.as_bytes()), Some(v));
        }
    }
});
