//! NUMA placement (`ock.mmc.numa.enable`): which node each shard's CPU belongs to, shards grouped
//! by node, and the `mbind` call that binds a range of memory to one node.
//!
//! The topology is read from sysfs by one function, [`read_topology`], given the sysfs root, so
//! tests point it at a synthetic tree (two nodes, four CPUs) and the placement logic is tested
//! on a one-node machine. On a machine with one node (or none visible) placement is a no-op,
//! and the start-up log says so.
//!
//! Status: the plan ([`plan`]) is computed and logged at start; binding each shard's segment
//! runs with [`bind_to_node`] and a node-aware prefault are left to the store (issue 16, part 6).

use std::io;
use std::path::Path;

/// `ock.mmc.numa.enable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// Never place by node.
    Off,
    /// Place by node; on a one-node machine a no-op (logged).
    On,
    /// Place by node when the machine has more than one node with CPUs.
    Auto,
}

impl NumaMode {
    pub fn parse(s: &str) -> Result<NumaMode, &'static str> {
        match s.trim().to_ascii_lowercase().as_str() {
            "false" | "0" | "no" | "off" => Ok(NumaMode::Off),
            "true" | "1" | "yes" | "on" => Ok(NumaMode::On),
            "auto" => Ok(NumaMode::Auto),
            _ => Err("true, false or auto"),
        }
    }
}

/// One NUMA node: its id and its CPUs, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: u32,
    pub cpus: Vec<usize>,
}

/// The machine's nodes, by ascending id (only nodes with CPUs: a memory-only node has no shard).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

impl Topology {
    /// The node `cpu` belongs to.
    pub fn node_of(&self, cpu: usize) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.binary_search(&cpu).is_ok())
            .map(|n| n.id)
    }
}

/// The largest node id accepted from sysfs: the `mbind` mask below is one `u64` per 64 nodes,
/// and no machine this server targets has more than a few hundred.
pub const MAX_NODE_ID: u32 = 1023;

/// Reads `<sysfs>/devices/system/node/node<N>/cpulist` for every node (`sysfs` is `/sys` in
/// production). A missing `node` directory (a kernel without NUMA) is an empty topology; a
/// malformed file is an error naming it.
pub fn read_topology(sysfs: &Path) -> io::Result<Topology> {
    let dir = sysfs.join("devices/system/node");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Topology::default()),
        Err(e) => return Err(e),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        if id > MAX_NODE_ID {
            return Err(bad(format!(
                "{}: node id above {MAX_NODE_ID}",
                entry.path().display()
            )));
        }
        let path = entry.path().join("cpulist");
        let text = std::fs::read_to_string(&path)?;
        let cpus = parse_cpulist(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        if !cpus.is_empty() {
            nodes.push(Node { id, cpus });
        }
    }
    nodes.sort_by_key(|n| n.id);
    Ok(Topology { nodes })
}

/// The kernel's CPU list format: `0-3,8,10-11`, possibly empty (a node without CPUs).
fn parse_cpulist(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad CPU list {:?}", s.trim()))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if hi < lo || hi - lo > 1 << 16 {
            return Err(format!("bad CPU range {part:?}"));
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Where shards go: each shard's node, and the shards of each node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Per shard (index = shard id): the node of its CPU, `None` when placement is off.
    pub shard_node: Vec<Option<u32>>,
    /// `(node, shard ids)` for every node that has a shard, by ascending node id.
    pub groups: Vec<(u32, Vec<usize>)>,
    /// Why placement is on or off, for the start-up log.
    pub reason: String,
}

impl Placement {
    pub fn active(&self) -> bool {
        !self.groups.is_empty()
    }
}

/// The placement of shards pinned to `shard_cpus` (index = shard id) under `mode`.
pub fn plan(mode: NumaMode, topology: &Topology, shard_cpus: &[usize]) -> Placement {
    let off = |reason: String| Placement {
        shard_node: vec![None; shard_cpus.len()],
        groups: Vec::new(),
        reason,
    };
    if mode == NumaMode::Off {
        return off("NUMA placement off (ock.mmc.numa.enable = false)".into());
    }
    if topology.nodes.len() < 2 {
        return off(format!(
            "NUMA placement is a no-op: this machine has {} node(s) with CPUs",
            topology.nodes.len()
        ));
    }
    let shard_node: Vec<Option<u32>> = shard_cpus.iter().map(|&c| topology.node_of(c)).collect();
    if let Some(i) = shard_node.iter().position(Option::is_none) {
        return off(format!(
            "NUMA placement off: CPU {} of shard {i} is on no node",
            shard_cpus[i]
        ));
    }
    let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
    for (shard, node) in shard_node.iter().enumerate() {
        let node = node.expect("checked above");
        match groups.iter_mut().find(|(n, _)| *n == node) {
            Some((_, shards)) => shards.push(shard),
            None => groups.push((node, vec![shard])),
        }
    }
    groups.sort_by_key(|(n, _)| *n);
    let reason = groups
        .iter()
        .map(|(n, s)| format!("node {n}: shards {s:?}"))
        .collect::<Vec<_>>()
        .join("; ");
    Placement {
        shard_node,
        groups,
        reason: format!("NUMA placement on: {reason}"),
    }
}

/// Binds the pages of `[addr, addr + len)` to `node` (`mbind(MPOL_BIND)`): pages not yet
/// committed will be committed there, whichever thread touches them first. `addr` must be
/// page aligned. Called before the range is first written.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns; its memory policy changes.
pub unsafe fn bind_to_node(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    if node > MAX_NODE_ID {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node id too large",
        ));
    }
    let mut mask = vec![0u64; (node as usize / 64) + 1];
    mask[node as usize / 64] |= 1 << (node % 64);
    const MPOL_BIND: libc::c_long = 2;
    // SAFETY: the caller owns the mapping (this function's contract); the mask buffer
    // outlives the call and its bit length is passed with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            (mask.len() * 64) as libc::c_ulong,
            0 as libc::c_uint,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs tree with `nodes` = (node id, cpulist).
    fn tree(nodes: &[(u32, &str)]) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        for (id, cpus) in nodes {
            let n = d.path.join(format!("devices/system/node/node{id}"));
            std::fs::create_dir_all(&n).unwrap();
            std::fs::write(n.join("cpulist"), format!("{cpus}\n")).unwrap();
        }
        // Files next to the node directories that are not nodes.
        let base = d.path.join("devices/system/node");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("online"), "0-1\n").unwrap();
        std::fs::write(base.join("possible"), "0-1\n").unwrap();
        d
    }

    mod tempdir {
        pub struct Dir {
            pub path: std::path::PathBuf,
        }
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "mmc-numa-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                let _ = std::fs::remove_dir_all(&path);
                std::fs::create_dir_all(&path).unwrap();
                Dir { path }
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.path);
            }
        }
    }

    #[test]
    fn reads_a_synthetic_two_node_tree() {
        let d = tree(&[(1, "2-3"), (0, "0,1")]);
        let t = read_topology(&d.path).unwrap();
        assert_eq!(
            t.nodes,
            vec![
                Node {
                    id: 0,
                    cpus: vec![0, 1]
                },
                Node {
                    id: 1,
                    cpus: vec![2, 3]
                }
            ]
        );
        assert_eq!(t.node_of(3), Some(1));
        assert_eq!(t.node_of(0), Some(0));
        assert_eq!(t.node_of(4), None);
    }

    #[test]
    fn memory_only_nodes_and_missing_trees() {
        let d = tree(&[(0, "0-3"), (1, "")]);
        assert_eq!(read_topology(&d.path).unwrap().nodes.len(), 1);
        let empty = tempdir::Dir::new();
        assert_eq!(read_topology(&empty.path).unwrap(), Topology::default());
        let bad = tree(&[(0, "0-x")]);
        let e = read_topology(&bad.path).unwrap_err();
        assert!(e.to_string().contains("node0/cpulist"), "{e}");
    }

    #[test]
    fn shards_are_grouped_by_the_node_of_their_cpu() {
        let d = tree(&[(0, "0-1"), (1, "2-3")]);
        let t = read_topology(&d.path).unwrap();
        // Four shards on CPUs 0..3, then two more wrapping round (`--shards 6`).
        let p = plan(NumaMode::On, &t, &[0, 1, 2, 3, 0, 2]);
        assert!(p.active());
        assert_eq!(
            p.shard_node,
            vec![Some(0), Some(0), Some(1), Some(1), Some(0), Some(1)]
        );
        assert_eq!(p.groups, vec![(0, vec![0, 1, 4]), (1, vec![2, 3, 5])]);
        assert_eq!(
            p.reason,
            "NUMA placement on: node 0: shards [0, 1, 4]; node 1: shards [2, 3, 5]"
        );
        // Shards all on node 1: one group.
        let p = plan(NumaMode::Auto, &t, &[2, 3]);
        assert_eq!(p.groups, vec![(1, vec![0, 1])]);
        // Off means off, whatever the machine.
        let p = plan(NumaMode::Off, &t, &[0, 2]);
        assert!(!p.active() && p.shard_node == vec![None, None]);
        // A CPU outside every node turns placement off rather than guessing.
        let p = plan(NumaMode::On, &t, &[0, 9]);
        assert!(
            !p.active() && p.reason.contains("CPU 9 of shard 1"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn one_node_is_a_logged_no_op() {
        let d = tree(&[(0, "0-3")]);
        let t = read_topology(&d.path).unwrap();
        for mode in [NumaMode::On, NumaMode::Auto] {
            let p = plan(mode, &t, &[0, 1, 2, 3]);
            assert!(!p.active());
            assert_eq!(p.shard_node, vec![None; 4]);
            assert!(
                p.reason.contains("no-op") && p.reason.contains("1 node"),
                "{}",
                p.reason
            );
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!(NumaMode::parse("auto"), Ok(NumaMode::Auto));
        assert_eq!(NumaMode::parse(" TRUE "), Ok(NumaMode::On));
        assert_eq!(NumaMode::parse("off"), Ok(NumaMode::Off));
        assert!(NumaMode::parse("maybe").is_err());
    }

    #[test]
    fn cpulists_parse() {
        assert_eq!(
            parse_cpulist("0-2,5,7-8\n").unwrap(),
            vec![0, 1, 2, 5, 7, 8]
        );
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a").is_err());
    }

    /// `mbind` on this machine's node 0 (every Linux machine has one) succeeds on a fresh
    /// anonymous mapping, and a node that does not exist is refused by the kernel.
    #[test]
    fn binds_a_mapping_to_node_zero() {
        let len = 1 << 20;
        // SAFETY: a private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping made above.
        let r = unsafe { bind_to_node(p.cast(), len, 0) };
        // SAFETY: as above.
        let missing = unsafe { bind_to_node(p.cast(), len, 1000) };
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(p, len) };
        match r {
            Ok(()) => assert!(missing.is_err()),
            // A seccomp profile or a kernel without NUMA refuses mbind itself.
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
                "{e}"
            ),
        }
    }
}
