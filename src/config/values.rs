//! Parsers for the value syntaxes of configuration keys and command-line options.
//!
//! Every parser returns `Err(allowed)` with a short description of what is allowed; the caller
//! adds the key and the offending value to make the one-line start-up error.

use std::net::{SocketAddr, ToSocketAddrs};

/// Parses a size in the upstream syntax: `134217728`, `2048KB`, `200MB`, `1GB`, `1TB`.
/// Units are binary (1 KB = 1024 bytes), as in the upstream configuration files; `K`/`KiB`,
/// `M`/`MiB`, ... are accepted as synonyms and case does not matter.
pub fn parse_size(s: &str) -> Result<u64, &'static str> {
    const ALLOWED: &str = "a size: bytes, or a number with KB, MB, GB or TB (binary units)";
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(ALLOWED);
    }
    let number: u64 = s[..digits_end].parse().map_err(|_| ALLOWED)?;
    let unit = s[digits_end..].trim().to_ascii_uppercase();
    let shift = match unit.as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(ALLOWED),
    };
    number.checked_mul(1u64 << shift).ok_or(ALLOWED)
}

pub fn parse_bool(s: &str) -> Result<bool, &'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("true or false"),
    }
}

/// Parses an unsigned integer within `[min, max]`.
pub fn parse_u64_in(s: &str, min: u64, max: u64) -> Result<u64, String> {
    let allowed = || format!("an integer from {min} to {max}");
    let v: u64 = s.trim().parse().map_err(|_| allowed())?;
    if v < min || v > max {
        return Err(allowed());
    }
    Ok(v)
}

/// A `HOST:PORT` pair as written by the user. The host may be an IP address (IPv6 in brackets)
/// or a name; it is resolved when the server binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    pub fn parse(s: &str) -> Result<HostPort, &'static str> {
        const ALLOWED: &str = "HOST:PORT with an IP address or host name and a port 0-65535";
        let s = s.trim();
        let (host, port) = s.rsplit_once(':').ok_or(ALLOWED)?;
        let port: u16 = port.parse().map_err(|_| ALLOWED)?;
        let host = if let Some(inner) = host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(ALLOWED)?;
            inner.parse::<std::net::Ipv6Addr>().map_err(|_| ALLOWED)?;
            inner
        } else if host.is_empty() || host.contains(':') || !host.bytes().all(is_host_byte) {
            return Err(ALLOWED);
        } else {
            host
        };
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }

    /// Resolves to the first address of the host. Names are resolved once, at start.
    pub fn resolve(&self) -> std::io::Result<SocketAddr> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{} resolves to no address", self.host)))
    }

    /// Whether every address this host names is a loopback address (used by the fail-closed
    /// binding rule: only loopback listeners may run without tokens).
    pub fn is_loopback(&self) -> bool {
        match self.host.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => self.host.eq_ignore_ascii_case("localhost"),
        }
    }
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

fn is_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
}

/// Parses the upstream `metrics_url`: `http://HOST:PORT` (a trailing `/` is allowed; `https`
/// is accepted when TLS is configured). Returns the scheme's TLS flag and the address.
pub fn parse_url(s: &str) -> Result<(bool, HostPort), &'static str> {
    const ALLOWED: &str = "a URL http://HOST:PORT or https://HOST:PORT";
    let s = s.trim();
    let (tls, rest) = if let Some(r) = s.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = s.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(ALLOWED);
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let hp = HostPort::parse(rest).map_err(|_| ALLOWED)?;
    Ok((tls, hp))
}

/// CPU numbers a CPU list may name (the kernel's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 4096;

/// Parses a CPU list such as `0-3,8`. Order is kept and duplicates are refused: each entry is
/// the core of one shard.
/// The error is what was expected, for `invalid value … : expected {it}`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    const ALLOWED: &str = "a CPU list such as 0-3,8 (ascending ranges, no repeats)";
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: usize = lo.parse().map_err(|_| ALLOWED.to_string())?;
        let hi: usize = hi.parse().map_err(|_| ALLOWED.to_string())?;
        if hi >= MAX_CPUS {
            return Err(format!(
                "CPUs numbered 0 to {}: CPU {hi} is out of range",
                MAX_CPUS - 1
            ));
        }
        if lo > hi {
            return Err(ALLOWED.to_string());
        }
        for c in lo..=hi {
            if out.contains(&c) {
                return Err(ALLOWED.to_string());
            }
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err(ALLOWED.to_string());
    }
    Ok(out)
}

/// Checks an endpoint's form (`tcp://host:port`, `ipc://path`, `inproc://name`).
pub fn valid_endpoint(s: &str) -> bool {
    if let Some(rest) = s.strip_prefix("tcp://") {
        return rest
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    }
    ["ipc://", "inproc://"]
        .iter()
        .any(|p| s.strip_prefix(p).is_some_and(|r| !r.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("134217728"), Ok(134217728));
        assert_eq!(parse_size("2048KB"), Ok(2048 * 1024));
        assert_eq!(parse_size("200MB"), Ok(200 << 20));
        assert_eq!(parse_size("1GB"), Ok(1 << 30));
        assert_eq!(parse_size("1 gib"), Ok(1 << 30));
        assert_eq!(parse_size("3T"), Ok(3 << 40));
        assert_eq!(parse_size(" 0 "), Ok(0));
        for bad in [
            "",
            "MB",
            "1.5GB",
            "-1",
            "12XB",
            "99999999999999999999",
            "17179869184TB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn host_ports() {
        let hp = HostPort::parse("127.0.0.1:8000").unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("127.0.0.1", 8000));
        let hp = HostPort::parse("[::1]:0").unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("::1", 0));
        assert_eq!(hp.to_string(), "[::1]:0");
        assert!(HostPort::parse("localhost:8000").unwrap().is_loopback());
        assert!(!HostPort::parse("0.0.0.0:8000").unwrap().is_loopback());
        for bad in [
            "127.0.0.1",
            ":80",
            "host:99999",
            "ho st:1",
            "::1:80",
            "[zz]:1",
            "a:b",
        ] {
            assert!(HostPort::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn urls() {
        let (tls, hp) = parse_url("http://127.0.0.1:8000").unwrap();
        assert!(!tls);
        assert_eq!(hp.port, 8000);
        assert!(parse_url("https://example.com:443/").unwrap().0);
        for bad in ["127.0.0.1:8000", "ftp://a:1", "http://a", "http://a:1/x"] {
            assert!(parse_url(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8"), Ok(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpu_list("1"), Ok(vec![1]));
        assert_eq!(
            parse_cpu_list("99999").unwrap_err(),
            "CPUs numbered 0 to 4095: CPU 99999 is out of range"
        );
        for bad in ["", "3-1", "0,0", "a", "0-", "1,,2"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn bools_and_ranges() {
        assert_eq!(parse_bool("ON"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("maybe").is_err());
        assert_eq!(parse_u64_in("90", 0, 100), Ok(90));
        assert!(parse_u64_in("101", 0, 100).is_err());
        assert!(parse_u64_in("-1", 0, 100).is_err());
    }

    #[test]
    fn endpoints() {
        assert!(valid_endpoint("tcp://*:5557"));
        assert!(valid_endpoint("tcp://127.0.0.1:0"));
        assert!(valid_endpoint("ipc:///tmp/x"));
        for bad in [
            "",
            "tcp://",
            "tcp://host",
            "udp://x:1",
            "tcp://:1",
            "ipc://",
        ] {
            assert!(!valid_endpoint(bad), "{bad}");
        }
    }
}
