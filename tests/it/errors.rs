//! Error kinds: every error envelope carries `X-MMC-Error-Code`, the kind a client maps to
//! its return code without reading `error_message` (docs/api.md, *Errors*).

use crate::both_drivers;
use crate::harness::{Client, Driver, Response, ServerBuilder};
use crate::store::{data, get_bytes, put, put_ok};

both_drivers!(each_error_the_client_maps_carries_its_kind);

/// The envelope with `message`, and `kind` in its header.
#[track_caller]
fn assert_kind(r: &Response, status: u16, message: &str, kind: &str) {
    r.assert_error(status, message);
    assert_eq!(r.header("x-mmc-error-code"), Some(kind), "{message}");
}

fn each_error_the_client_maps_carries_its_kind(driver: Driver) {
    let srv = ServerBuilder::new(driver)
        .shards(1)
        .set("ock.mmc.local_service.hbm.size", "0")
        .set("ock.mmc.local_service.dram.size", "1MB")
        .set("ock.mmc.lease_ms", "10000")
        .set("ock.mmc.http.max_body_bytes", "2MB")
        .set("ock.mmc.http.max_connections_per_shard", "2")
        .start();
    let mut c = srv.client();

    // key_not_found (MMC_UNMATCHED_KEY): a get, a delete, a query of a missing key.
    let missing = c.get("/api/v1/objects?key=absent");
    assert_kind(&missing, 200, "Key not found", "key_not_found");
    let r = c.request("DELETE", "/api/v1/objects?key=absent", None);
    assert_kind(&r, 200, "Key not found", "key_not_found");
    assert_kind(
        &c.get("/query_key?key=absent"),
        200,
        "Key not found",
        "key_not_found",
    );
    assert_kind(
        &c.get("/metadata?key=absent"),
        200,
        "Metadata key not found",
        "key_not_found",
    );

    // duplicated_object (MMC_DUPLICATED_OBJECT).
    put_ok(&mut c, "a", &data(300 << 10, 1), "");
    assert_kind(
        &put(&mut c, "a", b"again", ""),
        200,
        "Duplicated object: key already exists",
        "duplicated_object",
    );

    // no_space (MMC_NOT_ENOUGH_MEMORY): both objects leased, nothing can be evicted.
    get_bytes(&mut c, "a");
    put_ok(&mut c, "b", &data(300 << 10, 2), "");
    get_bytes(&mut c, "b");
    assert_kind(
        &put(&mut c, "c", &data(500 << 10, 3), ""),
        200,
        "No space on DRAM for 512000 bytes, even after eviction",
        "no_space",
    );

    // invalid_param (MMC_INVALID_PARAM): business errors and protocol errors alike.
    assert_kind(
        &c.get("/api/v1/objects"),
        200,
        "Missing 'key' parameter",
        "invalid_param",
    );
    assert_kind(
        &put(&mut c, "d", b"x", "&medium=tape"),
        200,
        "Invalid 'medium' parameter: expected hbm or dram",
        "invalid_param",
    );
    let r = c.get(&format!("/query_key?key={}", "k".repeat(4097)));
    assert_eq!(r.header("x-mmc-error-code"), Some("invalid_param"));
    let r = c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=x,x&sizes=1,1",
        Some(b"ab"),
    );
    assert_kind(&r, 200, "Duplicated key in batch", "invalid_param");

    // Protocol errors carry the kind of their status.
    assert_eq!(
        c.get("/no/such/path").header("x-mmc-error-code"),
        Some("not_found")
    );
    let r = c.request("PATCH", "/api/v1/objects?key=a", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("x-mmc-error-code"), Some("unsupported"));
    assert_kind(
        &c.request("POST", "/api/v1/drain_jobs", None),
        200,
        "Not supported",
        "unsupported",
    );

    // overloaded (MMC_TIMEOUT): past the connection limit.
    let mut second = srv.client();
    assert_eq!(second.get("/healthz").status, 200);
    let mut third = Client::connect(srv.addr);
    let r = third.read_response(false);
    assert_kind(&r, 429, "Too many connections", "overloaded");

    // A batch's failed items carry their kinds in `error_code` (the answer itself succeeded).
    let r = c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=a,fresh&sizes=1,1",
        Some(b"xy"),
    );
    assert_eq!(r.header("x-mmc-error-code"), None);
    let v = r.json();
    assert_eq!(v["results"][0]["error_code"], "duplicated_object", "{v}");
    assert_eq!(v["results"][1]["success"], true, "{v}");
    assert!(v["results"][1].get("error_code").is_none(), "{v}");
    let r = c.request(
        "POST",
        "/api/v1/objects/batch_remove?keys=absent,fresh",
        None,
    );
    let v = r.json();
    assert_eq!(v["results"][0]["error_code"], "key_not_found", "{v}");
    assert_eq!(v["results"][1]["success"], true, "{v}");

    // A success carries no kind.
    assert_eq!(c.get("/health").header("x-mmc-error-code"), None);
}
