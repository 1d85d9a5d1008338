//! The operations a shard applies to the state it owns, independent of any transport.
//!
//! The HTTP front end (and, later, any other protocol) turns a request into a [`Command`];
//! the key's owner shard applies it and answers with a [`Reply`]. Commands are owned values
//! so they can travel to another shard's inbox unchanged.

use bytes::Bytes;

#[derive(Debug)]
pub enum Command {
    MetadataGet { key: Box<[u8]> },
    MetadataPut { key: Box<[u8]>, value: Bytes },
    MetadataDelete { key: Box<[u8]> },
}

impl Command {
    /// The key that decides the owner shard.
    pub fn key(&self) -> &[u8] {
        match self {
            Command::MetadataGet { key }
            | Command::MetadataPut { key, .. }
            | Command::MetadataDelete { key } => key,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// The operation succeeded and returns bytes.
    Value(Bytes),
    /// The operation succeeded.
    Done,
    /// The key does not exist.
    NotFound,
    /// The owner refused the operation; the text is the error message for the client.
    Refused(&'static str),
    /// The owner shard could not take the request (its inbox, or our outstanding limit, is
    /// full). The client should retry later (429).
    Overloaded,
}
