//! The layering of `src/`, as ARCHITECTURE.md's *Layers* states it, checked on the source.
//!
//! Every top-level module of `src/` is a layer, and so is `shards/store` (the store of one
//! shard: a layer of its own, below the rest of `shards`). [`LAYERS`] gives each one the layers
//! it may import; an import the table does not allow fails
//! [`each_layer_imports_only_what_the_table_allows`], so a new dependency between layers is a
//! change of the table (and of the diagram), never an accident. The table itself must be
//! acyclic ([`the_table_is_a_layering`]), and so must the imports found
//! ([`no_import_cycle_between_layers`]).
//!
//! An import is any path the code names through `crate::…` (every item of a
//! `use crate::{a::…, b::{…}}` group included) or through `super::…` (resolved from the file's
//! place in the module tree). Comments, a file's `#[cfg(test)] mod tests` and the files of a
//! module declared under `#[cfg(test)]` (`cluster/sim/`, `shards/store/sim.rs`) are left out:
//! tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{code_of, rel, src_files};

/// For [`LAYERS`]' third column: every layer may import it.
const ALL: &[&str] = &["*"];

/// A row of [`LAYERS`].
type Row = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
);

/// Every layer, bottom first: (layer, the layers it may import, the layers that may import it
/// besides those whose row names it (`ALL`: every one), why).
///
/// A layer that is not here fails the test, so a new top-level module comes with its row.
#[rustfmt::skip]
const LAYERS: &[Row] = &[
    ("common", &[], ALL, "the bottom: shared vocabulary (media, segment ids, the store's events) and primitives"),
    ("limits", &[], ALL, "protocol limits with their reasons, read by every layer"),
    ("config", &[], &[], "config imports no other layer: settings are plain data their users build from"),
    ("grant", &[], &[], "a grant is signed and checked knowing nothing of who asks"),
    ("accel", &[], &[], "device memory behind a trait, below the store"),
    ("cluster", &[], &["shards/store", "shards", "http", "agent", "ha"], "the cluster protocol's pure machines and data (no socket, no clock read): below everything that carries them out"),
    ("numa", &["config"], &[], "NUMA topology and mbind, below the store"),
    ("metrics", &["config", "numa"], &[], "metrics read what they are handed (metrics::view::Source)"),
    ("kv_events", &["config", "metrics"], &[], "the publisher takes events as data (common::event)"),
    ("ha", &["cluster", "config", "kv_events"], &[], "the HA threads reach the server through ha::HaHost, never the shards' types"),
    ("shards/store", &["accel", "config", "grant", "metrics", "numa"], &[], "one shard's store: nothing of src/shards outside store/"),
    ("shards", &["shards/store", "config", "grant", "ha", "kv_events", "metrics", "numa"], &[], "shards own state and know no HTTP (http hands them FrontAssets)"),
    ("http", &["shards", "shards/store", "config", "grant", "ha", "kv_events", "metrics"], &[], "the only module that knows HTTP"),
    ("agent", &["http", "shards", "shards/store", "grant", "metrics"], &[], "a local service's membership, over http's client"),
    ("cli", &["config", "shards"], &[], "the command line → a start-up plan"),
    ("server", &["agent", "cli", "http", "shards", "config", "ha", "kv_events", "numa"], &[], "assembles every layer; nothing imports it"),
];

/// Layer breaks that exist today: (file, imported layer), each waiting for its fix. Empty: keep
/// it so that a break found later can be listed with its reason while it is fixed; the list can
/// only shrink (an entry that no longer occurs fails the test too).
const KNOWN_LAYER_BREAKS: &[(&str, &str)] = &[];

/// The layer a module path (`["shards", "store", "put"]`) belongs to.
fn layer_of_path(path: &[String]) -> Option<String> {
    match path {
        [first, second, ..] if first == "shards" && second == "store" => {
            Some("shards/store".to_string())
        }
        [first, ..] => Some(first.clone()),
        [] => None,
    }
}

/// The module path of a file of `src/`: `src/shards/store/put.rs` → `shards::store::put`,
/// `src/ha/mod.rs` → `ha`; `None` for the crate root and `src/bin`.
fn module_of(rel: &str) -> Option<Vec<String>> {
    let rest = rel.strip_prefix("src/")?.strip_suffix(".rs")?;
    let mut parts: Vec<String> = rest.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    (parts.first().is_some_and(|p| p != "lib" && p != "bin")).then_some(parts)
}

/// The layer of a file of `src/`: `src/shards/store/mod.rs` → `shards/store`.
fn layer_of(rel: &str) -> Option<String> {
    layer_of_path(&module_of(rel)?)
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn skip_space(code: &[u8], mut i: usize) -> usize {
    while i < code.len() && code[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The paths of the use tree or path starting at `i` (after `crate::` or `super::`), each
/// appended to `prefix`: `a::b::{c, d::{e, self}, f as g}` → `a::b::c`, `a::b::d::e`,
/// `a::b::d`, `a::b::f`. Returns where it ended.
fn use_tree(code: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        i = skip_space(code, i);
        if code.get(i) == Some(&b'{') {
            i += 1;
            loop {
                i = skip_space(code, i);
                match code.get(i) {
                    Some(b'}') => return i + 1,
                    Some(b',') => i += 1,
                    None => return i,
                    // An item that is no path (`*`): skipped.
                    _ => i = use_tree(code, i, &path, out).max(i + 1),
                }
            }
        }
        let start = i;
        while i < code.len() && is_ident(code[i]) {
            i += 1;
        }
        let name = std::str::from_utf8(&code[start..i]).unwrap();
        if !name.is_empty() && name != "self" {
            path.push(name.to_string());
        }
        if code[i..].starts_with(b"::") {
            i += 2;
            continue;
        }
        // `* `, `as alias` or the end of a path in an expression: the path ends here.
        let j = skip_space(code, i);
        if code[j..].starts_with(b"as ") {
            i = skip_space(code, j + 3);
            while i < code.len() && is_ident(code[i]) {
                i += 1;
            }
        }
        out.push(path);
        return i;
    }
}

/// Every module path the code of the file at module path `module` names through `crate::` or
/// `super::`, as a path from the crate root.
fn imported_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':');
        if starts && bytes[i..].starts_with(b"crate::") {
            i = use_tree(bytes, i + "crate::".len(), &[], &mut out);
        } else if starts && bytes[i..].starts_with(b"super::") {
            let mut up = 0;
            while bytes[i..].starts_with(b"super::") {
                up += 1;
                i += "super::".len();
            }
            // `super` from `src/ha/mod.rs` (module `ha`) is the crate root.
            let base = &module[..module.len().saturating_sub(up)];
            i = use_tree(bytes, i, base, &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Whether the module at `module` (or one it is inside) is declared under `#[cfg(test)]` by
/// its parent: its files are test code.
fn test_only(module: &[String]) -> bool {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    (1..=module.len()).any(|n| {
        let (parent, name) = (&module[..n - 1], &module[n - 1]);
        let dir = parent.iter().fold(src.clone(), |p, m| p.join(m));
        let files = if parent.is_empty() {
            vec![src.join("lib.rs")]
        } else {
            vec![dir.join("mod.rs"), dir.with_extension("rs")]
        };
        files.iter().any(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            ["mod", "pub mod", "pub(crate) mod"]
                .iter()
                .any(|m| text.contains(&format!("#[cfg(test)]\n{m} {name};")))
        })
    })
}

/// Every (file, its layer, an imported layer other than its own) of `src/`.
fn imports() -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for p in src_files() {
        let r = rel(&p);
        let Some(module) = module_of(&r) else {
            continue;
        };
        if test_only(&module) {
            continue;
        }
        let layer = layer_of_path(&module).unwrap();
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        let layers: BTreeSet<String> = imported_paths(&code, &module)
            .iter()
            .filter_map(|path| layer_of_path(path))
            .filter(|l| *l != layer)
            .collect();
        for l in layers {
            found.push((r.clone(), layer.clone(), l));
        }
    }
    found
}

fn row(layer: &str) -> Option<&'static Row> {
    LAYERS.iter().find(|(l, ..)| *l == layer)
}

/// A layer every layer may import (`ALL`): it imports none itself.
fn bottom(layer: &str) -> bool {
    row(layer).is_some_and(|(_, _, by, _)| *by == ALL)
}

/// The table lets `from` import `to`.
fn allowed(from: &str, to: &str) -> bool {
    let listed = row(from).is_some_and(|(_, may, ..)| may.contains(&to));
    let welcomed =
        row(to).is_some_and(|(_, _, by, _)| by.contains(&from)) || (bottom(to) && !bottom(from));
    listed || welcomed
}

/// The layers: the top-level modules `src/lib.rs` declares, and `shards/store`.
fn layers_of_the_crate() -> BTreeSet<String> {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut out: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            Some(l.strip_prefix("mod ")?.strip_suffix(';')?.to_string())
        })
        .collect();
    out.insert("shards/store".to_string());
    out
}

/// A cycle of `edges`, as the layers along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut done, &mut Vec::new()))
}

#[test]
fn every_layer_has_its_row() {
    let crate_layers = layers_of_the_crate();
    let rows: BTreeSet<String> = LAYERS.iter().map(|(l, ..)| l.to_string()).collect();
    let missing: Vec<_> = crate_layers.difference(&rows).collect();
    assert!(
        missing.is_empty(),
        "layers without a row in tidy's LAYERS (say what each may import): {missing:?}"
    );
    let unknown: Vec<String> = LAYERS
        .iter()
        .flat_map(|(l, may, by, _)| std::iter::once(l).chain(may.iter()).chain(by.iter()))
        .filter(|l| **l != "*" && !crate_layers.contains(**l))
        .map(|l| l.to_string())
        .collect();
    assert!(
        unknown.is_empty(),
        "LAYERS names what is no layer of src/: {unknown:?}"
    );
}

#[test]
fn each_layer_imports_only_what_the_table_allows() {
    let crate_layers = layers_of_the_crate();
    let mut breaks = BTreeSet::new();
    let mut strange = Vec::new();
    for (file, from, to) in imports() {
        if !crate_layers.contains(&to) {
            strange.push(format!("{file}: {to}"));
        } else if !allowed(&from, &to) {
            breaks.insert((file, to));
        }
    }
    assert!(
        strange.is_empty(),
        "paths that resolve to no layer of src/ (the import scanner needs teaching): {strange:?}"
    );
    let known: BTreeSet<(String, String)> = KNOWN_LAYER_BREAKS
        .iter()
        .map(|(f, m)| (f.to_string(), m.to_string()))
        .collect();
    let new: Vec<_> = breaks.difference(&known).collect();
    let gone: Vec<_> = known.difference(&breaks).collect();
    assert!(
        new.is_empty(),
        "imports tidy's LAYERS does not allow (move the shared item down, or hand a trait or \
         plain data down, instead): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "these layer breaks are fixed: remove them from KNOWN_LAYER_BREAKS: {gone:?}"
    );
}

#[test]
fn the_table_is_a_layering() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let all: Vec<&str> = LAYERS.iter().map(|(l, ..)| *l).collect();
    for from in &all {
        for to in &all {
            if from != to && allowed(from, to) {
                edges
                    .entry(from.to_string())
                    .or_default()
                    .insert(to.to_string());
            }
        }
    }
    assert_eq!(
        find_cycle(&edges),
        None,
        "tidy's LAYERS allows an import cycle"
    );
    for (l, may, ..) in LAYERS {
        assert!(
            !bottom(l) || may.is_empty(),
            "{l} is a bottom layer (every layer may import it): it imports nothing"
        );
    }
}

#[test]
fn no_import_cycle_between_layers() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, from, to) in imports() {
        edges.entry(from).or_default().insert(to);
    }
    // The top-level modules on their own too: `shards/store` counts as `shards` there.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in &edges {
        let from = from.split('/').next().unwrap().to_string();
        for to in tos {
            let to = to.split('/').next().unwrap().to_string();
            if to != from {
                top.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    for graph in [&edges, &top] {
        if let Some(cycle) = find_cycle(graph) {
            panic!("an import cycle between layers: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn the_import_scanner_sees_grouped_nested_and_relative_paths() {
    let code = "use crate::{http::tls::TlsConfig, shards::{store::Medium, Seg}, limits};\n\
                let x = crate::kv_events::X;\nuse crate::numa::{self, NodePart as P};";
    let module: Vec<String> = ["shards", "store", "put"].map(String::from).to_vec();
    let got: BTreeSet<Option<String>> = imported_paths(code, &module)
        .iter()
        .map(|p| layer_of_path(p))
        .collect();
    let want = [
        "http",
        "shards/store",
        "shards",
        "limits",
        "kv_events",
        "numa",
    ];
    assert_eq!(got, want.iter().map(|l| Some(l.to_string())).collect());
    // `super` climbs the module tree from the file's place.
    let code =
        "use super::super::Reply;\nuse super::lru::Lru;\nfn f(_: super::super::super::ha::X) {}";
    let got: Vec<Vec<String>> = imported_paths(code, &module);
    assert_eq!(got[0], ["shards", "Reply"]);
    assert_eq!(got[1], ["shards", "store", "lru", "Lru"]);
    assert_eq!(got[2], ["ha", "X"]);
    assert_eq!(
        layer_of("src/shards/store/mod.rs").as_deref(),
        Some("shards/store")
    );
    assert_eq!(layer_of("src/shards/apply.rs").as_deref(), Some("shards"));
    assert_eq!(layer_of("src/cli.rs").as_deref(), Some("cli"));
    assert_eq!(layer_of("src/lib.rs"), None);
    // A commented-out import and a test module's imports do not count.
    let code = code_of(
        "// use crate::http::X;\nfn f() {}\n#[cfg(test)]\nmod tests {\n use crate::server::Y;\n}\n",
    );
    assert!(imported_paths(&code, &module).is_empty());
    // A cycle is found, and none where there is none.
    let edges = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert!(find_cycle(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])).is_none());
    let c = find_cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
    assert_eq!(c.len(), 4);
    // The table: config imports no other layer; everyone may use common.
    assert!(!allowed("config", "ha") && allowed("config", "common") && allowed("ha", "limits"));
    assert!(!allowed("shards/store", "shards") && allowed("shards", "shards/store"));
}
