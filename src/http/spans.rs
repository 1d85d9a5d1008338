//! Request spans (`ock.mmc.otlp.trace_sample_ratio`): a sampled request gets a SERVER span
//! from its head being parsed to its answer being encoded, under the W3C `traceparent` it came
//! with. A `traceparent` query parameter (the one this server's 307 to a local service puts in
//! the `Location`, so the hop is a child of the meta's span) wins over the header. Off, a
//! request pays one load; on and not sampled, one random number.

use std::time::Instant;

use crate::http::parse::Head;
use crate::http::query;
use crate::http::response::{Body, Response};
use crate::http::router::Route;
use crate::metrics::otlp::{Attr, Kind, SpanRecord, Telemetry, TraceContext};

/// A sampled request's span while it is being answered.
pub struct RequestSpan {
    rec: SpanRecord,
    started: Instant,
}

/// The trace context a request brings: its `traceparent` query parameter, else its header.
fn parent(head: &Head<'_>) -> Option<TraceContext> {
    if let Ok(Some(v)) = query::param(head.query, "traceparent")
        && let Some(c) = TraceContext::parse(&v)
    {
        return Some(c);
    }
    TraceContext::parse(head.traceparent?)
}

impl RequestSpan {
    /// The span of the request `head`, when tracing is on and it is sampled.
    #[inline]
    pub fn start(t: &Telemetry, head: &Head<'_>, started: Instant) -> Option<RequestSpan> {
        if !t.tracing() {
            return None;
        }
        let (ctx, parent_id) = t.start(parent(head).as_ref())?;
        let mut rec = SpanRecord::begin(ctx, parent_id, head.method.as_str(), Kind::Server);
        // The span starts when the head was parsed (a body over several reads, when it began).
        rec.start_ns = rec
            .start_ns
            .saturating_sub(started.elapsed().as_nanos() as u64);
        Some(RequestSpan { rec, started })
    }

    /// The context the request's outgoing calls and redirects carry.
    pub fn context(&self) -> TraceContext {
        self.rec.ctx
    }

    /// Ends the span with what the request was and how it was answered, and queues it.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        mut self,
        t: &Telemetry,
        head: &Head<'_>,
        route: Option<Route>,
        shard: usize,
        shards: usize,
        body_bytes: u64,
        resp: &Response,
        scratch_len: usize,
    ) {
        let r = &mut self.rec;
        let method = head.method.as_str();
        if let Some(route) = route {
            let path = route.spec().path;
            r.name = format!("{method} {path}").into();
            r.attr("http.route", Attr::Static(path));
        }
        r.attr("http.request.method", Attr::Static(method));
        r.attr(
            "http.response.status_code",
            Attr::Int(i64::from(resp.status.0)),
        );
        r.attr("mmc.shard", Attr::Int(shard as i64));
        if let Ok(Some(key)) = query::param(head.query, "key") {
            r.attr("mmc.key.size", Attr::Int(key.len() as i64));
            let owner = crate::shards::shard_for(&key, shards);
            r.attr("mmc.owner_shard", Attr::Int(owner as i64));
        }
        if body_bytes > 0 {
            r.attr("http.request.body.size", Attr::Int(body_bytes as i64));
        }
        let sent = match (&resp.transfer, &resp.body) {
            (Some(t), _) if !t.per_blob => Some(t.bytes),
            (_, Body::Scratch) => Some(scratch_len as u64),
            _ => None,
        };
        if let Some(n) = sent {
            r.attr("http.response.body.size", Attr::Int(n as i64));
        }
        if let Some(loc) = &resp.location {
            // The hop, without its query: a grant is a credential.
            let hop = loc.split('?').next().unwrap_or_default();
            r.attr("mmc.redirect", Attr::Text(hop.to_string()));
        }
        if let Some(id) = head.request_id {
            r.attr(
                "mmc.request_id",
                Attr::Text(String::from_utf8_lossy(id).into_owned()),
            );
        }
        r.error = resp.status.0 >= 500;
        r.end(self.started.elapsed());
        t.record(self.rec);
    }
}

/// The `traceparent` of a call a request's handler makes to another process (none when the
/// request is not sampled).
pub struct Outgoing(Option<String>);

impl Outgoing {
    pub fn of(trace: Option<TraceContext>) -> Outgoing {
        Outgoing(trace.map(|t| t.header()))
    }

    /// The header fields to send.
    pub fn fields(&self) -> Vec<(&str, &str)> {
        self.0.iter().map(|v| ("traceparent", v.as_str())).collect()
    }
}

/// Puts a sampled request's context on a redirect's `Location` (a URL with a query): the
/// local service's span of the hop is a child of this one.
pub fn carry(location: &mut String, trace: Option<TraceContext>) {
    if let Some(t) = trace {
        location.push_str("&traceparent=");
        location.push_str(&t.header());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_goes_on_redirects_and_calls_only_when_sampled() {
        let t = TraceContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let mut loc = "http://10.0.0.2:8000/api/v1/objects?key=k&grant=g".to_string();
        carry(&mut loc, None);
        assert!(!loc.contains("traceparent"));
        carry(&mut loc, t);
        assert!(
            loc.ends_with("&traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        // The local service reads it back from the query.
        let q = loc.split_once('?').unwrap().1;
        let v = query::param(q.as_bytes(), "traceparent").unwrap().unwrap();
        assert_eq!(TraceContext::parse(&v), t);
        assert!(Outgoing::of(None).fields().is_empty());
        assert_eq!(Outgoing::of(t).fields()[0].0, "traceparent");
    }
}
