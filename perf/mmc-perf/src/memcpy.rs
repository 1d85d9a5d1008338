//! `mmc-perf memcpy`: this machine's single-thread memcpy bandwidth for given copy sizes, the
//! yardstick of the data-plane throughput figures (a put or get over loopback moves every
//! byte through at least two copies: into and out of the kernel's socket buffers).
//!
//! Three access patterns per size, each the median of five timed windows:
//! - `hot`: the same source and destination every time (cache-resident when both fit);
//! - `to_pool`: a fixed source, the destination stepping through a large pool (like a put
//!   writing each new object to a new place in a segment);
//! - `from_pool`: the source stepping through the pool, a fixed destination (like a get
//!   sending objects stored all over a segment).
//!
//! The copy is `<[u8]>::copy_from_slice`, i.e. the C library's `memcpy`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::units::{format_bytes, parse_bytes};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Copy sizes, comma-separated (bytes, or K/KiB, M/MiB, G/GiB: binary units).
    #[arg(
        long,
        default_value = "64KiB,1MiB,16MiB",
        value_delimiter = ',',
        value_name = "SIZES"
    )]
    sizes: Vec<String>,

    /// Measured seconds per size and pattern (five windows; the median is reported).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    secs: f64,

    /// Memory the `to_pool` and `from_pool` patterns step through (written once before timing).
    #[arg(long, default_value = "1GiB", value_name = "BYTES")]
    pool: String,

    /// Pin the measuring thread to this CPU.
    #[arg(long, value_name = "CPU")]
    pin: Option<usize>,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,

    /// Write report.json (the JSON figures) and bandwidth.svg (GB/s by copy size, one line
    /// per pattern) into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,
}

/// Largest accepted copy size and pool, so that a typo cannot exhaust memory.
const MAX_SIZE_BYTES: u64 = 1 << 30;
const MAX_POOL_BYTES: u64 = 16 << 30;
const WINDOWS: usize = 5;

/// Bytes per second of the three patterns for one size.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    pub size: usize,
    pub hot: f64,
    pub to_pool: f64,
    pub from_pool: f64,
}

/// Copies `copy(i)` for i = 0, 1, ... during `window`; returns copies per second.
fn rate(window: Duration, mut copy: impl FnMut(usize)) -> f64 {
    copy(0);
    let start = Instant::now();
    let mut n = 0;
    loop {
        copy(n);
        n += 1;
        let t = start.elapsed();
        if t >= window {
            return n as f64 / t.as_secs_f64();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures one size over `pool` (at least two copies of `size` long).
pub fn measure(size: usize, pool: &mut [u8], secs: f64) -> Bandwidth {
    assert!(size > 0 && pool.len() >= 2 * size, "pool too small");
    let window = Duration::from_secs_f64(secs / WINDOWS as f64);
    let slots = pool.len() / size;
    let mut src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    let windows = |f: &mut dyn FnMut(usize)| -> f64 {
        let per_s: Vec<f64> = (0..WINDOWS).map(|_| rate(window, &mut *f)).collect();
        median(per_s) * size as f64
    };
    let hot = windows(&mut |_| {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    let to_pool = windows(&mut |i| {
        let at = i % slots * size;
        pool[at..at + size].copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut *pool);
    });
    let from_pool = windows(&mut |i| {
        let at = i % slots * size;
        dst.copy_from_slice(std::hint::black_box(&pool[at..at + size]));
        std::hint::black_box(&mut dst);
    });
    src[0] = dst[0]; // keep both buffers alive and used
    Bandwidth {
        size,
        hot,
        to_pool,
        from_pool,
    }
}

pub fn main(args: &Args) -> Result<(), String> {
    let mut sizes = Vec::new();
    for s in &args.sizes {
        let n = parse_bytes(s).map_err(|e| format!("invalid --sizes: {e}"))?;
        if n == 0 || n > MAX_SIZE_BYTES {
            return Err(format!("invalid --sizes {s}: expected 1 byte to 1 GiB"));
        }
        sizes.push(n as usize);
    }
    let pool_bytes = parse_bytes(&args.pool).map_err(|e| format!("invalid --pool: {e}"))?;
    if pool_bytes > MAX_POOL_BYTES {
        return Err(format!("invalid --pool {}: at most 16 GiB", args.pool));
    }
    if !(args.secs.is_finite() && args.secs > 0.0 && args.secs <= 3600.0) {
        return Err(format!("invalid --secs {}: expected 0 to 3600", args.secs));
    }
    if let Some(cpu) = args.pin {
        mmc::shards::runtime::pin_to(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    }
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let pool_len = (pool_bytes as usize).max(2 * largest);
    // Written once, so that no page fault lands in a timed window.
    let mut pool = vec![1u8; pool_len];
    let results: Vec<Bandwidth> = sizes
        .iter()
        .map(|&size| measure(size, &mut pool, args.secs))
        .collect();
    let rows: Vec<_> = results
        .iter()
        .map(|b| {
            json!({
                "bytes": b.size,
                "hot_bytes_per_s": b.hot.round(),
                "to_pool_bytes_per_s": b.to_pool.round(),
                "from_pool_bytes_per_s": b.from_pool.round(),
            })
        })
        .collect();
    let figures =
        json!({"pool_bytes": pool_len, "secs": args.secs, "cpu": args.pin, "sizes": rows});
    if let Some(dir) = &args.report {
        crate::report::write_charts(dir, &figures, &[chart(&results)])?;
    }
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "memcpy, one thread, median of {WINDOWS} windows, pool {}",
            format_bytes(pool_len as u64)
        );
        println!(
            "{:>8}  {:>12}  {:>12}  {:>12}",
            "size", "hot GB/s", "to_pool GB/s", "from_pool GB/s"
        );
        for b in &results {
            println!(
                "{:>8}  {:>12.2}  {:>12.2}  {:>12.2}",
                format_bytes(b.size as u64),
                b.hot / 1e9,
                b.to_pool / 1e9,
                b.from_pool / 1e9
            );
        }
    }
    Ok(())
}

/// GB/s by copy size, one line per pattern.
fn chart(results: &[Bandwidth]) -> crate::report::LineChart {
    let line = |name: &str, f: fn(&Bandwidth) -> f64| {
        let pts = results
            .iter()
            .map(|b| (b.size as f64, f(b) / 1e9))
            .collect();
        (name.to_string(), pts)
    };
    crate::report::LineChart {
        file: "bandwidth.svg".into(),
        title: "memcpy bandwidth, one thread".into(),
        x_desc: "copy size (bytes)".into(),
        y_desc: "GB/s".into(),
        log_x: true,
        series: vec![
            line("hot", |b| b.hot),
            line("to_pool", |b| b.to_pool),
            line("from_pool", |b| b.from_pool),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_every_pattern() {
        let mut pool = vec![0u8; 1 << 20];
        let b = measure(64 << 10, &mut pool, 0.05);
        assert_eq!(b.size, 64 << 10);
        // Any machine copies more than 100 MB/s; the figures are finite and positive.
        for v in [b.hot, b.to_pool, b.from_pool] {
            assert!(v.is_finite() && v > 1e8, "{b:?}");
        }
        assert!(pool.contains(&0x5a), "the copies reached the pool");
    }

    #[test]
    fn median_of_windows() {
        assert_eq!(median(vec![3.0, 1.0, 2.0, 5.0, 4.0]), 3.0);
    }
}
