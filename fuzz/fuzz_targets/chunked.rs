//! `mmc::http::chunked::ChunkedDecoder` fed the way `src/http/conn.rs` feeds it: decoded body
//! bytes stay at the front of the buffer, consumed framing is drained, new input is appended,
//! at fuzzer-chosen split points.
//!
//! Input format (so that seeds stay readable and every byte string is still a valid input):
//! - byte 0 selects the decoder's `max` (`'0'`..`'7'`, i.e. the value modulo 8, index `MAXES`);
//! - the rest is the chunked stream, in which
//!   - `0xFF` marks a split point (the bytes between two marks arrive as one read) and is
//!     removed from the stream;
//!   - `0xFE lo hi b` expands to `u16::from_le_bytes([lo, hi])` copies of byte `b`, so that a
//!     small input can reach the 1 KiB chunk-line and 16 KiB trailer limits (a literal `0xFF`
//!     or `0xFE` in the stream is written `0xFE 0x01 0x00 0xFF`).
//!
//! Properties: no panic; `write <= read <= len` after every call; the decoded total never
//! exceeds `max`; the stream in one piece and in pieces gives the same outcome: same body and
//! same remaining input when done, same body so far when more is needed, both refused when
//! refused. A refusal's status may depend on where the input was split when the input breaks
//! two rules at once (a trailer line over the limit that also ends in a bare LF is 400 when it
//! arrives whole and 431 when its first part arrives alone); the connection closes after
//! either. 413 is different (the connection answers it before reading the body), so a 413
//! must be a 413 however the input is split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmc::http::chunked::{ChunkedDecoder, Progress};
use mmc::http::response::Status;

const MAXES: [u64; 8] = [0, 1, 5, 16, 1000, 65536, 64 << 20, u64::MAX];
/// Bound on the expanded stream, to keep executions fast.
const MAX_STREAM: usize = 256 * 1024;

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done { body: Vec<u8>, rest: Vec<u8> },
    NeedMore { body: Vec<u8> },
    Refused(Status),
}

/// Expands the input into the stream and the lengths of its pieces.
fn expand(data: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let mut stream = Vec::new();
    let mut cuts = Vec::new();
    let mut i = 0;
    while i < data.len() && stream.len() < MAX_STREAM {
        match data[i] {
            0xFF => {
                cuts.push(stream.len());
                i += 1;
            }
            0xFE if i + 3 < data.len() => {
                let n = u16::from_le_bytes([data[i + 1], data[i + 2]]) as usize;
                let n = n.min(MAX_STREAM - stream.len());
                stream.extend(std::iter::repeat_n(data[i + 3], n));
                i += 4;
            }
            b => {
                stream.push(b);
                i += 1;
            }
        }
    }
    cuts.push(stream.len());
    let mut pieces = Vec::with_capacity(cuts.len());
    let mut last = 0;
    for c in cuts {
        pieces.push(c - last);
        last = c;
    }
    (stream, pieces)
}

fn check_offsets(buf: &[u8], write: usize, read: usize, max: u64) {
    assert!(write <= read, "write {write} > read {read}");
    assert!(read <= buf.len(), "read {read} > len {}", buf.len());
    assert!(write as u64 <= max, "decoded {write} bytes, max {max}");
}

fn one_piece(stream: &[u8], max: u64) -> Outcome {
    let mut dec = ChunkedDecoder::new(max);
    let mut buf = stream.to_vec();
    let (mut w, mut r) = (0, 0);
    let p = dec.decode_in_place(&mut buf, &mut w, &mut r);
    check_offsets(&buf, w, r, max);
    match p {
        Ok(Progress::Done) => Outcome::Done {
            body: buf[..w].to_vec(),
            rest: stream[r..].to_vec(),
        },
        Ok(Progress::NeedMore) => Outcome::NeedMore {
            body: buf[..w].to_vec(),
        },
        Err(e) => Outcome::Refused(e.status),
    }
}

fn in_pieces(stream: &[u8], pieces: &[usize], max: u64) -> Outcome {
    let mut dec = ChunkedDecoder::new(max);
    let mut buf = Vec::new();
    let mut write = 0;
    let mut offset = 0;
    for &n in pieces {
        buf.extend_from_slice(&stream[offset..offset + n]);
        offset += n;
        let mut w = write;
        let mut r = write;
        let p = dec.decode_in_place(&mut buf, &mut w, &mut r);
        check_offsets(&buf, w, r, max);
        buf.drain(w..r);
        write = w;
        match p {
            Ok(Progress::NeedMore) => {}
            Ok(Progress::Done) => {
                let mut rest = buf.split_off(w);
                rest.extend_from_slice(&stream[offset..]);
                return Outcome::Done { body: buf, rest };
            }
            Err(e) => return Outcome::Refused(e.status),
        }
    }
    buf.truncate(write);
    Outcome::NeedMore { body: buf }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let max = MAXES[sel as usize % MAXES.len()];
    let (stream, pieces) = expand(rest);
    let whole = one_piece(&stream, max);
    let split = in_pieces(&stream, &pieces, max);
    match (&whole, &split) {
        (Outcome::Refused(a), Outcome::Refused(b)) => assert!(
            (*a == Status::PAYLOAD_TOO_LARGE) == (*b == Status::PAYLOAD_TOO_LARGE),
            "one piece refused with {a:?}, pieces {pieces:?} with {b:?}"
        ),
        _ => assert_eq!(whole, split, "one piece vs pieces {pieces:?}"),
    }
});
