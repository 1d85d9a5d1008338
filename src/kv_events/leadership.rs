//! KV events follow the HA leadership: only the leader publishes, each leadership is a new
//! epoch of the stream, and routers find the current publisher in etcd or over HTTP.
//!
//! - **Standby.** The publisher's sockets are bound at start on every meta (a port conflict
//!   stops the start, not a failover later; routers may keep a SUB connected to every meta,
//!   since ZMQ SUB connects to many publishers and only the leader's sends). While a meta does
//!   not lead, its shards produce no events and its publisher sends none.
//! - **A leadership won** ([`HaView::add_epoch_step`](crate::ha::HaView::add_epoch_step): after
//!   the purge of stale objects, before the `/metadata` load and the catalog hand-over): the
//!   epoch begins ([`KvQueue::begin_epoch`]): sequence numbers restart at 0, the replay buffer
//!   is emptied, and batch 0 opens with `AllBlocksCleared`; then every shard queues a
//!   `BlockStored` for each block its store holds. Everything the leadership adds afterwards
//!   (objects adopted from live local services, new puts) follows as ordinary `BlockStored`s.
//! - **A leadership lost** (step-down, resignation, shutdown): the epoch ends
//!   ([`KvQueue::end_epoch`]); what is still queued is dropped, not sent.
//! - **Discovery.** The leader writes `<prefix>kv_events` in the transaction that makes it
//!   leader, under the election key's lease ([`etcd_value`]): a router reads or watches that
//!   key; `GET /kv_events/publisher` answers the same on the leader (a standby redirects there).
//!
//! This module holds what the publisher advertises; the wiring to the HA view and the shards
//! (which `kv_events` does not import) is `ha/kv_events.rs`.

use serde_json::json;

use crate::config::Config;

/// Where routers subscribe to this node's publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertised {
    pub endpoint: String,
    /// Empty: no replay socket.
    pub replay_endpoint: String,
}

/// The publisher's endpoints as a router on another host connects to them: a wildcard bind
/// host (`*`, `0.0.0.0`, `[::]`) becomes the host of this meta's advertised URL
/// (`ock.mmc.meta.ha.advertise_url`, else `ock.mmc.meta_service.advertise_address`).
pub fn advertised(config: &Config) -> Advertised {
    let host = [
        config.ha.advertise_url.as_str(),
        config.advertise_address.as_str(),
    ]
    .into_iter()
    .find_map(url_host);
    let kv = &config.kv_events;
    Advertised {
        endpoint: connectable(&kv.endpoint, host),
        replay_endpoint: connectable(&kv.replay_endpoint, host),
    }
}

/// The value of `<prefix>kv_events` (KV events on): a JSON object naming the publisher.
pub fn etcd_value(config: &Config) -> Option<String> {
    if !config.kv_events.enable {
        return None;
    }
    let a = advertised(config);
    Some(
        json!({
            "endpoint": a.endpoint,
            "replay_endpoint": a.replay_endpoint,
            "topic": config.kv_events.topic,
            "encoding": config.kv_events.encoding.name(),
            "leader_address": config.ha.advertise_url,
        })
        .to_string(),
    )
}

/// `tcp://*:5557` → `tcp://HOST:5557`; anything else unchanged.
fn connectable(endpoint: &str, host: Option<&str>) -> String {
    let (Some(rest), Some(host)) = (endpoint.strip_prefix("tcp://"), host) else {
        return endpoint.to_string();
    };
    match rest.rfind(':') {
        Some(i) if matches!(&rest[..i], "*" | "0.0.0.0" | "[::]" | "::") => {
            format!("tcp://{host}{}", &rest[i..])
        }
        _ => endpoint.to_string(),
    }
}

/// The host of `http://HOST:PORT/...` or `HOST:PORT` (an IPv6 host keeps its brackets).
fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let host = if authority.starts_with('[') {
        &authority[..authority.find(']')? + 1]
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_hosts_become_the_advertised_host() {
        let h = Some("10.0.0.7");
        assert_eq!(connectable("tcp://*:5557", h), "tcp://10.0.0.7:5557");
        assert_eq!(connectable("tcp://0.0.0.0:5558", h), "tcp://10.0.0.7:5558");
        assert_eq!(connectable("tcp://[::]:5557", h), "tcp://10.0.0.7:5557");
        assert_eq!(
            connectable("tcp://127.0.0.1:5557", h),
            "tcp://127.0.0.1:5557"
        );
        assert_eq!(connectable("ipc:///tmp/kv", h), "ipc:///tmp/kv");
        assert_eq!(connectable("tcp://*:5557", None), "tcp://*:5557");
        assert_eq!(connectable("", h), "");
        assert_eq!(
            url_host("http://meta-1.example:8000"),
            Some("meta-1.example")
        );
        assert_eq!(url_host("http://[fd00::1]:8000/x"), Some("[fd00::1]"));
        assert_eq!(url_host("10.1.2.3:8000"), Some("10.1.2.3"));
        assert_eq!(url_host(""), None);
    }

    #[test]
    fn the_etcd_value_names_the_publisher() {
        let mut c = Config::defaults();
        assert_eq!(etcd_value(&c), None, "KV events off: no key");
        c.set("ock.mmc.kv_events.enable", "true").unwrap();
        c.set("ock.mmc.kv_events.endpoint", "tcp://*:5557").unwrap();
        c.set("ock.mmc.kv_events.topic", "kv@meta").unwrap();
        c.set("ock.mmc.meta.ha.advertise_url", "http://10.0.0.7:8000")
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&etcd_value(&c).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({
                "endpoint": "tcp://10.0.0.7:5557",
                "replay_endpoint": "",
                "topic": "kv@meta",
                "encoding": "array",
                "leader_address": "http://10.0.0.7:8000",
            })
        );
    }
}
