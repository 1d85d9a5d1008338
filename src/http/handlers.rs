//! One handler per route: the request → a [`Command`] for the owner shard (or a read of
//! shared state) → the contract's response bytes.

use bytes::Bytes;

use super::json::JsonWriter;
use super::parse::{Head, Method};
use super::query;
use super::response::{Body, ContentType, Response, Status};
use super::router::Route;
use crate::config::Config;
use crate::limits::MAX_KEY_BYTES;
use crate::shards::{Command, Reply, Shard};

/// The largest body a route accepts; a larger one is answered 413 before it is read.
pub fn body_limit(route: Route, method: Method, config: &Config) -> u64 {
    match (route, method) {
        (Route::Metadata, Method::Put) => config.metadata.max_value_bytes,
        _ => config.http.max_body_bytes,
    }
}

/// A request whose head and body are complete.
pub struct Request<'a> {
    pub head: &'a Head<'a>,
    pub route: Route,
    pub body: &'a [u8],
}

/// Everything a handler may use besides the request.
pub struct Ctx<'a> {
    pub shard: &'a Shard,
    /// Reused buffer for bodies built per request (JSON, error envelopes).
    pub scratch: &'a mut Vec<u8>,
}

impl Ctx<'_> {
    /// A business error: HTTP 200 with the contract's envelope.
    pub fn business_error(&mut self, message: &str) -> Response {
        Response::error(
            Status::OK,
            message,
            self.shard.clock.unix_secs(),
            self.scratch,
        )
    }

    /// A protocol error: its own status, the same envelope.
    pub fn protocol_error(&mut self, status: Status, message: &str) -> Response {
        Response::error(status, message, self.shard.clock.unix_secs(), self.scratch)
    }

    /// 429 with `Retry-After`, for a request the owner shard could not take.
    pub fn overloaded(&mut self) -> Response {
        let mut r = self.protocol_error(
            Status::TOO_MANY_REQUESTS,
            "Server overloaded: shard queue full, retry later",
        );
        r.retry_after_secs = Some(1);
        r
    }
}

pub async fn handle(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    match req.route {
        Route::Metadata => metadata(req, ctx).await,
        Route::Health => health(ctx),
        Route::Role => {
            let role = ctx.shard.cluster.ha.snapshot().role.as_str();
            Response::text(role)
        }
        Route::HaStatus => {
            let state = ctx.shard.cluster.ha.snapshot().state.as_str();
            Response::text(state)
        }
        Route::Leader => leader(ctx),
        Route::Healthz => Response::text("ok"),
        Route::Ready => {
            if ctx.shard.cluster.is_ready() {
                Response::text("ready")
            } else {
                let mut r = ctx.protocol_error(Status::SERVICE_UNAVAILABLE, "Service not ready");
                r.retry_after_secs = Some(1);
                r
            }
        }
        Route::OpenApi => {
            let mut r = Response::new(
                Status::OK,
                ContentType::Json,
                Body::Static(super::openapi::DOCUMENT.as_bytes()),
            );
            r.no_store = false;
            r
        }
    }
}

/// The `key` parameter: present, non-empty, within the key limit. Errors are returned as the
/// response to send.
fn required_key(req: &Request<'_>, ctx: &mut Ctx<'_>, name: &str) -> Result<Box<[u8]>, Response> {
    match query::param(req.head.query, name) {
        Err(query::BadEscape) => Err(ctx.protocol_error(
            Status::BAD_REQUEST,
            "Malformed query string: invalid percent-encoding",
        )),
        Ok(None) => Err(ctx.business_error(&format!("Missing '{name}' parameter"))),
        Ok(Some(k)) if k.is_empty() => {
            Err(ctx.business_error(&format!("Missing '{name}' parameter")))
        }
        Ok(Some(k)) if k.len() > MAX_KEY_BYTES => {
            Err(ctx.business_error(&format!("Key too long (max {MAX_KEY_BYTES} bytes)")))
        }
        Ok(Some(k)) => Ok(k.into_owned().into_boxed_slice()),
    }
}

async fn metadata(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let key = match required_key(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    match req.head.method {
        Method::Get | Method::Head => match ctx.shard.execute(Command::MetadataGet { key }).await {
            Reply::Value(v) => Response::new(Status::OK, ContentType::Text, Body::Bytes(v)),
            Reply::NotFound => ctx.business_error("Metadata key not found"),
            other => reply_error(other, ctx),
        },
        Method::Put => {
            let value = Bytes::copy_from_slice(req.body);
            match ctx.shard.execute(Command::MetadataPut { key, value }).await {
                Reply::Done => Response::text("metadata updated"),
                other => reply_error(other, ctx),
            }
        }
        Method::Delete => match ctx.shard.execute(Command::MetadataDelete { key }).await {
            Reply::Done => Response::text("metadata deleted"),
            Reply::NotFound => ctx.business_error("Metadata key not found"),
            other => reply_error(other, ctx),
        },
        _ => unreachable!("the router admits only GET, HEAD, PUT, DELETE here"),
    }
}

/// The response for a reply that is not the handler's success case.
fn reply_error(reply: Reply, ctx: &mut Ctx<'_>) -> Response {
    match reply {
        Reply::Overloaded => ctx.overloaded(),
        Reply::Refused(msg) => ctx.business_error(msg),
        Reply::NotFound => ctx.business_error("Key not found"),
        Reply::Value(_) | Reply::Done => {
            log::error!("unexpected reply {reply:?}");
            ctx.business_error("Internal server error")
        }
    }
}

fn health(ctx: &mut Ctx<'_>) -> Response {
    let ha = ctx.shard.cluster.ha.snapshot();
    let ready = ctx.shard.cluster.is_ready();
    ctx.scratch.clear();
    let mut w = JsonWriter::new(ctx.scratch);
    w.begin_object();
    w.field_str("status", b"ok");
    w.field_str("role", ha.role.as_str().as_bytes());
    w.field_str("ha_state", ha.state.as_str().as_bytes());
    w.field_bool("service_ready", ready);
    w.field_str("leader_address", ha.leader_address_str().as_bytes());
    w.field_u64("view_version", ha.view_version);
    w.end_object();
    Response::json_scratch(Status::OK)
}

fn leader(ctx: &mut Ctx<'_>) -> Response {
    let ha = ctx.shard.cluster.ha.snapshot();
    ctx.scratch.clear();
    let mut w = JsonWriter::new(ctx.scratch);
    w.begin_object();
    w.field_bool("present", ha.leader_present());
    w.field_str("leader_address", ha.leader_address_str().as_bytes());
    w.field_u64("view_version", ha.view_version);
    w.end_object();
    Response::json_scratch(Status::OK)
}
