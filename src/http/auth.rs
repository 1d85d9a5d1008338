//! Bearer-token authentication, as the gateway convention (`docs/contract/gateway-http.zh.txt`)
//! has it. `/healthz`, `/ready` and `/openapi.json` are public. With `ock.mmc.http.auth_token`
//! set, every other route needs `Authorization: Bearer <token>`. The scrape routes
//! (`/metrics`, `/metrics/summary`, `/metrics/ptracer`, `/api/v1/analysis/alloc_free_latency`)
//! need `ock.mmc.http.metrics_token` when it is set (so a scraper never holds the data token),
//! else the data token when that is set (with `auth_token` configured `/metrics` is never
//! open), else nothing. Tokens are compared in constant time.

use super::parse::Head;
use super::router::{self, Route};
use crate::config::Config;

/// The realm in `WWW-Authenticate`.
pub const CHALLENGE: &str = "Bearer realm=\"memcache\"";

pub struct Auth {
    data: Option<Box<[u8]>>,
    metrics: Option<Box<[u8]>>,
    shared: Option<Box<[u8]>>,
}

/// Which token a path needs.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    Nothing,
    Data,
    Metrics,
    /// The cluster token: the routes between a meta and its local services.
    Shared,
}

/// Which token a route needs: `/healthz`, `/ready` and `/openapi.json` none, the scrape
/// routes the metrics token (the data token when no metrics token is set), everything else
/// (unknown paths too) the data token.
fn need(route: Option<Route>) -> Need {
    match route {
        Some(Route::Healthz | Route::Ready | Route::OpenApi) => Need::Nothing,
        Some(r) if r.is_metrics() => Need::Metrics,
        Some(r) if r.is_cluster() => Need::Shared,
        _ => Need::Data,
    }
}

/// An object request carrying a grant is authorized by the grant (checked by the handler:
/// signed by the meta service, bound to the key, blob and operation), not by a token.
fn carries_grant(head: &Head<'_>) -> bool {
    head.path == b"/api/v1/objects" && memchr::memmem::find(head.query, b"grant=").is_some()
}

/// The bearer scheme the server enforces on `route` with `config`'s tokens, named as in the
/// OpenAPI document (`dataToken`, `metricsToken`), or `None` when the route is open: a route
/// is open when it needs no token or when the token it needs is not configured.
pub fn scheme_for(config: &Config, route: Route) -> Option<&'static str> {
    match need(Some(route)) {
        Need::Nothing => None,
        Need::Data => (!config.http.auth_token.is_empty()).then_some(DATA_SCHEME),
        Need::Metrics if !config.http.metrics_token.is_empty() => Some(METRICS_SCHEME),
        Need::Metrics => (!config.http.auth_token.is_empty()).then_some(DATA_SCHEME),
        Need::Shared => (!config.cluster.token.is_empty()).then_some(CLUSTER_SCHEME),
    }
}

/// The OpenAPI security scheme of `ock.mmc.http.auth_token`.
pub const DATA_SCHEME: &str = "dataToken";
/// The OpenAPI security scheme of `ock.mmc.http.metrics_token`.
pub const METRICS_SCHEME: &str = "metricsToken";
/// The OpenAPI security scheme of `ock.mmc.cluster.token`.
pub const CLUSTER_SCHEME: &str = "clusterToken";

impl Auth {
    pub fn new(config: &Config) -> Auth {
        let some = |t: &str| (!t.is_empty()).then(|| t.as_bytes().into());
        Auth {
            data: some(&config.http.auth_token),
            metrics: some(&config.http.metrics_token),
            shared: some(&config.cluster.token),
        }
    }

    /// Whether the request may proceed.
    pub fn allows(&self, head: &Head<'_>) -> bool {
        let expected = match need(router::lookup(head.path)) {
            Need::Nothing => return true,
            Need::Data if carries_grant(head) => return true,
            Need::Data => &self.data,
            Need::Metrics if self.metrics.is_some() => &self.metrics,
            Need::Metrics => &self.data,
            Need::Shared => &self.shared,
        };
        let Some(expected) = expected else {
            return true;
        };
        head.authorization
            .and_then(bearer)
            .is_some_and(|t| constant_time_eq(t, expected))
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive).
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ' || b == b'\t')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let t = super::parse::trim(rest);
    (!t.is_empty()).then_some(t)
}

/// Compares without an early exit: the time depends only on the expected token's length.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = (given.len() != expected.len()) as u8;
    for (i, &e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse::{Parsed, parse_head};

    fn auth(data: &str, metrics: &str) -> Auth {
        let mut c = Config::defaults();
        c.set("ock.mmc.http.auth_token", data).unwrap();
        c.set("ock.mmc.http.metrics_token", metrics).unwrap();
        Auth::new(&c)
    }

    fn allows(a: &Auth, req: &str) -> bool {
        match parse_head(req.as_bytes()) {
            Parsed::Complete(h) => a.allows(&h),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn routes_and_tokens() {
        let a = auth("data-token", "scrape-token");
        assert!(allows(&a, "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(allows(&a, "GET /ready HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(!allows(&a, "GET /health HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(allows(
            &a,
            "GET /health HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer data-token\r\n\r\n"
        ));
        assert!(allows(
            &a,
            "GET /health HTTP/1.1\r\nHost: h\r\nAuthorization: bearer   data-token \r\n\r\n"
        ));
        assert!(!allows(
            &a,
            "GET /health HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer data-tokeN\r\n\r\n"
        ));
        assert!(!allows(
            &a,
            "GET /health HTTP/1.1\r\nHost: h\r\nAuthorization: Basic data-token\r\n\r\n"
        ));
        assert!(!allows(
            &a,
            "GET /metrics HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer data-token\r\n\r\n"
        ));
        assert!(allows(
            &a,
            "GET /metrics/summary HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer scrape-token\r\n\r\n"
        ));
        assert!(!allows(
            &a,
            "GET /health HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer scrape-token\r\n\r\n"
        ));
        assert!(
            !allows(&a, "GET /unknown HTTP/1.1\r\nHost: h\r\n\r\n"),
            "unknown paths need the data token"
        );
        let open = auth("", "");
        assert!(allows(&open, "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n"));
        let data_only = auth("d", "");
        assert!(
            !allows(&data_only, "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n"),
            "with auth_token set, /metrics needs a bearer too (the gateway convention)"
        );
        assert!(allows(
            &data_only,
            "GET /metrics/summary HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer d\r\n\r\n"
        ));
        let metrics_only = auth("", "m");
        assert!(allows(
            &metrics_only,
            "GET /health HTTP/1.1\r\nHost: h\r\n\r\n"
        ));
        assert!(!allows(
            &metrics_only,
            "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n"
        ));
        // The document is public whatever the tokens (the gateway convention).
        for a in [&a, &data_only, &metrics_only] {
            assert!(allows(a, "GET /openapi.json HTTP/1.1\r\nHost: h\r\n\r\n"));
        }
    }

    /// `scheme_for` (what the OpenAPI document says) and `allows` (what the server does)
    /// agree on every route under every combination of tokens.
    #[test]
    fn documented_security_matches_enforcement() {
        for (data, metrics) in [("", ""), ("d", ""), ("", "m"), ("d", "m")] {
            let a = auth(data, metrics);
            let mut c = Config::defaults();
            c.set("ock.mmc.http.auth_token", data).unwrap();
            c.set("ock.mmc.http.metrics_token", metrics).unwrap();
            for spec in router::ROUTES {
                let req = format!("GET {} HTTP/1.1\r\nHost: h\r\n\r\n", spec.path);
                let secured = scheme_for(&c, spec.route).is_some();
                assert_eq!(
                    secured,
                    !allows(&a, &req),
                    "{} with tokens {data:?}/{metrics:?}",
                    spec.path
                );
            }
        }
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
    }
}
