//! Number formatting shared by the JSON writer (`http::json`) and the exposition writers
//! (`metrics::exposition`), and byte counts as log lines give them ([`size_text`]).
//!
//! [`write_f64`] writes what `format!("{value}")` writes (Rust's shortest round-trip digits,
//! in plain decimal notation: never an exponent, no `.0` on whole numbers), from the digits
//! the `zmij` crate finds, several times faster than the standard formatter. The two pick
//! the same shortest digits but for a tie between two candidates (the exact value halfway
//! between them), which only a 16- or 17-digit answer can meet (two shorter candidates are
//! never both within one ulp): those few values go through the standard formatter.

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

/// Writes `value` in Rust's shortest round-trip form (exactly as `Display` writes it);
/// non-finite values (which neither JSON nor the scrapers we serve accept) as 0.
pub fn write_f64(out: &mut Vec<u8>, value: f64) {
    if !value.is_finite() {
        out.push(b'0');
        return;
    }
    let mut b = zmij::Buffer::new();
    let s = b.format_finite(value).as_bytes();
    let significant = s
        .iter()
        .take_while(|&&c| c != b'e')
        .skip_while(|&&c| !(b'1'..=b'9').contains(&c))
        .filter(|c| c.is_ascii_digit())
        .count();
    if significant >= 16 {
        let _ = write!(out, "{value}");
        return;
    }
    let (neg, s) = match s {
        [b'-', rest @ ..] => (true, rest),
        s => (false, s),
    };
    if neg {
        out.push(b'-');
    }
    let Some(e) = s.iter().position(|&c| c == b'e') else {
        // Fixed notation: the same as Display but for a whole number's `.0`.
        out.extend_from_slice(s.strip_suffix(b".0").unwrap_or(s));
        return;
    };
    // `d[.ddd]e±x`: the digits, then the place of the decimal point after the first digit
    // moved by the exponent.
    let (mantissa, exp) = (&s[..e], &s[e + 1..]);
    let exp_neg = exp.first() == Some(&b'-');
    let exp: i32 = exp
        .iter()
        .filter(|c| c.is_ascii_digit())
        .fold(0, |n, &c| n * 10 + i32::from(c - b'0'));
    let exp = if exp_neg { -exp } else { exp };
    let mut digits = [0u8; 24];
    let mut n = 0;
    for &c in mantissa.iter().filter(|c| c.is_ascii_digit()) {
        digits[n] = c;
        n += 1;
    }
    let digits = &digits[..n];
    // Digits before the decimal point.
    let point = 1 + exp;
    if point <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-point) as usize, b'0');
        out.extend_from_slice(digits);
    } else if point as usize >= n {
        out.extend_from_slice(digits);
        out.resize(out.len() + (point as usize - n), b'0');
    } else {
        out.extend_from_slice(&digits[..point as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[point as usize..]);
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

    #[track_caller]
    fn same_as_display(v: f64) {
        let mut out = Vec::new();
        write_f64(&mut out, v);
        assert_eq!(std::str::from_utf8(&out).unwrap(), format!("{v}"), "{v:e}");
    }

    /// Every kind of float writes exactly what `Display` writes: zeros, whole numbers, the
    /// exponent ranges at both ends, subnormals, and random bit patterns.
    #[test]
    fn writes_what_display_writes() {
        for v in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            1e-5,
            2.5e-5,
            1e-7,
            1.25e-7,
            123.456,
            1e15,
            1e16,
            1e17,
            1.5e21,
            1e22,
            1e23,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            1.0 / 3.0,
            0.000_123_4,
            1_234_567.0 / 1e6,
            1_099_511_627_776.0,
            9_007_199_254_740_993.0,
        ] {
            same_as_display(v);
            same_as_display(-v);
        }
        for e in -330..310 {
            for v in [10f64.powi(e), 3.7 * 10f64.powi(e)] {
                if v.is_finite() {
                    same_as_display(v);
                }
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if v.is_finite() {
                same_as_display(v);
            }
            // Figures a scrape shows: ratios, milliseconds, seconds.
            same_as_display((x % 10_000_000) as f64 / 1e6);
            same_as_display((x % 1_000_000_007) as f64 / 1e9);
        }
    }
}
