//! Number formatting shared by the JSON writer (`http::json`) and the Prometheus writer
//! (`metrics::exposition`), and byte counts as log lines give them ([`size_text`]).

use std::io::Write;

/// A byte count as an operator reads it: `64 GiB (68719476736 bytes)`.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} bytes");
    }
    let figure = if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    };
    format!("{figure} {} ({bytes} bytes)", UNITS[unit])
}

/// Writes `value` in Rust's shortest round-trip form; non-finite values (which neither JSON
/// nor the scrapers we serve accept) as 0.
pub fn write_f64(out: &mut Vec<u8>, value: f64) {
    if value.is_finite() {
        let _ = write!(out, "{value}");
    } else {
        out.push(b'0');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_and_not() {
        let mut out = Vec::new();
        write_f64(&mut out, 1.5);
        out.push(b' ');
        write_f64(&mut out, f64::NAN);
        out.push(b' ');
        write_f64(&mut out, f64::INFINITY);
        assert_eq!(out, b"1.5 0 0");
    }
}
