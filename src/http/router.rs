//! The closed set of routes: path → [`Route`], and the methods each route answers.
//!
//! [`ROUTES`] is the single table of what the server serves. The `Allow` header of a 405, the
//! OPTIONS answer and the test that keeps `openapi.json` true all read it.

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
}

pub struct RouteSpec {
    pub path: &'static str,
    pub route: Route,
    /// Methods served; HEAD is implied wherever GET is listed.
    pub methods: &'static [Method],
    /// The `Allow` header value: the methods, HEAD where GET is, and OPTIONS.
    pub allow: &'static str,
}

use Method::{Delete, Get, Put};

/// Every route, in the order of [`Route`]'s variants.
pub static ROUTES: &[RouteSpec] = &[
    RouteSpec {
        path: "/metadata",
        route: Route::Metadata,
        methods: &[Get, Put, Delete],
        allow: "GET, HEAD, PUT, DELETE, OPTIONS",
    },
    RouteSpec {
        path: "/health",
        route: Route::Health,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/role",
        route: Route::Role,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/ha_status",
        route: Route::HaStatus,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/leader",
        route: Route::Leader,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/healthz",
        route: Route::Healthz,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/ready",
        route: Route::Ready,
        methods: &[Get],
        allow: GET_ONLY,
    },
    RouteSpec {
        path: "/openapi.json",
        route: Route::OpenApi,
        methods: &[Get],
        allow: GET_ONLY,
    },
];

const GET_ONLY: &str = "GET, HEAD, OPTIONS";

impl Route {
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
