//! One handler per route: the request → [`Command`]s for the owner shards (or a read of
//! shared state) → the contract's response bytes.

mod keys;
/// The key-listing cursor the connection uses to stream `/get_all_keys`.
pub mod keys_stream {
    pub use super::keys::KeyCursor;
}
mod cluster;
mod copies;
mod freed;
mod grant_urls;
pub use copies::HttpCopier;
mod memory;
mod meta;
mod objects;
mod remote;
mod tier;
pub use tier::HttpRemoteTier;
mod scrape;
mod segments;

use std::borrow::Cow;
use std::rc::Rc;

use super::json::JsonWriter;
use super::parse::{Head, Method};
use super::query;
use super::response::{Response, Status};
use super::router::Route;
use crate::common::error_kind::{ErrorKind, Refusal};
use crate::config::Config;
use crate::limits::MAX_KEY_BYTES;
use crate::metrics::requests::ReqOp;
use crate::metrics::trace::Tp;
use crate::shards::store::keys as object_keys;
use crate::shards::{Command, Reply, Shard};

pub use crate::http::bodies::MAX_BATCH_KEYS;

/// The largest body a route accepts; a larger one is answered 413 before it is read.
pub fn body_limit(route: Route, method: Method, config: &Config) -> u64 {
    match (route, method) {
        (Route::Metadata, Method::Put) => config.metadata.max_value_bytes,
        // JSON bodies of /memory/* name chunk hashes; 4 MiB is tens of thousands of them.
        (Route::MemoryEvict | Route::MemoryPrefetch, _) => config.http.max_body_bytes.min(4 << 20),
        // The POST form of a batch names its keys in a JSON body.
        (route, Method::Post) if takes_keys_body(route) => config
            .http
            .max_body_bytes
            .min(crate::http::bodies::MAX_BATCH_KEYS_BODY_BYTES),
        _ => config.http.max_body_bytes,
    }
}

/// The 413 text: the limit a body passed and the key that sets it.
pub fn body_limit_message(route: Option<Route>, method: Method, config: &Config) -> String {
    let limit = match route {
        Some(r) => body_limit(r, method, config),
        None => config.http.max_body_bytes,
    };
    // A route whose own fixed limit is below the configured one says so.
    if limit < config.http.max_body_bytes
        && !matches!(route, Some(Route::Metadata) if method == Method::Put)
    {
        return format!(
            "Request body too large: this route takes at most {limit} bytes (a fixed limit)"
        );
    }
    let key = match route {
        Some(Route::Metadata) if method == Method::Put => "ock.mmc.metadata.max_value_bytes",
        _ => "ock.mmc.http.max_body_bytes",
    };
    format!("Request body too large: the limit is {limit} bytes (set by {key})")
}

/// A request whose head and body are complete.
pub struct Request<'a> {
    pub head: &'a Head<'a>,
    pub route: Route,
    pub body: &'a [u8],
    /// When the body started to arrive, if it took several reads (a put's transfer time
    /// includes receiving it); `None` when it came with its head.
    pub body_since: Option<std::time::Instant>,
    /// When the request was handed to its handler: the start of its client latency (read
    /// once, where the request's duration starts, not again by each handler).
    pub dispatched: std::time::Instant,
}

impl Request<'_> {
    /// A HEAD request: answered with the headers of its GET, but it is not a business
    /// operation (a HEAD is not a get, a query or an exist), so it counts nowhere and takes
    /// no lease.
    pub fn is_head(&self) -> bool {
        self.head.method == Method::Head
    }

    /// `cmd` as this request applies it: uncounted for a HEAD request.
    pub fn read_command(&self, cmd: Command) -> Command {
        if self.is_head() {
            Command::Uncounted(Box::new(cmd))
        } else {
            cmd
        }
    }
}

/// `Key not found`, the answer to a key that names no readable object.
pub const KEY_NOT_FOUND: Refusal = Refusal::of(ErrorKind::KeyNotFound);

/// Everything a handler may use besides the request.
pub struct Ctx<'a> {
    pub shard: &'a Rc<Shard>,
    /// Reused buffer for bodies built per request (JSON, error envelopes).
    pub scratch: &'a mut Vec<u8>,
    /// The request's span context, when it is sampled (`http::spans`): carried on the
    /// redirects and the calls its handler makes to other processes.
    pub trace: Option<crate::metrics::otlp::TraceContext>,
}

impl Ctx<'_> {
    /// A 200 answer of one JSON object, its fields written by `fill` into the scratch buffer.
    #[inline]
    pub fn json_object(&mut self, fill: impl FnOnce(&mut JsonWriter<'_>)) -> Response {
        self.scratch.clear();
        let mut w = JsonWriter::new(self.scratch);
        w.begin_object();
        fill(&mut w);
        w.end_object();
        Response::json_scratch(Status::OK)
    }

    /// `cmd` of each key, run by the keys' owners in parallel; the replies in key order.
    pub async fn execute_each(
        &self,
        keys: &[Box<[u8]>],
        cmd: impl Fn(Box<[u8]>) -> Command,
    ) -> Vec<Reply> {
        let cmds = keys.iter().map(|k| cmd(k.clone())).collect();
        self.shard.execute_many(cmds).await
    }

    /// `{"success":true,"message":…}`.
    pub fn success_message(&mut self, message: &str) -> Response {
        self.json_object(|w| {
            w.field_bool("success", true);
            w.field_str("message", message.as_bytes());
        })
    }

    /// A business error: HTTP 200 with the contract's envelope, `kind` in its
    /// `X-MMC-Error-Code`.
    pub fn business_error(&mut self, kind: ErrorKind, message: &str) -> Response {
        Response::error(
            Status::OK,
            kind,
            message,
            self.shard.clock.unix_secs(),
            self.scratch,
        )
    }

    /// A refused operation as a business error.
    pub fn refuse(&mut self, why: Refusal) -> Response {
        self.business_error(why.kind, &why.message)
    }

    /// A protocol error: its own status, the same envelope, the status's kind
    /// ([`ErrorKind::for_status`]).
    pub fn protocol_error(&mut self, status: Status, message: &str) -> Response {
        let kind = ErrorKind::for_status(status.0);
        Response::error(
            status,
            kind,
            message,
            self.shard.clock.unix_secs(),
            self.scratch,
        )
    }

    /// 429 with `Retry-After` (estimated from the work waiting and the recent pace), for a
    /// request this shard or the key's owner could not take.
    pub fn overloaded(&mut self) -> Response {
        let backlog = self.shard.remote().inbox_depth();
        let retry = self.shard.load.retry_after_secs(backlog);
        self.shard.stats().overload_rejections.inc();
        let overloaded = Refusal::of(ErrorKind::Overloaded);
        let mut r = self.protocol_error(Status::TOO_MANY_REQUESTS, &overloaded.message);
        r.retry_after_secs = Some(retry);
        r
    }

    /// The response for a reply that is not the handler's success case.
    pub fn reply_error(&mut self, reply: Reply, not_found: Refusal) -> Response {
        match reply {
            Reply::Overloaded => self.overloaded(),
            Reply::Refused(why) => self.refuse(why),
            Reply::NotFound => self.refuse(not_found),
            other => {
                log::error!("unexpected reply {other:?}");
                self.refuse(Refusal::of(ErrorKind::Failed))
            }
        }
    }
}

/// The tracepoint a request runs under (coordinator side; owners trace their own steps). A
/// HEAD request is no business operation and runs under none.
fn tracepoint(route: Route, method: Method) -> Option<Tp> {
    Some(match (route, method) {
        (_, Method::Head) => return None,
        (Route::Objects, Method::Put) => Tp::Put,
        (Route::Objects, Method::Get) => Tp::Get,
        (Route::Objects | Route::Key, Method::Delete) => Tp::Remove,
        (Route::ObjectsExist, _) => Tp::Exist,
        (Route::ObjectsBatchPut, _) => Tp::BatchPut,
        (Route::ObjectsBatchGet, _) => Tp::BatchGet,
        (Route::ObjectsBatchExist, _) => Tp::BatchExist,
        (Route::ObjectsBatchRemove, _) => Tp::BatchRemove,
        (Route::AllKeys, _) => Tp::RemoveAll,
        (Route::QueryKey, _) => Tp::Query,
        (Route::BatchQueryKeys, _) => Tp::BatchQuery,
        (Route::GetAllKeys, _) => Tp::GetAllKeys,
        (Route::SegmentsMount, _) => Tp::Mount,
        (Route::SegmentsUnmount, _) => Tp::Unmount,
        (Route::MemoryEvict, _) => Tp::MemoryEvict,
        (Route::MemoryPrefetch, _) => Tp::MemoryPrefetch,
        _ => return None,
    })
}

/// The `operation` label of `memcache_http_request_duration_seconds` for a request to
/// `route` (`None`: no route matched) with `method`. docs/metrics.md lists them.
pub fn request_op(route: Option<Route>, method: Method) -> ReqOp {
    let Some(route) = route else {
        return ReqOp::Other;
    };
    match (route, method) {
        (Route::Objects, Method::Put) => ReqOp::Put,
        (Route::Objects, Method::Get | Method::Head) => ReqOp::Get,
        (Route::Objects | Route::Key, Method::Delete) => ReqOp::Remove,
        (Route::ObjectsExist, _) => ReqOp::Exist,
        (Route::QueryKey, _) => ReqOp::Query,
        (Route::AllKeys, _) => ReqOp::RemoveAll,
        (Route::ObjectsBatchPut, _) => ReqOp::BatchPut,
        (Route::ObjectsBatchGet, _) => ReqOp::BatchGet,
        (Route::ObjectsBatchExist, _) => ReqOp::BatchExist,
        (Route::BatchQueryKeys, _) => ReqOp::BatchQuery,
        (Route::ObjectsBatchRemove, _) => ReqOp::BatchRemove,
        (Route::Metadata, _) => ReqOp::Metadata,
        (Route::GetAllKeys, _) => ReqOp::GetAllKeys,
        (
            Route::GetAllSegments
            | Route::QuerySegment
            | Route::SegmentStatus
            | Route::CapacityUsage
            | Route::SegmentRemaining
            | Route::SegmentsMount
            | Route::SegmentsUnmount,
            _,
        ) => ReqOp::Segments,
        (Route::MemoryEvict | Route::MemoryPrefetch, _) => ReqOp::Memory,
        (Route::Metrics | Route::MetricsSummary | Route::MetricsPtracer, _) => ReqOp::Scrape,
        (
            Route::Health
            | Route::Ready
            | Route::Healthz
            | Route::Role
            | Route::HaStatus
            | Route::Leader,
            _,
        ) => ReqOp::Health,
        _ => ReqOp::Other,
    }
}

pub use objects::Filled;

/// Whether a request's body is streamed into its destination as it arrives instead of being
/// buffered first: a single-object put large enough for the copy and the buffer to matter.
pub fn streams_body(route: Route, method: Method, len: u64) -> bool {
    route == Route::Objects && method == Method::Put && len >= crate::limits::STREAM_BODY_MIN_BYTES
}

/// `PUT /api/v1/objects` with a body that is still arriving: `fill` moves it into the granted
/// blobs (or consumes it when the put fails first). `None`: the connection broke mid-body.
pub async fn put_streamed(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    size: u64,
    fill: impl AsyncFnOnce(Option<&crate::shards::WriteGrant>) -> Filled,
) -> Option<Response> {
    let span = ctx.shard.remote().tracer.begin(Tp::Put);
    let start = req.dispatched;
    let resp = match object_key(req, ctx, "key") {
        Ok(key) => objects::put(req, ctx, key, size, start, fill).await,
        Err(r) => objects::consumed(ctx, fill, r).await,
    };
    span.end(resp.as_ref().is_some_and(|r| !r.failed));
    resp
}

pub async fn handle(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    let shard: &Rc<Shard> = ctx.shard;
    let span = tracepoint(req.route, req.head.method).map(|tp| shard.remote().tracer.begin(tp));
    let resp = route(req, ctx).await;
    if let Some(span) = span {
        span.end(!resp.failed);
    }
    resp
}

async fn route(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Response {
    if ctx.shard.shared.config.cluster.role == crate::config::Role::Local
        && !req.route.served_by_local_service()
    {
        return ctx.protocol_error(
            Status::FORBIDDEN,
            "This is a local service: it serves objects under its meta service's grants, its health and its metrics; send other requests to the meta service",
        );
    }
    match req.route {
        Route::Metadata => meta::metadata(req, ctx).await,
        Route::Health => meta::health(ctx),
        Route::Role => meta::role(ctx),
        Route::HaStatus => meta::ha_status(ctx),
        Route::Leader => meta::leader(ctx),
        Route::Healthz => Response::text("ok"),
        Route::Ready => meta::ready(ctx),
        Route::OpenApi => meta::openapi(ctx),
        Route::QueryKey => keys::query_key(req, ctx).await,
        Route::BatchQueryKeys => keys::batch_query_keys(req, ctx).await,
        Route::Key => keys::delete_key(req, ctx).await,
        Route::AllKeys => keys::delete_all_keys(ctx).await,
        Route::GetAllKeys => keys::get_all_keys(req, ctx),
        Route::GetAllSegments => segments::get_all_segments(ctx),
        Route::QuerySegment => segments::query_segment(req, ctx),
        Route::SegmentStatus => segments::segment_status(req, ctx),
        Route::CapacityUsage => segments::capacity_usage(ctx),
        Route::SegmentRemaining => segments::segment_remaining(ctx),
        Route::DrainJobs | Route::DrainJobsQuery | Route::DrainJobsCancel => {
            ctx.refuse(Refusal::of(ErrorKind::Unsupported))
        }
        Route::MemoryEvict => memory::evict(req, ctx).await,
        Route::MemoryPrefetch => memory::prefetch(req, ctx).await,
        Route::Objects => objects::object(req, ctx).await,
        Route::ObjectsExist => objects::exist(req, ctx).await,
        Route::ObjectsBatchPut => objects::batch_put(req, ctx).await,
        Route::ObjectsBatchGet => objects::batch_get(req, ctx).await,
        Route::ObjectsBatchExist => objects::batch_exist(req, ctx).await,
        Route::ObjectsBatchRemove => objects::batch_remove(req, ctx).await,
        Route::SegmentsMount => segments::mount(req, ctx).await,
        // Boxed, as the leave below: rare requests whose futures are large, and every
        // connection's task is sized for the largest state it may reach.
        Route::SegmentsUnmount => Box::pin(segments::unmount(req, ctx)).await,
        Route::Metrics => scrape::metrics(req, ctx),
        Route::MetricsSummary => scrape::summary(ctx),
        Route::MetricsPtracer => scrape::ptracer(ctx, false),
        Route::AllocFreeLatency => scrape::ptracer(ctx, true),
        Route::KvEventsStatus => scrape::kv_events_status(ctx),
        Route::KvEventsPublisher => scrape::kv_events_publisher(ctx),
        Route::Ui => meta::ui(),
        Route::Root => meta::root(),
        Route::ClusterJoin => cluster::join(req, ctx).await,
        Route::ClusterHeartbeat => cluster::heartbeat(req, ctx).await,
        Route::ClusterCommit => remote::cluster_commit(req, ctx).await,
        Route::ClusterLeave => Box::pin(cluster::leave(req, ctx)).await,
        Route::ClusterMove => tier::cluster_move(req, ctx).await,
        Route::ClusterFreed => freed::receive(req, ctx).await,
        Route::ClusterDamaged => tier::cluster_damaged(req, ctx).await,
    }
}

/// An optional query parameter, percent-decoded. A malformed escape is a 400.
fn optional<'q>(
    req: &Request<'q>,
    ctx: &mut Ctx<'_>,
    name: &str,
) -> Result<Option<Cow<'q, [u8]>>, Response> {
    query::param(req.head.query, name).map_err(|query::BadEscape| {
        ctx.protocol_error(
            Status::BAD_REQUEST,
            "Malformed query string: invalid percent-encoding",
        )
    })
}

/// A required query parameter: present and non-empty, else the contract's
/// `Missing '<name>' parameter`.
fn required<'q>(
    req: &Request<'q>,
    ctx: &mut Ctx<'_>,
    name: &str,
) -> Result<Cow<'q, [u8]>, Response> {
    match optional(req, ctx, name)? {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(ctx.business_error(
            ErrorKind::InvalidParam,
            &format!("Missing '{name}' parameter"),
        )),
    }
}

/// A required key within the key limit (any bytes: `/metadata` keys).
fn required_key(req: &Request<'_>, ctx: &mut Ctx<'_>, name: &str) -> Result<Box<[u8]>, Response> {
    Ok(required_key_ref(req, ctx, name)?
        .into_owned()
        .into_boxed_slice())
}

/// As `required_key`, borrowed from the request when it has no escape (for a read answered
/// without a command, which needs no key of its own).
fn required_key_ref<'q>(
    req: &Request<'q>,
    ctx: &mut Ctx<'_>,
    name: &str,
) -> Result<Cow<'q, [u8]>, Response> {
    let k = required(req, ctx, name)?;
    if k.len() > MAX_KEY_BYTES {
        return Err(ctx.business_error(
            ErrorKind::InvalidParam,
            &format!("Key too long (max {MAX_KEY_BYTES} bytes)"),
        ));
    }
    Ok(k)
}

/// A required object key: within the limit, UTF-8, no control characters.
fn object_key(req: &Request<'_>, ctx: &mut Ctx<'_>, name: &str) -> Result<Box<[u8]>, Response> {
    let k = required_key(req, ctx, name)?;
    check_object_key(&k, ctx)?;
    Ok(k)
}

fn check_object_key(k: &[u8], ctx: &mut Ctx<'_>) -> Result<(), Response> {
    if k.len() > MAX_KEY_BYTES {
        return Err(ctx.business_error(
            ErrorKind::InvalidParam,
            &format!("Key too long (max {MAX_KEY_BYTES} bytes)"),
        ));
    }
    object_keys::validate(k).map_err(|m| ctx.business_error(ErrorKind::InvalidParam, m))
}

/// A comma-separated list (`keys=a,b`): split first, then each item percent-decoded, so a
/// key may contain an encoded comma (`%2C`). Empty items are skipped.
fn list_param(
    req: &Request<'_>,
    ctx: &mut Ctx<'_>,
    name: &str,
) -> Result<Vec<Box<[u8]>>, Response> {
    let raw = raw_param(req.head.query, name);
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Err(ctx.business_error(
            ErrorKind::InvalidParam,
            &format!("Missing '{name}' parameter"),
        ));
    };
    let mut out = Vec::new();
    for item in raw.split(|&b| b == b',') {
        let item = query::decode(item).map_err(|query::BadEscape| {
            ctx.protocol_error(
                Status::BAD_REQUEST,
                "Malformed query string: invalid percent-encoding",
            )
        })?;
        if item.is_empty() {
            continue;
        }
        if out.len() == MAX_BATCH_KEYS {
            return Err(ctx.business_error(
                ErrorKind::InvalidParam,
                &format!("Too many keys (max {MAX_BATCH_KEYS} per request)"),
            ));
        }
        out.push(item.into_owned().into_boxed_slice());
    }
    Ok(out)
}

/// Whether a route's POST form may carry its keys as a JSON body `{"keys":[…]}`: every batch
/// route but `batch_put` (whose body is the objects' bytes). The URI's 8 KiB cannot hold the
/// 4096 keys a batch may name.
fn takes_keys_body(route: Route) -> bool {
    matches!(
        route,
        Route::BatchQueryKeys
            | Route::ObjectsBatchGet
            | Route::ObjectsBatchExist
            | Route::ObjectsBatchRemove
    )
}

/// The keys of a batch request: `keys=a,b` in the query, or (POST, [`takes_keys_body`]) a
/// JSON body `{"keys":["a","b"]}`. Not validated as object keys here. A POST with both is
/// refused rather than guessing which one the client meant.
fn batch_key_list(req: &Request<'_>, ctx: &mut Ctx<'_>) -> Result<Vec<Box<[u8]>>, Response> {
    if req.head.method != Method::Post || !takes_keys_body(req.route) || req.body.is_empty() {
        return list_param(req, ctx, "keys");
    }
    if raw_param(req.head.query, "keys").is_some() {
        return Err(ctx.business_error(
            ErrorKind::InvalidParam,
            "Give 'keys' either in the query or in a JSON body, not both",
        ));
    }
    crate::http::bodies::parse_batch_keys(req.head.content_type, req.body).map_err(|e| match e {
        crate::http::bodies::BodyError::MediaType => ctx.protocol_error(
            Status::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type: expected Content-Type: application/json",
        ),
        crate::http::bodies::BodyError::Invalid(m) => {
            ctx.business_error(ErrorKind::InvalidParam, &m)
        }
    })
}

/// The raw (still percent-encoded) value of the first parameter `name`.
fn raw_param<'q>(query: &'q [u8], name: &str) -> Option<&'q [u8]> {
    query.split(|&b| b == b'&').find_map(|pair| {
        let (n, v) = match memchr::memchr(b'=', pair) {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        (query::decode(n).ok()?.as_ref() == name.as_bytes()).then_some(v)
    })
}

/// Parses an unsigned integer parameter within a range; the message names what is allowed.
fn parse_uint(v: &[u8], min: u64, max: u64) -> Option<u64> {
    let n: u64 = std::str::from_utf8(v).ok()?.trim().parse().ok()?;
    (min..=max).contains(&n).then_some(n)
}
