//! The POST form of the batch routes (issue 10): a batch may name 4096 keys, more than the
//! 8 KiB URI holds, so every batch route but `batch_put` also takes `{"keys":[…]}` as a JSON
//! body, and answers exactly as its GET (query) form does.

use std::time::Duration;

use serde_json::json;

use crate::both_drivers;
use crate::harness::{Client, Driver, Response, ServerBuilder, pct};
use crate::store::{data, put_ok};

both_drivers!(
    post_batches_take_4096_keys_and_answer_like_get,
    post_batch_bodies_are_checked
);

fn post_json(c: &mut Client, target: &str, body: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(body).unwrap();
    c.request_with(
        "POST",
        target,
        &[("Content-Type", "application/json")],
        Some(&body),
    )
}

/// A `/batch_query_keys` answer without its `leaseTimeoutTtlMs` fields.
fn without_lease(mut v: serde_json::Value) -> serde_json::Value {
    for item in v["data"].as_array_mut().unwrap() {
        for blob in item["blobs"].as_array_mut().unwrap() {
            blob.as_object_mut().unwrap().remove("leaseTimeoutTtlMs");
        }
    }
    v
}

fn query_list(keys: &[String]) -> String {
    keys.iter()
        .map(|k| pct(k.as_bytes()))
        .collect::<Vec<_>>()
        .join(",")
}

fn post_batches_take_4096_keys_and_answer_like_get(driver: Driver) {
    let srv = ServerBuilder::new(driver).shards(3).start();
    let mut c = srv.client();
    // Every 300th key exists, and one that holds a comma (no escaping in a JSON string).
    let keys: Vec<String> = (0..4096)
        .map(|i| {
            if i == 7 {
                "with,comma".to_string()
            } else {
                format!("bk-{i:05}")
            }
        })
        .collect();
    let present: Vec<bool> = (0..4096).map(|i| i % 300 == 0 || i == 7).collect();
    for i in (0..4096).filter(|&i| present[i]) {
        let body = if i == 7 {
            b"comma".to_vec()
        } else {
            data(100 + i, i as u64)
        };
        put_ok(&mut c, &keys[i], &body, "");
    }
    // The query form cannot carry 4096 keys: 414.
    let r = c.get(&format!(
        "/api/v1/objects/batch_exist?keys={}",
        query_list(&keys)
    ));
    assert_eq!(r.status, 414);
    let mut c = srv.client();

    // 4096 keys as a JSON body.
    let r = post_json(
        &mut c,
        "/api/v1/objects/batch_exist",
        &json!({ "keys": keys }),
    );
    assert_eq!(r.status, 200);
    let exists: Vec<bool> = r.json()["exists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_bool().unwrap())
        .collect();
    assert_eq!(exists, present);
    // The same answers as the GET form, on sets a URI holds.
    for part in keys.chunks(300) {
        let list = part.to_vec();
        let get = c.get(&format!(
            "/api/v1/objects/batch_exist?keys={}",
            query_list(&list)
        ));
        let post = post_json(
            &mut c,
            "/api/v1/objects/batch_exist",
            &json!({ "keys": list }),
        );
        assert_eq!((get.status, post.status), (200, 200));
        assert_eq!(get.body, post.body);
    }
    let sample: Vec<String> = [0, 1, 7, 300, 301, 600, 4095]
        .iter()
        .map(|&i| keys[i].clone())
        .collect();
    for route in ["/api/v1/objects/batch_get", "/batch_query_keys"] {
        let get = c.get(&format!("{route}?keys={}", query_list(&sample)));
        let post = post_json(&mut c, route, &json!({ "keys": sample }));
        assert_eq!((get.status, post.status), (200, 200), "{route}");
        assert_eq!(get.content_type(), post.content_type(), "{route}");
        if route == "/batch_query_keys" {
            // The remaining read lease (taken by the batch_get above) ticks between the two.
            assert_eq!(without_lease(get.json()), without_lease(post.json()));
        } else {
            assert_eq!(get.body, post.body, "{route}");
        }
    }
    // batch_get frames the bytes as documented.
    let post = post_json(
        &mut c,
        "/api/v1/objects/batch_get",
        &json!({ "keys": [keys[300].clone(), keys[1].clone()] }),
    );
    let mut expect = (400u64).to_be_bytes().to_vec();
    expect.extend_from_slice(&data(400, 300));
    expect.extend_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(post.body, expect);

    // batch_remove with 4096 keys in the body: one result per key, in order.
    let r = post_json(
        &mut c,
        "/api/v1/objects/batch_remove",
        &json!({ "keys": keys }),
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4096);
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["key"], keys[i].as_str());
        assert_eq!(res["success"], present[i], "{}", keys[i]);
    }
    let r = post_json(
        &mut c,
        "/api/v1/objects/batch_exist",
        &json!({ "keys": keys }),
    );
    assert!(
        r.json()["exists"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v == false)
    );
    // The query form of batch_remove still works.
    put_ok(&mut c, "q1", b"x", "");
    let r = c.request("POST", "/api/v1/objects/batch_remove?keys=q1", None);
    assert_eq!(
        r.json(),
        json!({"success": true, "results": [{"key": "q1", "success": true}]})
    );
}

fn post_batch_bodies_are_checked(driver: Driver) {
    let srv = ServerBuilder::new(driver).start();
    let mut c = srv.client();
    let route = "/api/v1/objects/batch_exist";
    let raw = |c: &mut Client, ct: &str, body: &[u8]| {
        c.request_with("POST", route, &[("Content-Type", ct)], Some(body))
    };
    let json_ct = "application/json";
    raw(&mut c, json_ct, b"{\"keys\":[").assert_error(200, "Invalid JSON body");
    raw(&mut c, json_ct, b"[\"a\"]").assert_error(200, "Invalid JSON body");
    raw(&mut c, json_ct, b"{\"key\":[\"a\"]}").assert_error(200, "Missing 'keys' in request body");
    raw(&mut c, json_ct, b"{\"keys\":\"a,b\"}")
        .assert_error(200, "Invalid 'keys': expected an array of strings");
    raw(&mut c, json_ct, b"{\"keys\":[\"a\",2]}")
        .assert_error(200, "Invalid 'keys': expected an array of strings");
    raw(&mut c, json_ct, b"{\"keys\":[\"bad\\u0001key\"]}")
        .assert_error(200, "Invalid key: control characters are not allowed");
    let over: Vec<String> = (0..4097).map(|i| i.to_string()).collect();
    post_json(&mut c, route, &json!({ "keys": over }))
        .assert_error(200, "Too many keys (max 4096 per request)");
    raw(&mut c, "text/plain", b"{\"keys\":[\"a\"]}").assert_error(
        415,
        "Unsupported media type: expected Content-Type: application/json",
    );
    let r = c.request_with(
        "POST",
        &format!("{route}?keys=a"),
        &[("Content-Type", json_ct)],
        Some(b"{\"keys\":[\"b\"]}"),
    );
    r.assert_error(
        200,
        "Give 'keys' either in the query or in a JSON body, not both",
    );
    // No keys anywhere: the query form's message.
    c.request("POST", route, None)
        .assert_error(200, "Missing 'keys' parameter");
    // batch_put keeps its own POST form (the body is the objects' bytes).
    let r = c.request(
        "POST",
        "/api/v1/objects/batch_put?keys=p1&sizes=2",
        Some(b"{}"),
    );
    assert_eq!(r.json()["results"][0]["success"], true);
    // The connection survived every business error.
    assert_eq!(c.get("/healthz").text(), "ok");
    // A body over the limit is refused from its head: 413, closed.
    let mut c = srv.client();
    c.send(
        format!(
            "POST {route} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            32u64 << 20
        )
        .as_bytes(),
    );
    c.read_response(false).assert_error(
        413,
        "Request body too large: this route takes at most 17858560 bytes (a fixed limit)",
    );
    assert!(c.closed_within(Duration::from_secs(5)));
}
