//! A seeded, deterministic simulation of the cluster (metas, local services, clients, the
//! network, etcd and the clocks) on the real machines, in the style of FoundationDB's and
//! TigerBeetle's simulators; see `world.rs` for one step.
//!
//! What is and is not modelled, how to run it, the campaign figures and what it found:
//! docs/cluster-protocol.md, Simulation. In short: the real membership, catalog, freed-log and
//! store machines on every node, the handlers' glue mirrored (`meta.rs`, `local.rs`), etcd's
//! leader key, leases and loss records (`ha.rs`), a faulty network (`net.rs`), and a checker of
//! every read against the clients' history (`check.rs`); not SSD tiers, tier moves,
//! re-replication, embedded ranks, several shards or the `/metadata` KV.

mod check;
mod client;
mod ha;
mod local;
mod meta;
mod net;
mod tests;
mod world;

use std::collections::VecDeque;

pub(crate) use crate::shards::store::sim::Rng;

/// A key of the workload (the store's key is `k<n>`).
pub(super) type Key = u16;
/// A value: one put attempt's bytes (every page of its blob holds it).
pub(super) type Vid = u64;

pub(super) fn key_bytes(key: Key) -> Box<[u8]> {
    format!("k{key}").into_bytes().into_boxed_slice()
}

/// The workload key of a store key.
/// The calls on their way whose deadline passed at `now` (each answered `Unreachable`).
pub(super) fn past_deadline<C>(
    calls: &std::collections::BTreeMap<u64, (u64, C)>,
    now: u64,
) -> Vec<u64> {
    calls
        .iter()
        .filter(|(_, (deadline, _))| *deadline <= now)
        .map(|(&c, _)| c)
        .collect()
}

pub(super) fn key_of(key: &[u8]) -> Option<Key> {
    std::str::from_utf8(key.strip_prefix(b"k")?)
        .ok()?
        .parse()
        .ok()
}

/// The protocol's timing in the simulation (ms), keeping the relations the configuration
/// keeps (`Config::validate`, `remote_writer_ms`).
pub(super) mod timing {
    use crate::limits;

    pub const HB_INTERVAL_MS: u64 = 200;
    pub const HB_TIMEOUT_MS: u64 = 1500;
    /// A read's lease on the meta (`ock.mmc.lease_ms`).
    pub const LEASE_MS: u64 = 2000;
    pub const GRANT_TTL_MS: u64 = 2000;
    pub const ALLOC_TIMEOUT_MS: u64 = 5000;
    pub const REMOTE_WRITER_MS: u64 =
        GRANT_TTL_MS + limits::CLOCK_SKEW_MS + limits::HOP_TIMEOUT_MS + limits::TICK_MS;
    pub const HOP_TIMEOUT_MS: u64 = limits::HOP_TIMEOUT_MS;
    /// The agent's join and heartbeat calls, and its leave (`agent.rs`).
    pub const CALL_TIMEOUT_MS: u64 = 5000;
    pub const LEAVE_TIMEOUT_MS: u64 = 18_000;
    /// A push of freed records (`freed.rs`).
    pub const PUSH_TIMEOUT_MS: u64 = 2000;
    /// How long a client waits for any answer.
    pub const CLIENT_TIMEOUT_MS: u64 = 4000;
    /// The HA lease (`ock.mmc.meta.ha.lease_ttl`).
    pub const HA_TTL_MS: u64 = 3000;
    /// Each host's wall clock is within half the skew the grants allow of the true time.
    pub const MAX_OFFSET_MS: i64 = (limits::CLOCK_SKEW_MS / 2) as i64;
}

/// A node of the simulated cluster: what a message is addressed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Node {
    Etcd,
    Meta(u8),
    Local(u8),
    Client(u8),
}

impl Node {
    pub fn url(self) -> String {
        match self {
            Node::Etcd => "etcd".into(),
            Node::Meta(i) => format!("http://meta-{i}"),
            Node::Local(i) => format!("http://local-{i}"),
            Node::Client(i) => format!("client-{i}"),
        }
    }

    pub fn from_url(url: &str) -> Option<Node> {
        let rest = url.strip_prefix("http://")?;
        let (kind, n) = rest.split_once('-')?;
        let n: u8 = n.parse().ok()?;
        match kind {
            "meta" => Some(Node::Meta(n)),
            "local" => Some(Node::Local(n)),
            _ => None,
        }
    }
}

/// The old behaviours the cluster-faults issue fixed, switched back on in the simulation's
/// adapter (never in production code), so a test can show the simulation finds each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Mutations {
    /// A removal is answered once the meta applied it, not once the local services holding
    /// copies dropped them from their catalogs.
    pub no_removal_barrier: bool,
    /// A membership declared lost that joins again hands its catalog over (its objects were
    /// removed here, deletes answered relying on that).
    pub adopt_lost_catalog: bool,
    /// A catalog that missed a leadership which served is adopted (`Members::missed`).
    pub adopt_missed_catalog: bool,
    /// A put takes a new version while an older copy's removal is unconfirmed.
    pub put_over_unconfirmed: bool,
    /// A heartbeat or leave is taken for the rank's current membership whatever incarnation
    /// and epoch it names.
    pub no_epoch_fencing: bool,
    /// A write grant is served as often as it comes (no `GrantLedger`).
    pub reusable_grants: bool,
    /// A copy's write grant carries no floor: a freed record of an earlier attempt at the same
    /// copy (same range, same stamp) drops the entry of the one that succeeded.
    pub no_copy_floor: bool,
    /// A drain's copy takes its floor when the copy begins, not before the ask that allocated
    /// its blob: a removal between the two notes a record below the floor.
    pub late_copy_floor: bool,
    /// A live membership a join replaced has its freed log dropped at the join, its removals
    /// confirmed, before the service acknowledged what the new membership's adoption refused.
    pub settle_replaced_at_join: bool,
    /// Incarnations are not ordered by start time (every run seems to start at once): a late
    /// join of a replaced run replaces the live run that followed it.
    pub unordered_incarnations: bool,
    /// A loss refused by etcd is tried again under whichever leadership of the meta leads
    /// then, not only the one that declared it.
    pub loss_under_current_fence: bool,
    /// A local service joining again leaves open the same-host connections holding mapped
    /// reads of the previous membership (`shards/grant_reads.rs` not swept).
    pub keep_mapped_reads_at_join: bool,
    /// A client's copy of a mapped read counts however late it ended (no check of the grant's
    /// expiry after it).
    pub mapped_copy_past_expiry: bool,
}

/// What a run injected and did, per kind.
#[derive(Clone, Debug, Default)]
pub(super) struct Counts {
    pub partitions: u64,
    pub slow_links: u64,
    pub drops: u64,
    pub duplicates: u64,
    pub delays: u64,
    pub cut_messages: u64,
    pub pauses: u64,
    pub kills: u64,
    pub restarts: u64,
    pub meta_pauses: u64,
    pub meta_kills: u64,
    pub meta_restarts: u64,
    pub etcd_outages: u64,
    pub failovers: u64,
    pub churns: u64,
    pub clock_jumps: u64,
    pub grant_replays: u64,
    pub client_retries: u64,
    pub leaves: u64,
    pub stale_messages: u64,
    pub puts_acked: u64,
    pub deletes_acked: u64,
    pub reads_checked: u64,
    pub reads_found: u64,
    pub losses_excused: u64,
    pub moves: u64,
    pub rereplicated: u64,
    pub mapped_reads: u64,
    pub mapped_discarded: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        for (a, b) in self.fields_mut().into_iter().zip(o.fields()) {
            *a += b;
        }
    }

    fn fields(&self) -> [u64; 29] {
        [
            self.partitions,
            self.slow_links,
            self.drops,
            self.duplicates,
            self.delays,
            self.cut_messages,
            self.pauses,
            self.kills,
            self.restarts,
            self.meta_pauses,
            self.meta_kills,
            self.meta_restarts,
            self.etcd_outages,
            self.failovers,
            self.churns,
            self.clock_jumps,
            self.grant_replays,
            self.client_retries,
            self.leaves,
            self.stale_messages,
            self.puts_acked,
            self.deletes_acked,
            self.reads_checked,
            self.reads_found,
            self.losses_excused,
            self.moves,
            self.rereplicated,
            self.mapped_reads,
            self.mapped_discarded,
        ]
    }

    fn fields_mut(&mut self) -> [&mut u64; 29] {
        [
            &mut self.partitions,
            &mut self.slow_links,
            &mut self.drops,
            &mut self.duplicates,
            &mut self.delays,
            &mut self.cut_messages,
            &mut self.pauses,
            &mut self.kills,
            &mut self.restarts,
            &mut self.meta_pauses,
            &mut self.meta_kills,
            &mut self.meta_restarts,
            &mut self.etcd_outages,
            &mut self.failovers,
            &mut self.churns,
            &mut self.clock_jumps,
            &mut self.grant_replays,
            &mut self.client_retries,
            &mut self.leaves,
            &mut self.stale_messages,
            &mut self.puts_acked,
            &mut self.deletes_acked,
            &mut self.reads_checked,
            &mut self.reads_found,
            &mut self.losses_excused,
            &mut self.moves,
            &mut self.rereplicated,
            &mut self.mapped_reads,
            &mut self.mapped_discarded,
        ]
    }

    pub const NAMES: [&'static str; 29] = [
        "partitions",
        "slow links",
        "dropped messages",
        "duplicated messages",
        "delayed messages",
        "messages lost to a partition",
        "local pauses",
        "local kills",
        "local restarts",
        "meta pauses",
        "meta kills",
        "meta restarts",
        "etcd outages",
        "failovers",
        "leadership churns",
        "clock jumps",
        "grant replays",
        "client retries",
        "leaves",
        "messages of a replaced membership",
        "puts acknowledged",
        "deletes acknowledged",
        "reads checked",
        "reads that found a value",
        "losses excused by a documented rule",
        "drain moves copied",
        "re-replicated copies",
        "mapped reads copied",
        "mapped reads discarded",
    ];

    /// One line per kind.
    pub fn table(&self) -> String {
        Counts::NAMES
            .iter()
            .zip(self.fields())
            .map(|(n, v)| format!("  {n:<36} {v}\n"))
            .collect()
    }
}

/// The last lines of a run's log, printed when it fails.
pub(super) struct Trace {
    lines: VecDeque<String>,
    cap: usize,
}

impl Trace {
    fn new(cap: usize) -> Trace {
        Trace {
            lines: VecDeque::with_capacity(cap),
            cap,
        }
    }

    pub fn log(&mut self, now: u64, line: String) {
        if self.lines.len() == self.cap {
            self.lines.pop_front();
        }
        self.lines
            .push_back(format!("{:>8}.{:03} {line}", now / 1000, now % 1000));
    }

    pub fn dump(&self) -> String {
        self.lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// A stamp's view as a trace shows it: a leadership's `view_version` under HA (`h3`), a
/// process's start time without HA (`t1234`, its milliseconds).
pub(super) fn short_view(view: u64) -> String {
    match view.checked_sub(crate::cluster::catalog::HA_STAMP_BASE) {
        Some(v) => format!("h{v}"),
        None => format!("t{view}"),
    }
}

/// The shape of one run, drawn from its seed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub metas: usize,
    pub locals: usize,
    pub clients: usize,
    /// Pages of each local service's DRAM segment.
    pub seg_pages: u64,
    /// A local service with a configured rank that dies keeps its blobs and its catalog's
    /// committed entries (and the leadership it was in step with) for its next process, as an
    /// SSD file and its journal would: one seed in four (those ≡ 3 mod 4, drawn without the
    /// seed's random stream, so the others' runs do not move); `MMC_SIM_SSD=1` every seed,
    /// `MMC_SIM_SSD=0` none.
    pub keeps_catalog: bool,
    /// Faults (pauses, kills, partitions, failovers, clock jumps, grant replays...) a quarter
    /// as often, so memberships and catalogs live longer between them (`MMC_SIM_CALM=1`; off by
    /// default). Drawn without the seed's random stream: a calm run of a seed is another
    /// trajectory, the default runs do not move.
    pub calm: bool,
    /// Half the clients' gets through a local service ask for a mapped answer and copy from
    /// its memory later, some up to seconds later (a client frozen mid-copy): the join's
    /// sweep and the grant's expiry are what keep those copies right
    /// (`shards/grant_reads.rs`). `MMC_SIM_MAPPED=1`; off by default (the runs the found
    /// seeds were found in do not move).
    pub mapped_reads: bool,
    /// About half the local services have no configured rank and take the lowest free one
    /// (drawn from the seed's random stream, so this is another trajectory of the seed): a
    /// service given a rank that another, configured with it, asks for gives it up, and one
    /// given a rank asks for it again after a freeze, holding blobs there
    /// (`members::takes_over`). One seed in five of [`run`]'s (those ≡ 1 mod 5);
    /// `MMC_SIM_AUTO_RANKS=1` every seed, `=0` none; the found seeds' and the mutation tests'
    /// runs only when asked.
    pub auto_ranks: bool,
}

/// The switches of a run's [`Shape`] that its seed does not draw (the fields of the same
/// names).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Flags {
    pub keeps_catalog: bool,
    pub calm: bool,
    pub mapped_reads: bool,
    pub auto_ranks: bool,
}

impl Flags {
    /// What the environment asks for (`MMC_SIM_CALM=1`, `MMC_SIM_MAPPED=1`,
    /// `MMC_SIM_AUTO_RANKS=1`), catalogs kept across kills as `keeps_catalog` says.
    pub fn from_env(keeps_catalog: bool) -> Flags {
        let on = |var| std::env::var(var).is_ok_and(|v| v == "1");
        Flags {
            keeps_catalog,
            calm: on("MMC_SIM_CALM"),
            mapped_reads: on("MMC_SIM_MAPPED"),
            auto_ranks: on("MMC_SIM_AUTO_RANKS"),
        }
    }
}

/// Runs `seed` for `steps` steps and the settling after; `Err` is the failure's report (the
/// seed, what broke and the trace of the last steps).
pub(super) fn run(seed: u64, steps: u64, mutations: Mutations) -> Result<Counts, String> {
    run_with(seed, steps, mutations, metas_from_env())
}

/// `MMC_SIM_METAS`: that many metas instead of each seed's choice.
pub(super) fn metas_from_env() -> Option<usize> {
    std::env::var("MMC_SIM_METAS")
        .ok()
        .filter(|m| !m.is_empty())
        .map(|m| m.parse().expect("MMC_SIM_METAS: 1 to 3"))
}

/// [`run`] with that many metas instead of the seed's choice (1: no HA).
pub(super) fn run_with(
    seed: u64,
    steps: u64,
    mutations: Mutations,
    metas: Option<usize>,
) -> Result<Counts, String> {
    run_shaped(
        seed,
        steps,
        mutations,
        metas,
        Flags {
            auto_ranks: auto_ranks(seed),
            ..Flags::from_env(keeps_catalog(seed))
        },
    )
}

/// Whether seed `seed`'s local services keep their catalogs across kills
/// ([`Shape::keeps_catalog`]).
fn keeps_catalog(seed: u64) -> bool {
    match std::env::var("MMC_SIM_SSD").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => seed % 4 == 3,
    }
}

/// Whether seed `seed`'s local services take automatic ranks ([`Shape::auto_ranks`]): one seed
/// in five (those ≡ 1 mod 5, drawn outside the seed's random stream), so campaigns of the drawn
/// shape cover them without asking (seven defects were found only with them, session of
/// 2026-12-05); `MMC_SIM_AUTO_RANKS=1` every seed, `MMC_SIM_AUTO_RANKS=0` none.
fn auto_ranks(seed: u64) -> bool {
    match std::env::var("MMC_SIM_AUTO_RANKS").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => seed % 5 == 1,
    }
}

/// [`run_with`] with catalogs lost on every kill (whatever `MMC_SIM_SSD` says), the shape the
/// seeds in `tests.rs` were found in (the mutation tests', `FOUND`).
pub(super) fn run_plain(
    seed: u64,
    steps: u64,
    mutations: Mutations,
    metas: Option<usize>,
) -> Result<Counts, String> {
    run_shaped(seed, steps, mutations, metas, Flags::from_env(false))
}

/// [`run_with`] in the shape `flags` gives (whatever the environment says).
pub(super) fn run_shaped(
    seed: u64,
    steps: u64,
    mutations: Mutations,
    metas: Option<usize>,
    flags: Flags,
) -> Result<Counts, String> {
    let mut w = world::World::new(seed, mutations, metas, flags);
    let shape = w.shape;
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            w.step();
            if !w.violations().is_empty() {
                return;
            }
        }
        w.settle();
    }));
    let violations = w.violations();
    if std::env::var_os("MMC_SIM_DUMP").is_some() {
        eprintln!("{}", w.trace.dump());
    }
    if res.is_ok() && violations.is_empty() {
        return Ok(w.counts.clone());
    }
    let what = match &res {
        Err(e) => e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into()),
        Ok(()) => violations.join("\n"),
    };
    Err(format!(
        "cluster simulation failed: seed {seed} ({shape:?}, {mutations:?}), step {} at {} ms\n{what}\n--- the last steps (MMC_SIM_SEED={seed} replays this run) ---\n{}",
        w.steps,
        w.now,
        w.trace.dump()
    ))
}
