//! Reading back the `/metrics` text (Prometheus text 0.0.4, as `exposition` writes it) as
//! families, so the OTLP push carries exactly the families, series and values a scrape shows,
//! read from the same per-shard figures by the same code, whatever that code becomes.

/// A family's type, from its `# TYPE` line (none: untyped, pushed as a gauge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Untyped,
}

/// One sample line: the sample's own name (a histogram's carry `_bucket`, `_sum`, `_count`),
/// its labels in order, its value as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: Value,
}

/// A sample value: an integer when written as one, else a float (`+Inf`, `NaN` included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
}

impl Value {
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub samples: Vec<Sample>,
}

/// The families of an exposition text, in order. Lines that are not understood are skipped
/// (the text is the server's own, so none are expected).
pub fn parse(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            family(&mut out, name).help = unescape_help(help);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            family(&mut out, name).kind = match kind.trim() {
                "counter" => Kind::Counter,
                "gauge" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                _ => Kind::Untyped,
            };
        } else if line.starts_with('#') {
            continue;
        } else if let Some(s) = sample(line) {
            let belongs = out.last().is_some_and(|f| owns(f, &s.name));
            if !belongs {
                family(&mut out, &s.name);
            }
            out.last_mut().expect("a family").samples.push(s);
        }
    }
    out
}

/// Whether sample `name` is of family `f`.
fn owns(f: &Family, name: &str) -> bool {
    if name == f.name {
        return f.kind != Kind::Histogram;
    }
    f.kind == Kind::Histogram
        && name
            .strip_prefix(f.name.as_str())
            .is_some_and(|s| matches!(s, "_bucket" | "_sum" | "_count"))
}

/// The family `name` at the end of `out`, added when it is not the last one.
fn family<'a>(out: &'a mut Vec<Family>, name: &str) -> &'a mut Family {
    if out.last().is_none_or(|f| f.name != name) {
        out.push(Family {
            name: name.to_string(),
            help: String::new(),
            kind: Kind::Untyped,
            samples: Vec::new(),
        });
    }
    out.last_mut().expect("just pushed")
}

fn unescape_help(h: &str) -> String {
    h.replace("\\n", "\n").replace("\\\\", "\\")
}

/// `name{a="x",b="y"} value [timestamp]`.
fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut r = r;
        loop {
            r = r.trim_start_matches([',', ' ']);
            if let Some(after) = r.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = r.find('=')?;
            let key = r[..eq].trim().to_string();
            let mut chars = r[eq + 1..].char_indices();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            let mut escaped = false;
            let mut end = None;
            for (i, c) in chars {
                if escaped {
                    value.push(if c == 'n' { '\n' } else { c });
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    end = Some(i);
                    break;
                } else {
                    value.push(c);
                }
            }
            r = &r[eq + 1 + end? + 1..];
            labels.push((key, value));
        }
    }
    let v = rest.split_whitespace().next()?;
    let value = match v.parse::<i64>() {
        Ok(i) => Value::Int(i),
        Err(_) => Value::Float(parse_float(v)?),
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn parse_float(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        v => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP memcache_a_total Things done\n\
# TYPE memcache_a_total counter\n\
memcache_a_total{op=\"get\",path=\"a\\\"b\\\\c\\nd\"} 12\n\
memcache_a_total{op=\"put\"} 3\n\
# HELP memcache_ratio A ratio\n\
# TYPE memcache_ratio gauge\n\
memcache_ratio 0.25\n\
# HELP memcache_lat_seconds Latency\n\
# TYPE memcache_lat_seconds histogram\n\
memcache_lat_seconds_bucket{op=\"get\",le=\"0.001\"} 1\n\
memcache_lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n\
memcache_lat_seconds_sum{op=\"get\"} 0.5\n\
memcache_lat_seconds_count{op=\"get\"} 4\n\
memcache_untyped 7\n";

    #[test]
    fn families_kinds_labels_and_values() {
        let f = parse(TEXT);
        let names: Vec<_> = f.iter().map(|f| (f.name.as_str(), f.kind)).collect();
        assert_eq!(
            names,
            [
                ("memcache_a_total", Kind::Counter),
                ("memcache_ratio", Kind::Gauge),
                ("memcache_lat_seconds", Kind::Histogram),
                ("memcache_untyped", Kind::Untyped),
            ]
        );
        assert_eq!(f[0].help, "Things done");
        assert_eq!(
            f[0].samples[0].labels,
            [
                ("op".to_string(), "get".to_string()),
                ("path".to_string(), "a\"b\\c\nd".to_string())
            ]
        );
        assert_eq!(f[0].samples[0].value, Value::Int(12));
        assert_eq!(f[1].samples[0].value, Value::Float(0.25));
        assert_eq!(f[2].samples.len(), 4);
        assert_eq!(f[2].samples[1].labels[1].1, "+Inf");
        assert_eq!(f[3].samples[0].value, Value::Int(7));
    }

    #[test]
    fn odd_values_parse() {
        assert_eq!(sample("x +Inf").unwrap().value.as_f64(), f64::INFINITY);
        assert!(sample("x NaN").unwrap().value.as_f64().is_nan());
        assert_eq!(
            sample("x{} 1e3 1700000000").unwrap().value,
            Value::Float(1000.0)
        );
        assert!(sample("x{a=b} 1").is_none());
    }
}
