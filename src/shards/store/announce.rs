//! What the store holds, as KV-event blocks: a new HA leader re-announces them at the start
//! of its KV-event epoch (`kv_events::leadership`), right after the epoch's `AllBlocksCleared`.

use super::Store;
use crate::common::medium::Medium;

impl Store {
    /// Every (chunk hash, medium, size) readable here: one per object and medium it has a
    /// readable blob on, as the `Stored` events that made them readable announced them.
    /// Objects whose key has no chunk hash and objects being removed are left out.
    pub fn held_blocks(&self) -> Vec<(u64, Medium, u64)> {
        let mut out = Vec::new();
        for (obj, o) in self.objects.iter() {
            let Some(chunk) = o.chunk else { continue };
            let obj = obj as u32;
            if self.doomed(obj) {
                continue;
            }
            for medium in Medium::ALL {
                if self.has_readable_on(obj, medium) {
                    out.push((chunk, medium, o.size));
                }
            }
        }
        out
    }
}
