//! The chunk hash inside the object keys of the KV-cache layers that write to this store
//! (LMCache's forms, vllm-ascend's), by which KV events and `/memory/*` name blocks, and
//! `ock.mmc.kv_events.key_format`, which names the form (or a regex) to read it with.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The key forms `ock.mmc.kv_events.key_format` names (the chunk hash is the field given).
///
/// - `lmcache`: LMCache's `CacheEngineKey`, `model@world_size@worker_id@chunk_hash@dtype`
///   (a layer id and `tag%value` parts may follow);
/// - `lmcache_legacy`: LMCache before 0.2, `fmt@model@world_size@worker_id@chunk_hash`;
/// - `lmcache_mp`: LMCache's multiprocess (L2 adapter) keys,
///   `model@kv_rank(8 hex)@group(hex)@chunk_hash` with an optional `@cache_salt`;
/// - `vllm_ascend`: vllm-ascend's pool keys, `model@pcpN@dcpN@head_or_tp_rank:N@…@chunk_hash`
///   (the hash last), and its layer-wise keys `model@chunk_hash@rank` and
///   `model@group@chunk_hash@rank`;
/// - `auto` (the default): whichever of these the key is (see [`KeyFormat::chunk_hash`]);
/// - anything else is a regular expression with a named group `hash`.
#[derive(Clone, Debug, Default)]
pub enum KeyFormat {
    #[default]
    Auto,
    Lmcache,
    LmcacheLegacy,
    LmcacheMp,
    VllmAscend,
    Regex(regex::bytes::Regex),
}

impl KeyFormat {
    /// The names `ock.mmc.kv_events.key_format` accepts besides a regular expression.
    pub const NAMES: [&'static str; 5] = [
        "auto",
        "lmcache",
        "lmcache_legacy",
        "lmcache_mp",
        "vllm_ascend",
    ];

    /// A form's name, or a regular expression with a named group `hash`.
    pub fn parse(v: &str) -> Result<KeyFormat, String> {
        Ok(match v.trim() {
            "auto" | "" => KeyFormat::Auto,
            "lmcache" => KeyFormat::Lmcache,
            "lmcache_legacy" => KeyFormat::LmcacheLegacy,
            "lmcache_mp" => KeyFormat::LmcacheMp,
            "vllm_ascend" => KeyFormat::VllmAscend,
            re => {
                // One line (the caller prefixes "expected "): the regex crate's error draws
                // the pattern and a caret over several lines; its last line says what is wrong.
                let r = regex::bytes::Regex::new(re).map_err(|e| {
                    let text = e.to_string();
                    let why = text
                        .lines()
                        .map(str::trim)
                        .rfind(|l| !l.is_empty())
                        .unwrap_or("")
                        .trim_start_matches("error: ");
                    format!(
                        "one of {} or a regular expression (this one does not parse: {why})",
                        Self::NAMES.join(", ")
                    )
                })?;
                if !r.capture_names().any(|n| n == Some("hash")) {
                    return Err(format!(
                        "one of {} or a regular expression with a named group `hash` \
                         (?P<hash>…)",
                        Self::NAMES.join(", ")
                    ));
                }
                KeyFormat::Regex(r)
            }
        })
    }

    pub fn name(&self) -> &str {
        match self {
            KeyFormat::Auto => "auto",
            KeyFormat::Lmcache => "lmcache",
            KeyFormat::LmcacheLegacy => "lmcache_legacy",
            KeyFormat::LmcacheMp => "lmcache_mp",
            KeyFormat::VllmAscend => "vllm_ascend",
            KeyFormat::Regex(r) => r.as_str(),
        }
    }

    /// The 64-bit chunk hash of `key`, or `None` when the key is not of this form. The hash is
    /// read as hex (optionally `0x`; a leading `-` is two's complement; a longer digest keeps
    /// its low 64 bits).
    ///
    /// `auto` tells the forms apart by their fields, in this order: vllm-ascend's pool keys
    /// (`pcp…@dcp…@head_or_tp_rank:…`); LMCache's (decimal world size and worker id before the
    /// hash); LMCache's multiprocess keys (an 8-hex-digit kv rank second); LMCache's legacy
    /// keys (five parts, decimal world size and worker id before the hash); vllm-ascend's
    /// layer-wise keys (a decimal rank last).
    pub fn chunk_hash(&self, key: &[u8]) -> Option<u64> {
        let mut buf = [&b""[..]; 12];
        let parts = split(key, &mut buf);
        match self {
            KeyFormat::Auto => ascend_pool(key)
                .or_else(|| lmcache(parts))
                .or_else(|| lmcache_mp(parts))
                .or_else(|| lmcache_legacy(parts))
                .or_else(|| ascend_layerwise(parts)),
            KeyFormat::Lmcache => lmcache(parts),
            KeyFormat::LmcacheLegacy => lmcache_legacy(parts),
            KeyFormat::LmcacheMp => lmcache_mp(parts),
            KeyFormat::VllmAscend => ascend_pool(key).or_else(|| ascend_layerwise(parts)),
            KeyFormat::Regex(r) => parse_hex_hash(r.captures(key)?.name("hash")?.as_bytes()),
        }
    }
}

/// The first 12 `@`-separated parts (the forms split here have at most 6 before any tags;
/// vllm-ascend's pool keys, whose hash is last, are read by [`ascend_pool`] on their own).
fn split<'a, 'b>(key: &'a [u8], buf: &'b mut [&'a [u8]; 12]) -> &'b [&'a [u8]] {
    let mut n = 0;
    for p in key.split(|&b| b == b'@') {
        if n == buf.len() {
            break;
        }
        buf[n] = p;
        n += 1;
    }
    &buf[..n]
}

fn decimal(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_digit)
}

fn hex(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_hexdigit)
}

/// `model@world_size@worker_id@hash@dtype[@…]`.
fn lmcache(p: &[&[u8]]) -> Option<u64> {
    if p.len() >= 5 && decimal(p[1]) && decimal(p[2]) && !p[4].is_empty() {
        parse_hex_hash(p[3])
    } else {
        None
    }
}

/// `fmt@model@world_size@worker_id@hash`.
fn lmcache_legacy(p: &[&[u8]]) -> Option<u64> {
    if p.len() == 5 && decimal(p[2]) && decimal(p[3]) {
        parse_hex_hash(p[4])
    } else {
        None
    }
}

/// `model@kv_rank@group@hash[@salt]`, the kv rank as 8 hex digits, the group in hex.
fn lmcache_mp(p: &[&[u8]]) -> Option<u64> {
    if (p.len() == 4 || p.len() == 5) && p[1].len() == 8 && hex(p[1]) && hex(p[2]) {
        parse_hex_hash(p[3])
    } else {
        None
    }
}

/// `model@pcpN@dcpN@head_or_tp_rank:N@…@hash` (vllm-ascend's `PoolKey`/`LayerPoolKey`): the
/// hash is the last part, after a number of labelled parts that varies with the version.
fn ascend_pool(key: &[u8]) -> Option<u64> {
    let mut it = key.split(|&b| b == b'@').skip(1);
    let (pcp, dcp, rank) = (it.next()?, it.next()?, it.next()?);
    if !(pcp.starts_with(b"pcp")
        && dcp.starts_with(b"dcp")
        && rank.starts_with(b"head_or_tp_rank:"))
    {
        return None;
    }
    parse_hex_hash(it.last()?)
}

/// `model@hash@rank` and `model@group@hash@rank` (vllm-ascend's layer-wise GVA keys).
fn ascend_layerwise(p: &[&[u8]]) -> Option<u64> {
    match p.len() {
        3 if decimal(p[2]) => parse_hex_hash(p[1]),
        4 if decimal(p[1]) && decimal(p[3]) => parse_hex_hash(p[2]),
        _ => None,
    }
}

/// The chunk hash of `key` in any of the forms `auto` knows.
pub fn chunk_hash(key: &[u8]) -> Option<u64> {
    KeyFormat::Auto.chunk_hash(key)
}

/// The chunk hash of `key` under `format`; the first key of the process that does not parse
/// is logged (they are all counted in `skipped_unparsed_keys` as their events are dropped).
pub fn chunk_hash_logged(format: &KeyFormat, key: &[u8]) -> Option<u64> {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    let hash = format.chunk_hash(key);
    if hash.is_none() && !LOGGED.swap(true, Relaxed) {
        log::info!(
            "KV events: key {:?} has no chunk hash in the form {:?} \
             (ock.mmc.kv_events.key_format); its blocks publish no events (counted in \
             skipped_unparsed_keys; logged once)",
            String::from_utf8_lossy(&key[..key.len().min(256)]),
            format.name()
        );
    }
    hash
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

    fn auto(key: &str) -> Option<u64> {
        chunk_hash(key.as_bytes())
    }

    #[test]
    fn lmcache_keys() {
        assert_eq!(auto("llama@1@0@abc123@bfloat16"), Some(0xabc123));
        assert_eq!(auto("m@8@3@0x00ff@fp16"), Some(0xff));
        assert_eq!(auto("m@8@3@-1@fp16"), Some(u64::MAX));
        assert_eq!(
            auto("m@8@3@1234567890abcdef1122@fp16"),
            Some(0x5678_90ab_cdef_1122)
        );
        // A layer id and tags after the dtype; a dtype that is itself hex (bf16).
        assert_eq!(auto("m@8@3@beef@bfloat16@5@user%alice"), Some(0xbeef));
        assert_eq!(auto("m@8@3@1234@bf16"), Some(0x1234));
        assert_eq!(auto("m@1@0@xyz@fp16"), None, "not hex");
        assert_eq!(auto("plain_key"), None);
        assert_eq!(auto(""), None);
    }

    #[test]
    fn lmcache_legacy_keys_take_the_last_part_not_the_worker_id() {
        let h = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(
            auto(&format!("vllm@meta-llama/Llama-3@4@2@{h}")),
            Some(0xa495_991b_7852_b855)
        );
        assert_eq!(
            KeyFormat::LmcacheLegacy.chunk_hash(format!("huggingface@m@1@0@{h}").as_bytes()),
            Some(0xa495_991b_7852_b855)
        );
        assert_eq!(
            KeyFormat::LmcacheLegacy.chunk_hash(b"m@8@3@beef@fp16"),
            None
        );
    }

    #[test]
    fn lmcache_multiprocess_keys_with_and_without_salt() {
        // As LMCache 0.5.6's _object_key_to_string writes them.
        assert_eq!(auto("llama@000000ff@0@00010203"), Some(0x0001_0203));
        assert_eq!(auto("llama@000000ff@5@00010203"), Some(0x0001_0203));
        assert_eq!(auto("llama@000000ff@a@00010203@alice"), Some(0x0001_0203));
        assert_eq!(
            auto("llama@00000000@0@00010203@user-1.x:42"),
            Some(0x0001_0203)
        );
        // A 32-byte digest keeps its low 64 bits.
        let h = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        assert_eq!(
            auto(&format!("meta-llama/Llama-3@00000001@0@{h}")),
            Some(0x8899_aabb_ccdd_eeff)
        );
        // A key prefix (the connector's key_prefix) stays part of the model field.
        assert_eq!(
            auto("tenant-a/llama@000000ff@0@00010203"),
            Some(0x0001_0203)
        );
        assert_eq!(KeyFormat::LmcacheMp.chunk_hash(b"llama@1@0@abc@fp16"), None);
        assert_eq!(auto("llama@000000ff@0@xyz"), None);
    }

    #[test]
    fn vllm_ascend_keys() {
        // Pool keys (PoolKey, LayerPoolKey): the hash last.
        let pool = "Qwen@pcp0@dcp0@head_or_tp_rank:3@pp_rank:0@group:0@cache_role:kv\
                    @cache_family:default@0a1b2c3d4e5f6071";
        assert_eq!(auto(pool), Some(0x0a1b_2c3d_4e5f_6071));
        let layer = "Qwen@pcp1@dcp0@head_or_tp_rank:0@group:1@cache_role:kv@cache_family:c4\
                     @layer_id:17@ff";
        assert_eq!(auto(layer), Some(0xff));
        assert_eq!(
            KeyFormat::VllmAscend.chunk_hash(layer.as_bytes()),
            Some(0xff)
        );
        // Layer-wise GVA keys: model@hash@rank, model@group@hash@rank.
        assert_eq!(auto("Qwen@deadbeef@3"), Some(0xdead_beef));
        assert_eq!(auto("Qwen@1@deadbeef@3"), Some(0xdead_beef));
        // Request-scoped partial blocks carry no hash.
        assert_eq!(auto("Qwen@partial@req-1@0@4@1000@3"), None);
        assert_eq!(
            KeyFormat::VllmAscend.chunk_hash(b"llama@1@0@abc@fp16"),
            None
        );
    }

    #[test]
    fn named_forms_and_regex() {
        for name in KeyFormat::NAMES {
            assert_eq!(KeyFormat::parse(name).unwrap().name(), name);
        }
        // An error is one line, worded to follow the config's "expected " (fuzz target
        // `config` found the regex crate's multi-line message).
        let e = KeyFormat::parse("lo[g to finish`").unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with("one of auto,")
                && e.ends_with("(this one does not parse: unclosed character class)"),
            "{e}"
        );
        let e = KeyFormat::parse("^kv:([0-9a-f]+)").unwrap_err();
        assert!(
            e.starts_with("one of auto,") && e.contains("named group `hash`"),
            "{e}"
        );
        let f = KeyFormat::parse(r"^kv:(?P<hash>[0-9a-f]+):").unwrap();
        assert_eq!(f.chunk_hash(b"kv:00ff:layer3"), Some(0xff));
        assert_eq!(f.chunk_hash(b"llama@1@0@abc@fp16"), None);
        assert_eq!(f.name(), r"^kv:(?P<hash>[0-9a-f]+):");
        let e = KeyFormat::parse("kv:([0-9a-f]+)").unwrap_err();
        assert!(e.contains("named group `hash`"), "{e}");
        assert!(
            KeyFormat::parse("kv:(")
                .unwrap_err()
                .contains("regular expression")
        );
        assert_eq!(
            KeyFormat::Lmcache.chunk_hash(b"llama@000000ff@0@00010203"),
            None
        );
    }
}
