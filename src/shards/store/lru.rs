//! An intrusive least-recently-used list over a slab: O(1) insert, touch and remove, 16 bytes
//! per entry, no allocation per operation once the slab has grown.

/// Marks "no node" in links and in blobs that are not in a list.
pub const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    /// What the node stands for (the store puts a blob id here).
    item: u32,
}

/// Several lists share one slab of nodes (the store keeps one list per medium).
pub struct Lru {
    nodes: Vec<Node>,
    free_head: u32,
    heads: Vec<u32>,
    tails: Vec<u32>,
    lens: Vec<usize>,
}

impl Lru {
    pub fn new(lists: usize) -> Lru {
        Lru {
            nodes: Vec::new(),
            free_head: NIL,
            heads: vec![NIL; lists],
            tails: vec![NIL; lists],
            lens: vec![0; lists],
        }
    }

    pub fn len(&self, list: usize) -> usize {
        self.lens[list]
    }

    /// Inserts `item` as the most recently used of `list`; returns its node.
    pub fn push_front(&mut self, list: usize, item: u32) -> u32 {
        let node = Node {
            prev: NIL,
            next: self.heads[list],
            item,
        };
        let id = if self.free_head != NIL {
            let id = self.free_head;
            self.free_head = self.nodes[id as usize].next;
            self.nodes[id as usize] = node;
            id
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.link_front(list, id);
        id
    }

    fn link_front(&mut self, list: usize, id: u32) {
        let old_head = self.heads[list];
        self.nodes[id as usize].prev = NIL;
        self.nodes[id as usize].next = old_head;
        if old_head != NIL {
            self.nodes[old_head as usize].prev = id;
        } else {
            self.tails[list] = id;
        }
        self.heads[list] = id;
        self.lens[list] += 1;
    }

    fn unlink(&mut self, list: usize, id: u32) {
        let Node { prev, next, .. } = self.nodes[id as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.heads[list] = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tails[list] = prev;
        }
        self.lens[list] -= 1;
    }

    /// Marks `id` as most recently used.
    pub fn touch(&mut self, list: usize, id: u32) {
        if self.heads[list] != id {
            self.unlink(list, id);
            self.link_front(list, id);
        }
    }

    pub fn remove(&mut self, list: usize, id: u32) {
        self.unlink(list, id);
        self.nodes[id as usize].next = self.free_head;
        self.nodes[id as usize].item = NIL;
        self.free_head = id;
    }

    /// Items from least to most recently used.
    pub fn iter_lru(&self, list: usize) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.tails[list];
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let n = self.nodes[cur as usize];
            cur = n.prev;
            Some(n.item)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_touch_remove_reuse() {
        let mut l = Lru::new(2);
        let a = l.push_front(0, 10);
        let b = l.push_front(0, 11);
        let c = l.push_front(0, 12);
        let _x = l.push_front(1, 99);
        assert_eq!(l.iter_lru(0).collect::<Vec<_>>(), vec![10, 11, 12]);
        l.touch(0, a);
        assert_eq!(l.iter_lru(0).collect::<Vec<_>>(), vec![11, 12, 10]);
        l.remove(0, c);
        assert_eq!(l.iter_lru(0).collect::<Vec<_>>(), vec![11, 10]);
        assert_eq!(l.len(0), 2);
        let d = l.push_front(0, 13);
        assert_eq!(d, c, "freed nodes are reused");
        l.remove(0, b);
        l.remove(0, a);
        l.remove(0, d);
        assert_eq!(l.len(0), 0);
        assert_eq!(l.iter_lru(0).count(), 0);
        assert_eq!(l.iter_lru(1).collect::<Vec<_>>(), vec![99]);
    }
}
