//! What kind of failure an error answer reports, so that a client can act on it without
//! reading its text.
//!
//! The contract fixes the error envelope (`success`, `error_message`, `timestamp`) and some of
//! its texts, not a machine-readable code. Every error answer of this server also carries
//! `X-MMC-Error-Code: <kind>` ([`ErrorKind::name`]), and each kind says which return code of
//! upstream MemCache Hybrid (`MmcErrorCode`) a client maps it to ([`ErrorKind::upstream_code`]);
//! `clients/python/mmc_client` does. docs/api.md has the table.

use std::borrow::Cow;

/// The kind of an error answer: one per return code a client distinguishes, plus the
/// reasons an operator tells apart (all `MMC_ERROR` upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A parameter, key or body the server will not take as given (400, 411, 413, 414, 415,
    /// 431, or a business error such as `Invalid 'medium' parameter`).
    InvalidParam,
    /// The key names no readable object (`Key not found`).
    KeyNotFound,
    /// A put of a key that already exists.
    DuplicatedObject,
    /// No room for the object, even after eviction (a full `/metadata` store too).
    NoSpace,
    /// The server or the key's owner has too much work waiting (429, `Retry-After`).
    Overloaded,
    /// The request took too long to arrive (408).
    Timeout,
    /// The server cannot serve it now: not the leader, draining, a peer unreachable (503).
    Unavailable,
    /// A token is missing or wrong, or a grant is refused (401, 403).
    Unauthorized,
    /// No such route or segment (404, `Segment not found`).
    NotFound,
    /// The method, coding, version or operation is not supported (405, 501, 505, `Not
    /// supported`).
    Unsupported,
    /// The key was removed while its put was writing it; the put did not take effect.
    WriteRevoked,
    /// Anything else: an I/O error, a damaged copy, an internal error.
    Failed,
}

impl ErrorKind {
    /// Every kind, in the order docs/api.md lists them.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::InvalidParam,
        ErrorKind::KeyNotFound,
        ErrorKind::DuplicatedObject,
        ErrorKind::NoSpace,
        ErrorKind::Overloaded,
        ErrorKind::Timeout,
        ErrorKind::Unavailable,
        ErrorKind::Unauthorized,
        ErrorKind::NotFound,
        ErrorKind::Unsupported,
        ErrorKind::WriteRevoked,
        ErrorKind::Failed,
    ];

    /// The value of the `X-MMC-Error-Code` header.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidParam => "invalid_param",
            ErrorKind::KeyNotFound => "key_not_found",
            ErrorKind::DuplicatedObject => "duplicated_object",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::WriteRevoked => "write_revoked",
            ErrorKind::Failed => "failed",
        }
    }

    /// Upstream MemCache Hybrid's return code for this kind (`MmcErrorCode`: `MMC_ERROR` -1,
    /// `MMC_INVALID_PARAM` -3000, `MMC_TIMEOUT` -3004, `MMC_DUPLICATED_OBJECT` -3006,
    /// `MMC_NOT_ENOUGH_MEMORY` -3016, `MMC_NOT_CONNET_META` -3017, `MMC_UNMATCHED_KEY` -3102).
    pub const fn upstream_code(self) -> i32 {
        match self {
            ErrorKind::InvalidParam => -3000,
            ErrorKind::KeyNotFound => -3102,
            ErrorKind::DuplicatedObject => -3006,
            ErrorKind::NoSpace => -3016,
            ErrorKind::Overloaded | ErrorKind::Timeout => -3004,
            ErrorKind::Unavailable => -3017,
            ErrorKind::Unauthorized
            | ErrorKind::NotFound
            | ErrorKind::Unsupported
            | ErrorKind::WriteRevoked
            | ErrorKind::Failed => -1,
        }
    }

    /// The contract's (or this server's fixed) text for the kinds that have one.
    pub const fn message(self) -> Option<&'static str> {
        match self {
            ErrorKind::KeyNotFound => Some("Key not found"),
            ErrorKind::DuplicatedObject => Some("Duplicated object: key already exists"),
            ErrorKind::NoSpace => Some("No space, even after eviction"),
            ErrorKind::Overloaded => Some("Server overloaded: too much work waiting, retry later"),
            ErrorKind::WriteRevoked => Some("Key was removed while it was being written"),
            ErrorKind::Unsupported => Some("Not supported"),
            ErrorKind::Failed => Some("Internal server error"),
            _ => None,
        }
    }

    /// The kind of a protocol error answered with `status` and no more specific kind.
    pub const fn for_status(status: u16) -> ErrorKind {
        match status {
            400 | 411 | 413 | 414 | 415 | 431 => ErrorKind::InvalidParam,
            401 | 403 => ErrorKind::Unauthorized,
            // A standby's redirect to the leader: not served here.
            307 => ErrorKind::Unavailable,
            404 => ErrorKind::NotFound,
            405 | 501 | 505 => ErrorKind::Unsupported,
            408 => ErrorKind::Timeout,
            429 => ErrorKind::Overloaded,
            503 => ErrorKind::Unavailable,
            _ => ErrorKind::Failed,
        }
    }
}

/// Why an operation was refused: its kind and the text the client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: ErrorKind,
    pub message: Cow<'static, str>,
}

impl Refusal {
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    /// A refusal with `kind`'s fixed text ([`ErrorKind::message`]; the kind's name for a kind
    /// without one).
    pub const fn of(kind: ErrorKind) -> Refusal {
        Refusal {
            kind,
            message: Cow::Borrowed(match kind.message() {
                Some(m) => m,
                None => kind.name(),
            }),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_tokens() {
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert!(
            names.iter().all(|n| {
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn protocol_statuses_map_as_the_client_did() {
        assert_eq!(ErrorKind::for_status(413).upstream_code(), -3000);
        assert_eq!(ErrorKind::for_status(429).upstream_code(), -3004);
        assert_eq!(ErrorKind::for_status(408).upstream_code(), -3004);
        assert_eq!(ErrorKind::for_status(503).upstream_code(), -3017);
        assert_eq!(ErrorKind::for_status(401).upstream_code(), -1);
        assert_eq!(ErrorKind::for_status(500), ErrorKind::Failed);
    }
}
