//! `mmc-server`: the MemCache Hybrid meta service.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use mmc::cli::{self, Args};
use mmc::server::Server;

fn init_logging(level: log::LevelFilter) {
    let mut b = env_logger::Builder::new();
    b.filter_level(level);
    if let Ok(spec) = std::env::var("RUST_LOG") {
        b.parse_filters(&spec);
    }
    b.format(|f, record| {
        let ts = f.timestamp_millis();
        let thread = std::thread::current();
        writeln!(
            f,
            "{ts} {:5} [{}] {}",
            record.level(),
            thread.name().unwrap_or("main"),
            record.args()
        )
    });
    b.init();
}

/// Thousands of connections need descriptors: raise the soft limit to the hard one.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                log::warn!("cannot raise the open-files limit from {}", lim.rlim_cur);
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_default_config {
        if args.role == "local" {
            print!("{}", mmc::config::default_local_config_file());
            return ExitCode::SUCCESS;
        }
        print!("{}", mmc::config::default_config_file());
        return ExitCode::SUCCESS;
    }
    let plan = match cli::plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mmc-server: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        // Checking a config is what --print-config is for: the warnings go to stderr, so the
        // printed file stays clean to redirect.
        for w in &plan.warnings {
            eprintln!("mmc-server: warning: {w}");
        }
        print!("{}", plan.config.render());
        return ExitCode::SUCCESS;
    }
    init_logging(plan.config.log_level);
    // A panic anywhere is a bug; a server with a dead shard would hang the requests routed to
    // it, so the process exits and lets its supervisor restart it.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if mmc::metrics::bus::in_subscriber() {
            // An event-bus subscriber failed: the bus contains and counts it.
            log::debug!("event bus subscriber panicked: {info}");
            return;
        }
        default_hook(info);
        log::error!("fatal: {info}");
        std::process::exit(101);
    }));
    for w in &plan.warnings {
        log::warn!("{w}");
    }
    raise_fd_limit();
    let shards = plan.shard_cpus.len();
    let cpus = {
        let mut c = plan.shard_cpus.clone();
        c.sort_unstable();
        c.dedup();
        mmc::shards::runtime::format_cpu_list(&c)
    };
    // Register for the signals before the port opens, so a SIGTERM that arrives during the
    // start is queued and handled as a graceful stop, not the default "die at once".
    let signals = signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT]);
    let server = match Server::start(plan) {
        Ok(s) => s,
        Err(e) => {
            // One line, the same shape as a configuration error.
            eprintln!("mmc-server: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!(
        "mmc-server {} listening on {}://{} ({shards} shards on CPUs {cpus}, io driver {})",
        env!("CARGO_PKG_VERSION"),
        if server.shared.front.tls.is_some() {
            "https"
        } else {
            "http"
        },
        server.local_addr,
        server.drivers[0]
    );

    let shared = server.shared.clone();
    match signals {
        Ok(mut signals) => {
            std::thread::Builder::new()
                .name("mmc-signals".into())
                .spawn(move || {
                    let mut seen = 0;
                    for sig in signals.forever() {
                        seen += 1;
                        let name = if sig == libc::SIGTERM {
                            "SIGTERM"
                        } else {
                            "SIGINT"
                        };
                        if seen == 1 {
                            if shared.config.cluster.role == mmc::config::Role::Local {
                                // Leave the meta service first (it stops sending clients
                                // here), then stop; bounded if the meta does not answer.
                                match shared.ha.followed() {
                                    Some(meta) => {
                                        log::info!("{name}: leaving the meta service at {meta}")
                                    }
                                    None => log::info!(
                                        "{name}: not joined to a meta service: nothing to leave"
                                    ),
                                }
                                shared
                                    .membership
                                    .local
                                    .leaving
                                    .store(true, std::sync::atomic::Ordering::Release);
                                let deadline =
                                    std::time::Instant::now() + std::time::Duration::from_secs(20);
                                while !shared
                                    .membership
                                    .local
                                    .left
                                    .load(std::sync::atomic::Ordering::Acquire)
                                    && std::time::Instant::now() < deadline
                                {
                                    std::thread::sleep(std::time::Duration::from_millis(10));
                                }
                            }
                            log::info!("{name}: stopping accepting, finishing requests in flight");
                            shared.begin_shutdown();
                        } else {
                            log::warn!("{name} again: exiting without waiting");
                            std::process::exit(1);
                        }
                    }
                })
                .expect("cannot start the signal thread");
        }
        Err(e) => log::warn!("cannot install signal handlers ({e}); stop with SIGKILL"),
    }
    if server.join() {
        log::info!("mmc-server stopped");
        ExitCode::SUCCESS
    } else {
        log::error!("a shard thread failed");
        ExitCode::from(1)
    }
}
