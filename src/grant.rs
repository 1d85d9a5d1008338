//! Grants: the meta service's signed permission for one transfer of one blob's bytes on one
//! rank, carried in a redirect's `Location` so the bytes go between the client and the local
//! service that holds them.
//!
//! A grant is the query parameter `grant=<fields>.<mac>`: eleven decimal fields separated by
//! dots — operation, rank, medium, offset, allocated length, object size, object slot, object
//! generation, the creating leadership's view, expiry (Unix milliseconds), checksum (the
//! xxh3-64 an SSD blob's bytes must match when read; 0 otherwise) — and the first 16 bytes of
//! an HMAC-SHA256 over the
//! object's key, the fields and the next hop's URL (a replicated put's chain), in hex. Only
//! the meta service and its local services hold the key (each local service its own, derived
//! from the meta's for its rank, incarnation and membership and handed to it when it joins,
//! over the cluster-token-authenticated join), so a grant cannot be forged or altered: changing
//! the key, the rank, the blob or the operation breaks the MAC, and a grant given to a process
//! that has since been replaced on its rank, or to an earlier membership of the same process,
//! does not verify on its successor. Grants are short-lived
//! (`ock.mmc.cluster.grant_ttl_ms`, and a read's never outlives its lease).
//!
//! A write or move grant is single-use on the process that serves it: [`GrantLedger`] keeps
//! the MACs of the grants used so far until they expire, and a second request under one is
//! refused before any byte of it lands (a client or proxy retrying a timed-out put, or anyone
//! replaying its URL, would otherwise write into a range the meta may have given to another
//! object since).
//!
//! This module is pure (no I/O): it encodes, signs and checks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use ring::hmac;

/// What a grant permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantOp {
    /// Write the blob, then (after the chain's next hops) commit the put with the meta service.
    WriteCommit = 1,
    /// Write the blob only: a later hop of a replicated put's chain.
    Write = 2,
    /// Read the blob.
    Read = 3,
    /// One half of a tier move on a local service (`POST /cluster/v1/move`): the source or
    /// the destination blob of a copy between its own segments. Never serves an object request.
    Move = 4,
}

impl GrantOp {
    fn from_u64(v: u64) -> Option<GrantOp> {
        match v {
            1 => Some(GrantOp::WriteCommit),
            2 => Some(GrantOp::Write),
            3 => Some(GrantOp::Read),
            4 => Some(GrantOp::Move),
            _ => None,
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, GrantOp::WriteCommit | GrantOp::Write)
    }
}

/// The fields of a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub op: GrantOp,
    pub rank: u32,
    /// `Medium as u8` (0 HBM, 1 DRAM, 2 SSD).
    pub medium: u8,
    pub offset: u64,
    /// The blob's allocated length (page-rounded).
    pub len: u64,
    /// The object's size: the bytes a write carries and a read returns.
    pub size: u64,
    pub obj_id: u32,
    /// The object's generation: with `view`, its stamp in the local service's catalog
    /// (`shards/store/catalog.rs`).
    pub obj_generation: u64,
    /// The `view_version` of the leadership that created the object (0 without HA).
    pub view: u64,
    /// Unix time in milliseconds after which the grant is refused.
    pub expires_ms: u64,
    /// For an SSD blob read (or moved from): the checksum its bytes were flushed with; the
    /// local service serves nothing that does not match it. 0 for memory blobs.
    pub sum: u64,
    /// For a copy's write (a drain's move, a re-replication): the sequence of the destination
    /// membership's freed log when the grant was given. The records up to it were noted
    /// before this write was asked for, so none of them drops the entry it makes, even one
    /// naming the same range and stamp (an earlier attempt at the same copy, given up). 0 for
    /// every other grant.
    pub floor: u64,
}

/// Why a grant was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum GrantError {
    /// Not twelve numbers and a MAC.
    Malformed,
    /// The MAC does not match: forged, or altered (key, fields or next hop).
    BadMac,
    Expired,
    /// This process holds no grant key yet (a local service that has not joined).
    NoKey,
    /// A write or move grant this process already served a request under ([`GrantLedger`]).
    Used,
    /// The ledger of used grants is full of grants not yet expired: the request is refused
    /// (503, retry later) rather than served without being recorded.
    LedgerFull,
}

impl GrantError {
    pub fn message(&self) -> &'static str {
        match self {
            GrantError::Malformed => "Invalid grant: malformed",
            GrantError::BadMac => "Invalid grant: signature does not match",
            GrantError::Expired => "Invalid grant: expired",
            GrantError::NoKey => "Invalid grant: this local service has not joined a meta service",
            GrantError::Used => "Invalid grant: already used",
            GrantError::LedgerFull => {
                "Too many grants in use on this service: retry later with a new grant"
            }
        }
    }
}

/// MAC bytes kept (128 bits).
const MAC_BYTES: usize = 16;

/// A grant key: HMAC-SHA256.
#[derive(Clone)]
pub struct GrantKey {
    key: hmac::Key,
    /// The raw bytes, for handing to a joining local service.
    raw: [u8; 32],
}

impl GrantKey {
    pub fn from_bytes(raw: [u8; 32]) -> GrantKey {
        GrantKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, &raw),
            raw,
        }
    }

    /// A fresh random key (the meta service makes one at start).
    pub fn random() -> GrantKey {
        use ring::rand::SecureRandom;
        let mut raw = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut raw)
            .expect("the system random source works");
        GrantKey::from_bytes(raw)
    }

    /// The key of one membership of a local service: rank `rank` in its incarnation
    /// `incarnation`, admitted as membership `epoch` (`cluster::members`). A meta hands it to
    /// that service when it joins and signs the grants on the rank's blobs with it, so a grant
    /// given while another process held the rank (one killed and restarted on the same
    /// address), or while the same process held an earlier membership (declared lost, then
    /// joined again: the meta dropped that membership's blobs and gives their ranges to other
    /// objects), does not verify on its successor, whose memory there holds other bytes.
    pub fn for_member(&self, rank: u32, incarnation: u64, epoch: u64) -> GrantKey {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"mmc local service grant key\n");
        ctx.update(&rank.to_be_bytes());
        ctx.update(&incarnation.to_be_bytes());
        ctx.update(&epoch.to_be_bytes());
        let mut raw = [0u8; 32];
        raw.copy_from_slice(&ctx.sign().as_ref()[..32]);
        GrantKey::from_bytes(raw)
    }

    pub fn to_hex(&self) -> String {
        hex(&self.raw)
    }

    pub fn from_hex(s: &str) -> Option<GrantKey> {
        let bytes = unhex(s)?;
        let raw: [u8; 32] = bytes.try_into().ok()?;
        Some(GrantKey::from_bytes(raw))
    }

    /// The MAC of a message body between a meta and the local service holding this key (a
    /// push of freed records): 16 bytes of HMAC-SHA256, in hex.
    pub fn body_mac(&self, body: &[u8]) -> String {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"mmc message\n");
        ctx.update(body);
        hex(&ctx.sign().as_ref()[..MAC_BYTES])
    }

    /// Whether `mac` is [`GrantKey::body_mac`] of `body` (compared in constant time).
    pub fn verify_body(&self, body: &[u8], mac: &[u8]) -> bool {
        let expected = self.body_mac(body);
        expected.len() == mac.len()
            && expected
                .bytes()
                .zip(mac)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    fn tag(&self, key: &[u8], fields: &str, next: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(&(key.len() as u64).to_be_bytes());
        ctx.update(key);
        ctx.update(fields.as_bytes());
        ctx.update(b"\n");
        ctx.update(next);
        ctx.sign()
    }
}

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(..)")
    }
}

/// The grant key a process holds, replaced when a local service (re)joins; read lock-free.
#[derive(Default)]
pub struct GrantKeyCell(ArcSwapOption<GrantKey>);

impl GrantKeyCell {
    pub fn set(&self, key: GrantKey) {
        self.0.store(Some(Arc::new(key)));
    }

    pub fn get(&self) -> Option<Arc<GrantKey>> {
        self.0.load_full()
    }

    /// Forgets the key (a local service joining again): no grant is accepted until the next
    /// join's answer sets the new one.
    pub fn clear(&self) {
        self.0.store(None);
    }
}

impl Grant {
    fn fields(&self) -> String {
        format!(
            "{}.{}.{}.{}.{}.{}.{}.{}.{}.{}.{}.{}",
            self.op as u8,
            self.rank,
            self.medium,
            self.offset,
            self.len,
            self.size,
            self.obj_id,
            self.obj_generation,
            self.view,
            self.expires_ms,
            self.sum,
            self.floor
        )
    }

    /// The `grant` parameter's value for the object `key`, with `next` the next hop's URL
    /// (empty when there is none).
    pub fn sign(&self, gk: &GrantKey, key: &[u8], next: &[u8]) -> String {
        let fields = self.fields();
        let tag = gk.tag(key, &fields, next);
        format!("{fields}.{}", hex(&tag.as_ref()[..MAC_BYTES]))
    }

    /// Checks a `grant` parameter for the object `key` and next hop `next` at `now_ms`.
    pub fn verify(
        gk: &GrantKey,
        text: &str,
        key: &[u8],
        next: &[u8],
        now_ms: u64,
    ) -> Result<Grant, GrantError> {
        let (fields, mac) = text.rsplit_once('.').ok_or(GrantError::Malformed)?;
        let mac = unhex(mac).filter(|m| m.len() == MAC_BYTES);
        let grant = parse_fields(fields).ok_or(GrantError::Malformed)?;
        let mac = mac.ok_or(GrantError::Malformed)?;
        // Re-encode: a grant is only ever accepted in its one canonical spelling.
        if grant.fields() != fields {
            return Err(GrantError::Malformed);
        }
        let expected = gk.tag(key, fields, next);
        // Compared in constant time: every byte is looked at whatever differs.
        let diff = expected.as_ref()[..MAC_BYTES]
            .iter()
            .zip(&mac)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(GrantError::BadMac);
        }
        if now_ms > grant.expires_ms {
            return Err(GrantError::Expired);
        }
        Ok(grant)
    }
}

impl Grant {
    /// The rank a `grant` parameter names, unverified: which key to verify it with.
    pub fn rank_in(text: &str) -> Option<u32> {
        let (fields, _) = text.rsplit_once('.')?;
        parse_fields(fields).map(|g| g.rank)
    }
}

fn parse_fields(fields: &str) -> Option<Grant> {
    let mut it = fields.split('.').map(|f| {
        if f.is_empty() || f.len() > 20 || !f.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            f.parse::<u64>().ok()
        }
    });
    let mut next = || it.next().flatten();
    let op = GrantOp::from_u64(next()?)?;
    let rank = u32::try_from(next()?).ok()?;
    let medium = u8::try_from(next()?).ok().filter(|&m| m <= 2)?;
    let grant = Grant {
        op,
        rank,
        medium,
        offset: next()?,
        len: next()?,
        size: next()?,
        obj_id: u32::try_from(next()?).ok()?,
        obj_generation: next()?,
        view: next()?,
        expires_ms: next()?,
        sum: next()?,
        floor: next()?,
    };
    if it.next().is_some() || grant.size > grant.len {
        return None;
    }
    Some(grant)
}

/// The MAC of a grant's text: what identifies it in the [`GrantLedger`]. `None` when the text
/// has none (a grant that verified always has one).
pub fn mac_of(text: &str) -> Option<[u8; MAC_BYTES]> {
    let (_, mac) = text.rsplit_once('.')?;
    unhex(mac)?.try_into().ok()
}

/// The grants a process served a write or a move under, each kept until its expiry (a grant
/// past it is refused as expired anyway), in at most `cap` entries. Pure: the caller passes
/// the time; [`GrantLedger`] shares it between threads.
pub struct UsedGrants {
    /// MAC → expiry (Unix ms).
    seen: HashMap<[u8; MAC_BYTES], u64, foldhash::fast::RandomState>,
    /// The same entries, soonest expiry first, for pruning.
    by_expiry: BinaryHeap<Reverse<(u64, [u8; MAC_BYTES])>>,
    cap: usize,
    /// The latest expiry of a grant forgotten so far: a grant expiring at or before it may
    /// have been used and forgotten, and is refused as expired whatever the clock says now
    /// (a wall clock set back would otherwise make a forgotten grant valid again).
    forgot_up_to: u64,
}

/// Expired entries one [`UsedGrants::admit`] forgets, at most: one admission never pays for
/// a whole burst of expiries, and pruning keeps up (each admission adds one entry and takes
/// up to this many out). A full ledger with an expired entry always frees room: the soonest
/// expiry goes first.
const PRUNE_STEP: usize = 32;

impl UsedGrants {
    pub fn new(cap: usize) -> UsedGrants {
        UsedGrants {
            seen: HashMap::default(),
            by_expiry: BinaryHeap::new(),
            cap,
            forgot_up_to: 0,
        }
    }

    /// Records the grant with MAC `mac` (valid until `expires_ms`) as used at `now_ms`:
    /// `Err(Used)` when it was already, `Err(Expired)` when it expires no later than a grant
    /// already forgotten (it may be one: the wall clock went back since), `Err(LedgerFull)`
    /// when `cap` grants not yet expired are recorded (nothing is forgotten early, so nothing
    /// could be replayed).
    pub fn admit(
        &mut self,
        mac: [u8; MAC_BYTES],
        expires_ms: u64,
        now_ms: u64,
    ) -> Result<(), GrantError> {
        self.prune(now_ms, PRUNE_STEP);
        if self.seen.contains_key(&mac) {
            return Err(GrantError::Used);
        }
        if expires_ms <= self.forgot_up_to {
            return Err(GrantError::Expired);
        }
        // Still full after pruning: none has expired (the soonest expiry is pruned first).
        if self.seen.len() >= self.cap {
            return Err(GrantError::LedgerFull);
        }
        self.seen.insert(mac, expires_ms);
        self.by_expiry.push(Reverse((expires_ms, mac)));
        Ok(())
    }

    /// Forgets up to `most` grants expired at `now_ms`.
    fn prune(&mut self, now_ms: u64, most: usize) {
        for _ in 0..most {
            match self.by_expiry.peek() {
                Some(Reverse((exp, mac))) if *exp < now_ms => {
                    self.forgot_up_to = self.forgot_up_to.max(*exp);
                    self.seen.remove(mac);
                    self.by_expiry.pop();
                }
                _ => break,
            }
        }
    }

    /// Grants recorded (used, not yet forgotten).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// [`UsedGrants`] of a whole process (every shard serves grants): the one place a write or
/// move grant is marked used, when its request is admitted, before any byte of it is written.
pub struct GrantLedger(
    // LOCK-OK: one short hold per write or move served under a grant (a hash lookup and insert,
    // at most `PRUNE_STEP` expired entries pruned), never per read
    Mutex<UsedGrants>,
);

impl GrantLedger {
    pub fn new(cap: usize) -> GrantLedger {
        GrantLedger(Mutex::new(UsedGrants::new(cap))) // LOCK-OK: see the field
    }

    /// Marks the verified `grant` (its text `text`) used at `now_ms`; refused when it was
    /// already, or when the ledger is full.
    pub fn admit(&self, text: &str, grant: &Grant, now_ms: u64) -> Result<(), GrantError> {
        let mac = mac_of(text).ok_or(GrantError::Malformed)?;
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(mac, grant.expires_ms, now_ms)
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Wall-clock milliseconds since the Unix epoch (grants cross hosts; their clocks are
/// assumed within a few seconds of each other, as NTP keeps them).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Grant {
        Grant {
            op: GrantOp::WriteCommit,
            rank: 2,
            medium: 1,
            offset: 8192,
            len: 12288,
            size: 10000,
            obj_id: 7,
            obj_generation: 42,
            view: 3,
            expires_ms: 2_000_000,
            sum: 99,
            floor: 5,
        }
    }

    #[test]
    fn a_signed_grant_verifies_and_round_trips() {
        let gk = GrantKey::random();
        let text = sample().sign(&gk, b"k1", b"");
        assert_eq!(
            Grant::verify(&gk, &text, b"k1", b"", 1_000_000),
            Ok(sample())
        );
    }

    #[test]
    fn altering_anything_breaks_the_grant() {
        let gk = GrantKey::random();
        let text = sample().sign(&gk, b"k1", b"http://h:1/x");
        // Another key, another next hop, another signing key.
        let other = GrantKey::random();
        for (signer, key, hop) in [
            (&gk, &b"k2"[..], &b"http://h:1/x"[..]),
            (&gk, b"k1", b"http://evil:1/x"),
            (&other, b"k1", b"http://h:1/x"),
        ] {
            assert_eq!(
                Grant::verify(signer, &text, key, hop, 0),
                Err(GrantError::BadMac)
            );
        }
        // Another rank, offset, operation or checksum in the fields.
        for (from, to) in [
            ("1.2.1.", "1.3.1."),
            (".8192.", ".4096."),
            ("1.2.", "3.2."),
            (".2000000.99.", ".2000000.98."),
        ] {
            let altered = text.replacen(from, to, 1);
            assert_ne!(altered, text);
            assert_eq!(
                Grant::verify(&gk, &altered, b"k1", b"http://h:1/x", 0),
                Err(GrantError::BadMac),
                "{altered}"
            );
        }
    }

    #[test]
    fn expired_and_malformed_grants_are_refused() {
        let gk = GrantKey::random();
        let text = sample().sign(&gk, b"k", b"");
        assert_eq!(
            Grant::verify(&gk, &text, b"k", b"", 2_000_001),
            Err(GrantError::Expired)
        );
        for bad in [
            "",
            "abc",
            "1.2.3",
            "1.2.1.0.0.0.0.0.0",
            "9.2.1.0.4096.0.0.0.5.00112233445566778899aabbccddeeff",
            "1.2.1.0.4096.5000.0.0.5.00112233445566778899aabbccddeeff",
            "1.2.1.00.4096.0.0.0.5.00112233445566778899aabbccddeeff",
            "1.2.1.0.4096.0.0.0.5.0011",
        ] {
            assert_eq!(
                Grant::verify(&gk, bad, b"k", b"", 0),
                Err(GrantError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_members_grants_verify_only_with_that_members_key() {
        let master = GrantKey::random();
        let mine = master.for_member(2, 77, 5);
        let text = sample().sign(&mine, b"k", b"");
        assert!(Grant::verify(&master.for_member(2, 77, 5), &text, b"k", b"", 0).is_ok());
        // The rank's next incarnation, the same process's next membership (it was declared
        // lost and joined again), another rank, the master key itself: refused.
        for other in [
            master.for_member(2, 78, 5),
            master.for_member(2, 77, 6),
            master.for_member(3, 77, 5),
            master,
        ] {
            assert_eq!(
                Grant::verify(&other, &text, b"k", b"", 0),
                Err(GrantError::BadMac)
            );
        }
        assert_eq!(Grant::rank_in(&text), Some(2));
        assert_eq!(Grant::rank_in("1.2.3"), None);
    }

    #[test]
    fn a_body_mac_verifies_only_the_same_body_under_the_same_key() {
        let gk = GrantKey::random();
        let mac = gk.body_mac(b"{\"freed\":[]}");
        assert_eq!(mac.len(), 2 * MAC_BYTES);
        assert!(gk.verify_body(b"{\"freed\":[]}", mac.as_bytes()));
        assert!(!gk.verify_body(b"{\"freed\":[1]}", mac.as_bytes()));
        assert!(!GrantKey::random().verify_body(b"{\"freed\":[]}", mac.as_bytes()));
        assert!(!gk.verify_body(b"{\"freed\":[]}", &mac.as_bytes()[1..]));
    }

    #[test]
    fn a_used_grant_is_refused_until_it_expires_then_forgotten() {
        let gk = GrantKey::random();
        let text = sample().sign(&gk, b"k", b"");
        let ledger = GrantLedger::new(4);
        assert_eq!(ledger.admit(&text, &sample(), 1_000_000), Ok(()));
        // A replay, however soon or late before the expiry.
        for now in [1_000_000, 1_500_000, 2_000_000] {
            assert_eq!(
                ledger.admit(&text, &sample(), now),
                Err(GrantError::Used),
                "{now}"
            );
        }
        // Another grant (another blob, or the same blob with another expiry) is its own.
        let mut other = sample();
        other.expires_ms += 1;
        let other_text = other.sign(&gk, b"k", b"");
        assert_eq!(ledger.admit(&other_text, &other, 1_000_000), Ok(()));
        assert_eq!(ledger.len(), 2);
        // Past its expiry it is forgotten (`verify` refuses it as expired from then on).
        let mut later = sample();
        later.offset = 0;
        later.expires_ms = 9_000_000;
        let later_text = later.sign(&gk, b"k", b"");
        assert_eq!(ledger.admit(&later_text, &later, 2_000_002), Ok(()));
        assert_eq!(ledger.len(), 1, "both expired grants were pruned");
        assert_eq!(
            ledger.admit("no-mac", &sample(), 0),
            Err(GrantError::Malformed)
        );
    }

    #[test]
    fn a_full_ledger_refuses_rather_than_forgets() {
        let mut used = UsedGrants::new(3);
        let mac = |i: u8| [i; MAC_BYTES];
        for i in 0..3 {
            assert_eq!(used.admit(mac(i), 100 + u64::from(i), 50), Ok(()));
        }
        // Full of live grants: refused, and nothing was dropped to make room.
        assert_eq!(used.admit(mac(9), 200, 60), Err(GrantError::LedgerFull));
        assert_eq!(used.admit(mac(0), 100, 60), Err(GrantError::Used));
        assert_eq!(used.len(), 3);
        // Once one expired there is room again; the others are still refused.
        assert_eq!(used.admit(mac(9), 200, 101), Ok(()));
        assert_eq!(used.admit(mac(1), 101, 101), Err(GrantError::Used));
        assert_eq!(used.admit(mac(2), 102, 101), Err(GrantError::Used));
        assert_eq!(used.len(), 3);
    }

    /// Found by the cluster simulation (seed 731, three metas): a local service's wall clock
    /// set back 632 ms made a grant it had used and then forgotten (expired by its clock then)
    /// valid again; the replayed write landed on a range another key held since.
    #[test]
    fn a_clock_set_back_does_not_revive_a_forgotten_grant() {
        let mut used = UsedGrants::new(100);
        let mac = |i: u8| [i; MAC_BYTES];
        assert_eq!(used.admit(mac(1), 1000, 500), Ok(()));
        // Later, by this clock, the grant expired and is forgotten.
        assert_eq!(used.admit(mac(2), 5000, 1200), Ok(()));
        assert_eq!(used.len(), 1);
        // The clock is set back: the first grant looks valid again, and is refused.
        assert_eq!(used.admit(mac(1), 1000, 900), Err(GrantError::Expired));
        // So is any grant expiring no later than one forgotten; later ones are admitted.
        assert_eq!(used.admit(mac(3), 999, 900), Err(GrantError::Expired));
        assert_eq!(used.admit(mac(4), 1001, 900), Ok(()));
        assert_eq!(used.admit(mac(2), 5000, 900), Err(GrantError::Used));
    }

    #[test]
    fn pruning_is_bounded_per_admission() {
        let mut used = UsedGrants::new(1000);
        for i in 0..200u32 {
            let mut mac = [0u8; MAC_BYTES];
            mac[..4].copy_from_slice(&i.to_be_bytes());
            used.admit(mac, 10, 0).unwrap();
        }
        // All 200 expired: one admission forgets at most PRUNE_STEP of them, the next ones
        // the rest.
        used.admit([0xff; MAC_BYTES], 1000, 11).unwrap();
        assert_eq!(used.len(), 200 - PRUNE_STEP + 1);
        for i in 0..10 {
            used.admit([0xf0 + i; MAC_BYTES], 1000, 11).unwrap();
        }
        assert_eq!(used.len(), 11);
    }

    #[test]
    fn keys_round_trip_through_hex() {
        let gk = GrantKey::random();
        let back = GrantKey::from_hex(&gk.to_hex()).unwrap();
        let text = sample().sign(&gk, b"k", b"");
        assert!(Grant::verify(&back, &text, b"k", b"", 0).is_ok());
        assert!(GrantKey::from_hex("zz").is_none());
    }
}
