//! Incremental decoder of `Transfer-Encoding: chunked` request bodies (RFC 9112 §7.1).
//!
//! Fed whatever bytes have arrived; appends the decoded data to a body buffer and says how
//! many input bytes it consumed, so the connection can drop them from its read buffer.

use super::parse::ProtocolError;
use super::response::Status;
use crate::limits::{MAX_CHUNK_LINE_BYTES, MAX_TRAILER_BYTES};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data; this many bytes remain.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty line. Counts trailer bytes seen.
    Trailers(usize),
    Done,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Consumed what it could; more input is needed.
    NeedMore,
    /// The body is complete.
    Done,
}

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    decoded: u64,
    max: u64,
}

const MALFORMED: ProtocolError = ProtocolError::new(Status::BAD_REQUEST, "Malformed chunked body");
pub const TOO_LARGE: ProtocolError =
    ProtocolError::new(Status::PAYLOAD_TOO_LARGE, "Request body too large");

impl ChunkedDecoder {
    /// A decoder that refuses bodies longer than `max` decoded bytes (413).
    pub fn new(max: u64) -> ChunkedDecoder {
        ChunkedDecoder {
            state: State::Size,
            decoded: 0,
            max,
        }
    }

    /// Decodes in place: undecoded input is `buf[*read..]`, decoded body bytes are moved down
    /// to end at `*write` (`*write <= *read` always holds, because framing is never shorter
    /// than zero bytes). Advances both offsets past what it could process.
    pub fn decode_in_place(
        &mut self,
        buf: &mut [u8],
        write: &mut usize,
        read: &mut usize,
    ) -> Result<Progress, ProtocolError> {
        debug_assert!(*write <= *read && *read <= buf.len());
        loop {
            let rest = &buf[*read..];
            match self.state {
                State::Done => return Ok(Progress::Done),
                State::Size => {
                    let Some(nl) = memchr::memchr(b'\n', rest) else {
                        if rest.len() > MAX_CHUNK_LINE_BYTES {
                            return Err(MALFORMED);
                        }
                        return Ok(Progress::NeedMore);
                    };
                    if nl > MAX_CHUNK_LINE_BYTES || nl == 0 || rest[nl - 1] != b'\r' {
                        return Err(MALFORMED);
                    }
                    let size = parse_chunk_size(&rest[..nl - 1]).ok_or(MALFORMED)?;
                    *read += nl + 1;
                    if size == 0 {
                        self.state = State::Trailers(0);
                    } else {
                        if self.decoded.saturating_add(size) > self.max {
                            return Err(TOO_LARGE);
                        }
                        self.state = State::Data(size);
                    }
                }
                State::Data(remaining) => {
                    if rest.is_empty() {
                        return Ok(Progress::NeedMore);
                    }
                    let take = (remaining as usize).min(rest.len());
                    buf.copy_within(*read..*read + take, *write);
                    *write += take;
                    *read += take;
                    self.decoded += take as u64;
                    let left = remaining - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                }
                State::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(Progress::NeedMore);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(MALFORMED);
                    }
                    *read += 2;
                    self.state = State::Size;
                }
                State::Trailers(seen) => {
                    let too_large = ProtocolError::new(
                        Status::HEADERS_TOO_LARGE,
                        "Chunked trailer section too large",
                    );
                    let Some(nl) = memchr::memchr(b'\n', rest) else {
                        // A lone CR may begin the blank line that ends the section, which
                        // does not count towards the limit.
                        if rest != b"\r" && seen + rest.len() > MAX_TRAILER_BYTES {
                            return Err(too_large);
                        }
                        return Ok(Progress::NeedMore);
                    };
                    if nl == 0 || rest[nl - 1] != b'\r' {
                        return Err(MALFORMED);
                    }
                    *read += nl + 1;
                    if nl == 1 {
                        self.state = State::Done;
                    } else {
                        // Trailer fields are accepted and ignored.
                        let seen = seen + nl + 1;
                        if seen > MAX_TRAILER_BYTES {
                            return Err(too_large);
                        }
                        self.state = State::Trailers(seen);
                    }
                }
            }
        }
    }
}

/// `1*HEXDIG [ BWS ";" ext ]`: the size, extensions ignored. At most 15 hex digits so the
/// value fits comfortably in a u64. Extensions may hold no control character but HTAB: a bare
/// CR (or other control byte) there is read as a line end by some parsers, which is how a
/// proxy and a server come to disagree on where a body ends.
fn parse_chunk_size(line: &[u8]) -> Option<u64> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if digits_end == 0 || digits_end > 15 {
        return None;
    }
    let tail = super::parse::trim(&line[digits_end..]);
    if !tail.is_empty() && tail[0] != b';' {
        return None;
    }
    if tail.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return None;
    }
    let mut n = 0u64;
    for &b in &line[..digits_end] {
        n = n * 16 + (b as char).to_digit(16)? as u64;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` in one call; returns input consumed, progress and the body.
    fn decode_all(input: &[u8], max: u64) -> Result<(usize, Progress, Vec<u8>), ProtocolError> {
        let mut d = ChunkedDecoder::new(max);
        let mut buf = input.to_vec();
        let (mut w, mut r) = (0, 0);
        let p = d.decode_in_place(&mut buf, &mut w, &mut r)?;
        buf.truncate(w);
        Ok((r, p, buf))
    }

    #[test]
    fn decodes_a_body_with_extensions_and_trailers() {
        let input = b"5;name=v\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        let (n, p, out) = decode_all(input, 1024).unwrap();
        assert_eq!(out, b"hello world");
        assert_eq!(p, Progress::Done);
        assert_eq!(&input[n..], b"NEXT");
    }

    #[test]
    fn byte_at_a_time_gives_the_same_result() {
        // The connection's way: decoded bytes stay at the front, consumed framing is dropped,
        // new input is appended.
        let input = b"a\r\n0123456789\r\n1\r\n!\r\n0\r\n\r\n";
        let mut d = ChunkedDecoder::new(1024);
        let mut buf = Vec::new();
        let mut write = 0;
        let mut done = false;
        for &b in input.iter() {
            buf.push(b);
            let mut read = write;
            let p = d.decode_in_place(&mut buf, &mut write, &mut read).unwrap();
            buf.drain(write..read);
            done = p == Progress::Done;
        }
        assert!(done);
        assert_eq!(buf, b"0123456789!");
    }

    #[test]
    fn refuses_malformed_and_oversized() {
        for bad in [
            &b"x\r\n"[..],
            b"5\nhello\r\n",
            b"5\r\nhelloXX",
            b"-1\r\n",
            b"1234567890abcdef0\r\n",
            b"5 junk\r\n",
            // RFC 9112 §7.1 smuggling shapes: a size prefixed like a C literal, a bare CR or
            // LF in an extension, a missing CRLF after the data, an LF-only size line.
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello0\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"\r\n5\r\nhello\r\n0\r\n\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX: a\n\r\n",
        ] {
            assert_eq!(
                decode_all(bad, 1024).unwrap_err().status,
                Status::BAD_REQUEST,
                "{bad:?}"
            );
        }
        let e = decode_all(b"10\r\n", 8).unwrap_err();
        assert_eq!(e.status, Status::PAYLOAD_TOO_LARGE);
        let endless_size_line = vec![b'1'; MAX_CHUNK_LINE_BYTES + 2];
        assert!(decode_all(&endless_size_line, 1024).is_err());
    }

    #[test]
    fn trailers_at_the_limit_do_not_depend_on_where_reads_end() {
        // Found by the `chunked` fuzz target (fuzz/corpus/chunked/regress_trailer_limit_split):
        // trailers of exactly MAX_TRAILER_BYTES were accepted in one read, but refused with
        // 431 when the CR and LF of the final blank line arrived in separate reads.
        let line = format!("X-Pid: {}\r\n", "a".repeat(MAX_TRAILER_BYTES - 9));
        assert_eq!(line.len(), MAX_TRAILER_BYTES);
        let first = format!("0\r\n{line}\r");
        let whole = format!("{first}\n");
        let (n, p, out) = decode_all(whole.as_bytes(), 1024).unwrap();
        assert_eq!((n, p, out.len()), (whole.len(), Progress::Done, 0));

        let mut d = ChunkedDecoder::new(1024);
        let mut buf = first.into_bytes();
        let (mut w, mut r) = (0, 0);
        let p = d.decode_in_place(&mut buf, &mut w, &mut r);
        assert_eq!(p, Ok(Progress::NeedMore));
        buf.drain(w..r);
        assert_eq!(buf, b"\r");
        buf.push(b'\n');
        let mut r = w;
        let p = d.decode_in_place(&mut buf, &mut w, &mut r);
        assert_eq!((p, w, r), (Ok(Progress::Done), 0, 2));

        // One byte more is refused, and so is a line past the limit before its end arrives.
        let over = format!("0\r\nX-Pid: {}\r\n\r\n", "a".repeat(MAX_TRAILER_BYTES - 8));
        let e = decode_all(over.as_bytes(), 1024).unwrap_err();
        assert_eq!(e.status, Status::HEADERS_TOO_LARGE);
        let unfinished = format!("0\r\nX-Pid: {}", "a".repeat(MAX_TRAILER_BYTES));
        let e = decode_all(unfinished.as_bytes(), 1024).unwrap_err();
        assert_eq!(e.status, Status::HEADERS_TOO_LARGE);
    }
}
