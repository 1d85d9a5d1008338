//! Byte counts on the command line: `65536`, `64K`, `64KiB`, `64KB`, `1M`, `1MiB`, `1G`, ...
//! (binary units, as the server's configuration reads them).

/// Parses a byte count with an optional binary suffix (K, KB, KiB, M, MB, MiB, G, GB, GiB,
/// T, TB, TiB; case-insensitive).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid byte count {s:?}: expected e.g. 65536, 64KiB or 16MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("invalid byte count {s:?}: unknown unit {unit:?}")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid byte count {s:?}: too large"))
}

/// `65536` → `64KiB`, `1048576` → `1MiB`; other values stay in bytes.
pub fn format_bytes(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}B")
}

/// The first address `--target` (HOST:PORT) resolves to.
pub fn resolve_target(target: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    target
        .to_socket_addrs()
        .map_err(|e| format!("invalid --target {target:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--target {target:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("64k"), Ok(65536));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1 << 30));
        assert_eq!(parse_bytes(" 2 MiB "), Ok(2 << 20));
        for bad in ["", "MiB", "1.5MiB", "-1", "1XB", "99999999999999999999TiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_bytes(65536), "64KiB");
        assert_eq!(format_bytes(16 << 20), "16MiB");
        assert_eq!(format_bytes(1000), "1000B");
    }
}
