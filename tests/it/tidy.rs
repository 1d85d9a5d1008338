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
//! - Layers import only what their row of [`layers::LAYERS`] allows, and no import cycle runs
//!   between them ([`layers`]).
//! - The server package's dependency graph has no chart library: `plotters` belongs to the
//!   load generator's package (`perf/mmc-perf`).

use std::path::{Path, PathBuf};

mod layers;

const MAX_LINES: usize = 800;

/// The atomic read-modify-writes `src/shards` and `src/metrics` may do: (file, the atomic's
/// name on the line, why several threads write it). Statistics are not among them.
const SHARED_RMW: &[(&str, &str, &str)] = &[
    (
        "src/metrics/exposition/writer.rs",
        "SLOTS",
        "a histogram's place in each thread's last texts: taken once per histogram made, at its family's first scrape on any shard",
    ),
    (
        "src/shards/ranks.rs",
        "commits_in_flight",
        "a local service's commits on their way to its meta, from any shard, read by the agent",
    ),
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

/// The Markdown files a reader follows links between: the top-level ones, `docs/`, and the
/// READMEs of the folders.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["", "docs", "clients/python", "deploy", "perf", "fuzz"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The relative link targets of a Markdown text (`[text](target)`, anchors cut off; web links
/// and pure anchors left out).
fn relative_links(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.contains(char::is_whitespace) {
            out.push(target);
        }
        rest = &rest[end..];
    }
    out
}

/// Every relative link in the docs leads to a file of the repository (the docs were split
/// into pages; a moved section must not leave a dead link behind).
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(files.len() > 10, "found the docs: {files:?}");
    let mut dead = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for t in relative_links(&text) {
            if !f.parent().unwrap().join(t).exists() {
                dead.push(format!("{}: {t}", rel(f)));
            }
        }
    }
    assert!(dead.is_empty(), "dead links: {dead:?}");
}

#[test]
fn the_link_check_reads_links() {
    let links = relative_links("a [x](docs/a.md#b) [y](https://e.org) [z](#top) [w](../c)");
    assert_eq!(links, ["docs/a.md", "../c"]);
}

/// The crates of `package`'s dependency graph (normal, build and dev edges: what
/// `cargo tree -p <package>` shows), from the workspace's Cargo.lock, offline.
fn dependency_crates(package: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["tree", "--offline", "--locked", "-p", package])
        .args([
            "-e",
            "normal,build,dev",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn the_server_package_has_no_chart_library() {
    let server = dependency_crates("memcache-hybrid");
    assert!(server.iter().any(|c| c == "monoio"), "{server:?}");
    assert!(
        !server.iter().any(|c| c == "plotters"),
        "plotters is in the server's dependency graph (`cargo tree -p memcache-hybrid -i \
         plotters` says through what): charts belong to mmc-perf's package"
    );
    // The check sees the library where it is.
    assert!(
        dependency_crates("mmc-perf")
            .iter()
            .any(|c| c == "plotters")
    );
}
