//! The cluster protocol between a meta service and its local services, as pure state: no
//! socket, no clock read, no sleep. Every step takes what happened and the time, and says
//! what to do; `http::handlers::cluster`, `agent` and `shards::ranks` carry the messages and
//! the actions, and the cluster simulation drives the same code from a seed.
//!
//! - [`members`]: the meta's membership machine (joins, heartbeats, leaves, losses), fenced
//!   by incarnation and epoch.
//! - [`catalog`]: what a local service holds (its catalog) and what the meta freed on each
//!   rank (the freed logs), with the barriers a removal waits on.
//!
//! `docs/cluster-protocol.md` is the protocol: roles, messages, machines, invariants.

pub mod agent;
pub mod catalog;
pub mod members;

#[cfg(test)]
mod barrier_tests;
