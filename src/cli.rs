//! The `mmc-server` command line and how it becomes a validated start-up plan.

use std::path::PathBuf;

use clap::Parser;

use crate::common::fmt::size_text;
use crate::config::values::{HostPort, parse_cpu_list};
use crate::config::{Config, ConfigError};
use crate::shards::runtime::{DriverChoice, allowed_cpus, format_cpu_list};

#[derive(Parser, Debug)]
#[command(
    name = "mmc-server",
    version,
    about = "MemCache Hybrid meta service: a thread-per-core server for a tiered (HBM/DRAM/SSD) KV cache",
    after_help = "With no options the server runs on its embedded default: http://127.0.0.1:8000, \
                  one shard per CPU of the affinity mask. Every configuration key is documented in \
                  config/mmc-meta.conf (or: mmc-server --print-default-config)."
)]
pub struct Args {
    /// Configuration file of `key = value` lines (`#` comments), as upstream mmc-meta.conf.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Override one configuration key; repeatable. Applied after --config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,

    /// Listen address; overrides ock.mmc.meta_service.metrics_url.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,

    /// CPUs to run shards on, e.g. 0-3,8 (default: the process's affinity mask).
    #[arg(long, value_name = "LIST")]
    pub cores: Option<String>,

    /// Number of shards (default: one per CPU of --cores). More shards than CPUs share them
    /// round-robin.
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,

    /// io driver: io_uring with the plain-TCP front on a ring of its own when the kernel has
    /// it, else monoio's io_uring, else epoll (auto); monoio's io_uring only (uring); epoll;
    /// or the front ring without the epoll fallback (ring).
    #[arg(
        long = "io-driver",
        value_name = "auto|uring|epoll|ring",
        default_value = "auto"
    )]
    pub io_driver: String,

    /// Which side of a cluster to run: the meta service (index and placement, with
    /// ock.mmc.embedded.ranks ranks of its own) or a local service lending this host's memory
    /// to the meta at ock.mmc.meta_service_url.
    #[arg(long, value_name = "meta|local", default_value = "meta")]
    pub role: String,

    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Print the documented default configuration file and exit.
    #[arg(long)]
    pub print_default_config: bool,
}

/// Everything needed to start, validated.
#[derive(Debug)]
pub struct Plan {
    pub config: Config,
    /// The CPU of each shard, in shard order.
    pub shard_cpus: Vec<usize>,
    pub driver: DriverChoice,
    /// Unknown configuration keys, to warn about once logging is up.
    pub warnings: Vec<String>,
}

/// Turns the arguments into a plan, or the one line that explains why the server cannot start.
pub fn plan(args: &Args) -> Result<Plan, String> {
    let mut plan = plan_with(args, &allowed_cpus(), |var| std::env::var(var).ok())?;
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total(&m));
    plan.warnings.extend(memory_warnings(&plan.config, total));
    Ok(plan)
}

/// `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sizes in host memory larger than the machine's (`total` bytes, `MemTotal`): accepted, since
/// segments are committed only as they fill, but the machine cannot hold them full and the
/// process would be OOM-killed on the way. The DRAM and (emulated) HBM segments of every rank
/// this process mounts count.
pub fn memory_warnings(config: &Config, total: Option<u64>) -> Vec<String> {
    let Some(total) = total else {
        return Vec::new();
    };
    let store = &config.store;
    let ranks = match config.cluster.role {
        crate::config::Role::Local => 1,
        crate::config::Role::Meta => store.ranks,
    };
    let mut out = Vec::new();
    for (key, size) in [
        ("ock.mmc.local_service.dram.size", store.dram_bytes),
        ("ock.mmc.local_service.hbm.size", store.hbm_bytes),
    ] {
        if ranks > 0 && size > total {
            out.push(format!(
                "{key} = {} is more than this machine's memory (MemTotal {}): segments are committed as they fill, and the process will be killed for lack of memory before this one is full; give it less",
                size_text(size),
                size_text(total)
            ));
        }
    }
    let all = ranks.saturating_mul(store.dram_bytes.saturating_add(store.hbm_bytes));
    if out.is_empty() && all > total {
        out.push(format!(
            "the memory segments come to {} ({ranks} ranks × (DRAM {} + emulated HBM {})), more than this machine's memory (MemTotal {}): the process will be killed for lack of memory before they are full; give them less",
            size_text(all),
            size_text(store.dram_bytes),
            size_text(store.hbm_bytes),
            size_text(total)
        ));
    }
    out
}

/// Environment variables that set configuration keys: applied after the config file and
/// before `--set`.
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("MMC_API_TOKEN", "ock.mmc.http.auth_token"),
    ("MMC_METRICS_TOKEN", "ock.mmc.http.metrics_token"),
    ("MMC_CLUSTER_TOKEN", "ock.mmc.cluster.token"),
    ("MMC_OTLP_HEADERS", "ock.mmc.otlp.headers"),
];

pub fn plan_with_cpus(args: &Args, allowed: &[usize]) -> Result<Plan, String> {
    plan_with(args, allowed, |_| None)
}

pub fn plan_with(
    args: &Args,
    allowed: &[usize],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Plan, String> {
    let mut config = Config::defaults();
    let mut warnings = Vec::new();
    let err = |e: ConfigError| e.to_string();
    if let Some(path) = &args.config {
        for (line, key) in config.apply_file(path).map_err(err)? {
            warnings.push(format!(
                "config file {} line {line}: unknown key {key} (ignored)",
                path.display()
            ));
        }
    }
    for (var, key) in ENV_KEYS {
        if let Some(v) = env(var).filter(|v| !v.is_empty()) {
            config
                .set(key, &v)
                .map_err(|e| format!("{e} (from the environment variable {var})"))?;
        }
    }
    for s in &args.sets {
        let Some((k, v)) = s.split_once('=') else {
            return Err(format!("invalid value {s:?} for --set: expected KEY=VALUE"));
        };
        if !config.set(k.trim(), v).map_err(err)? {
            warnings.push(format!("--set: unknown key {} (ignored)", k.trim()));
        }
    }
    if let Some(listen) = &args.listen {
        let hp = HostPort::parse(listen).map_err(|allowed| {
            format!("invalid value {listen:?} for --listen: expected {allowed}")
        })?;
        let scheme = if config.url_is_https { "https" } else { "http" };
        config
            .set(
                "ock.mmc.meta_service.metrics_url",
                &format!("{scheme}://{hp}"),
            )
            .map_err(err)?;
    }
    config.cluster.role = match args.role.as_str() {
        "meta" => crate::config::Role::Meta,
        "local" => crate::config::Role::Local,
        other => {
            return Err(format!(
                "invalid value {other:?} for --role: expected meta or local"
            ));
        }
    };
    config.validate().map_err(err)?;

    let driver = DriverChoice::parse(&args.io_driver).map_err(|allowed| {
        format!(
            "invalid value {:?} for --io-driver: expected {allowed}",
            args.io_driver
        )
    })?;

    let cpus = match &args.cores {
        None => allowed.to_vec(),
        Some(list) => {
            let cpus = parse_cpu_list(list).map_err(|allowed| {
                format!("invalid value {list:?} for --cores: expected {allowed}")
            })?;
            if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(format!(
                    "invalid value {list:?} for --cores: CPU {bad} is not available to this process (allowed: {})",
                    format_cpu_list(allowed)
                ));
            }
            cpus
        }
    };
    if cpus.is_empty() {
        return Err("no CPU is available to this process".to_string());
    }
    let shards = match args.shards {
        None => cpus.len(),
        Some(0) | Some(1025..) => {
            return Err(format!(
                "invalid value \"{}\" for --shards: expected an integer from 1 to 1024",
                args.shards.unwrap_or(0)
            ));
        }
        Some(n) => n,
    };
    let shard_cpus = (0..shards).map(|i| cpus[i % cpus.len()]).collect();
    Ok(Plan {
        config,
        shard_cpus,
        driver,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("mmc-server").chain(list.iter().copied())).unwrap()
    }

    #[test]
    fn defaults() {
        let p = plan_with_cpus(&args(&[]), &[0, 1]).unwrap();
        assert_eq!(p.shard_cpus, vec![0, 1]);
        assert_eq!(p.driver, DriverChoice::Auto);
        assert_eq!(p.config.listen.to_string(), "127.0.0.1:8000");
    }

    #[test]
    fn overrides_in_order() {
        let p = plan_with_cpus(
            &args(&[
                "--set",
                "ock.mmc.meta_service.metrics_url=http://127.0.0.1:9000",
                "--listen",
                "127.0.0.1:0",
                "--shards",
                "4",
                "--cores",
                "1",
                "--set",
                "ock.mmc.unknown=1",
            ]),
            &[0, 1],
        )
        .unwrap();
        assert_eq!(p.config.listen.port, 0);
        assert_eq!(p.shard_cpus, vec![1, 1, 1, 1]);
        assert_eq!(
            p.warnings,
            vec!["--set: unknown key ock.mmc.unknown (ignored)"]
        );
    }

    #[test]
    fn memory_sizes_past_the_machine_are_warned_about() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  1 kB\n";
        let total = mem_total(meminfo);
        assert_eq!(total, Some(24_000_000 * 1024));
        let p = plan_with_cpus(
            &args(&["--set", "ock.mmc.local_service.dram.size=64GB"]),
            &[0],
        )
        .unwrap();
        let w = memory_warnings(&p.config, total);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("ock.mmc.local_service.dram.size = 64 GiB (68719476736 bytes) is more than this machine's memory (MemTotal 22.9 GiB (24576000000 bytes))"),
            "{}",
            w[0]
        );
        // Within the machine: nothing; past it only together: the sum is named.
        let p = plan_with_cpus(&args(&[]), &[0]).unwrap();
        assert!(memory_warnings(&p.config, total).is_empty());
        let p = plan_with_cpus(
            &args(&[
                "--set",
                "ock.mmc.embedded.ranks=3",
                "--set",
                "ock.mmc.local_service.dram.size=8GB",
            ]),
            &[0],
        )
        .unwrap();
        let w = memory_warnings(&p.config, total);
        assert!(
            w[0].contains("27 GiB (28991029248 bytes) (3 ranks"),
            "{w:?}"
        );
        // A pure meta (no ranks) holds no segment; no meminfo, no warning.
        let p = plan_with_cpus(
            &args(&[
                "--set",
                "ock.mmc.embedded.ranks=0",
                "--set",
                "ock.mmc.local_service.dram.size=64GB",
            ]),
            &[0],
        )
        .unwrap();
        assert!(memory_warnings(&p.config, total).is_empty());
        assert!(memory_warnings(&p.config, None).is_empty());
    }

    #[test]
    fn refusals_are_one_clear_line() {
        let cases: &[(&[&str], &str)] = &[
            (&["--listen", "nowhere"], "--listen"),
            (&["--io-driver", "kqueue"], "--io-driver"),
            (&["--cores", "7"], "CPU 7 is not available"),
            (&["--cores", "1-0"], "--cores"),
            (&["--shards", "0"], "--shards"),
            (&["--set", "novalue"], "--set"),
            (
                &["--set", "ock.mmc.evict_threshold_high=101"],
                "ock.mmc.evict_threshold_high",
            ),
            (
                &["--set", "ock.mmc.http.max_body_bytes=1XB"],
                "ock.mmc.http.max_body_bytes",
            ),
        ];
        for (argv, needle) in cases {
            let e = plan_with_cpus(&args(argv), &[0, 1]).unwrap_err();
            assert!(e.contains(needle), "{argv:?}: {e}");
            assert!(!e.contains('\n'), "{argv:?}: {e}");
        }
    }
}
