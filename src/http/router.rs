//! The closed set of routes: path → [`Route`], and the methods each route answers.
//!
//! [`ROUTES`] is the single table of what the server serves. The `Allow` header of a 405, the
//! OPTIONS answer and the generated OpenAPI document ([`super::openapi`]) all read it.

use super::parse::Method;

pub struct RouteSpec {
    pub path: &'static str,
    pub route: Route,
    /// Methods served; HEAD is implied wherever GET is listed.
    pub methods: &'static [Method],
    /// The `Allow` header value: the methods, HEAD where GET is, and OPTIONS.
    pub allow: &'static str,
}

use Method::{Delete, Get, Post, Put};

/// The methods a route serves and its `Allow` header.
type Methods = (&'static [Method], &'static str);

const GET: Methods = (&[Get], "GET, HEAD, OPTIONS");
const POST: Methods = (&[Post], "POST, OPTIONS");
const DELETE: Methods = (&[Delete], "DELETE, OPTIONS");
/// A batch read: GET with `keys=` in the query, or POST with the keys in a JSON body (more
/// keys than a URI holds).
const GET_OR_POST: Methods = (&[Get, Post], "GET, HEAD, POST, OPTIONS");
const GET_PUT_DELETE: Methods = (&[Get, Put, Delete], "GET, HEAD, PUT, DELETE, OPTIONS");

/// A path of the table as text (they are ASCII).
const fn path_text(path: &'static [u8]) -> &'static str {
    match std::str::from_utf8(path) {
        Ok(p) => p,
        Err(_) => panic!("a route's path is ASCII"),
    }
}

/// Makes [`Route`], [`ROUTES`] and [`lookup`] from one list, so each path is written once.
macro_rules! routes {
    ($($path:literal => $route:ident, $methods:expr;)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Route {
            $($route,)*
        }

        /// Every route, in the order of [`Route`]'s variants.
        pub static ROUTES: &[RouteSpec] = &[$(
            RouteSpec {
                path: path_text($path),
                route: Route::$route,
                methods: $methods.0,
                allow: $methods.1,
            },
        )*];

        /// The route serving `path`, if any. A `match` on the bytes compiles to a length
        /// switch and a comparison, cheaper than scanning the table on every request.
        pub fn lookup(path: &[u8]) -> Option<Route> {
            Some(match path {
                $($path => Route::$route,)*
                _ => return None,
            })
        }
    };
}

routes! {
    b"/metadata" => Metadata, GET_PUT_DELETE;
    b"/health" => Health, GET;
    b"/role" => Role, GET;
    b"/ha_status" => HaStatus, GET;
    b"/leader" => Leader, GET;
    b"/healthz" => Healthz, GET;
    b"/ready" => Ready, GET;
    b"/openapi.json" => OpenApi, GET;
    b"/query_key" => QueryKey, GET;
    b"/batch_query_keys" => BatchQueryKeys, GET_OR_POST;
    b"/key" => Key, DELETE;
    b"/all_keys" => AllKeys, DELETE;
    b"/get_all_keys" => GetAllKeys, GET;
    b"/get_all_segments" => GetAllSegments, GET;
    b"/query_segment" => QuerySegment, GET;
    b"/api/v1/segments/status" => SegmentStatus, GET;
    b"/api/v1/capacity/usage" => CapacityUsage, GET;
    b"/api/v1/capacity/segment_remaining" => SegmentRemaining, GET;
    b"/api/v1/drain_jobs" => DrainJobs, POST;
    b"/api/v1/drain_jobs/query" => DrainJobsQuery, GET;
    b"/api/v1/drain_jobs/cancel" => DrainJobsCancel, POST;
    b"/memory/evict" => MemoryEvict, POST;
    b"/memory/prefetch" => MemoryPrefetch, POST;
    b"/api/v1/objects" => Objects, GET_PUT_DELETE;
    b"/api/v1/objects/exist" => ObjectsExist, GET;
    b"/api/v1/objects/batch_put" => ObjectsBatchPut, POST;
    b"/api/v1/objects/batch_get" => ObjectsBatchGet, GET_OR_POST;
    b"/api/v1/objects/batch_exist" => ObjectsBatchExist, GET_OR_POST;
    b"/api/v1/objects/batch_remove" => ObjectsBatchRemove, POST;
    b"/api/v1/segments/mount" => SegmentsMount, POST;
    b"/api/v1/segments/unmount" => SegmentsUnmount, POST;
    b"/metrics" => Metrics, GET;
    b"/metrics/summary" => MetricsSummary, GET;
    b"/metrics/ptracer" => MetricsPtracer, GET;
    b"/api/v1/analysis/alloc_free_latency" => AllocFreeLatency, GET;
    b"/kv_events/status" => KvEventsStatus, GET;
    b"/kv_events/publisher" => KvEventsPublisher, GET;
    b"/ui" => Ui, GET;
    b"/" => Root, GET;
    b"/cluster/v1/join" => ClusterJoin, POST;
    b"/cluster/v1/heartbeat" => ClusterHeartbeat, POST;
    b"/cluster/v1/commit" => ClusterCommit, POST;
    b"/cluster/v1/leave" => ClusterLeave, POST;
    b"/cluster/v1/move" => ClusterMove, POST;
    b"/cluster/v1/damaged" => ClusterDamaged, POST;
    b"/cluster/v1/freed" => ClusterFreed, POST;
}

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

    /// What every node answers about itself: health, readiness, role.
    fn is_own_health(self) -> bool {
        matches!(
            self,
            Route::Health | Route::Healthz | Route::Ready | Route::Role
        )
    }

    /// Routes a standby answers itself (HA on): health, readiness, the HA facts and its own
    /// metrics. Every other route is the leader's.
    pub fn served_by_standby(self) -> bool {
        self.is_own_health() || matches!(self, Route::HaStatus | Route::Leader | Route::Metrics)
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
                | Route::ClusterFreed
        )
    }

    /// A local service's membership messages (join, heartbeat, leave): a few per rank per
    /// heartbeat interval, never shed by a busy shard, since a heartbeat answered 429 is no
    /// heartbeat and a live rank would be declared lost and its objects dropped.
    pub fn is_membership(self) -> bool {
        matches!(
            self,
            Route::ClusterJoin | Route::ClusterHeartbeat | Route::ClusterLeave
        )
    }

    /// What a local service serves: its own health, role and HA view (the meta it follows),
    /// its metrics, and objects under grants.
    pub fn served_by_local_service(self) -> bool {
        self.is_own_health()
            || matches!(
                self,
                Route::HaStatus
                    | Route::Leader
                    | Route::OpenApi
                    | Route::Objects
                    | Route::ClusterMove
                    | Route::ClusterFreed
            )
            || self.is_metrics()
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
