//! Health, HA state, readiness, the OpenAPI document and `/metadata`.

use bytes::Bytes;

use super::{Ctx, Request, required_key_ref};
use crate::common::error_kind::{ErrorKind, Refusal};
use crate::http::parse::Method;
use crate::http::response::{Body, ContentType, Response, Status};
use crate::shards::{Command, Reply};

pub fn role(ctx: &mut Ctx<'_>) -> Response {
    Response::text(ctx.shard.shared.ha.snapshot().role.as_str())
}

pub fn ha_status(ctx: &mut Ctx<'_>) -> Response {
    Response::text(ctx.shard.shared.ha.snapshot().state.as_str())
}

pub fn ready(ctx: &mut Ctx<'_>) -> Response {
    if ctx.shard.shared.is_ready() {
        Response::text("ready")
    } else {
        let mut r = ctx.protocol_error(Status::SERVICE_UNAVAILABLE, "Service not ready");
        r.retry_after_secs = Some(1);
        r
    }
}

/// The status page (`src/http/ui.html`): one self-contained document that reads the server's
/// own JSON and text routes from the browser. It holds no data itself; it is guarded by the
/// data token like the routes it reads (`/metrics/*` it reads with the metrics token).
const UI_HTML: &str = include_str!("../ui.html");

pub fn ui() -> Response {
    let mut r = Response::new(
        Status::OK,
        ContentType::Html,
        Body::Static(UI_HTML.as_bytes()),
    );
    r.no_store = false;
    r
}

/// `/`: a 302 to the status page, so that a browser pointed at the server's address lands
/// somewhere (the contract defines no `/`). The Location is relative and carries no fragment,
/// so a browser keeps the one it was given: `/#token=…` opens `/ui#token=…`.
pub fn root() -> Response {
    let mut r = Response::new(
        Status::FOUND,
        ContentType::Text,
        Body::Static(b"The status page is at /ui\n"),
    );
    r.location = Some("/ui".into());
    r.no_store = false;
    r
}

pub fn openapi(ctx: &mut Ctx<'_>) -> Response {
    let mut r = Response::new(
        Status::OK,
        ContentType::Json,
        Body::Bytes(ctx.shard.shared.front.openapi.clone()),
    );
    r.no_store = false;
    r
}

pub fn health(ctx: &mut Ctx<'_>) -> Response {
    let ha = ctx.shard.shared.ha.snapshot();
    let ready = ctx.shard.shared.is_ready();
    ctx.json_object(|w| {
        w.field_str("status", b"ok");
        w.field_str("role", ha.role.as_str().as_bytes());
        w.field_str("ha_state", ha.state.as_str().as_bytes());
        w.field_bool("service_ready", ready);
        w.field_str("leader_address", ha.leader_address_str().as_bytes());
        w.field_u64("view_version", ha.view_version);
    })
}

pub fn leader(ctx: &mut Ctx<'_>) -> Response {
    let ha = ctx.shard.shared.ha.snapshot();
    ctx.json_object(|w| {
        w.field_bool("present", ha.leader_present());
        w.field_str("leader_address", ha.leader_address_str().as_bytes());
        w.field_u64("view_version", ha.view_version);
    })
}

/// A `/metadata` key that holds no value (the kind of a missing object key).
const METADATA_KEY_NOT_FOUND: Refusal = Refusal {
    kind: ErrorKind::KeyNotFound,
    message: std::borrow::Cow::Borrowed("Metadata key not found"),
};

pub async fn metadata(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let key = match required_key_ref(req, ctx, "key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    if let Method::Get | Method::Head = req.head.method {
        // A key of this shard is read where it is: no command, no copy of the key.
        let reply = match ctx.shard.metadata_get_here(&key) {
            Ok(r) => r,
            Err(owner) => {
                let key = key.into_owned().into_boxed_slice();
                ctx.shard
                    .submit(owner, Command::MetadataGet { key })
                    .wait()
                    .await
            }
        };
        return match reply {
            Reply::Value(v) => Response::new(Status::OK, ContentType::Text, Body::Bytes(v)),
            other => ctx.reply_error(other, METADATA_KEY_NOT_FOUND),
        };
    }
    let key = key.into_owned().into_boxed_slice();
    match req.head.method {
        Method::Put => {
            let value = Bytes::copy_from_slice(req.body);
            match ctx.shard.execute(Command::MetadataPut { key, value }).await {
                Reply::Done => Response::text("metadata updated"),
                other => ctx.reply_error(other, METADATA_KEY_NOT_FOUND),
            }
        }
        Method::Delete => match ctx.shard.execute(Command::MetadataDelete { key }).await {
            Reply::Done => Response::text("metadata deleted"),
            other => ctx.reply_error(other, METADATA_KEY_NOT_FOUND),
        },
        _ => unreachable!("the router admits only GET, HEAD, PUT, DELETE here"),
    }
}
