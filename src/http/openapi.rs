//! The OpenAPI 3 document served at `/openapi.json`, generated once at start-up
//! ([`crate::http::front_assets`]) for the running configuration.
//!
//! Paths and methods come from the router's table ([`ROUTES`]): a new row is documented
//! without touching this file. Security comes from the auth rules and the configured tokens
//! ([`auth::scheme_for`]): no requirement, and no 401, on a route the server leaves open. The
//! statuses every request can meet (protocol errors, overload, 401 where secured, 415 where
//! the body must be JSON) are added here, with the error envelope and the headers the server
//! sends. Only what is particular to one operation is kept as data, in
//! `openapi_operations.json`: its summary, parameters, request body and success answer
//! (`operations.<path>.<method>`), plus the shared schemas.
//!
//! Adding a route or a method: its `ROUTES` row is enough for the document to list it (with a
//! stub summary); `every_operation_has_a_fragment` then names the fragment to add. A fragment
//! whose request body is only `application/json` gets 415 documented automatically.

use serde_json::{Map, Value, json};

use super::auth;
use super::parse::Method;
use super::router::{ROUTES, Route};
use crate::common::error_kind::ErrorKind;
use crate::config::{Config, Role};

/// Per-operation fragments and the shared schemas.
const OPERATIONS: &str = include_str!("openapi_operations.json");

/// The media type of every JSON answer, the error envelope included.
pub const JSON: &str = "application/json; charset=utf-8";

const ENVELOPE: &str = "#/components/schemas/ErrorEnvelope";

/// The protocol errors any request can meet before a handler runs, each a response in
/// `components/responses`: (status, component name, description).
const PROTOCOL_ERRORS: &[(u16, &str, &str)] = &[
    (
        400,
        "BadRequest",
        "Malformed request line, headers, chunked body or query percent-encoding",
    ),
    (
        413,
        "ContentTooLarge",
        "The body is over the route's limit (answered before it is read; the connection closes)",
    ),
    (414, "UriTooLong", "The request target is too long"),
    (
        417,
        "ExpectationFailed",
        "An `Expect` other than 100-continue",
    ),
    (
        431,
        "HeadersTooLarge",
        "Too many or too large header fields",
    ),
    (
        501,
        "NotImplemented",
        "A transfer coding other than chunked",
    ),
    (505, "HttpVersionNotSupported", "Not HTTP/1.0 or HTTP/1.1"),
];

/// The document for `config`, as served.
pub fn document(config: &Config) -> Vec<u8> {
    serde_json::to_vec(&build(config)).expect("a JSON value serializes")
}

fn build(config: &Config) -> Value {
    let parts: Value = serde_json::from_str(OPERATIONS).expect("openapi_operations.json is JSON");
    let fragments = parts["operations"].as_object().cloned().unwrap_or_default();

    let local = config.cluster.role == Role::Local;
    let mut paths = Map::new();
    let mut schemes_used = Vec::new();
    // A local service documents what it serves; the meta's other routes answer 403 there.
    for spec in ROUTES
        .iter()
        .filter(|r| !local || r.route.served_by_local_service())
    {
        let mut item = Map::new();
        // HEAD is implied by GET and OPTIONS by every path, as HTTP defines them.
        for method in spec.methods.iter().filter(|m| **m != Method::Head) {
            let name = method.as_str().to_ascii_lowercase();
            let mut fragment = fragments.get(spec.path).and_then(|f| f.get(&name)).cloned();
            let granted = local && spec.route == Route::Objects;
            if granted && let Some(f) = &mut fragment {
                under_grant(f, *method);
            }
            // An object request to a local service is authorized by its grant, not a token.
            let scheme = auth::scheme_for(config, spec.route).filter(|_| !granted);
            if let Some(s) = scheme
                && !schemes_used.contains(&s)
            {
                schemes_used.push(s);
            }
            let mut op = operation(spec.path, fragment, scheme);
            if granted {
                add_grant_answers(&mut op, *method);
            }
            if config.ha.enable && !spec.route.served_by_standby() {
                add_standby_answers(&mut op);
            }
            item.insert(name, op);
        }
        paths.insert(spec.path.to_string(), Value::Object(item));
    }

    let mut components = Map::new();
    components.insert("schemas".into(), parts["components"]["schemas"].clone());
    let mut shared = responses();
    if config.ha.enable {
        standby_responses(&mut shared);
    }
    components.insert("responses".into(), shared);
    if !schemes_used.is_empty() {
        let mut schemes = Map::new();
        for s in [
            auth::DATA_SCHEME,
            auth::METRICS_SCHEME,
            auth::CLUSTER_SCHEME,
        ] {
            if schemes_used.contains(&s) {
                let source = match s {
                    auth::DATA_SCHEME => "ock.mmc.http.auth_token (env MMC_API_TOKEN)",
                    auth::METRICS_SCHEME => "ock.mmc.http.metrics_token (env MMC_METRICS_TOKEN)",
                    _ => "ock.mmc.cluster.token (env MMC_CLUSTER_TOKEN)",
                };
                schemes.insert(
                    s.into(),
                    json!({"type": "http", "scheme": "bearer", "description": source}),
                );
            }
        }
        components.insert("securitySchemes".into(), Value::Object(schemes));
    }

    let mut info = parts["info"].clone();
    if let Some(d) = info.get_mut("description") {
        let mut text = format!("{} {}", d.as_str().unwrap_or(""), security_summary(config));
        if local {
            text.push_str(LOCAL_SERVICE);
        }
        *d = Value::String(text);
    }
    if local && let Some(t) = info.get_mut("title") {
        *t = Value::String("MemCache Hybrid local service".into());
    }
    json!({
        "openapi": parts["openapi"],
        "info": info,
        "paths": paths,
        "components": components,
    })
}

/// What the document of a local service (`--role local`) adds to the description.
const LOCAL_SERVICE: &str = " This is a local service: it serves its own health, role and HA view (the meta service it follows), its metrics, and the bytes of its blobs under the grants its meta service signs (clients reach it through the meta's 307 redirects); the meta service's other routes answer 403 here.";

/// An object operation as a local service serves it: under a grant (`key` and `grant`, and
/// for a chain's hop `next`; `traceparent` when the meta's request was traced), its other
/// parameters meaningless there.
fn under_grant(fragment: &mut Value, method: Method) {
    let mut params = vec![
        json!({"name": "key", "in": "query", "required": true, "schema": {"type": "string"},
            "description": "Object key, as the grant names it"}),
        json!({"name": "grant", "in": "query", "required": true, "schema": {"type": "string"},
            "description": "The grant the meta service signed for this transfer (its 307 Location carries it)"}),
    ];
    if method == Method::Put {
        params.push(json!({"name": "next", "in": "query", "required": false,
            "schema": {"type": "string"},
            "description": "The next hop of a replicated put, as the grant was signed with"}));
    }
    params.push(json!({"name": "traceparent", "in": "query", "required": false,
        "schema": {"type": "string", "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"},
        "description": "W3C trace context of the meta's span of the redirected request (its 307 Location carries it when that request was traced, docs/otlp.md): this request's span is its child; it wins over a `traceparent` header; a value that does not parse is ignored"}));
    if let Some(f) = fragment.as_object_mut() {
        f.insert("parameters".into(), Value::Array(params));
        // The meta's redirect to the rank holding the blob: a local service is that rank.
        if let Some(r) = f.get_mut("responses").and_then(Value::as_object_mut) {
            r.remove("307");
        }
    }
}

/// The answers of a local service's object routes beyond their success: 401 without a grant
/// (a delete always: nothing is deleted on a local service), 403 with an invalid one, and for
/// a put the meta's refusal of the commit (502).
fn add_grant_answers(op: &mut Value, method: Method) {
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    responses.insert("401".into(), reference("Unauthorized"));
    if method != Method::Delete {
        responses.insert(
            "403".into(),
            error_response(
                "Invalid grant: a bad signature, expired, for another key, operation or segment",
                &[],
            ),
        );
    }
    if method == Method::Put {
        responses.insert(
            "502".into(),
            error_response(
                "The meta service refused the commit or did not answer it",
                &[],
            ),
        );
    }
    let mut sorted: Vec<(String, Value)> = std::mem::take(responses).into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    *responses = sorted.into_iter().collect();
}

/// One sentence on what this configuration secures.
fn security_summary(config: &Config) -> String {
    let scrape: Vec<&str> = ROUTES
        .iter()
        .filter(|r| r.route.is_metrics())
        .map(|r| r.path)
        .collect();
    let scrape = scrape.join(", ");
    let data = !config.http.auth_token.is_empty();
    let metrics = !config.http.metrics_token.is_empty();
    let data_text = if data {
        "every route but /healthz, /ready, /openapi.json and the scrape routes needs `Authorization: Bearer <ock.mmc.http.auth_token>`"
    } else {
        "no data token is configured: the data routes are open"
    };
    let metrics_text = match (metrics, data) {
        (true, _) => format!("{scrape} need the separate ock.mmc.http.metrics_token"),
        (false, true) => {
            format!("no metrics token is configured: {scrape} need the data token")
        }
        (false, false) => format!("no token is configured: {scrape} are open"),
    };
    let challenge = if data || metrics {
        format!(
            "; a missing or wrong token is answered 401 with `WWW-Authenticate: {}`",
            auth::CHALLENGE
        )
    } else {
        String::new()
    };
    format!("This server: {data_text}; {metrics_text}{challenge}.")
}

/// A response header the server always sends.
fn request_id_header() -> Value {
    json!({
        "description": "The client's X-Request-ID when it sent a valid one, else a generated id",
        "required": true,
        "schema": {"type": "string", "minLength": 1, "maxLength": 128}
    })
}

/// `X-MMC-Error-Code`, the kind of an error envelope (`common::error_kind`): on every error
/// answer (`required`), and on a 200 answer when it is a business error.
fn error_code_header(required: bool) -> Value {
    let kinds: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
    json!({
        "description": "The kind of the error, on every error envelope: a client maps it to its return code without reading error_message (docs/api.md, Errors)",
        "required": required,
        "schema": {"type": "string", "enum": kinds}
    })
}

fn error_response(description: &str, extra_headers: &[(&str, Value)]) -> Value {
    let mut headers = Map::new();
    headers.insert("X-Request-ID".into(), request_id_header());
    headers.insert("X-MMC-Error-Code".into(), error_code_header(true));
    for (name, h) in extra_headers {
        headers.insert((*name).into(), h.clone());
    }
    json!({
        "description": description,
        "headers": headers,
        "content": {JSON: {"schema": {"$ref": ENVELOPE}}}
    })
}

/// `components/responses`: the error answers, with the headers each always carries.
fn responses() -> Value {
    let retry_after = json!({
        "description": "Seconds to wait before retrying",
        "required": true,
        "schema": {"type": "integer", "minimum": 1}
    });
    let mut r = Map::new();
    for (_, name, description) in PROTOCOL_ERRORS {
        r.insert((*name).into(), error_response(description, &[]));
    }
    r.insert(
        "Unauthorized".into(),
        error_response(
            "Missing or invalid bearer token",
            &[(
                "WWW-Authenticate",
                json!({"required": true, "schema": {"type": "string", "enum": [auth::CHALLENGE]}}),
            )],
        ),
    );
    r.insert(
        "UnsupportedMediaType".into(),
        error_response("The body is not `Content-Type: application/json`", &[]),
    );
    r.insert(
        "Overloaded".into(),
        error_response(
            "The shard or the key's owner has too much work waiting, or the connection limit or buffer budget is reached",
            &[("Retry-After", retry_after.clone())],
        ),
    );
    r.insert(
        "NotReady".into(),
        error_response(
            "Not every shard accepts yet, or the server is shutting down",
            &[("Retry-After", retry_after)],
        ),
    );
    // Not used by an operation (no documented operation answers them) but sent for paths
    // and methods outside the document.
    r.insert("NotFound".into(), error_response("No such path", &[]));
    r.insert(
        "MethodNotAllowed".into(),
        error_response(
            "The path does not serve this method",
            &[(
                "Allow",
                json!({"required": true, "schema": {"type": "string"}}),
            )],
        ),
    );
    Value::Object(r)
}

/// With HA on, a node that is not the serving leader answers the leader's routes with a 307
/// to the leader, or 503 when no leader is known.
fn standby_responses(r: &mut Value) {
    let Some(r) = r.as_object_mut() else { return };
    r.insert(
        "NotLeader".into(),
        error_response(
            "HA: this meta is a standby; `Location` is the same path and query on the leader",
            &[(
                "Location",
                json!({"required": true, "schema": {"type": "string"}}),
            )],
        ),
    );
    r.insert(
        "NoLeader".into(),
        error_response(
            "HA: no leader is known (election in progress, etcd unreachable) or the leader is still loading its state",
            &[(
                "Retry-After",
                json!({"description": "Seconds to wait before retrying", "required": true, "schema": {"type": "integer", "minimum": 1}}),
            )],
        ),
    );
}

fn add_standby_answers(op: &mut Value) {
    if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
        responses.insert("307".into(), reference("NotLeader"));
        // A route that answers 503 itself keeps its own description.
        responses
            .entry("503")
            .or_insert_with(|| reference("NoLeader"));
        let mut sorted: Vec<(String, Value)> = std::mem::take(responses).into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        *responses = sorted.into_iter().collect();
    }
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/responses/{name}")})
}

/// One operation: its fragment (or a bare stub for a route without one) with the security,
/// the headers and the error statuses this server really answers.
fn operation(path: &str, fragment: Option<Value>, scheme: Option<&str>) -> Value {
    let mut op = match fragment {
        Some(Value::Object(m)) => m,
        _ => {
            let mut m = Map::new();
            m.insert("summary".into(), Value::String(path.to_string()));
            m
        }
    };
    let mut responses = match op.remove("responses") {
        Some(Value::Object(r)) => r,
        _ => Map::new(),
    };
    if responses.is_empty() {
        responses.insert("200".into(), json!({"description": "Success"}));
    }
    // Every answer carries X-Request-ID; a 200 may be a business error, with its kind.
    for (status, r) in responses.iter_mut() {
        if let Some(r) = r.as_object_mut()
            && !r.contains_key("$ref")
        {
            let headers = r
                .entry("headers")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(h) = headers.as_object_mut() {
                h.entry("X-Request-ID").or_insert_with(request_id_header);
                if status == "200" {
                    h.entry("X-MMC-Error-Code")
                        .or_insert_with(|| error_code_header(false));
                }
            }
        }
    }
    for (status, name, _) in PROTOCOL_ERRORS {
        responses.insert(status.to_string(), reference(name));
    }
    // Every dispatched request may be shed (and any connection refused) with 429.
    responses.insert("429".into(), reference("Overloaded"));
    if json_body_only(&op) {
        responses.insert("415".into(), reference("UnsupportedMediaType"));
    }
    match scheme {
        Some(s) => {
            responses.insert("401".into(), reference("Unauthorized"));
            op.insert("security".into(), json!([{ s: [] }]));
        }
        None => {
            op.insert("security".into(), json!([]));
        }
    }
    let mut sorted: Vec<(String, Value)> = responses.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    op.insert(
        "responses".into(),
        Value::Object(sorted.into_iter().collect()),
    );
    Value::Object(op)
}

/// Whether the operation's body must be JSON: the handler then answers any other
/// `Content-Type` with 415.
fn json_body_only(op: &Map<String, Value>) -> bool {
    op.get("requestBody")
        .and_then(|b| b.get("content"))
        .and_then(Value::as_object)
        .is_some_and(|c| {
            !c.is_empty()
                && c.keys()
                    .all(|k| super::parse::is_json_media_type(k.as_bytes()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn has_fragment(path: &str, method: Method) -> bool {
        let parts: Value = serde_json::from_str(OPERATIONS).unwrap();
        let name = method.as_str().to_ascii_lowercase();
        parts["operations"][path][name].is_object()
    }

    fn config(data: &str, metrics: &str) -> Config {
        let mut c = Config::defaults();
        c.set("ock.mmc.http.auth_token", data).unwrap();
        c.set("ock.mmc.http.metrics_token", metrics).unwrap();
        c
    }

    fn doc(data: &str, metrics: &str) -> Value {
        serde_json::from_slice(&document(&config(data, metrics))).unwrap()
    }

    /// With HA on, the leader's routes may answer 307 (to the leader) and 503 (no leader);
    /// the routes a standby serves itself do not redirect. HA off, nothing redirects.
    #[test]
    fn ha_adds_the_standby_answers() {
        let mut c = Config::defaults();
        c.set("ock.mmc.meta.ha.enable", "true").unwrap();
        let d: Value = serde_json::from_slice(&document(&c)).unwrap();
        let put = &d["paths"]["/metadata"]["put"]["responses"];
        assert_eq!(put["307"]["$ref"], "#/components/responses/NotLeader");
        assert_eq!(put["503"]["$ref"], "#/components/responses/NoLeader");
        let nl = &d["components"]["responses"]["NotLeader"];
        assert!(nl["headers"]["Location"]["required"] == true);
        for p in [
            "/health",
            "/role",
            "/ha_status",
            "/leader",
            "/ready",
            "/healthz",
            "/metrics",
        ] {
            assert!(
                d["paths"][p]["get"]["responses"].get("307").is_none(),
                "{p}"
            );
        }
        let off = doc("", "");
        assert!(
            off["paths"]["/metadata"]["put"]["responses"]
                .get("307")
                .is_none()
        );
        assert!(off["components"]["responses"].get("NotLeader").is_none());
    }

    /// The document describes exactly the router's paths and methods (HEAD and OPTIONS are
    /// implied, as HTTP defines them).
    #[test]
    fn document_matches_the_router() {
        let doc = doc("", "");
        assert_eq!(
            doc["openapi"].as_str().map(|v| v.starts_with("3.")),
            Some(true)
        );
        let paths = doc["paths"].as_object().expect("paths");
        let documented: BTreeSet<(String, String)> = paths
            .iter()
            .flat_map(|(p, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .map(move |m| (p.clone(), m.to_uppercase()))
            })
            .collect();
        let served: BTreeSet<(String, String)> = ROUTES
            .iter()
            .flat_map(|r| {
                r.methods
                    .iter()
                    .filter(|m| **m != Method::Head)
                    .map(|m| (r.path.to_string(), m.as_str().to_string()))
            })
            .collect();
        assert_eq!(documented, served, "the document and the router disagree");
    }

    /// Every operation has its own fragment (summary, parameters, success schema), and no
    /// fragment describes an operation the router does not serve.
    #[test]
    fn every_operation_has_a_fragment() {
        let mut missing = Vec::new();
        for spec in ROUTES {
            for m in spec.methods {
                if !has_fragment(spec.path, *m) {
                    missing.push(format!("{} {}", m.as_str(), spec.path));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "add these to src/http/openapi_operations.json: {missing:?}"
        );
        let parts: Value = serde_json::from_str(OPERATIONS).unwrap();
        for (path, item) in parts["operations"].as_object().unwrap() {
            let route = super::super::router::lookup(path.as_bytes())
                .unwrap_or_else(|| panic!("{path} is not a route"));
            for m in item.as_object().unwrap().keys() {
                assert!(
                    route
                        .spec()
                        .methods
                        .iter()
                        .any(|x| x.as_str().eq_ignore_ascii_case(m)),
                    "{m} {path} is not served"
                );
            }
        }
    }

    fn security(doc: &Value, path: &str) -> Value {
        doc["paths"][path]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()["security"]
            .clone()
    }

    fn has_401(doc: &Value, path: &str) -> bool {
        doc["paths"][path]
            .as_object()
            .unwrap()
            .values()
            .all(|op| op["responses"].get("401").is_some())
    }

    #[test]
    fn security_follows_the_tokens() {
        let open = doc("", "");
        for spec in ROUTES {
            assert_eq!(security(&open, spec.path), json!([]), "{}", spec.path);
            assert!(!has_401(&open, spec.path), "{}", spec.path);
        }
        assert!(open["components"].get("securitySchemes").is_none());

        let data_only = doc("d", "");
        assert_eq!(security(&data_only, "/health"), json!([{"dataToken": []}]));
        assert!(has_401(&data_only, "/health"));
        assert_eq!(security(&data_only, "/healthz"), json!([]));
        assert_eq!(security(&data_only, "/ready"), json!([]));
        // With auth_token set the scrape routes need a bearer too: the data token, as no
        // metrics token is set (the gateway convention); the document stays public.
        for p in [
            "/metrics",
            "/metrics/summary",
            "/metrics/ptracer",
            "/api/v1/analysis/alloc_free_latency",
        ] {
            assert_eq!(security(&data_only, p), json!([{"dataToken": []}]), "{p}");
            assert!(has_401(&data_only, p), "{p}");
        }
        assert_eq!(security(&data_only, "/openapi.json"), json!([]));
        assert!(!has_401(&data_only, "/openapi.json"));
        assert!(data_only["components"]["securitySchemes"]["metricsToken"].is_null());

        let both = doc("d", "m");
        assert_eq!(security(&both, "/openapi.json"), json!([]));
        assert_eq!(security(&both, "/metrics"), json!([{"metricsToken": []}]));
        assert!(has_401(&both, "/metrics"));
        assert_eq!(security(&both, "/get_all_keys"), json!([{"dataToken": []}]));

        let secret = String::from_utf8(document(&config("d-secret-1", "m-secret-2"))).unwrap();
        assert!(
            !secret.contains("secret-"),
            "no token value in the document"
        );

        let metrics_only = doc("", "m");
        assert_eq!(security(&metrics_only, "/health"), json!([]));
        assert_eq!(
            security(&metrics_only, "/metrics/summary"),
            json!([{"metricsToken": []}])
        );
    }

    #[test]
    fn error_statuses_and_media_types() {
        let d = doc("d", "");
        let ops = |p: &str| d["paths"][p].as_object().unwrap().clone();
        for (_, item) in d["paths"].as_object().unwrap() {
            for (_, op) in item.as_object().unwrap() {
                for s in ["400", "413", "414", "429", "431"] {
                    assert!(op["responses"].get(s).is_some(), "{s}");
                }
            }
        }
        assert!(
            ops("/memory/evict")["post"]["responses"]
                .get("415")
                .is_some()
        );
        assert!(ops("/metadata")["put"]["responses"].get("415").is_none());
        assert!(ops("/ready")["get"]["responses"].get("503").is_some());
        let gak = &ops("/get_all_keys")["get"]["responses"]["200"]["content"];
        assert!(gak.get("text/plain; charset=utf-8").is_some());
        assert!(
            gak.get(JSON).is_some(),
            "business errors are the JSON envelope"
        );
        let r = &d["components"]["responses"];
        assert!(r["Unauthorized"]["headers"]["WWW-Authenticate"]["required"] == true);
        assert!(r["Overloaded"]["headers"]["Retry-After"]["required"] == true);
        assert!(r["UriTooLong"]["content"].get(JSON).is_some());
    }

    /// Whether an error envelope (`success` false, `error_message`, `timestamp`) can be valid
    /// under `schema` (a fragment's schema, `$ref`s into the shared schemas resolved).
    fn admits_an_envelope(schema: &Value, schemas: &Value) -> bool {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r.trim_start_matches("#/components/schemas/");
            return admits_an_envelope(&schemas[name], schemas);
        }
        if schema.get("type").is_some_and(|t| t != "object") {
            return false;
        }
        let envelope = ["success", "error_message", "timestamp"];
        let required_elsewhere = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| !envelope.contains(&f.as_str().unwrap_or("")));
        let success_true_only = schema["properties"]["success"]["enum"] == json!([true]);
        !required_elsewhere && !success_true_only
    }

    /// A `oneOf` with the error envelope as one branch has no other branch an envelope is
    /// valid under: otherwise every error answer matches two branches and is invalid
    /// (issue 27: `/cluster/v1/commit` and `/cluster/v1/damaged` had `{"type":"object"}`).
    #[test]
    fn no_one_of_admits_the_envelope_twice() {
        let d = doc("", "");
        let schemas = &d["components"]["schemas"];
        let mut ambiguous = Vec::new();
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for (status, r) in op["responses"].as_object().unwrap() {
                    for (_, media) in r["content"].as_object().into_iter().flatten() {
                        let Some(branches) = media["schema"]["oneOf"].as_array() else {
                            continue;
                        };
                        let n = branches
                            .iter()
                            .filter(|b| admits_an_envelope(b, schemas))
                            .count();
                        if n > 1 {
                            ambiguous.push(format!("{method} {path} {status}"));
                        }
                    }
                }
            }
        }
        assert!(ambiguous.is_empty(), "{ambiguous:?}");
    }

    /// A local service's document lists what it serves: its health, role and HA view, its
    /// metrics, and object transfers under a grant (401 without one, 403 with a bad one).
    #[test]
    fn a_local_service_documents_what_it_serves() {
        let mut c = Config::defaults();
        c.cluster.role = Role::Local;
        let d: Value = serde_json::from_slice(&document(&c)).unwrap();
        let paths: BTreeSet<&str> = d["paths"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let served: BTreeSet<&str> = ROUTES
            .iter()
            .filter(|r| r.route.served_by_local_service())
            .map(|r| r.path)
            .collect();
        assert_eq!(paths, served);
        assert!(paths.contains("/ha_status") && paths.contains("/leader"));
        assert!(!paths.contains("/query_key") && !paths.contains("/cluster/v1/join"));
        let get = &d["paths"]["/api/v1/objects"]["get"];
        assert_eq!(get["security"], json!([]));
        let names: Vec<&str> = get["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["key", "grant", "traceparent"]);
        let put = &d["paths"]["/api/v1/objects"]["put"]["parameters"];
        let names: Vec<&str> = put
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["key", "grant", "next", "traceparent"]);
        for m in ["get", "put"] {
            let r = &d["paths"]["/api/v1/objects"][m]["responses"];
            assert!(r.get("401").is_some() && r.get("403").is_some(), "{m}");
        }
        assert!(d["paths"]["/api/v1/objects"]["delete"]["responses"]["401"].is_object());
        assert!(d["paths"]["/api/v1/objects"]["put"]["responses"]["502"].is_object());
        assert!(
            get["responses"].get("307").is_none(),
            "a local service redirects nothing"
        );
        // A meta sends an object request to the rank holding the blob.
        let meta = doc("", "");
        for m in ["get", "put"] {
            let r = &meta["paths"]["/api/v1/objects"][m]["responses"]["307"];
            assert!(r["headers"]["Location"]["required"] == true, "{m}");
        }
        assert!(
            d["info"]["description"]
                .as_str()
                .unwrap()
                .contains("This is a local service")
        );
    }

    /// A route without a fragment is still documented, with the generated statuses.
    #[test]
    fn a_route_without_a_fragment_is_documented() {
        let op = operation("/new", None, Some("dataToken"));
        assert_eq!(op["summary"], "/new");
        assert!(op["responses"]["200"].is_object());
        assert!(op["responses"]["401"].is_object());
        assert_eq!(op["security"], json!([{"dataToken": []}]));
    }
}
