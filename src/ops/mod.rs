//! The operations behind the commands, as library code that returns typed
//! reports and never prints: provisioning and checking a topology, and the
//! status of its queues, and the doctor's checklist.

pub mod dlq;
pub mod doctor;
pub mod provision;
pub mod status;
