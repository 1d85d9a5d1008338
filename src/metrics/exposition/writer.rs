//! The Prometheus text format (0.0.4) writer: families, samples, label escaping, classic
//! histograms. Every value is an integer or a plain float.

use std::io::Write;

pub(super) struct Out<'a> {
    pub buf: &'a mut Vec<u8>,
}

impl Out<'_> {
    /// A family's `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = write!(self.buf, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.buf.push(b'{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            let _ = write!(self.buf, "{k}=\"");
            self.escaped(v);
            self.buf.push(b'"');
        }
        self.buf.push(b'}');
    }

    /// A label value with `\`, `"` and newlines escaped.
    fn escaped(&mut self, v: &str) {
        for c in v.chars() {
            match c {
                '\\' => self.buf.extend_from_slice(b"\\\\"),
                '"' => self.buf.extend_from_slice(b"\\\""),
                '\n' => self.buf.extend_from_slice(b"\\n"),
                c => {
                    let mut b = [0u8; 4];
                    self.buf.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
    }

    /// An integer sample.
    pub fn int(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.buf.extend_from_slice(name.as_bytes());
        self.labels(labels);
        self.buf.push(b' ');
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self.buf.push(b'\n');
    }

    /// A float sample (shortest form that reads back the same, `0` for zero).
    pub fn float(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.buf.extend_from_slice(name.as_bytes());
        self.labels(labels);
        self.buf.push(b' ');
        crate::common::fmt::write_f64(self.buf, v);
        self.buf.push(b'\n');
    }

    /// A one-sample family.
    pub fn single(&mut self, name: &str, help: &str, kind: &str, v: u64) {
        self.family(name, help, kind);
        self.int(name, &[], v);
    }

    /// The samples of one classic histogram (no family lines): `_bucket` per bound, cumulative,
    /// with `le` after `labels`; `+Inf`; `_sum`; `_count`. `counts` are per bucket (not
    /// cumulative), `+Inf` last; `les` the bounds as written.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        les: &[&str],
        counts: &[u64],
        sum: f64,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("le", ""));
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            *l.last_mut().expect("the le label") = ("le", les.get(i).copied().unwrap_or("+Inf"));
            self.int(&bucket, &l, cumulative);
        }
        self.float(&format!("{name}_sum"), labels, sum);
        self.int(&format!("{name}_count"), labels, cumulative);
    }
}
