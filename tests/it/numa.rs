//! NUMA placement (`ock.mmc.numa.enable`) end to end: a server reading a synthetic two-node
//! topology (`MMC_NUMA_SYSFS`) cuts its DRAM segment between the nodes, binds node 0's part to
//! node 0 (visible in `/proc/<pid>/numa_maps`), prefaults it there, and `/metrics` shows the
//! bytes and allocated bytes of each node's part.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::both_drivers;
use crate::harness::{Client, Driver, ServerBuilder};
use crate::same_host::thread_cpus;
use crate::store::{data, get_bytes, put_into_hbm, put_ok, with_a_small_hbm};

both_drivers!(segments_are_placed_on_the_nodes_of_their_shards);

/// A sysfs tree with node 0 = `cpus[0]`, node 1 = `cpus[1]`; removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(tag: &str, cpus: [usize; 2]) -> Tree {
        let root = std::env::temp_dir().join(format!("mmc-it-numa-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (node, cpu) in cpus.iter().enumerate() {
            let d = root.join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpu}\n")).unwrap();
        }
        Tree(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two CPUs this process may run on (the same one twice on a one-CPU machine).
fn two_cpus() -> [usize; 2] {
    // SAFETY: a zeroed cpu_set_t is valid; the call fills it.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    };
    [cpus[0], cpus[1 % cpus.len()]]
}

/// The value of the one sample of `/metrics` whose line starts with `series `.
fn sample(c: &mut Client, series: &str) -> Option<u64> {
    let text = c.get("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Pages of the mappings whose policy is `policy` (`prefer:0`) on node `node`, per
/// `/proc/<pid>/numa_maps` (`N0=<pages>`).
fn pages_on(pid: u32, policy: &str, node: u32) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap_or_default();
    let field = format!("N{node}=");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(policy))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&field)?.parse::<u64>().ok())
        })
        .sum()
}

/// [`two_cpus`] when they are two; `None` (the test skipped, said on stderr) on a one-CPU
/// machine, where a two-node tree cannot be made. scripts/test.sh sets MMC_REQUIRE_TWO_CPUS
/// where it sees two: there the test must run.
fn two_cpus_or_skip() -> Option<[usize; 2]> {
    let cpus = two_cpus();
    if cpus[0] == cpus[1] {
        assert!(
            std::env::var_os("MMC_REQUIRE_TWO_CPUS").is_none(),
            "one CPU in this process's affinity mask, and MMC_REQUIRE_TWO_CPUS is set"
        );
        eprintln!("SKIPPED: one CPU: a two-node tree needs two");
        return None;
    }
    Some(cpus)
}

fn segments_are_placed_on_the_nodes_of_their_shards(driver: Driver) {
    let Some(cpus) = two_cpus_or_skip() else {
        return;
    };
    let tree = Tree::new(driver.arg(), cpus);
    let mb = 1u64 << 20;
    let srv = ServerBuilder::new(driver)
        .shards(2)
        .arg("--cores")
        .arg(&format!("{},{}", cpus[0], cpus[1]))
        .env("MMC_NUMA_SYSFS", tree.0.to_str().unwrap())
        .set("ock.mmc.numa.enable", "true")
        .set("ock.mmc.local_service.dram.size", "64MB")
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.segment.prefault", "true")
        .start();
    let log = srv.log();
    assert!(
        log.contains("NUMA placement on: node 0: shards [0]; node 1: shards [1]"),
        "{log}"
    );
    let mut c = srv.client();
    let cap = |c: &mut Client, node: u32| {
        let s = format!(
            "memcache_segment_node_capacity_bytes{{segment=\"rank-0-dram\",node=\"{node}\"}}"
        );
        sample(c, &s)
    };
    assert_eq!(cap(&mut c, 0), Some(32 * mb));
    assert_eq!(cap(&mut c, 1), Some(32 * mb));

    // Objects land in the part of their shard's node: both parts are used, and the parts'
    // allocated bytes add up to the segment's.
    let body = vec![7u8; 256 << 10];
    for i in 0..32 {
        put_ok(&mut c, &format!("numa-{i}"), &body, "");
    }
    let alloc = |c: &mut Client, node: u32| {
        let s = format!(
            "memcache_segment_node_allocated_bytes{{segment=\"rank-0-dram\",node=\"{node}\"}}"
        );
        sample(c, &s).unwrap()
    };
    let (a0, a1) = (alloc(&mut c, 0), alloc(&mut c, 1));
    let total = sample(
        &mut c,
        "memcache_segment_allocated_bytes{segment=\"rank-0-dram\"}",
    )
    .unwrap();
    assert_eq!(a0 + a1, total);
    assert_eq!(total, 32 * (256 << 10));
    assert!(
        a0 > 0 && a1 > 0,
        "both nodes' shards stored keys: {a0} {a1}"
    );

    // Node 0's part is bound to node 0 and prefaulted there: its 32 MB of pages are on node 0
    // (when the kernel lets this process call mbind at all).
    let log = srv.log();
    if log.contains("rank-0-dram: bytes 0..33554432 bound to NUMA node 0 (Preferred)") {
        let deadline = Instant::now() + Duration::from_secs(20);
        while pages_on(srv.pid(), "prefer:0", 0) < 8192 {
            assert!(
                Instant::now() < deadline,
                "node 0's part is not on node 0: {} pages\n{}",
                pages_on(srv.pid(), "prefer:0", 0),
                std::fs::read_to_string(format!("/proc/{}/numa_maps", srv.pid())).unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        assert!(
            log.contains("rank-0-dram: cannot bind bytes 0..33554432 to NUMA node 0"),
            "{log}"
        );
    }
    // Node 1 exists on a two-node machine (bound), not on a one-node one (refused, logged).
    assert!(
        log.contains("rank-0-dram: bytes 33554432..67108864 bound to NUMA node 1")
            || log.contains("rank-0-dram: cannot bind bytes 33554432..67108864 to NUMA node 1"),
        "{log}"
    );

    // Without placement there is no per-node family.
    let plain = ServerBuilder::new(driver)
        .set("ock.mmc.local_service.dram.size", "8MB")
        .start();
    let text = plain.client().get("/metrics").text();
    assert!(!text.contains("memcache_segment_node_"), "{text}");
}

#[test]
fn demotions_are_copied_by_a_mover_of_the_node_they_land_on() {
    // HBM fills and drains down to DRAM, whose segment is cut between the two nodes: each
    // shard's demotions land in its node's part, and are copied by that node's mover threads
    // (`mmc-mover-<node>`, pinned to the node's CPUs, `shards/mover.rs`), none by the
    // process-wide group; the bytes intact.
    let Some(cpus) = two_cpus_or_skip() else {
        return;
    };
    let tree = Tree::new("mover", cpus);
    let srv = with_a_small_hbm(
        ServerBuilder::new(Driver::Epoll)
            .shards(2)
            .arg("--cores")
            .arg(&format!("{},{}", cpus[0], cpus[1]))
            .env("MMC_NUMA_SYSFS", tree.0.to_str().unwrap())
            .set("ock.mmc.numa.enable", "true"),
    )
    .start();
    let mut c = srv.client();
    let n = 32;
    put_into_hbm(&mut c, n);
    for i in 0..n {
        let key = format!("mv/{i}");
        assert_eq!(get_bytes(&mut c, &key), data(256 << 10, i), "{key}");
    }
    let mut demoted = |node: u32| {
        sample(
            &mut c,
            &format!(
                "memcache_segment_node_allocated_bytes{{segment=\"rank-0-dram\",node=\"{node}\"}}"
            ),
        )
        .unwrap()
    };
    let (d0, d1) = (demoted(0), demoted(1));
    assert!(
        d0 > 0 && d1 > 0,
        "both nodes' parts took demotions: {d0} {d1}"
    );
    for (node, cpu) in cpus.iter().enumerate() {
        let mover = thread_cpus(srv.pid(), &format!("mmc-mover-{node}"));
        assert_eq!(mover, Some(vec![*cpu]), "node {node}'s mover, on its CPU");
    }
    assert_eq!(
        thread_cpus(srv.pid(), "mmc-mover"),
        None,
        "no demotion went to the process-wide mover"
    );
}
