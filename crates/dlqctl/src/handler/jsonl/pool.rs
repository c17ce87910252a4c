//! The pool of handler processes as the messages see it: the ready
//! processes, each with its pending messages, and the reservation of a
//! place on one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::config::JsonlConfig;
use crate::core::handling::outcome::Outcome;

pub(super) struct Pool {
    pub(super) cfg: JsonlConfig,
    pub(super) slots: Vec<Mutex<Option<Arc<Live>>>>,
    /// A process became ready or a message left a process.
    pub(super) changed: Notify,
    pub(super) stopping: CancellationToken,
}

/// What a waiting message hears back.
pub(super) enum Reply {
    /// The process answered, or ended with the message in flight.
    Done(Outcome),
    /// The process ended before the message's line was written: hand it to
    /// another one.
    NotSent,
}

pub(super) struct Entry {
    /// `None` once the message timed out: the process may still work on
    /// it, so the entry stays (it counts against `max_in_flight`) until
    /// the process answers it (a late answer, logged) or ends.
    pub(super) reply: Option<oneshot::Sender<Reply>>,
    pub(super) sent: bool,
    /// Where the answer after the timeout goes (the idempotency guard:
    /// a success marks the key, a failure releases it); told `None` when
    /// the process ends without answering.
    pub(super) late: crate::core::handling::message::LateAnswer,
}

#[derive(Default)]
pub(super) struct Pending {
    /// No more messages: the process is ending.
    pub(super) closed: bool,
    pub(super) map: HashMap<u64, Entry>,
}

/// A ready process, as the messages see it.
pub(super) struct Live {
    pub(super) index: usize,
    pub(super) pid: u32,
    pub(super) lines: mpsc::Sender<(u64, Vec<u8>)>,
    pub(super) pending: Mutex<Pending>,
    pub(super) max_in_flight: usize,
    pub(super) next_id: AtomicU64,
    pub(super) timeouts_in_a_row: AtomicU32,
    /// Cancelled to have the supervisor end the process (with `why`).
    pub(super) restart: CancellationToken,
    pub(super) why: Mutex<Option<String>>,
    /// Cancelled to close the process's stdin.
    pub(super) close_stdin: CancellationToken,
}

impl Live {
    /// Has the supervisor end the process; from now on it takes no new
    /// message, and lines not yet written stay unwritten (their messages
    /// go to another process at no cost).
    pub(super) fn ask_restart(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert(why);
        }
        if let Ok(mut p) = self.pending.lock() {
            p.closed = true;
        }
        self.restart.cancel();
    }

    /// Marks the entry of `id` as sent, just before its line is written;
    /// `false` when it no longer waits or the process takes no more lines.
    pub(super) fn mark_sent(&self, id: u64) -> bool {
        let Ok(mut p) = self.pending.lock() else {
            return false;
        };
        if p.closed {
            return false;
        }
        match p.map.get_mut(&id) {
            Some(e) => {
                e.sent = true;
                true
            }
            None => false,
        }
    }

    /// Takes the entry of `id`, if it still waits.
    pub(super) fn take(&self, id: u64) -> Option<Entry> {
        self.pending.lock().ok()?.map.remove(&id)
    }

    /// The message of `id` timed out: an entry whose line was sent stays,
    /// without its reply, until the process answers it or ends; an unsent
    /// one goes. `Some(sent)` when it still waited, with whether every
    /// place of the process is now held by timed-out messages.
    pub(super) fn expire(&self, id: u64) -> Option<(bool, bool)> {
        let mut p = self.pending.lock().ok()?;
        let e = p.map.get_mut(&id)?;
        e.reply.as_ref()?;
        if !e.sent {
            p.map.remove(&id);
            return Some((false, false));
        }
        e.reply = None;
        let expired = p.map.values().filter(|e| e.reply.is_none()).count();
        Some((true, expired >= self.max_in_flight))
    }

    pub(super) fn load(&self) -> usize {
        self.pending
            .lock()
            .map(|p| p.map.len())
            .unwrap_or(usize::MAX)
    }
}

impl Pool {
    /// Reserves a place on the ready process with the fewest messages in
    /// flight, waiting for one when none is ready or all are full.
    pub(super) async fn reserve(
        &self,
        late: &crate::core::handling::message::LateAnswer,
    ) -> Option<(Arc<Live>, u64, oneshot::Receiver<Reply>)> {
        loop {
            if self.stopping.is_cancelled() {
                return None;
            }
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut ready: Vec<Arc<Live>> = self
                .slots
                .iter()
                .filter_map(|s| s.lock().ok().and_then(|s| s.clone()))
                .collect();
            ready.sort_by_key(|l| l.load());
            for live in ready {
                let Ok(mut p) = live.pending.lock() else {
                    continue;
                };
                if p.closed || p.map.len() >= self.cfg.max_in_flight {
                    continue;
                }
                let id = live.next_id.fetch_add(1, Ordering::SeqCst);
                let (tx, rx) = oneshot::channel();
                p.map.insert(
                    id,
                    Entry {
                        reply: Some(tx),
                        sent: false,
                        late: late.clone(),
                    },
                );
                drop(p);
                return Some((live, id, rx));
            }
            tokio::select! {
                () = changed => {}
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}
