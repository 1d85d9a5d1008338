//! A graceful leave's drain, as a pure machine: which of the leaving membership's segments the
//! shards are asked for moves next, with how much room to make first, when to ask again, and
//! when the drain is over. No socket, no clock read, no sleep: the driver asks
//! [`Drain::next`] what is due, carries it out (the shards' `BeginMoves`, the copies, their
//! `FinishMove`), and reports with [`Drain::answered`] and [`Drain::copied`].
//! `http/handlers/cluster.rs` `drain` and the cluster simulation (`sim/meta/drain.rs`) drive it.
//!
//! The rule: every object whose only copy is on a leaving segment is moved to another rank
//! while room lasts. When the shards skip objects for want of room, and room can be made (a
//! tier below can take what eviction would move), the drain asks again every
//! [`RETRY_MS`], asking the shards to make that room (each its share) unless room is already
//! coming (moves down in flight), until [`ROOM_WAIT_MS`] after the drain began; then what is
//! left stays and goes with the segments (a leaving local service waits 15 s for its leave's
//! answer).

use std::collections::VecDeque;

use crate::common::medium::Medium;

/// Bytes per medium, indexed as `Medium::ALL` (the store's `relocate::MediumBytes`).
pub type PerMedium = [u64; Medium::ALL.len()];

/// How long a drain waits for room being made on other ranks (their blobs moving down).
pub const ROOM_WAIT_MS: u64 = 10_000;

/// How soon a drain that waits for room asks again.
pub const RETRY_MS: u64 = 20;

/// Moves each shard hands out per ask.
pub const MOVES_PER_ASK: usize = 64;

/// What is due next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<S> {
    /// Ask every shard for up to [`MOVES_PER_ASK`] moves off segment `seg`, after making
    /// `room` bytes (per medium, each shard its share of it; all zero: none) by moving their
    /// own blobs down; report the summed answers with [`Drain::answered`].
    Ask { seg: S, room: PerMedium },
    /// Nothing until then (room is being made).
    Wait { until_ms: u64 },
    /// The drain is over: `moved` objects went to other ranks.
    Done { moved: u64 },
}

/// The shards' answers to one ask, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Moves handed out (the driver copies each and reports it with [`Drain::copied`]).
    pub moves: usize,
    /// Room for skipped objects is coming (moves down started or in flight).
    pub coming: bool,
    /// Room can be made for the skipped objects (a tier below can take what eviction moves).
    pub possible: bool,
    /// The bytes of the objects skipped for want of room, per medium.
    pub need: PerMedium,
}

/// One leave's drain over the segments `S` of the leaving membership.
#[derive(Clone, Debug)]
pub struct Drain<S> {
    /// Segments not drained yet, the current one first.
    segs: VecDeque<S>,
    /// Shards that share the room to make.
    shards: u64,
    /// Room the next ask makes, per medium.
    room: PerMedium,
    /// The next ask waits until then.
    wait_until: Option<u64>,
    /// Room is waited for until then.
    deadline_ms: u64,
    moved: u64,
}

impl<S: Clone> Drain<S> {
    /// A drain of `segs` beginning at `now_ms`, over `shards` shards.
    pub fn new(segs: impl IntoIterator<Item = S>, shards: usize, now_ms: u64) -> Drain<S> {
        Drain {
            segs: segs.into_iter().collect(),
            shards: shards.max(1) as u64,
            room: PerMedium::default(),
            wait_until: None,
            deadline_ms: now_ms + ROOM_WAIT_MS,
            moved: 0,
        }
    }

    /// What is due at `now_ms`.
    pub fn next(&mut self, now_ms: u64) -> Step<S> {
        let Some(seg) = self.segs.front() else {
            return Step::Done { moved: self.moved };
        };
        match self.wait_until {
            Some(until_ms) if now_ms < until_ms => Step::Wait { until_ms },
            _ => {
                self.wait_until = None;
                Step::Ask {
                    seg: seg.clone(),
                    room: std::mem::take(&mut self.room),
                }
            }
        }
    }

    /// The shards answered the last ask with `a` at `now_ms`. With moves, the next ask comes
    /// once they are copied; without, the segment is done unless room is wanted and can still
    /// be made in time, and then the drain asks again a moment later.
    pub fn answered(&mut self, a: Answer, now_ms: u64) {
        if a.moves > 0 {
            return;
        }
        let needed = a.need.iter().any(|&n| n > 0);
        if !needed || !a.possible || now_ms >= self.deadline_ms {
            self.segs.pop_front();
            self.room = PerMedium::default();
            return;
        }
        if !a.coming {
            // The room may be held by other shards' blobs (each makes its share), or by
            // leased ones: ask again until their leases end.
            self.room = a.need.map(|n| n.div_ceil(self.shards));
        }
        self.wait_until = Some(now_ms + RETRY_MS);
    }

    /// A move was copied (`ok`) or given up.
    pub fn copied(&mut self, ok: bool) {
        self.moved += ok as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments are drained in turn, each until the shards hand out no more moves; the
    /// count is of the copies that succeeded.
    #[test]
    fn each_segment_is_drained_until_no_move_is_left() {
        let mut d = Drain::new(["a", "b"], 2, 0);
        assert_eq!(
            d.next(0),
            Step::Ask {
                seg: "a",
                room: PerMedium::default()
            }
        );
        d.answered(
            Answer {
                moves: 2,
                ..Default::default()
            },
            1,
        );
        d.copied(true);
        d.copied(false);
        assert!(matches!(d.next(2), Step::Ask { seg: "a", .. }));
        d.answered(Answer::default(), 3);
        assert!(matches!(d.next(3), Step::Ask { seg: "b", .. }));
        d.answered(Answer::default(), 4);
        assert_eq!(d.next(4), Step::Done { moved: 1 });
    }

    /// Skipped for want of room that can be made: the shards are asked to make it (each its
    /// share) and the drain asks again a moment later; while room is coming it only waits; at
    /// the deadline what is left stays.
    #[test]
    fn a_drain_waits_for_room_until_its_deadline() {
        let mut d = Drain::new([7u32], 2, 1_000);
        assert!(matches!(d.next(1_000), Step::Ask { .. }));
        let short = Answer {
            moves: 0,
            coming: false,
            possible: true,
            need: [0, 4097, 0],
        };
        d.answered(short.clone(), 1_001);
        assert_eq!(d.next(1_010), Step::Wait { until_ms: 1_021 });
        assert_eq!(
            d.next(1_021),
            Step::Ask {
                seg: 7,
                room: [0, 2049, 0]
            }
        );
        d.answered(
            Answer {
                coming: true,
                ..short.clone()
            },
            1_022,
        );
        assert_eq!(
            d.next(1_042),
            Step::Ask {
                seg: 7,
                room: PerMedium::default()
            },
            "room coming: asked again, nothing more to make"
        );
        d.answered(short.clone(), 11_000);
        assert_eq!(d.next(11_000), Step::Done { moved: 0 });
    }

    /// Room wanted that cannot be made (no tier below takes evicted blobs): the segment is
    /// done at once.
    #[test]
    fn room_that_cannot_be_made_is_not_waited_for() {
        let mut d = Drain::new([1u8], 1, 0);
        d.next(0);
        d.answered(
            Answer {
                need: [1, 0, 0],
                ..Default::default()
            },
            0,
        );
        assert_eq!(d.next(0), Step::Done { moved: 0 });
    }
}
