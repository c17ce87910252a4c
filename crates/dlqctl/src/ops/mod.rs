//! The operations behind the commands, as library code that returns typed
//! reports and never prints: provisioning and checking a topology, and the
//! status of its queues, the doctor's checklist and the drill, and the
//! pipeline's health probe.

pub mod dlq;
pub mod doctor;
pub mod drill;
pub mod health;
pub mod metrics_page;
pub(crate) mod policies;
pub mod provision;
pub mod status;
