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

#[cfg(test)]
mod tests {
    use super::super::testing::TestStore;
    use super::super::*;

    fn put(s: &mut Store, key: &str, medium: Medium, commit: bool) {
        let step = s.alloc(key.as_bytes().into(), 100, Placement::on(Some(medium), 1));
        let AllocStep::Granted { obj, .. } = step else {
            panic!("alloc refused: {step:?}");
        };
        if commit {
            assert!(s.commit(obj, true));
        }
    }

    /// What a new leader re-announces: committed objects with a block hash, per medium; not
    /// a put still being written, not a key without a hash, not what a purge is removing.
    #[test]
    fn held_blocks_are_the_readable_objects_with_a_hash() {
        let mut s = TestStore::new()
            .segment(0, Medium::Dram, 16 << 20)
            .segment(0, Medium::Hbm, 16 << 20)
            .build();
        put(&mut s, "m@1@0@a1@bf16", Medium::Dram, true);
        put(&mut s, "m@1@0@b2@bf16", Medium::Hbm, true);
        put(&mut s, "m@1@0@c3@bf16", Medium::Dram, false);
        put(&mut s, "plain", Medium::Dram, true);
        let mut held = s.held_blocks();
        held.sort();
        assert_eq!(
            held,
            vec![(0xa1, Medium::Dram, 100), (0xb2, Medium::Hbm, 100)]
        );
        s.remove_all();
        assert!(s.held_blocks().is_empty(), "a purge's objects are not held");
    }
}
