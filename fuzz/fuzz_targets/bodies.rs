//! JSON bodies of `/memory/evict`, `/memory/prefetch` and the POST form of the batch routes
//! (`mmc::http::bodies`), with content type `application/json` and the fuzz input as the body.
//!
//! Properties: no panic; an accepted body names at most `MAX_CHUNK_HASHES` hashes and each
//! location at most once, or at most `MAX_BATCH_KEYS` non-empty keys; a refusal is a business
//! error (the media type is right).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmc::http::bodies::{
    BodyError, MAX_BATCH_KEYS, MAX_CHUNK_HASHES, parse_batch_keys, parse_evict, parse_prefetch,
};

const JSON: Option<&[u8]> = Some(b"application/json");

fuzz_target!(|data: &[u8]| {
    match parse_evict(JSON, data) {
        Ok(r) => {
            assert!(r.chunk_hashes.len() <= MAX_CHUNK_HASHES);
            if let Some(locs) = &r.locations {
                for (i, m) in locs.iter().enumerate() {
                    assert!(!locs[..i].contains(m), "duplicate location {m:?}");
                }
            }
        }
        Err(e) => assert!(matches!(e, BodyError::Invalid(_)), "{e:?}"),
    }
    match parse_prefetch(JSON, data) {
        Ok(r) => assert!(r.chunk_hashes.len() <= MAX_CHUNK_HASHES),
        Err(e) => assert!(matches!(e, BodyError::Invalid(_)), "{e:?}"),
    }
    match parse_batch_keys(JSON, data) {
        Ok(keys) => {
            assert!(keys.len() <= MAX_BATCH_KEYS);
            assert!(keys.iter().all(|k| !k.is_empty()), "an empty key");
        }
        Err(e) => assert!(matches!(e, BodyError::Invalid(_)), "{e:?}"),
    }
});
