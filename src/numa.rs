//! NUMA placement (`ock.mmc.numa.enable`): which node each shard's CPU belongs to, shards grouped
//! by node, and the `mbind` call that binds a range of memory to one node.
//!
//! The topology is read from sysfs by one function, [`read_topology`], given the sysfs root, so
//! tests point it at a synthetic tree (two nodes, four CPUs) and the placement logic is tested
//! on a one-node machine. On a machine with one node (or none visible) placement is a no-op,
//! and the start-up log says so.
//!
//! With placement active, each DRAM segment is cut into one contiguous part per node
//! ([`NumaLayout::split`], in proportion to the node's shards), each part `mbind`-ed to its
//! node ([`bind_to_node`], policy `ock.mmc.numa.policy`); a shard takes its runs from its
//! node's part (`store::segment`), the prefault thread commits each part pinned to that node's
//! CPUs (`store::mount`), and `/metrics` shows each part's bytes and used bytes.

use std::io;
use std::path::Path;

use crate::config::{MemPolicy, NumaMode};

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
    /// The synthetic topology tests place on: node 0 with CPUs 0-1, node 1 with CPUs 2-3.
    #[cfg(test)]
    pub(crate) fn two_nodes() -> Topology {
        Topology {
            nodes: vec![
                Node {
                    id: 0,
                    cpus: vec![0, 1],
                },
                Node {
                    id: 1,
                    cpus: vec![2, 3],
                },
            ],
        }
    }

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

/// Sets the memory policy of the pages of `[addr, addr + len)` to `node` (`mbind`): pages not
/// yet committed will be committed there, whichever thread touches them first (pages already
/// committed stay where they are). `addr` must be page aligned. Called before the range is
/// first written.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns; its memory policy changes.
pub unsafe fn bind_to_node(
    addr: *mut u8,
    len: usize,
    node: u32,
    policy: MemPolicy,
) -> io::Result<()> {
    if node > MAX_NODE_ID {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node id too large",
        ));
    }
    let mut mask = vec![0u64; (node as usize / 64) + 1];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: the caller owns the mapping (this function's contract); the mask buffer
    // outlives the call and its bit length is passed with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            policy.mode(),
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

/// The node each page of `[addr, addr + len)` is committed on (`move_pages(2)` with no target
/// nodes only reports): one entry per page, a node id, or a negative errno for a page that is
/// not committed (`-ENOENT`). For tests and diagnostics: it costs a syscall over every page.
pub fn page_nodes(addr: *const u8, len: usize) -> io::Result<Vec<i32>> {
    let page = 4096usize;
    let start = addr as usize / page * page;
    let pages: Vec<*const libc::c_void> = (start..addr as usize + len)
        .step_by(page)
        .map(|a| a as *const libc::c_void)
        .collect();
    let mut status = vec![i32::MIN; pages.len()];
    // SAFETY: `pages` and `status` hold `pages.len()` entries each and outlive the call; a
    // null `nodes` asks only where the pages are, moving nothing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::pid_t,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(status)
}

/// The memory policy of the page at address `addr` (`get_mempolicy(MPOL_F_ADDR)`): the
/// kernel's mode number and the nodes of its mask. For tests and diagnostics.
pub fn policy_at(addr: usize) -> io::Result<(i32, Vec<u32>)> {
    const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
    let mut mode: libc::c_int = -1;
    let mut mask = vec![0u64; (MAX_NODE_ID as usize + 1) / 64];
    // SAFETY: `mode` and `mask` are writable and outlive the call; the mask's bit length is
    // passed with it; `addr` is only looked up, not accessed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (mask.len() * 64) as libc::c_ulong,
            addr,
            MPOL_F_ADDR,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let nodes = (0..=MAX_NODE_ID)
        .filter(|&n| mask[n as usize / 64] & (1 << (n % 64)) != 0)
        .collect();
    Ok((mode, nodes))
}

/// What segments need to place their memory: the shards' grouping by node, each node's CPUs
/// and the memory policy. Present only when placement is active (two or more nodes).
#[derive(Clone, Debug)]
pub struct NumaLayout {
    pub placement: Placement,
    /// The CPUs of each node that has a shard (the prefault thread runs there).
    pub node_cpus: Vec<(u32, Vec<usize>)>,
    pub policy: MemPolicy,
}

impl NumaLayout {
    /// The layout for an active placement (`None` when placement is off).
    pub fn new(placement: Placement, topology: &Topology, policy: MemPolicy) -> Option<NumaLayout> {
        if !placement.active() {
            return None;
        }
        let node_cpus = placement
            .groups
            .iter()
            .map(|(n, _)| {
                let cpus = topology
                    .nodes
                    .iter()
                    .find(|t| t.id == *n)
                    .map(|t| t.cpus.clone())
                    .unwrap_or_default();
                (*n, cpus)
            })
            .collect();
        Some(NumaLayout {
            placement,
            node_cpus,
            policy,
        })
    }

    /// Cuts a segment of `capacity` bytes into one contiguous part per node, in proportion to
    /// the node's shards, each a multiple of `granule` (the segment's run size, so no run
    /// straddles two nodes) except the last, which takes the rest. A node whose share rounds
    /// to nothing gets no part (its shards take runs from the others).
    pub fn split(&self, capacity: u64, granule: u64) -> Vec<NodePart> {
        let shards: u64 = self.placement.shard_node.len() as u64;
        let granule = granule.max(1);
        let mut parts = Vec::new();
        let mut start = 0;
        let last = self.placement.groups.len().saturating_sub(1);
        for (i, (node, members)) in self.placement.groups.iter().enumerate() {
            let len = if i == last {
                capacity - start
            } else {
                let share = (capacity as u128 * members.len() as u128 / shards as u128) as u64;
                (share / granule * granule).min(capacity - start)
            };
            if len == 0 {
                continue;
            }
            let cpus = self
                .node_cpus
                .iter()
                .find(|(n, _)| n == node)
                .map(|(_, c)| c.clone())
                .unwrap_or_default();
            parts.push(NodePart {
                node: *node,
                cpus,
                start,
                len,
            });
            start += len;
        }
        parts
    }

    /// For each shard, the index in `parts` of its node's part (the first part when its node
    /// has none).
    pub fn shard_parts(&self, parts: &[NodePart]) -> Vec<usize> {
        self.placement
            .shard_node
            .iter()
            .map(|n| parts.iter().position(|p| Some(p.node) == *n).unwrap_or(0))
            .collect()
    }
}

/// One node's contiguous part of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePart {
    pub node: u32,
    /// The node's CPUs (where the prefault thread commits this part).
    pub cpus: Vec<usize>,
    pub start: u64,
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::memory::MappedRegion;

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

    fn two_nodes() -> Topology {
        Topology::two_nodes()
    }

    #[test]
    fn a_segment_is_cut_by_node_in_proportion_to_its_shards() {
        let t = two_nodes();
        let mb = 1u64 << 20;
        // Six shards, three per node: halves, on run (granule) boundaries.
        let l = NumaLayout::new(
            plan(NumaMode::On, &t, &[0, 1, 2, 3, 0, 2]),
            &t,
            MemPolicy::Bind,
        )
        .unwrap();
        assert_eq!(l.node_cpus, vec![(0, vec![0, 1]), (1, vec![2, 3])]);
        let parts = l.split(64 * mb, 4 * mb);
        assert_eq!(
            parts,
            vec![
                NodePart {
                    node: 0,
                    cpus: vec![0, 1],
                    start: 0,
                    len: 32 * mb
                },
                NodePart {
                    node: 1,
                    cpus: vec![2, 3],
                    start: 32 * mb,
                    len: 32 * mb
                },
            ]
        );
        assert_eq!(l.shard_parts(&parts), vec![0, 0, 1, 1, 0, 1]);
        // Three shards on node 0, one on node 1: 3/4 rounded down to a run, the rest to node 1.
        let l =
            NumaLayout::new(plan(NumaMode::On, &t, &[0, 1, 0, 2]), &t, MemPolicy::Bind).unwrap();
        let parts = l.split(100 * mb, 16 * mb);
        let cut: Vec<(u32, u64, u64)> = parts.iter().map(|p| (p.node, p.start, p.len)).collect();
        assert_eq!(cut, vec![(0, 0, 64 * mb), (1, 64 * mb, 36 * mb)]);
        assert_eq!(parts.iter().map(|p| p.len).sum::<u64>(), 100 * mb);
        // A share smaller than a run: node 0 gets no part, its shards borrow node 1's.
        let parts = l.split(16 * mb, 32 * mb);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            (parts[0].node, parts[0].start, parts[0].len),
            (1, 0, 16 * mb)
        );
        assert_eq!(l.shard_parts(&parts), vec![0, 0, 0, 0]);
        // Shards on one node of two: the whole segment on that node.
        let l =
            NumaLayout::new(plan(NumaMode::Auto, &t, &[2, 3]), &t, MemPolicy::Preferred).unwrap();
        let parts = l.split(8 * mb, mb);
        assert_eq!((parts.len(), parts[0].node, parts[0].len), (1, 1, 8 * mb));
        // No layout when placement is off or a no-op.
        assert!(NumaLayout::new(plan(NumaMode::Off, &t, &[0, 2]), &t, MemPolicy::Bind).is_none());
        let one = Topology {
            nodes: vec![t.nodes[0].clone()],
        };
        assert!(
            NumaLayout::new(plan(NumaMode::On, &one, &[0, 1]), &one, MemPolicy::Bind).is_none()
        );
    }

    #[test]
    fn policies_parse() {
        assert_eq!(MemPolicy::parse(" Bind"), Ok(MemPolicy::Bind));
        assert_eq!(MemPolicy::parse("preferred"), Ok(MemPolicy::Preferred));
        assert!(MemPolicy::parse("interleave").is_err());
        assert_eq!(MemPolicy::Preferred.numa_maps_word(), "prefer");
    }

    /// The policy `bind_to_node` sets is the one the kernel reports for the range, and the
    /// pages written there land on the node (node 0, which every Linux machine has).
    #[test]
    fn bound_pages_land_on_their_node() {
        let len = 16 * 4096;
        let region = MappedRegion::new(len as u64).unwrap();
        let base = region.ptr(0);
        for policy in [MemPolicy::Preferred, MemPolicy::Bind] {
            // SAFETY: the region's own mapping.
            match unsafe { bind_to_node(base, len, 0, policy) } {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => return,
                Err(e) => panic!("{e}"),
            }
            let (mode, nodes) = policy_at(base as usize + 5 * 4096).unwrap();
            assert_eq!((mode as libc::c_long, nodes), (policy.mode(), vec![0]));
        }
        // Write the first half; the second half stays uncommitted.
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_bytes(base, 7, len / 2) };
        let nodes = page_nodes(base, len).unwrap();
        assert_eq!(nodes.len(), 16);
        assert!(nodes[..8].iter().all(|&n| n == 0), "{nodes:?}");
        assert!(nodes[8..].iter().all(|&n| n == -libc::ENOENT), "{nodes:?}");
    }

    /// `mbind` on this machine's node 0 (every Linux machine has one) succeeds on a fresh
    /// anonymous mapping, and a node that does not exist is refused by the kernel.
    #[test]
    fn binds_a_mapping_to_node_zero() {
        let len = 1 << 20;
        let region = MappedRegion::new(len as u64).unwrap();
        // SAFETY: the region's own mapping.
        let r = unsafe { bind_to_node(region.ptr(0), len, 0, MemPolicy::Bind) };
        // SAFETY: as above.
        let missing = unsafe { bind_to_node(region.ptr(0), len, 1000, MemPolicy::Preferred) };
        drop(region);
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
