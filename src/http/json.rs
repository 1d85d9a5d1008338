//! A small JSON writer for response bodies: fields come out in exactly the order the handler
//! writes them (the contract fixes field order), straight into a reused buffer.
//!
//! Request bodies are parsed with serde_json; only the writing side is ours, because it is on
//! the hot path and because the contract's field orders are not any map's natural order.

use crate::common::fmt::write_f64;

pub struct JsonWriter<'a> {
    out: &'a mut Vec<u8>,
    /// One bit per open container: set while the next element is the first (no comma).
    first: u64,
    depth: u32,
}

impl<'a> JsonWriter<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> JsonWriter<'a> {
        JsonWriter {
            out,
            first: 0,
            depth: 0,
        }
    }

    fn separator(&mut self) {
        if self.depth == 0 {
            return;
        }
        let bit = 1u64 << (self.depth - 1);
        if self.first & bit != 0 {
            self.first &= !bit;
        } else {
            self.out.push(b',');
        }
    }

    fn open(&mut self, c: u8) {
        self.out.push(c);
        debug_assert!(self.depth < 64, "JSON nesting too deep");
        self.depth += 1;
        self.first |= 1u64 << (self.depth - 1);
    }

    fn close(&mut self, c: u8) {
        debug_assert!(self.depth > 0);
        self.first &= !(1u64 << (self.depth - 1));
        self.depth -= 1;
        self.out.push(c);
    }

    fn key(&mut self, name: &str) {
        self.separator();
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    pub fn begin_object(&mut self) {
        self.separator();
        self.open(b'{');
    }

    pub fn end_object(&mut self) {
        self.close(b'}');
    }

    pub fn begin_array(&mut self) {
        self.separator();
        self.open(b'[');
    }

    pub fn end_array(&mut self) {
        self.close(b']');
    }

    pub fn begin_object_field(&mut self, name: &str) {
        self.key(name);
        self.open(b'{');
    }

    pub fn begin_array_field(&mut self, name: &str) {
        self.key(name);
        self.open(b'[');
    }

    pub fn field_str(&mut self, name: &str, value: &[u8]) {
        self.key(name);
        write_string(self.out, value);
    }

    pub fn field_u64(&mut self, name: &str, value: u64) {
        self.key(name);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    pub fn field_i64(&mut self, name: &str, value: i64) {
        self.key(name);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    pub fn field_bool(&mut self, name: &str, value: bool) {
        self.key(name);
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
    }

    /// A finite number in its shortest round-trip form (`0`, `1`, `0.25`); non-finite values,
    /// which JSON cannot carry, are written as 0.
    pub fn field_f64(&mut self, name: &str, value: f64) {
        self.key(name);
        write_f64(self.out, value);
    }

    /// A ratio in the contract's form: rounded to [`RATIO_DIGITS`] digits after the point,
    /// trailing zeros dropped (`0`, `1`, `0.5`, `0.9999313354`).
    pub fn field_ratio(&mut self, name: &str, value: f64) {
        self.key(name);
        write_ratio(self.out, value);
    }

    pub fn value_str(&mut self, value: &[u8]) {
        self.separator();
        write_string(self.out, value);
    }

    pub fn value_bool(&mut self, value: bool) {
        self.separator();
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
    }

    pub fn value_u64(&mut self, value: u64) {
        self.separator();
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }
}

/// Digits after the point of the contract's ratios: its `/query_segment` example shows
/// `"remaining_ratio": 0.9999313354` for 368640 bytes used of 5368709120.
pub const RATIO_DIGITS: usize = 10;

/// Writes a ratio rounded to [`RATIO_DIGITS`] digits after the point, without trailing zeros
/// (so 0 and 1 are `0` and `1`, as in the contract's examples); non-finite values as 0.
pub fn write_ratio(out: &mut Vec<u8>, value: f64) {
    use std::io::Write;
    if !value.is_finite() {
        out.push(b'0');
        return;
    }
    let start = out.len();
    let _ = write!(out, "{value:.RATIO_DIGITS$}");
    while out.last() == Some(&b'0') {
        out.pop();
    }
    if out.last() == Some(&b'.') {
        out.pop();
    }
    // A value that rounds to zero from below would read `-0`.
    if &out[start..] == b"-0" {
        out.truncate(start);
        out.push(b'0');
    }
}

/// Writes `s` as a JSON string. Bytes that are not UTF-8 become U+FFFD (JSON text is UTF-8).
pub fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    match std::str::from_utf8(s) {
        Ok(text) => escape_into(out, text),
        Err(_) => escape_into(out, &String::from_utf8_lossy(s)),
    }
    out.push(b'"');
}

fn escape_into(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_have_the_contracts_digits() {
        let r = |v: f64| {
            let mut out = Vec::new();
            write_ratio(&mut out, v);
            String::from_utf8(out).unwrap()
        };
        // The seed's example: 5368709120 total, 368640 used.
        assert_eq!(
            r((5_368_709_120_u64 - 368_640) as f64 / 5_368_709_120_f64),
            "0.9999313354"
        );
        assert_eq!(r(0.0), "0");
        assert_eq!(r(1.0), "1");
        assert_eq!(r(0.5), "0.5");
        assert_eq!(r(0.25), "0.25");
        assert_eq!(r(1.0 / 3.0), "0.3333333333");
        assert_eq!(r(2.0 / 3.0), "0.6666666667");
        assert_eq!(r(0.99999999999), "1");
        assert_eq!(r(1e-12), "0");
        assert_eq!(r(-1e-12), "0");
        assert_eq!(r(f64::NAN), "0");
    }

    #[test]
    fn nested_values_in_written_order() {
        let mut buf = Vec::new();
        let mut w = JsonWriter::new(&mut buf);
        w.begin_object();
        w.field_str("key", b"a\"b\\c\n\x01");
        w.field_u64("size", 100);
        w.begin_array_field("blobs");
        w.begin_object();
        w.field_bool("valid", true);
        w.field_f64("ratio", 0.25);
        w.end_object();
        w.begin_object();
        w.field_i64("n", -3);
        w.end_object();
        w.end_array();
        w.begin_array_field("empty");
        w.end_array();
        w.begin_object_field("o");
        w.field_f64("one", 1.0);
        w.field_f64("nan", f64::NAN);
        w.end_object();
        w.end_object();
        let s = String::from_utf8(buf).unwrap();
        assert_eq!(
            s,
            r#"{"key":"a\"b\\c\n\u0001","size":100,"blobs":[{"valid":true,"ratio":0.25},{"n":-3}],"empty":[],"o":{"one":1,"nan":0}}"#
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["blobs"][1]["n"], -3);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let mut buf = Vec::new();
        write_string(&mut buf, b"k\xffey");
        assert_eq!(String::from_utf8(buf).unwrap(), "\"k\u{fffd}ey\"");
    }
}
