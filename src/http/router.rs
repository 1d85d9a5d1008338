//! The closed set of routes: path → [`Route`], and the methods each route answers.
//!
//! [`ROUTES`] is the single table of what the server serves. The `Allow` header of a 405, the
//! OPTIONS answer and the generated OpenAPI document ([`super::openapi`]) all read it.

use super::parse::Method;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Metadata,
    Health,
    Role,
    HaStatus,
    Leader,
    Healthz,
    Ready,
    OpenApi,
    QueryKey,
    BatchQueryKeys,
    Key,
    AllKeys,
    GetAllKeys,
    GetAllSegments,
    QuerySegment,
    SegmentStatus,
    CapacityUsage,
    SegmentRemaining,
    DrainJobs,
    DrainJobsQuery,
    DrainJobsCancel,
    MemoryEvict,
    MemoryPrefetch,
    Objects,
    ObjectsExist,
    ObjectsBatchPut,
    ObjectsBatchGet,
    ObjectsBatchExist,
    ObjectsBatchRemove,
    SegmentsMount,
    SegmentsUnmount,
    Metrics,
    MetricsSummary,
    MetricsPtracer,
    AllocFreeLatency,
    KvEventsStatus,
    KvEventsPublisher,
    Ui,
    ClusterJoin,
    ClusterHeartbeat,
    ClusterCommit,
    ClusterLeave,
    ClusterMove,
    ClusterDamaged,
}

pub struct RouteSpec {
    pub path: &'static str,
    pub route: Route,
    /// Methods served; HEAD is implied wherever GET is listed.
    pub methods: &'static [Method],
    /// The `Allow` header value: the methods, HEAD where GET is, and OPTIONS.
    pub allow: &'static str,
}

use Method::{Delete, Get, Post, Put};

const GET_ONLY: &str = "GET, HEAD, OPTIONS";
const POST_ONLY: &str = "POST, OPTIONS";
const DELETE_ONLY: &str = "DELETE, OPTIONS";

const fn get(path: &'static str, route: Route) -> RouteSpec {
    RouteSpec {
        path,
        route,
        methods: &[Get],
        allow: GET_ONLY,
    }
}

/// A batch read: GET with `keys=` in the query, or POST with the keys in a JSON body (more
/// keys than a URI holds).
const fn get_or_post(path: &'static str, route: Route) -> RouteSpec {
    RouteSpec {
        path,
        route,
        methods: &[Get, Post],
        allow: "GET, HEAD, POST, OPTIONS",
    }
}

const fn post(path: &'static str, route: Route) -> RouteSpec {
    RouteSpec {
        path,
        route,
        methods: &[Post],
        allow: POST_ONLY,
    }
}

/// Every route, in the order of [`Route`]'s variants.
pub static ROUTES: &[RouteSpec] = &[
    RouteSpec {
        path: "/metadata",
        route: Route::Metadata,
        methods: &[Get, Put, Delete],
        allow: "GET, HEAD, PUT, DELETE, OPTIONS",
    },
    get("/health", Route::Health),
    get("/role", Route::Role),
    get("/ha_status", Route::HaStatus),
    get("/leader", Route::Leader),
    get("/healthz", Route::Healthz),
    get("/ready", Route::Ready),
    get("/openapi.json", Route::OpenApi),
    get("/query_key", Route::QueryKey),
    get_or_post("/batch_query_keys", Route::BatchQueryKeys),
    RouteSpec {
        path: "/key",
        route: Route::Key,
        methods: &[Delete],
        allow: DELETE_ONLY,
    },
    RouteSpec {
        path: "/all_keys",
        route: Route::AllKeys,
        methods: &[Delete],
        allow: DELETE_ONLY,
    },
    get("/get_all_keys", Route::GetAllKeys),
    get("/get_all_segments", Route::GetAllSegments),
    get("/query_segment", Route::QuerySegment),
    get("/api/v1/segments/status", Route::SegmentStatus),
    get("/api/v1/capacity/usage", Route::CapacityUsage),
    get(
        "/api/v1/capacity/segment_remaining",
        Route::SegmentRemaining,
    ),
    post("/api/v1/drain_jobs", Route::DrainJobs),
    get("/api/v1/drain_jobs/query", Route::DrainJobsQuery),
    post("/api/v1/drain_jobs/cancel", Route::DrainJobsCancel),
    post("/memory/evict", Route::MemoryEvict),
    post("/memory/prefetch", Route::MemoryPrefetch),
    RouteSpec {
        path: "/api/v1/objects",
        route: Route::Objects,
        methods: &[Get, Put, Delete],
        allow: "GET, HEAD, PUT, DELETE, OPTIONS",
    },
    get("/api/v1/objects/exist", Route::ObjectsExist),
    post("/api/v1/objects/batch_put", Route::ObjectsBatchPut),
    get_or_post("/api/v1/objects/batch_get", Route::ObjectsBatchGet),
    get_or_post("/api/v1/objects/batch_exist", Route::ObjectsBatchExist),
    post("/api/v1/objects/batch_remove", Route::ObjectsBatchRemove),
    post("/api/v1/segments/mount", Route::SegmentsMount),
    post("/api/v1/segments/unmount", Route::SegmentsUnmount),
    get("/metrics", Route::Metrics),
    get("/metrics/summary", Route::MetricsSummary),
    get("/metrics/ptracer", Route::MetricsPtracer),
    get(
        "/api/v1/analysis/alloc_free_latency",
        Route::AllocFreeLatency,
    ),
    get("/kv_events/status", Route::KvEventsStatus),
    get("/kv_events/publisher", Route::KvEventsPublisher),
    get("/ui", Route::Ui),
    post("/cluster/v1/join", Route::ClusterJoin),
    post("/cluster/v1/heartbeat", Route::ClusterHeartbeat),
    post("/cluster/v1/commit", Route::ClusterCommit),
    post("/cluster/v1/leave", Route::ClusterLeave),
    post("/cluster/v1/move", Route::ClusterMove),
    post("/cluster/v1/damaged", Route::ClusterDamaged),
];

impl Route {
    /// The scrape routes, guarded by the metrics token.
    pub fn is_metrics(self) -> bool {
        matches!(
            self,
            Route::Metrics
                | Route::MetricsSummary
                | Route::MetricsPtracer
                | Route::AllocFreeLatency
        )
    }

    /// Routes a standby answers itself (HA on): health, readiness, the HA facts and its own
    /// metrics. Every other route is the leader's.
    pub fn served_by_standby(self) -> bool {
        matches!(
            self,
            Route::Health
                | Route::Healthz
                | Route::Ready
                | Route::Role
                | Route::HaStatus
                | Route::Leader
                | Route::Metrics
        )
    }

    /// The routes between a meta service and its local services, guarded by the cluster token.
    pub fn is_cluster(self) -> bool {
        matches!(
            self,
            Route::ClusterJoin
                | Route::ClusterHeartbeat
                | Route::ClusterCommit
                | Route::ClusterLeave
                | Route::ClusterMove
                | Route::ClusterDamaged
        )
    }

    /// What a local service serves: its own health and metrics, and objects under grants.
    pub fn served_by_local_service(self) -> bool {
        matches!(
            self,
            Route::Health
                | Route::Healthz
                | Route::Ready
                | Route::Role
                | Route::OpenApi
                | Route::Objects
                | Route::ClusterMove
        ) || self.is_metrics()
    }

    pub fn spec(self) -> &'static RouteSpec {
        &ROUTES[self as usize]
    }

    /// Whether the route answers `method` (HEAD wherever GET; OPTIONS everywhere).
    pub fn allows(self, method: Method) -> bool {
        let methods = self.spec().methods;
        match method {
            Method::Options => true,
            Method::Head => methods.contains(&Method::Get),
            m => methods.contains(&m),
        }
    }
}

/// The route serving `path`, if any. A `match` on the bytes compiles to a length switch and a
/// comparison, cheaper than scanning the table on every request.
pub fn lookup(path: &[u8]) -> Option<Route> {
    Some(match path {
        b"/metadata" => Route::Metadata,
        b"/health" => Route::Health,
        b"/role" => Route::Role,
        b"/ha_status" => Route::HaStatus,
        b"/leader" => Route::Leader,
        b"/healthz" => Route::Healthz,
        b"/ready" => Route::Ready,
        b"/openapi.json" => Route::OpenApi,
        b"/query_key" => Route::QueryKey,
        b"/batch_query_keys" => Route::BatchQueryKeys,
        b"/key" => Route::Key,
        b"/all_keys" => Route::AllKeys,
        b"/get_all_keys" => Route::GetAllKeys,
        b"/get_all_segments" => Route::GetAllSegments,
        b"/query_segment" => Route::QuerySegment,
        b"/api/v1/segments/status" => Route::SegmentStatus,
        b"/api/v1/capacity/usage" => Route::CapacityUsage,
        b"/api/v1/capacity/segment_remaining" => Route::SegmentRemaining,
        b"/api/v1/drain_jobs" => Route::DrainJobs,
        b"/api/v1/drain_jobs/query" => Route::DrainJobsQuery,
        b"/api/v1/drain_jobs/cancel" => Route::DrainJobsCancel,
        b"/memory/evict" => Route::MemoryEvict,
        b"/memory/prefetch" => Route::MemoryPrefetch,
        b"/api/v1/objects" => Route::Objects,
        b"/api/v1/objects/exist" => Route::ObjectsExist,
        b"/api/v1/objects/batch_put" => Route::ObjectsBatchPut,
        b"/api/v1/objects/batch_get" => Route::ObjectsBatchGet,
        b"/api/v1/objects/batch_exist" => Route::ObjectsBatchExist,
        b"/api/v1/objects/batch_remove" => Route::ObjectsBatchRemove,
        b"/api/v1/segments/mount" => Route::SegmentsMount,
        b"/api/v1/segments/unmount" => Route::SegmentsUnmount,
        b"/metrics" => Route::Metrics,
        b"/metrics/summary" => Route::MetricsSummary,
        b"/metrics/ptracer" => Route::MetricsPtracer,
        b"/api/v1/analysis/alloc_free_latency" => Route::AllocFreeLatency,
        b"/kv_events/status" => Route::KvEventsStatus,
        b"/kv_events/publisher" => Route::KvEventsPublisher,
        b"/ui" => Route::Ui,
        b"/cluster/v1/join" => Route::ClusterJoin,
        b"/cluster/v1/heartbeat" => Route::ClusterHeartbeat,
        b"/cluster/v1/commit" => Route::ClusterCommit,
        b"/cluster/v1/leave" => Route::ClusterLeave,
        b"/cluster/v1/move" => Route::ClusterMove,
        b"/cluster/v1/damaged" => Route::ClusterDamaged,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookup_and_allow_agree() {
        for (i, spec) in ROUTES.iter().enumerate() {
            assert_eq!(spec.route as usize, i, "{} is out of order", spec.path);
            assert_eq!(
                lookup(spec.path.as_bytes()),
                Some(spec.route),
                "{}",
                spec.path
            );
            let mut allow: Vec<&str> = Vec::new();
            for m in spec.methods {
                allow.push(m.as_str());
                if *m == Method::Get {
                    allow.push("HEAD");
                }
            }
            allow.push("OPTIONS");
            assert_eq!(spec.allow, allow.join(", "), "{}", spec.path);
        }
        assert_eq!(lookup(b"/nope"), None);
        assert_eq!(lookup(b"/metadata/"), None);
    }

    #[test]
    fn head_follows_get() {
        assert!(Route::Health.allows(Method::Head));
        assert!(!Route::Health.allows(Method::Put));
        assert!(Route::Metadata.allows(Method::Delete));
        assert!(Route::Ready.allows(Method::Options));
    }
}
