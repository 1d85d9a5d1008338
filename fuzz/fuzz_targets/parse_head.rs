//! `mmc::http::parse::parse_head` on arbitrary bytes (a request head, possibly with a body or
//! a pipelined request behind it).
//!
//! Properties beyond "no panic":
//! - a `Complete` head's `len` is at most the input length and at most `MAX_HEAD_BYTES`;
//! - `path`, `query` and the header values it keeps borrow the input (the one exception is
//!   the absolute form without a path, `GET http://host HTTP/1.1`, whose path is the static
//!   `/`; an empty query may be a static empty slice);
//! - parsing exactly the head's bytes gives the same head (the verdict does not depend on
//!   what follows the blank line).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmc::http::parse::{Head, Parsed, parse_head};
use mmc::limits::MAX_HEAD_BYTES;

fn within(input: &[u8], s: &[u8]) -> bool {
    let (start, end) = (
        input.as_ptr() as usize,
        input.as_ptr() as usize + input.len(),
    );
    let p = s.as_ptr() as usize;
    p >= start && p + s.len() <= end
}

fn check(input: &[u8], h: &Head<'_>) {
    assert!(
        h.len <= input.len(),
        "len {} > input {}",
        h.len,
        input.len()
    );
    assert!(h.len <= MAX_HEAD_BYTES, "len {} > MAX_HEAD_BYTES", h.len);
    assert!(
        within(input, h.path) || h.path == b"/",
        "path {:?} is not part of the input",
        h.path
    );
    assert!(!h.path.is_empty(), "empty path");
    assert!(
        within(input, h.query) || h.query.is_empty(),
        "query {:?} is not part of the input",
        h.query
    );
    for v in [h.request_id, h.content_type, h.authorization]
        .into_iter()
        .flatten()
    {
        assert!(
            within(input, v) || v.is_empty(),
            "header value {v:?} outside the input"
        );
    }
    // Path and query both come from the head.
    if within(input, h.path) && !h.path.is_empty() {
        assert!(h.path.as_ptr() as usize + h.path.len() <= input.as_ptr() as usize + h.len);
    }
    if within(input, h.query) && !h.query.is_empty() {
        assert!(h.query.as_ptr() as usize + h.query.len() <= input.as_ptr() as usize + h.len);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Parsed::Complete(h) = parse_head(data) {
        check(data, &h);
        let head_only = &data[..h.len];
        match parse_head(head_only) {
            Parsed::Complete(h2) => {
                check(head_only, &h2);
                assert_eq!(h2.len, h.len);
                assert_eq!(h2.method, h.method);
                assert_eq!(h2.path, h.path);
                assert_eq!(h2.query, h.query);
                assert_eq!(h2.framing, h.framing);
                assert_eq!(h2.keep_alive, h.keep_alive);
                assert_eq!(h2.minor_version, h.minor_version);
            }
            other => panic!("head alone parses differently: {other:?} vs {h:?}"),
        }
    }
});
