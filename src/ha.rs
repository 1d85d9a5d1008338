//! The high-availability view: `role`, `ha_state`, `leader_address`, `view_version`.
//!
//! Every endpoint that reports HA facts (`/health`, `/role`, `/ha_status`, `/leader`) reads them
//! from this one place. Today the server runs standalone, which is "this node is the leader and
//! is serving"; a later election (etcd) will write the same fields, and nothing that reads them
//! has to change.

use std::sync::RwLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Standby,
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Standby => "standby",
            Role::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaState {
    Starting,
    Standby,
    Serving,
    Unknown,
}

impl HaState {
    pub fn as_str(self) -> &'static str {
        match self {
            HaState::Starting => "starting",
            HaState::Standby => "standby",
            HaState::Serving => "serving",
            HaState::Unknown => "unknown",
        }
    }
}

/// One consistent reading of the HA facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaSnapshot {
    pub role: Role,
    pub state: HaState,
    /// `None` is reported as `unknown`, as the contract says when there is no stable source.
    pub leader_address: Option<String>,
    pub view_version: u64,
}

impl HaSnapshot {
    pub fn leader_present(&self) -> bool {
        self.role == Role::Leader || self.leader_address.is_some()
    }

    pub fn leader_address_str(&self) -> &str {
        self.leader_address.as_deref().unwrap_or("unknown")
    }
}

/// The shared HA view. Read on every HA endpoint (rare, cheap), written only on role changes.
pub struct HaView {
    current: RwLock<HaSnapshot>,
}

impl HaView {
    /// Standalone mode: this node leads and serves; its advertised address, if configured, is
    /// the leader address.
    pub fn standalone(advertise_address: &str) -> HaView {
        let leader_address = (!advertise_address.is_empty()).then(|| advertise_address.to_string());
        HaView {
            current: RwLock::new(HaSnapshot {
                role: Role::Leader,
                state: HaState::Serving,
                leader_address,
                view_version: 0,
            }),
        }
    }

    pub fn snapshot(&self) -> HaSnapshot {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
