//! Request bodies of `/memory/evict` and `/memory/prefetch`, and the `{"keys":[…]}` body of the
//! POST form of the batch routes: JSON → typed requests, with the contract's error texts. Pure
//! functions (no I/O), so they are unit-tested and fuzzed alone.

use serde_json::Value;
use smallvec::SmallVec;

use super::parse::is_json_media_type;
use crate::common::medium::Medium;

/// Most chunk hashes one request may name.
pub const MAX_CHUNK_HASHES: usize = 65_536;

/// Most keys one batch request may name (each costs work on its owner).
pub const MAX_BATCH_KEYS: usize = 4096;

/// Largest `{"keys":[…]}` body: room for [`MAX_BATCH_KEYS`] keys of the longest length
/// ([`crate::limits::MAX_KEY_BYTES`]) with their quotes and commas, plus slack for
/// whitespace and escapes. 16 MiB and a little; a larger body is answered 413 unread.
pub const MAX_BATCH_KEYS_BODY_BYTES: u64 =
    (MAX_BATCH_KEYS * (crate::limits::MAX_KEY_BYTES + 8) + (1 << 20)) as u64;

#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Not `application/json` (answered 415).
    MediaType,
    /// A business error with this message.
    Invalid(String),
}

impl BodyError {
    fn msg(s: impl Into<String>) -> BodyError {
        BodyError::Invalid(s.into())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct EvictRequest {
    pub chunk_hashes: Vec<String>,
    /// `None`: delete everywhere; else move one tier down from each medium.
    pub locations: Option<SmallVec<[Medium; 3]>>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct PrefetchRequest {
    pub chunk_hashes: Vec<String>,
    pub lookup_id: String,
}

fn object(
    content_type: Option<&[u8]>,
    body: &[u8],
) -> Result<serde_json::Map<String, Value>, BodyError> {
    if !content_type.is_some_and(is_json_media_type) {
        return Err(BodyError::MediaType);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(BodyError::msg("Invalid JSON body")),
    }
}

fn chunk_hashes(body: &serde_json::Map<String, Value>) -> Result<Vec<String>, BodyError> {
    let Some(v) = body.get("chunk_hashes").filter(|v| !v.is_null()) else {
        return Err(BodyError::msg("Missing 'chunk_hashes' in request body"));
    };
    let bad = || BodyError::msg("Invalid 'chunk_hashes': expected an array of strings");
    let items = v.as_array().ok_or_else(bad)?;
    if items.len() > MAX_CHUNK_HASHES {
        return Err(BodyError::msg(format!(
            "Too many chunk hashes (max {MAX_CHUNK_HASHES})"
        )));
    }
    items
        .iter()
        .map(|h| h.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)
}

/// LMCache backend names and medium names → media.
pub fn location(name: &str) -> Option<Medium> {
    Medium::from_lmcache_backend(name).or_else(|| Medium::parse(name))
}

pub fn parse_evict(content_type: Option<&[u8]>, body: &[u8]) -> Result<EvictRequest, BodyError> {
    let body = object(content_type, body)?;
    let chunk_hashes = chunk_hashes(&body)?;
    let locations = match body.get("locations") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut media = SmallVec::new();
            for it in items {
                match it.as_str().and_then(location) {
                    Some(m) => {
                        if !media.contains(&m) {
                            media.push(m);
                        }
                    }
                    None => {
                        return Err(BodyError::msg(format!(
                            "Unknown location {it}: expected LocalCPUBackend, LocalDiskBackend, HBM, DRAM or SSD"
                        )));
                    }
                }
            }
            Some(media)
        }
        Some(_) => {
            return Err(BodyError::msg(
                "Invalid 'locations': expected an array of strings or null",
            ));
        }
    };
    Ok(EvictRequest {
        chunk_hashes,
        locations,
    })
}

/// The keys of a batch request's JSON body `{"keys":["a","b"]}`, in order. As in the query
/// form, empty keys are skipped and at most [`MAX_BATCH_KEYS`] keys are accepted; other fields
/// are ignored. The keys themselves are validated by the caller, like the query form's.
pub fn parse_batch_keys(
    content_type: Option<&[u8]>,
    body: &[u8],
) -> Result<Vec<Box<[u8]>>, BodyError> {
    let body = object(content_type, body)?;
    let Some(v) = body.get("keys").filter(|v| !v.is_null()) else {
        return Err(BodyError::msg("Missing 'keys' in request body"));
    };
    let bad = || BodyError::msg("Invalid 'keys': expected an array of strings");
    let items = v.as_array().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(items.len().min(MAX_BATCH_KEYS));
    for item in items {
        let key = item.as_str().ok_or_else(bad)?;
        if key.is_empty() {
            continue;
        }
        if out.len() == MAX_BATCH_KEYS {
            return Err(BodyError::msg(format!(
                "Too many keys (max {MAX_BATCH_KEYS} per request)"
            )));
        }
        out.push(key.as_bytes().into());
    }
    Ok(out)
}

pub fn parse_prefetch(
    content_type: Option<&[u8]>,
    body: &[u8],
) -> Result<PrefetchRequest, BodyError> {
    let body = object(content_type, body)?;
    let chunk_hashes = chunk_hashes(&body)?;
    let lookup_id = match body.get("lookup_id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(BodyError::msg("Invalid 'lookup_id': expected a string")),
    };
    Ok(PrefetchRequest {
        chunk_hashes,
        lookup_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Option<&[u8]> = Some(b"application/json");

    #[test]
    fn evict_bodies() {
        let r = parse_evict(
            JSON,
            br#"{"chunk_hashes":["a","b"],"locations":["LocalCPUBackend","DRAM"]}"#,
        )
        .unwrap();
        assert_eq!(r.chunk_hashes, ["a", "b"]);
        assert_eq!(r.locations.unwrap().as_slice(), [Medium::Dram]);
        assert_eq!(
            parse_evict(JSON, br#"{"chunk_hashes":[],"locations":null}"#)
                .unwrap()
                .locations,
            None
        );
        assert_eq!(
            parse_evict(Some(b"text/plain"), b"{}"),
            Err(BodyError::MediaType)
        );
        assert_eq!(parse_evict(None, b"{}"), Err(BodyError::MediaType));
        assert_eq!(
            parse_evict(JSON, b"[]"),
            Err(BodyError::msg("Invalid JSON body"))
        );
        assert_eq!(
            parse_evict(JSON, b"{"),
            Err(BodyError::msg("Invalid JSON body"))
        );
        assert_eq!(
            parse_evict(JSON, b"{}"),
            Err(BodyError::msg("Missing 'chunk_hashes' in request body"))
        );
        assert!(parse_evict(JSON, br#"{"chunk_hashes":"a"}"#).is_err());
        assert!(parse_evict(JSON, br#"{"chunk_hashes":["a"],"locations":"x"}"#).is_err());
    }

    #[test]
    fn batch_key_bodies() {
        let keys = parse_batch_keys(JSON, br#"{"keys":["a","","b,c","\u00e9"],"x":1}"#).unwrap();
        let keys: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        assert_eq!(keys, [&b"a"[..], b"b,c", "\u{e9}".as_bytes()]);
        assert_eq!(parse_batch_keys(JSON, br#"{"keys":[]}"#).unwrap().len(), 0);
        assert_eq!(
            parse_batch_keys(Some(b"text/plain"), br#"{"keys":[]}"#),
            Err(BodyError::MediaType)
        );
        for (body, message) in [
            (&b"{"[..], "Invalid JSON body"),
            (b"[\"a\"]", "Invalid JSON body"),
            (b"{}", "Missing 'keys' in request body"),
            (br#"{"keys":null}"#, "Missing 'keys' in request body"),
            (
                br#"{"keys":"a,b"}"#,
                "Invalid 'keys': expected an array of strings",
            ),
            (
                br#"{"keys":["a",1]}"#,
                "Invalid 'keys': expected an array of strings",
            ),
        ] {
            assert_eq!(
                parse_batch_keys(JSON, body),
                Err(BodyError::msg(message)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let at_limit = serde_json::json!({ "keys": (0..MAX_BATCH_KEYS).map(|i| i.to_string()).collect::<Vec<_>>() });
        let body = serde_json::to_vec(&at_limit).unwrap();
        assert_eq!(parse_batch_keys(JSON, &body).unwrap().len(), MAX_BATCH_KEYS);
        let over = serde_json::json!({ "keys": (0..=MAX_BATCH_KEYS).map(|i| i.to_string()).collect::<Vec<_>>() });
        let body = serde_json::to_vec(&over).unwrap();
        assert_eq!(
            parse_batch_keys(JSON, &body),
            Err(BodyError::msg("Too many keys (max 4096 per request)"))
        );
        // The longest batch fits in the body limit.
        let longest = serde_json::json!({ "keys": (0..MAX_BATCH_KEYS).map(|i| format!("{i:0>4096}")).collect::<Vec<_>>() });
        assert!(serde_json::to_vec(&longest).unwrap().len() as u64 <= MAX_BATCH_KEYS_BODY_BYTES);
    }

    #[test]
    fn prefetch_bodies() {
        let r = parse_prefetch(JSON, br#"{"chunk_hashes":["a"],"lookup_id":"req_001"}"#).unwrap();
        assert_eq!((r.chunk_hashes.len(), r.lookup_id.as_str()), (1, "req_001"));
        assert_eq!(
            parse_prefetch(JSON, br#"{"chunk_hashes":[]}"#)
                .unwrap()
                .lookup_id,
            ""
        );
        assert!(parse_prefetch(JSON, br#"{"chunk_hashes":[],"lookup_id":5}"#).is_err());
    }
}
