//! Copies between memory this process addresses that keep clear of two slow cases: writing
//! memory out of cache that nobody reads soon (non-temporal stores: a put's bytes going into a
//! blob, a blob moving down a tier) and `rep movsb` between ends 1 to 31 bytes apart modulo a
//! page, which AMD Zen 3 runs some 20 times slower (glibc's `memcpy` takes it for copies of
//! 2 KiB up to the L2 cache's size).

/// A `memcpy` of `len` bytes; with `stream`, past [`STREAM_MIN_BYTES`], its stores bypass the
/// cache (non-temporal): for a put's bytes going into a blob, which nobody reads soon. A
/// normal copy into memory out of cache reads every line before writing it; 1 MiB into cold
/// memory took 57-61 µs so, 31-39 µs streamed (C, this EPYC VM: `perf/RESULTS.md`, *Session 9*).
/// A copy whose ends are [`aliased`] (up to [`rep_movsb_max`]) takes the same loop with normal
/// stores.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes; they do not overlap.
pub unsafe fn memcpy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    match route(dst, src, len, stream) {
        // SAFETY: per this function's contract.
        #[cfg(target_arch = "x86_64")]
        Route::Sse2 { stream } => unsafe { sse2_copy(dst, src, len, stream) },
        // SAFETY: per this function's contract.
        _ => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
    }
}

/// How [`memcpy`] copies.
#[derive(Debug, PartialEq)]
enum Route {
    /// `std::ptr::copy_nonoverlapping`: the C library's `memcpy`.
    Plain,
    /// [`sse2_copy`]: x86_64 only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Sse2 { stream: bool },
}

fn route(dst: *const u8, src: *const u8, len: usize, stream: bool) -> Route {
    let streamed = stream && len >= STREAM_MIN_BYTES;
    let aliased = (ALIASED_MIN_BYTES..rep_movsb_max()).contains(&len) && aliased(dst, src);
    if cfg!(target_arch = "x86_64") && (streamed || aliased) {
        Route::Sse2 { stream: streamed }
    } else {
        Route::Plain
    }
}

/// Whether `rep movsb` copies from `src` to `dst` at a fraction of its speed: glibc's `memcpy`
/// uses it from 2112 bytes up to [`rep_movsb_max`] on CPUs with ERMS, and on AMD Zen 3 (this
/// project's reference machine) it runs some 20 times slower (1.8 GB/s against 30 in cache,
/// measured in C: `perf/results/copy-alias-17.txt`) when the destination is 1 to 31 bytes past
/// the source modulo 4096. A blob starts on a page and a buffer glibc's `malloc` maps starts 16
/// bytes into one: a get into such a buffer (an array of numpy's) is that case.
fn aliased(dst: *const u8, src: *const u8) -> bool {
    let rel = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..32).contains(&rel)
}

/// The smallest copy [`aliased`] keeps from `rep movsb` (glibc copies smaller ones with vector
/// moves).
const ALIASED_MIN_BYTES: usize = 2048;

/// Where glibc's `memcpy` stops using `rep movsb` on AMD CPUs: the L2 cache's size (larger
/// copies take its AVX loop, faster than [`sse2_copy`] from memory out of cache: 79 against
/// 93 µs per MiB here); 512 KiB (Zen 3's) when the C library does not say.
fn rep_movsb_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        #[cfg(target_env = "gnu")]
        // SAFETY: sysconf reads a value; no memory is passed.
        let l2 = unsafe { libc::sysconf(libc::_SC_LEVEL2_CACHE_SIZE) };
        #[cfg(not(target_env = "gnu"))]
        let l2 = 0;
        usize::try_from(l2)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(512 << 10)
    })
}

/// A copy with SSE2 moves, 64 bytes per step, non-temporal stores when `stream`.
///
/// # Safety
/// As [`memcpy`].
#[cfg(target_arch = "x86_64")]
unsafe fn sse2_copy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_sfence, _mm_store_si128, _mm_stream_si128,
    };
    // SAFETY: the caller's ranges, walked in order: the bytes before `dst`'s first 16-byte
    // boundary copied plainly, then 64 bytes per step (unaligned loads, aligned stores: SSE2,
    // which every x86_64 has), then the tail plainly (under 64 bytes: no `rep movsb`); the
    // fence orders streamed stores before whatever follows (the commit that makes the blob
    // readable).
    unsafe {
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut left) = (dst.add(head), src.add(head), len - head);
        while left >= 64 {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            if stream {
                _mm_stream_si128(d.cast::<__m128i>(), a);
                _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
                _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
                _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            } else {
                _mm_store_si128(d.cast::<__m128i>(), a);
                _mm_store_si128(d.add(16).cast::<__m128i>(), b);
                _mm_store_si128(d.add(32).cast::<__m128i>(), c);
                _mm_store_si128(d.add(48).cast::<__m128i>(), e);
            }
            d = d.add(64);
            s = s.add(64);
            left -= 64;
        }
        std::ptr::copy_nonoverlapping(s, d, left);
        if stream {
            _mm_sfence();
        }
    }
}

/// The smallest copy [`memcpy`] streams (smaller ones are likely to stay in cache anyway).
pub const STREAM_MIN_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_copy_whose_ends_are_1_to_31_bytes_apart_modulo_a_page_is_kept_from_rep_movsb() {
        let page = 4096usize;
        let at = |rel: usize| aliased((page * 3 + rel) as *const u8, (page + 5) as *const u8);
        assert!(!aliased(page as *const u8, page as *const u8));
        assert!(!at(5) && !at(5 + 32) && !at(4));
        assert!(at(6) && at(5 + 16) && at(5 + 31));
        // The other way round: the destination before the source is not the slow case.
        assert!(!aliased((page - 16) as *const u8, page as *const u8));
        assert!(aliased((2 * page + 16) as *const u8, page as *const u8));
        // Those copies, and streamed ones, take the SSE2 loop; the rest glibc's `memcpy`.
        if cfg!(target_arch = "x86_64") {
            let (d, s) = ((page * 3 + 16) as *const u8, page as *const u8);
            let n = ALIASED_MIN_BYTES;
            assert_eq!(route(d, s, n, false), Route::Sse2 { stream: false });
            assert_eq!(route(d, s, n - 1, false), Route::Plain);
            let max = rep_movsb_max();
            assert_eq!(route(d, s, max - 1, false), Route::Sse2 { stream: false });
            assert_eq!(route(d, s, max, false), Route::Plain);
            assert_eq!(route(d, s, max, true), Route::Sse2 { stream: true });
            assert_eq!(route(s, s, n, false), Route::Plain);
            assert_eq!(
                route(s, s, STREAM_MIN_BYTES, true),
                Route::Sse2 { stream: true }
            );
            assert_eq!(
                route(d, s, STREAM_MIN_BYTES - 1, true),
                Route::Sse2 { stream: false }
            );
            assert_eq!(route(s, s, STREAM_MIN_BYTES - 1, true), Route::Plain);
        }
        // Copies in and around the window: every byte, nothing around them.
        let mut area = vec![0u8; 48 * page];
        let base = area.as_ptr().align_offset(page);
        let (src_at, dst_at) = (base + 7, base + 20 * page + 7);
        for (i, b) in area[src_at..src_at + 75_000].iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        for rel in [0, 1, 15, 16, 31, 32, 4095] {
            for len in [
                ALIASED_MIN_BYTES - 1,
                ALIASED_MIN_BYTES,
                ALIASED_MIN_BYTES + 77,
                70_000,
            ] {
                let d = dst_at + rel;
                area[d - 64..d + len + 64].fill(0xee);
                let p = area.as_mut_ptr();
                // SAFETY: both ranges lie in `area`, apart.
                unsafe { memcpy(p.add(d), p.add(src_at), len, false) };
                assert!(
                    area[d..d + len] == area[src_at..src_at + len],
                    "{rel} {len}"
                );
                assert!(area[d - 64..d].iter().all(|&b| b == 0xee));
                assert!(area[d + len..d + len + 64].iter().all(|&b| b == 0xee));
            }
        }
    }

    #[test]
    fn a_streamed_copy_is_a_copy_at_every_alignment_and_length() {
        let n = STREAM_MIN_BYTES + 4096;
        let src: Vec<u8> = (0..n + 64).map(|i| (i * 31 % 253) as u8).collect();
        for len in [
            0,
            1,
            63,
            STREAM_MIN_BYTES - 1,
            STREAM_MIN_BYTES,
            STREAM_MIN_BYTES + 77,
            n,
        ] {
            for (d_off, s_off) in [(0, 0), (1, 0), (0, 3), (15, 7), (16, 1), (33, 60)] {
                for stream in [false, true] {
                    let mut dst = vec![0xeeu8; n + 128];
                    // SAFETY: both vectors hold the ranges (offsets below 64, lengths up to n).
                    unsafe {
                        memcpy(
                            dst.as_mut_ptr().add(d_off),
                            src.as_ptr().add(s_off),
                            len,
                            stream,
                        )
                    };
                    assert!(dst[d_off..d_off + len] == src[s_off..s_off + len]);
                    // Nothing written around it.
                    assert!(dst[..d_off].iter().all(|&b| b == 0xee));
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }
}
