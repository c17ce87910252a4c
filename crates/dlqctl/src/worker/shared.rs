//! The state every delivery task of a worker shares.

use super::circuit::Circuit;
use crate::worker::metrics::QueueCounters;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tracing::warn;

/// State shared by every delivery task.
pub(super) struct Shared {
    pub(super) retry_queues: Vec<String>,
    /// Tasks currently retrying a refused publish: no new handler starts
    /// while this is above zero.
    pub(super) refusing: AtomicUsize,
    pub(super) unblocked: Notify,
    /// The pipeline's circuit breaker, when it has one.
    pub(super) circuit: Option<Arc<Circuit>>,
    /// The index of the broker address connected to last.
    pub(super) address: AtomicUsize,
    /// The connection was lost: start at the next address.
    pub(super) move_on: AtomicBool,
    /// The consumer timeout was checked at start (it is not checked again
    /// on a reconnection: the worker's own timer reads it every minute).
    pub(super) timeout_checked: AtomicBool,
    pub(super) warned: Mutex<HashSet<String>>,
    pub(super) counters: QueueCounters,
    /// The idempotency guard, once its store is open (pipelines with
    /// `idempotency`).
    pub(super) guard: std::sync::OnceLock<Arc<super::idempotency::Guard>>,
}

impl Shared {
    /// Logs a header warning once per distinct text.
    pub(super) fn warn_once(&self, text: &str) {
        let first = self
            .warned
            .lock()
            .map(|mut w| w.len() < 1000 && w.insert(text.to_string()))
            .unwrap_or(false);
        if first {
            warn!(warning = text, "malformed header, treated as absent");
        }
    }
}
