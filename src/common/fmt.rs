//! Number formatting shared by the JSON writer (`http::json`) and the Prometheus writer
//! (`metrics::exposition`).

use std::io::Write;

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
