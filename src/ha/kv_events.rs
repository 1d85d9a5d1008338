//! The KV-event publisher follows this node's leadership (see `kv_events::leadership`): idle
//! while not leading, a new epoch with what the node holds re-announced at each leadership
//! won, ended with it. Here because it ties the HA view (and through it the shards) and the KV
//! queue together.

use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{HaHost, HaView, Role, ShardMsg};
use crate::kv_events::KvQueue;

/// Makes the publisher follow the leadership (HA on; before the HA threads start): idle now,
/// an epoch per leadership won, ended with it.
pub fn follow_leadership(host: &Arc<dyn HaHost>, queue: &Arc<KvQueue>) {
    queue.end_epoch();
    let q = queue.clone();
    host.ha().subscribe(Box::new(move |previous, next| {
        if previous.role == Role::Leader && next.role != Role::Leader {
            q.end_epoch();
        }
    }));
    let q = queue.clone();
    // Weak: the step lives in the host's own HA view.
    let weak: Weak<dyn HaHost> = Arc::downgrade(host);
    host.ha().add_epoch_step(Box::new(move |view_version, deadline| {
            let epoch = q.begin_epoch();
            let Some(host) = weak.upgrade() else {
                return Ok(());
            };
            let announced = announce(host.ha(), deadline);
            log::info!(
                "KV events: epoch {epoch} for view_version {view_version}: what this node holds is re-announced"
            );
            announced
        }));
}

/// Every shard queues a `BlockStored` for each block it holds; waits for all of them.
fn announce(ha: &HaView, deadline: Instant) -> Result<(), String> {
    ha.ask_every_shard(
        |ack| ShardMsg::Announce { ack },
        deadline,
        "the shards did not re-announce their KV blocks in time",
    )
}
