//! The operations a shard applies to the state it owns, independent of any transport.
//!
//! The HTTP front end (and, later, any other protocol) turns a request into [`Command`]s; the
//! owner shard applies them and answers with a [`Reply`]. Commands are owned values so they
//! can travel to another shard's inbox unchanged.

use crate::common::error_kind::{ErrorKind, Refusal};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::store::segment::{Medium, SegmentId};
use super::store::{BlobHandle, BlobView, ObjHandle, Placement, QueryInfo, WriterLink};
use super::{Notice, ShardId, Shared};

#[derive(Debug)]
pub enum Command {
    MetadataGet {
        key: Box<[u8]>,
    },
    MetadataPut {
        key: Box<[u8]>,
        value: Bytes,
    },
    MetadataDelete {
        key: Box<[u8]>,
    },
    /// Allocate blobs for a new object (the first step of a put).
    Alloc {
        key: Box<[u8]>,
        size: u64,
        placement: Placement,
    },
    /// update_state after the bytes were written (`ok`) or could not be (`!ok`).
    Commit {
        key: Box<[u8]>,
        obj: ObjHandle,
        ok: bool,
    },
    /// A leased, pinned read.
    Get {
        key: Box<[u8]>,
    },
    /// A batch read's second try after the copy on remote rank `rank` did not come: a leased,
    /// pinned memory copy on another rank, or `NotFound` (never a wait or a rewarm).
    GetElsewhere {
        key: Box<[u8]>,
        rank: u32,
    },
    Exist {
        key: Box<[u8]>,
    },
    Query {
        key: Box<[u8]>,
    },
    Remove {
        key: Box<[u8]>,
    },
    /// Per shard (sent to every shard): remove every object.
    RemoveAll,
    /// Per shard: a page of keys from slot `cursor`.
    ListKeys {
        cursor: u32,
        max_bytes: u32,
        prefix: Box<[u8]>,
        limit: u64,
    },
    /// Per shard: evict the objects the chunk hashes name.
    EvictNamed {
        names: Arc<[Box<[u8]>]>,
        locations: Option<SmallVec<[Medium; 3]>>,
    },
    /// Per shard: rewarm the objects the chunk hashes name, in the background.
    PrefetchNamed {
        names: Arc<[Box<[u8]>]>,
    },
    /// Per shard: move every blob off a segment being unmounted.
    Evacuate {
        seg: SegmentId,
    },
    /// Per shard: start moving up to `max` objects whose only copy is on a leaving remote
    /// rank's segment (`Reply::Moves`).
    BeginMoves {
        seg: SegmentId,
        max: u32,
        /// Room to make for another shard's skipped objects (bytes per medium).
        room: super::store::relocate::MediumBytes,
    },
    /// A move's copy ended (`ok`: the new blob holds the bytes).
    FinishMove {
        key: Box<[u8]>,
        dst: BlobHandle,
        ok: bool,
    },
    /// A remote rank's local service found the SSD copy of `key` at `offset` of its
    /// `rank`/`medium` segment damaged: the copy is dropped (the object with it when it was
    /// the last one).
    DropDamaged {
        key: Box<[u8]>,
        rank: u32,
        medium: Medium,
        offset: u64,
    },
    /// Per shard: drop every blob on the segment of a lost remote rank (its bytes are gone);
    /// objects with no copy elsewhere are removed.
    DropSegment {
        seg: SegmentId,
    },
    /// Per shard: drop everything held for a segment removed from the table (its mapping and
    /// SSD file close when the last holder lets go).
    Forget {
        seg: SegmentId,
    },
    /// Per shard (sent to the owner of the keys): adopt blobs of a local service's catalog
    /// (`Reply::Catalog` with the entries refused).
    Adopt {
        entries: Vec<crate::cluster::catalog::Adopted>,
    },
    /// Per shard: every blob held on a remote rank (`Reply::Entries`), for a resync.
    RankBlobs {
        rank: u32,
    },
    /// Several commands for the same owner, answered in order.
    Many(Vec<Command>),
    /// A read applied without counting it as a business operation (a HEAD request is not a
    /// get, query or exist). Only `Query` and `Exist`, which answer at once, are run this way.
    Uncounted(Box<Command>),
}

impl Command {
    /// The key that decides the owner shard; `None` for per-shard commands.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Command::MetadataGet { key }
            | Command::MetadataPut { key, .. }
            | Command::MetadataDelete { key }
            | Command::Alloc { key, .. }
            | Command::Commit { key, .. }
            | Command::Get { key }
            | Command::GetElsewhere { key, .. }
            | Command::Exist { key }
            | Command::Query { key }
            | Command::Remove { key }
            | Command::FinishMove { key, .. }
            | Command::DropDamaged { key, .. } => Some(key),
            Command::RemoveAll
            | Command::ListKeys { .. }
            | Command::EvictNamed { .. }
            | Command::PrefetchNamed { .. }
            | Command::Evacuate { .. }
            | Command::DropSegment { .. }
            | Command::BeginMoves { .. }
            | Command::Forget { .. }
            | Command::Adopt { .. }
            | Command::RankBlobs { .. }
            | Command::Many(_) => None,
            Command::Uncounted(inner) => inner.key(),
        }
    }
}

/// A blob pinned for reading. Dropping it releases the pin on the owner shard, on every
/// path (sent, failed, abandoned), so a pin can never leak.
pub struct PinnedBlob {
    pub view: BlobView,
    pub(super) owner: ShardId,
    pub(super) shared: Arc<Shared>,
    /// `None`: pinned on an owner shard. `Some`: bytes a local service serves under a grant,
    /// which the meta service's lease protects; there is no pin here to release.
    pub(super) granted: Option<GrantedRead>,
}

/// A read a local service serves under a meta's grant: how long the meta's lease covers it,
/// and when this process admitted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedRead {
    /// The grant's expiry (Unix ms, this host's clock): the meta keeps the range this blob's
    /// until then at least (`store::get`'s `lease_end` adds the clock skew).
    pub until_ms: u64,
    /// The epoch of this process's grant reads, read before the grant was checked
    /// ([`super::grant_reads::GrantReads::epoch`]): a mapped answer is given only within it.
    pub epoch: u64,
}

impl PinnedBlob {
    /// Pinned on its owner shard here (not bytes served under a meta's grant): it stays
    /// readable, unmoved and unfreed, for as long as this lives.
    pub fn is_managed(&self) -> bool {
        self.granted.is_none()
    }

    /// For bytes served under a grant, the read's lease and epoch.
    pub fn granted(&self) -> Option<GrantedRead> {
        self.granted
    }

    /// A blob of this process's memory read under a grant: the meta service holds its lease.
    pub fn unmanaged(view: BlobView, shared: Arc<Shared>, read: GrantedRead) -> PinnedBlob {
        PinnedBlob {
            view,
            owner: 0,
            shared,
            granted: Some(read),
        }
    }
}

impl Drop for PinnedBlob {
    fn drop(&mut self) {
        if self.granted.is_none() {
            self.shared
                .notify(self.owner, Notice::Unpin(self.view.handle));
        }
    }
}

impl std::fmt::Debug for PinnedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBlob({:?} on shard {})", self.view, self.owner)
    }
}

/// Blobs allocated for a put. Dropping it without [`WriteGrant::disarm`] aborts the put on
/// the owner (the object and its blobs are freed), so a writer that vanishes leaks nothing.
/// The blobs are the writer's until the grant ends, even when the owner revokes it (the key
/// was removed, or the allocation reclaimed): then the writer must stop writing
/// ([`WriteGrant::is_revoked`]), and the owner frees the blobs only once the grant ends.
pub struct WriteGrant {
    pub obj: ObjHandle,
    pub blobs: SmallVec<[BlobView; 2]>,
    link: Arc<WriterLink>,
    pub(super) owner: ShardId,
    pub(super) shared: Arc<Shared>,
    armed: bool,
    /// An unmanaged grant's end (Unix ms): past it the writer writes nothing more.
    until_unix_ms: u64,
}

impl WriteGrant {
    pub(super) fn new(
        obj: ObjHandle,
        blobs: SmallVec<[BlobView; 2]>,
        link: Arc<WriterLink>,
        owner: ShardId,
        shared: Arc<Shared>,
    ) -> WriteGrant {
        WriteGrant {
            obj,
            blobs,
            link,
            owner,
            shared,
            armed: true,
            until_unix_ms: u64::MAX,
        }
    }

    /// Blobs of this process's memory written under a meta service's grant (a local service):
    /// there is no owner here to commit to or abort with; the grant's expiry (`expires_ms`,
    /// Unix ms) bounds the write: no byte is written into the blobs past it (the meta frees
    /// a range it took back soon after, `Config::remote_writer_ms`).
    pub fn unmanaged(
        blobs: SmallVec<[BlobView; 2]>,
        shared: Arc<Shared>,
        expires_ms: u64,
    ) -> WriteGrant {
        WriteGrant {
            obj: ObjHandle {
                id: u32::MAX,
                generation: 0,
            },
            blobs,
            // Revoked when the service joins a meta again (see `LocalIdentity::writers`); shared
            // by its writers, whose byte counts on it nobody reads (no owner here reclaims).
            link: shared.membership.local.writer_link(),
            owner: 0,
            shared,
            armed: false,
            until_unix_ms: expires_ms,
        }
    }

    /// The commit was handed to the owner; it now decides the object's fate.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// The owner removed the object or reclaimed the allocation (or, unmanaged, the grant
    /// expired): write nothing more into the blobs (they stay allocated until this grant
    /// ends).
    pub fn is_revoked(&self) -> bool {
        self.link.is_revoked()
            || (self.until_unix_ms != u64::MAX && crate::grant::unix_ms() > self.until_unix_ms)
    }

    /// Reports `n` more body bytes written: a writer making progress is not reclaimed.
    pub fn wrote(&self, n: u64) {
        self.link.wrote(n);
    }
}

impl Drop for WriteGrant {
    fn drop(&mut self) {
        if self.armed {
            self.shared.notify(self.owner, Notice::Abort(self.obj));
        }
    }
}

impl std::fmt::Debug for WriteGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteGrant({:?}, {:?})", self.obj, self.blobs)
    }
}

#[derive(Debug)]
pub enum Reply {
    /// Bytes (a metadata value).
    Value(Bytes),
    Done,
    NotFound,
    /// The operation failed: its kind and the error message for the client.
    Refused(Refusal),
    /// The owner shard could not take the request (its inbox, or our outstanding limit, is
    /// full). The client should retry later (429).
    Overloaded,
    /// Boxed: a grant is 160 bytes and every reply, a GET's included, is moved several times
    /// between the store and the answer (72 bytes unboxed, the size of `Read`).
    Granted(Box<WriteGrant>),
    Read(PinnedBlob),
    /// Whether the object is readable (`Some(rank)` of a readable copy).
    Exists(Option<u32>),
    Query(Box<QueryInfo>),
    /// A page of keys; `next` is the cursor to continue from.
    Keys {
        text: Vec<u8>,
        next: Option<u32>,
        limit_left: u64,
    },
    Count(u64),
    /// Objects to move off a leaving rank, their new blobs allocated and pinned.
    /// A drain's moves (see `Store::begin_moves`).
    Moves(super::store::relocate::MovesStep),
    /// Catalog entries: those refused by an adoption, or a rank's blobs.
    Adopted(Vec<crate::cluster::catalog::Adopted>),
    Entries(Vec<crate::cluster::catalog::Entry>),
    Many(Vec<Reply>),
}

impl Reply {
    pub fn refused(kind: ErrorKind, msg: &'static str) -> Reply {
        Reply::Refused(Refusal::new(kind, msg))
    }
}
