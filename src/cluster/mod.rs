//! The cluster protocol between a meta service and its local services, as pure state: no
//! socket, no clock read, no sleep. Every step takes what happened and the time, and says
//! what to do; `http::handlers::cluster`, `agent`, `shards::ranks` and `ha` carry the messages and
//! the actions, and the cluster simulation drives the same code from a seed.
//!
//! - [`members`]: the meta's membership machine (joins, heartbeats, leaves, losses), fenced
//!   by incarnation and epoch.
//! - [`catalog`]: what a local service holds (its catalog); [`freed`]: what the meta freed on
//!   each rank (the freed logs), with the barriers a removal waits on.
//! - [`records`]: the entries and records made the one way the handlers and the simulation
//!   share (a written blob's entry, a refused adoption's record, a removal's wait).
//! - [`drain`]: a graceful leave's drain (which segment, how much room, when to ask again,
//!   when it is over), carried out by the leave handler and by the simulation.
//! - [`election`]: a meta's election under HA (look, campaign, follow, renew, step down,
//!   purge), carried out by `ha::election` against etcd and by the simulation against its
//!   model; [`tenure`]: a leadership's hold on its etcd lease (serve, renew, step down).
//! - `sim` (tests only): the deterministic cluster simulation on these machines.
//!
//! `docs/cluster-protocol.md` is the protocol: roles, messages, machines, invariants.

pub mod agent;
pub mod catalog;
pub mod drain;
pub mod election;
pub mod freed;
pub mod members;
pub mod records;
pub mod tenure;

#[cfg(test)]
mod barrier_tests;
#[cfg(test)]
mod sim;
