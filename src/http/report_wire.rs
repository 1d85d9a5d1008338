//! The JSON form of what a local service reports with its heartbeats beside its membership:
//! the client bandwidth figures of the bytes it moved for its rank (`"client"`), which the
//! meta service merges into its `memcache_bandwidth_*` families for that rank.
//!
//! One element per operation: `{"operation": "batch_get", "bytes": …, "duration_ns": …,
//! "ops": …, "cum_bytes": …, "cum_duration_ns": …, "latency_s": [p50, p90, p99, avg]}`: the
//! window's figures (the last full window and the current one, as the local service's own
//! `/metrics` shows them when it sends the report) and the totals since it started.

use serde_json::{Value, json};

use crate::metrics::client::{ClientOp, OpView};

/// The `"client"` list of a heartbeat: `views` of the service's own rank `rank` (figures
/// recorded under another rank, before it joined again under a new one, are left out).
pub fn client_json(views: &[OpView], rank: u32) -> Value {
    Value::Array(
        views
            .iter()
            .filter(|v| v.rank == rank)
            .map(|v| {
                json!({
                    "operation": v.op.name(),
                    "bytes": v.bytes,
                    "duration_ns": v.duration_ns,
                    "ops": v.ops,
                    "cum_bytes": v.cum_bytes,
                    "cum_duration_ns": v.cum_duration_ns,
                    "latency_s": v.latency,
                })
            })
            .collect(),
    )
}

/// The figures of a heartbeat's `"client"` list, as views of `rank` (the heartbeat's rank,
/// whatever an element says): at most one per operation (the first), unknown operations and
/// malformed elements skipped, missing numbers 0, latencies that are no finite non-negative
/// number 0.
pub fn parse_client(v: Option<&Value>, rank: u32) -> Vec<OpView> {
    let mut out: Vec<OpView> = Vec::new();
    for e in v.and_then(Value::as_array).into_iter().flatten() {
        let op = e
            .get("operation")
            .and_then(Value::as_str)
            .and_then(|name| ClientOp::ALL.into_iter().find(|op| op.name() == name));
        let Some(op) = op else { continue };
        if out.iter().any(|o| o.op == op) {
            continue;
        }
        let n = |name: &str| e.get(name).and_then(Value::as_u64).unwrap_or(0);
        let mut latency = [0.0; 4];
        for (l, x) in latency.iter_mut().zip(
            e.get("latency_s")
                .and_then(Value::as_array)
                .into_iter()
                .flatten(),
        ) {
            *l = x
                .as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .unwrap_or(0.0);
        }
        out.push(OpView {
            rank,
            op,
            bytes: n("bytes"),
            duration_ns: n("duration_ns"),
            ops: n("ops"),
            cum_bytes: n("cum_bytes"),
            cum_duration_ns: n("cum_duration_ns"),
            latency,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_go_through_unchanged() {
        let get = OpView::sample(4, ClientOp::BatchGet);
        let put = OpView::empty(4, ClientOp::BatchPut);
        let stale = OpView::empty(1, ClientOp::BatchPut);
        let wire = client_json(&[get.clone(), put.clone(), stale], 4);
        assert_eq!(
            wire.as_array().unwrap().len(),
            2,
            "another rank's figures stay home"
        );
        let text = wire.to_string();
        let back = parse_client(Some(&serde_json::from_str(&text).unwrap()), 4);
        assert_eq!(back, [get, put]);
    }

    #[test]
    fn malformed_reports_are_read_as_far_as_they_make_sense() {
        let v: Value = serde_json::from_str(
            r#"[{"operation":"nope","bytes":1},{"operation":"batch_put","bytes":-1,"ops":2,
                "latency_s":[-1,"x",null,0.5,7]},{"operation":"batch_put","bytes":9},3,null]"#,
        )
        .unwrap();
        let back = parse_client(Some(&v), 2);
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].rank, back[0].bytes, back[0].ops), (2, 0, 2));
        assert_eq!(back[0].latency, [0.0, 0.0, 0.0, 0.5]);
        assert!(parse_client(Some(&json!({"a": 1})), 2).is_empty());
        assert!(parse_client(None, 2).is_empty());
    }
}
