//! Tidy tests (in the style of rust-analyzer's): the rules ARCHITECTURE.md states about the
//! source tree, checked on the source itself so that breaking one fails the test suite.
//!
//! - No file in `src/` passes [`MAX_LINES`] lines.
//! - No `Mutex` or `RwLock` in `src/shards` or `src/metrics` (the per-key path and the
//!   per-shard statistics are lock-free) unless the line, or the comment line just above it,
//!   says `LOCK-OK: <reason>`.
//! - No atomic read-modify-write (`fetch_add`, `fetch_sub`, …) in `src/shards` or
//!   `src/metrics` outside [`SHARED_RMW`]: statistics are written by one shard each (a
//!   relaxed load and store) and summed when read.
//! - A medium's names are written once, in `src/common/medium.rs`'s table: no other code
//!   spells one as a string literal.
//! - Layers import only the layers below them ([`FORBIDDEN`]). The imports that break a rule
//!   today are listed in [`KNOWN_LAYER_BREAKS`], each with what it is waiting for; the list can
//!   only shrink: an entry that no longer occurs fails the test too, so it is removed when the
//!   import is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// (layer, a layer it must not import, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    ("shards", "http", "shards own state and know no HTTP"),
    ("config", "http", "config imports no other layer"),
    ("config", "shards", "config imports no other layer"),
    ("config", "metrics", "config imports no other layer"),
    ("config", "kv_events", "config imports no other layer"),
    ("config", "accel", "config imports no other layer"),
    ("config", "server", "config imports no other layer"),
    ("metrics", "http", "metrics read what they are handed"),
    ("metrics", "server", "metrics read what they are handed"),
    ("metrics", "shards", "metrics read what they are handed"),
    ("kv_events", "http", "kv_events read what they are handed"),
    ("kv_events", "server", "kv_events read what they are handed"),
    ("kv_events", "shards", "kv_events read what they are handed"),
    ("accel", "http", "accel is below shards"),
    ("accel", "shards", "accel is below shards"),
    ("accel", "metrics", "accel is below shards"),
    (
        "http",
        "server",
        "the server assembles http, not the reverse",
    ),
    (
        "shards",
        "server",
        "the server assembles shards, not the reverse",
    ),
];

/// Layer breaks that exist today: (file, imported layer), each waiting for its fix. Empty since
/// the shared vocabulary moved to `src/common`; keep it so a break found later can be listed
/// with its reason while it is fixed.
const KNOWN_LAYER_BREAKS: &[(&str, &str)] = &[];

/// The atomic read-modify-writes `src/shards` and `src/metrics` may do: (file, the atomic's
/// name on the line, why several threads write it). Statistics are not among them.
const SHARED_RMW: &[(&str, &str, &str)] = &[
    (
        "src/shards/store/segment.rs",
        "next_id",
        "segment ids: a mount runs on whichever shard took the request",
    ),
    (
        "src/shards/store/segment.rs",
        "epoch",
        "the segment table's epoch: bumped by every mount and unmount, from any shard",
    ),
    (
        "src/shards/store/ssd/mod.rs",
        "seen",
        "fault injection (tests): the operations of all shards count towards one rule",
    ),
    (
        "src/metrics/client.rs",
        "forgotten",
        "any thread may ask a shard to forget a rank; the owning shard clears its figures",
    ),
    (
        "src/metrics/counter.rs",
        "self.0",
        "Counter::add_shared, for writers that are no shard (never a shard's own counters)",
    ),
];

/// Bottom layers: they import no other module of the crate, so every layer may use them.
const BOTTOM: &[&str] = &["common"];

fn src_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    walk(&root.join("src"), &mut out);
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The top-level module a file belongs to: `src/shards/store/mod.rs` → `shards`.
fn layer_of(rel: &str) -> Option<&str> {
    let rest = rel.strip_prefix("src/")?;
    let first = rest.split('/').next()?;
    Some(first.strip_suffix(".rs").unwrap_or(first))
}

/// The code of a file without comments and without its `#[cfg(test)]` module (tests may
/// reach anywhere).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::` paths in `code`, including every item of a
/// `use crate::{a::…, b, c::{…}}` group.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i + "crate::".len();
        from = at;
        if bytes.get(at) == Some(&b'{') {
            // Top-level items of the group: split on commas at depth 1.
            let mut depth = 0;
            let mut item_start = at + 1;
            let mut j = at;
            while j < bytes.len() {
                match bytes[j] {
                    b'{' => depth += 1,
                    b'}' | b',' if depth == 1 => {
                        let item = code[item_start..j].trim();
                        let name: String = item
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !name.is_empty() {
                            out.insert(name);
                        }
                        item_start = j + 1;
                        if bytes[j] == b'}' {
                            break;
                        }
                    }
                    b'}' => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
        } else {
            let name: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

/// `file:line: code` of every code line (comments and test modules left out, see [`code_of`])
/// of the files `file` accepts that `hit(file, line)` picks.
fn code_lines_where(file: impl Fn(&str) -> bool, hit: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for p in src_files() {
        let r = rel(&p);
        if !file(&r) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        for (i, line) in code.lines().enumerate() {
            if hit(&r, line) {
                found.push(format!("{r}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn no_source_file_passes_the_line_limit() {
    let long: Vec<String> = src_files()
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", rel(p)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by concern): {long:?}"
    );
}

/// The file names ARCHITECTURE.md's code map gives for `rel` (`src/http/conn/framing.rs`): any
/// of its path's tails in backticks, and for a `mod.rs` also its folder (`conn/`).
fn code_map_names(rel: &str) -> Vec<String> {
    let parts: Vec<&str> = rel.split('/').collect();
    let mut names: Vec<String> = (0..parts.len())
        .map(|i| format!("`{}`", parts[i..].join("/")))
        .collect();
    if parts.last() == Some(&"mod.rs") && parts.len() >= 3 {
        let dir = &parts[..parts.len() - 1];
        names.extend((0..dir.len()).map(|i| format!("`{}/`", dir[i..].join("/"))));
    }
    names
}

#[test]
fn every_source_file_is_in_the_code_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let start = doc
        .find("## Code map")
        .expect("ARCHITECTURE.md has a code map");
    let map = &doc[start..];
    let map = &map[..map[3..].find("\n## ").map_or(map.len(), |i| i + 3)];
    let missing: Vec<String> = src_files()
        .iter()
        .map(|p| rel(p))
        .filter(|r| !code_map_names(r).iter().any(|n| map.contains(n.as_str())))
        .collect();
    assert!(
        missing.is_empty(),
        "files ARCHITECTURE.md's code map does not name (a tail of the path in backticks): {missing:?}"
    );
}

#[test]
fn the_code_map_check_knows_a_missing_file() {
    assert!(code_map_names("src/http/conn/framing.rs").contains(&"`framing.rs`".to_string()));
    assert!(code_map_names("src/http/conn/mod.rs").contains(&"`conn/`".to_string()));
    assert!(!code_map_names("src/http/conn/framing.rs").contains(&"`conn/`".to_string()));
}

#[test]
fn no_lock_in_shards_or_metrics_without_its_reason() {
    let mut found = Vec::new();
    for p in src_files() {
        let r = rel(&p);
        if !(r.starts_with("src/shards/") || r.starts_with("src/metrics/")) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let before_comment = line.split("//").next().unwrap();
            let locks = ["Mutex<", "RwLock<", "Mutex::new", "RwLock::new"]
                .iter()
                .any(|l| before_comment.contains(l));
            let reasoned = line.contains("LOCK-OK:")
                || (i > 0
                    && lines[i - 1].trim_start().starts_with("//")
                    && lines[i - 1].contains("LOCK-OK:"));
            if locks && !reasoned {
                found.push(format!("{}:{}: {}", r, i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "locks in src/shards or src/metrics without a `// LOCK-OK: <reason>`:\n{}",
        found.join("\n")
    );
}

#[test]
fn layers_import_only_the_layers_below_them() {
    let mut breaks = BTreeSet::new();
    for p in src_files() {
        let r = rel(&p);
        let Some(layer) = layer_of(&r) else { continue };
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        for m in crate_modules(&code) {
            let below_bottom = BOTTOM.contains(&layer) && m != layer;
            if below_bottom || FORBIDDEN.iter().any(|(l, f, _)| *l == layer && *f == m) {
                breaks.insert((r.clone(), m));
            }
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_LAYER_BREAKS
        .iter()
        .map(|(f, m)| (f.to_string(), m.to_string()))
        .collect();
    let new: Vec<_> = breaks.difference(&known).collect();
    let gone: Vec<_> = known.difference(&breaks).collect();
    assert!(
        new.is_empty(),
        "imports against ARCHITECTURE.md's layering (move the shared item down instead): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "these layer breaks are fixed: remove them from KNOWN_LAYER_BREAKS: {gone:?}"
    );
}

#[test]
fn statistics_take_no_read_modify_write() {
    const RMW: &[&str] = &[
        ".fetch_add(",
        ".fetch_sub(",
        ".fetch_or(",
        ".fetch_and(",
        ".fetch_max(",
        ".fetch_min(",
        ".fetch_update(",
    ];
    let in_scope = |r: &str| r.starts_with("src/shards/") || r.starts_with("src/metrics/");
    let found = code_lines_where(in_scope, |r, line| {
        let allowed = SHARED_RMW
            .iter()
            .any(|(f, name, _)| *f == r && line.contains(&format!("{name}.fetch_")));
        RMW.iter().any(|op| line.contains(op)) && !allowed
    });
    assert!(
        found.is_empty(),
        "atomic read-modify-writes in src/shards or src/metrics (give each shard its own \
         slot and sum when read, or list a shared atomic in SHARED_RMW with its reason):\n{}",
        found.join("\n")
    );
}

#[test]
fn medium_names_are_written_only_in_their_table() {
    const TABLE: &str = "src/common/medium.rs";
    let names = [
        "hbm",
        "dram",
        "ssd",
        "npu",
        "gpu",
        "cpu",
        "disk",
        "LocalGPUBackend",
        "LocalCPUBackend",
        "LocalDiskBackend",
    ];
    let found = code_lines_where(
        |r| r != TABLE,
        |_, line| {
            names.iter().any(|name| {
                [name.to_string(), name.to_ascii_uppercase()]
                    .iter()
                    .any(|spelled| line.contains(&format!("\"{spelled}\"")))
            })
        },
    );
    assert!(
        found.is_empty(),
        "media named outside {TABLE} (read the name from `Medium`'s table):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_import_scanner_sees_grouped_and_nested_paths() {
    let code = "use crate::{http::tls::TlsConfig, shards::{Medium, Seg}, limits};\nlet x = crate::kv_events::X;";
    let got: Vec<String> = crate_modules(code).into_iter().collect();
    assert_eq!(got, ["http", "kv_events", "limits", "shards"]);
    assert_eq!(layer_of("src/shards/store/mod.rs"), Some("shards"));
    assert_eq!(layer_of("src/cli.rs"), Some("cli"));
    // A commented-out import and a test module's imports do not count.
    let code = code_of(
        "// use crate::http::X;\nfn f() {}\n#[cfg(test)]\nmod tests {\n use crate::server::Y;\n}\n",
    );
    assert!(crate_modules(&code).is_empty());
}
