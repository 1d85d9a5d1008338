//! The KV-event publisher follows this node's leadership (see `kv_events::leadership`): idle
//! while not leading, a new epoch with what the node holds re-announced at each leadership
//! won, ended with it. Here because it ties the HA view, the shards and the KV queue together.

use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{Role, ShardMsg};
use crate::kv_events::KvQueue;
use crate::shards::Cluster;

/// Makes the publisher follow the leadership (HA on; before the HA threads start): idle now,
/// an epoch per leadership won, ended with it.
pub fn follow_leadership(cluster: &Arc<Cluster>, queue: &Arc<KvQueue>) {
    queue.end_epoch();
    let q = queue.clone();
    cluster.ha.subscribe(Box::new(move |previous, next| {
        if previous.role == Role::Leader && next.role != Role::Leader {
            q.end_epoch();
        }
    }));
    let q = queue.clone();
    // Weak: the step lives in the cluster's own HA view.
    let weak: Weak<Cluster> = Arc::downgrade(cluster);
    cluster
        .ha
        .add_epoch_step(Box::new(move |view_version, deadline| {
            let epoch = q.begin_epoch();
            let Some(cluster) = weak.upgrade() else {
                return Ok(());
            };
            let announced = announce(&cluster, deadline);
            log::info!(
                "KV events: epoch {epoch} for view_version {view_version}: what this node holds is re-announced"
            );
            announced
        }));
}

/// Every shard queues a `BlockStored` for each block it holds; waits for all of them.
fn announce(cluster: &Cluster, deadline: Instant) -> Result<(), String> {
    cluster.ha.ask_every_shard(
        |ack| ShardMsg::Announce { ack },
        deadline,
        "the shards did not re-announce their KV blocks in time",
    )
}
