//! Integration tests against a real `mmc-server` process (one test binary, per the style
//! guide, docs/STYLE.md). Each server listens on 127.0.0.1 on a port the kernel picks.

mod harness;

mod batches;
mod cluster;
mod cluster_faults;
mod cluster_fencing;
mod cluster_rejoin;
mod cluster_rerepl;
mod cluster_ssd;
mod cluster_ssd_recover;
mod cluster_tiers;
mod cluster_tls;
mod errors;
mod foundation;
mod framing;
mod ha;
mod ha_kv;
mod latency_histograms;
mod lifecycle;
mod metrics_contract;
mod metrics_protobuf;
mod numa;
mod observability;
mod perf;
mod same_host;
mod security;
mod ssd;
mod ssd_recover;
mod store;
mod tidy;
mod uploads;
