//! What `provision`, `provision --check` and `doctor` find about the
//! objects a topology declares.
//!
//! - [`finding`]: one finding about one object.
//! - [`drift`]: reading the broker's refusals: which argument differs.
//! - [`effective`]: which policy and operator policy apply to a queue,
//!   from their definitions.
//! - [`policy`]: what a policy changes in a planned queue.
//! - [`stale`]: objects with dlqctl's names the topology no longer has.
//! - `cycle`: a DLQ that dead-letters back into its own pipeline.
//! - [`doctor`]: the checklist of `dlqctl doctor` (its parts in the
//!   `doctor_*` files).
//! - [`consumer_timeout`]: the queue's consumer timeout against the
//!   handler timeout (`work` refuses to start, `doctor` fails).
//! - [`permissions`]: which commands a user's permissions allow.
//! - [`circuit`]: a worker's circuit breaker, read from its metrics page.
//! - [`idempotency`]: a pipeline's idempotency store as doctor, status and
//!   validate see it.
//! - [`futile`]: valid settings that cannot do what they are for, which
//!   validate warns about.

pub mod circuit;
pub mod consumer_timeout;
pub(crate) mod cycle;
pub mod doctor;
mod doctor_broker;
mod doctor_health;
mod doctor_idempotency;
mod doctor_item;
mod doctor_limits;
mod doctor_permissions;
mod doctor_policies;
mod doctor_snapshot;
pub mod drift;
pub mod effective;
pub mod finding;
pub mod futile;
pub mod idempotency;
pub mod permissions;
pub mod policy;
pub mod stale;
