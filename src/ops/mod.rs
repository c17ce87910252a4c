//! The operations behind the commands, as library code that returns typed
//! reports and never prints: provisioning and checking a topology, and the
//! status of its queues, the doctor's checklist and the drill.

pub mod dlq;
pub mod doctor;
pub mod drill;
pub(crate) mod policies;
pub mod provision;
pub mod status;
