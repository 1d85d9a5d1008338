//! What the store benchmarks share: a standalone store as one shard owns it, LMCache-style
//! keys, and a small deterministic random number generator (so runs are repeatable).

use mmc::common::clock::Clock;
use std::sync::Arc;

use mmc::common::event::Event;
use mmc::metrics::store::StoreStats;
use mmc::metrics::trace::Tracer;
use mmc::shards::store::mount::build_segment;
use mmc::shards::store::segment::{Medium, SegmentTable};
use mmc::shards::store::{AllocStep, Placement, Store, StoreConfig};

/// The default of `ock.mmc.segment.run_bytes`.
pub const RUN_BYTES: u64 = 16 << 20;

/// One shard's store over one DRAM (host memory) segment of `capacity_bytes`, mapped lazily:
/// pages cost memory only once written. The shard is shard 0 of a one-shard process, with the
/// embedded default's lease and watermarks.
pub fn dram_store(capacity_bytes: u64) -> Store {
    let table = Arc::new(SegmentTable::default());
    let seg = build_segment(&table, 0, Medium::Dram, capacity_bytes, None, 1, RUN_BYTES)
        .expect("a DRAM segment");
    table.insert(seg).expect("the only segment");
    Store::new(
        0,
        StoreConfig {
            keep_tombstones: false,
            lease_ms: 2000,
            high_percent: 90,
            low_percent: 80,
            alloc_timeout_ms: 30_000,
            remote_writer_ms: 22_250,
            rereplicate: Default::default(),
            key_format: Default::default(),
        },
        table,
        Arc::new(StoreStats::default()),
        Arc::new(Tracer::default()),
        Clock::start(),
    )
}

/// A put as the data plane does it: alloc → write the bytes into the blob → update_state.
/// With `payload` None the bytes are not written (the segment's pages stay untouched), which
/// is enough to measure the store's metadata.
pub fn put(store: &mut Store, key: &[u8], size: u64, payload: Option<&[u8]>) {
    let step = store.alloc(key.into(), size, Placement::on(Some(Medium::Dram), 1));
    let AllocStep::Granted { obj, blobs, .. } = step else {
        panic!("alloc of {size} bytes refused: {step:?}");
    };
    if let Some(data) = payload {
        assert_eq!(data.len() as u64, size);
        for b in &blobs {
            // SAFETY: the blob is ALLOCATED for this writer alone until the commit below.
            unsafe { b.seg.backend.write(b.offset, data) }.expect("write into a DRAM blob");
        }
    }
    assert!(store.commit(obj, true), "commit: the object is gone");
}

/// Takes the store's events and drops them, as the shard loop does after each batch (the
/// store buffers them until then).
pub fn drain_events(store: &mut Store, buf: &mut Vec<Event>) {
    store.swap_events(buf);
    buf.clear();
}

/// xorshift64*: fast, deterministic, good enough to pick sizes and victims.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// A bijective 64-bit mix (the splitmix64 finaliser): distinct inputs give distinct outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const MODELS: [&str; 5] = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
];

/// The `i`-th key of an LMCache-style key space, `model@world_size@worker_id@chunk_hash@dtype`,
/// 62 to 86 bytes. With tensor parallelism `tp`, the `tp` workers of a chunk share its chunk
/// hash (keys `i` with the same `i / tp`). The chunk hash is 24 to 32 hex digits whose low 64
/// bits are a bijection of the chunk number, so keys are distinct and `keys::chunk_hash`
/// recovers a distinct 64-bit hash per chunk.
pub fn lmcache_key(i: u64, tp: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    let chunk = i / tp;
    let worker = i % tp;
    let h = mix(chunk);
    let model = MODELS[(h % MODELS.len() as u64) as usize];
    let dtype = if h & 0x100 == 0 {
        "bfloat16"
    } else {
        "float16"
    };
    // 8 to 16 more hex digits in front of the 16 that carry the hash.
    let extra = 8 + (h >> 60) as usize % 9;
    let high = format!("{:016x}", mix(h));
    out.clear();
    write!(
        out,
        "{model}@{tp}@{worker}@{}{h:016x}@{dtype}",
        &high[..extra]
    )
    .expect("writing to a Vec");
}
