//! Confirmed, `mandatory` publishing of copies on confirm-mode channels.

use crate::error::describe_lapin_error;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::core::retry::confirm::{judge_batch, BatchOutcome, Confirm};
pub use crate::core::retry::confirm::{Refusal, Verdict};

/// Publishes on `ch` with `mandatory` set: a copy no queue takes comes
/// back (`basic.return`) instead of being dropped, so it is never counted
/// as delivered. The confirm is the caller's to wait for.
pub(crate) async fn publish_mandatory(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> lapin::Result<PublisherConfirm> {
    ch.basic_publish(
        exchange.into(),
        routing_key.into(),
        BasicPublishOptions {
            mandatory: true,
            immediate: false,
        },
        body,
        props,
    )
    .await
}

/// Confirm-mode publishing channels ("lanes"), each with many copies in
/// flight, whose confirms are judged in the copies' own tasks.
///
/// lapin does not tie a `basic.return` to the publish it belongs to: it
/// hands the oldest waiting return to the next confirm it completes (a
/// multiple ack completes its tags in no set order). So a returned copy
/// can read as `Ack(None)` while another copy's confirm carries its return.
/// What holds: the broker sends a copy's return before its ack, and the
/// confirm that takes that return is resolved no later than the copy's own
/// (earlier in the same frame, or in an earlier frame). So a verdict is
/// given only by a judgement that has seen every confirm resolved so far:
///
/// - it runs when no publish is under way on the lane, so every published
///   confirm is in the lane's book;
/// - each confirm is polled with a waker of its own, which lapin calls as
///   it resolves the confirm (one thread resolves them in order) and which
///   notes the copy as ready before it wakes the copy's task; a judgement
///   takes every copy noted so far, so it sees every confirm resolved
///   before the one that woke it;
/// - when any confirm it takes carries a return, no verdict on that lane
///   can be trusted: every copy in the book is refused and the lane is
///   retired (its copies are published again elsewhere; a duplicate is
///   possible, a loss is not).
///
/// The judgement runs in the task of whichever copy is woken first (or of
/// the publisher that ends a publish while a judgement waits), and wakes
/// the copies it answered. A copy's task is woken by lapin when its
/// confirm resolves, as in a hand-written loop. An earlier version handed
/// each confirm to a collector task and each verdict back, which cost the
/// retry path two task wake-ups and four allocations a copy.
pub struct Publisher {
    conn: Arc<Connection>,
    lanes: Vec<tokio::sync::Mutex<Option<Arc<Lane>>>>,
    next: AtomicUsize,
    confirm_timeout: Duration,
}

/// One publishing channel.
struct Lane {
    channel: Channel,
    /// Held from `basic.publish` until its confirm is in the book: one
    /// publish at a time on a lane.
    gate: Arc<tokio::sync::Mutex<()>>,
    book: Mutex<Book>,
    /// The copies whose confirm has resolved since the last judgement, in
    /// the order lapin resolved them (filled by their [`Signal`]s).
    ready: Arc<Mutex<Vec<u64>>>,
}

/// A lane's copies in flight.
#[derive(Default)]
struct Book {
    next_id: u64,
    copies: HashMap<u64, Copy>,
    /// What the confirms read so far and not yet judged said.
    unjudged: Vec<(u64, Confirm)>,
    /// A `basic.publish` is under way: its confirm may already be resolved
    /// without being in the book, so no judgement may run (the publisher
    /// judges when it ends).
    publishing: bool,
    /// Why the lane was retired (a return, a timeout, a failed publish).
    retired: Option<String>,
}

/// A published copy.
struct Copy {
    /// Its confirm, until it resolves.
    confirm: Option<PublisherConfirm>,
    /// What wakes when the confirm resolves (its [`Signal`]).
    signal: Arc<Signal>,
    waker: Waker,
    /// The verdict, until its task takes it.
    verdict: Option<Verdict>,
    /// Its task stopped waiting (a timeout): it is judged all the same,
    /// since its confirm may carry another copy's return, then dropped.
    abandoned: bool,
    /// Its body's size, to tell whose size a channel's refusal is about.
    size: usize,
}

/// The waker a copy's confirm is polled with: notes the copy as ready,
/// then wakes the copy's task.
struct Signal {
    id: u64,
    ready: Arc<Mutex<Vec<u64>>>,
    task: Mutex<Waker>,
}

impl std::task::Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.ready).push(self.id);
        lock(&self.task).wake_by_ref();
    }
}

/// Locks `m`. No code under these locks panics, so a poisoned one is
/// still whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Copy {
    /// Reads the confirm, once it has resolved (only once).
    fn read(&mut self) -> Option<Confirm> {
        let confirm = self.confirm.as_mut()?;
        let mut cx = Context::from_waker(&self.waker);
        let Poll::Ready(r) = Pin::new(confirm).poll(&mut cx) else {
            return None;
        };
        self.confirm = None;
        Some(confirm_of(r))
    }
}

impl Book {
    fn retire(&mut self, because: &str) {
        if self.retired.is_none() {
            self.retired = Some(because.to_string());
        }
    }

    /// Gives every verdict it can, and returns the copies answered, with
    /// their tasks to wake.
    fn judge(&mut self, ready: &Mutex<Vec<u64>>) -> Vec<(u64, Waker)> {
        let mut wake = Vec::new();
        if let Some(because) = &self.retired {
            if let BatchOutcome::Retire(refusal) = judge_batch(&[], Some(because)) {
                self.refuse_all(&mut wake, &refusal);
            }
            return wake;
        }
        if self.publishing {
            return wake;
        }
        let noted = std::mem::take(&mut *lock(ready));
        for id in noted {
            if let Some(outcome) = self.copies.get_mut(&id).and_then(Copy::read) {
                self.unjudged.push((id, outcome));
            }
        }
        if self.unjudged.is_empty() {
            return wake;
        }
        let batch = std::mem::take(&mut self.unjudged);
        match judge_batch(&batch, None) {
            BatchOutcome::Retire(refusal) => {
                if let Refusal::Returned(why) = &refusal {
                    self.retire(&format!("a copy was returned ({why})"));
                }
                self.refuse_all(&mut wake, &refusal);
            }
            BatchOutcome::Answer(verdicts) => {
                for (id, v) in verdicts {
                    self.give(id, |size| v.map_err(|r| r.for_copy_of(size)), &mut wake);
                }
            }
        }
        wake
    }

    /// Refuses every copy in the book that has no verdict yet.
    fn refuse_all(&mut self, wake: &mut Vec<(u64, Waker)>, refusal: &Refusal) {
        self.unjudged.clear();
        let open: Vec<u64> = self
            .copies
            .iter()
            .filter(|(_, c)| c.verdict.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in open {
            self.give(id, |_| Err(refusal.clone()), wake);
        }
    }

    /// Gives copy `id` its verdict, made from its body's size: an
    /// abandoned copy leaves the book, the others' tasks are to be woken.
    fn give(
        &mut self,
        id: u64,
        verdict: impl FnOnce(usize) -> Verdict,
        wake: &mut Vec<(u64, Waker)>,
    ) {
        let Some(c) = self.copies.get_mut(&id) else {
            return;
        };
        c.verdict = Some(verdict(c.size));
        if c.abandoned {
            self.copies.remove(&id);
        } else {
            wake.push((id, lock(&c.signal.task).clone()));
        }
    }
}

impl Lane {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        lock(&self.book)
    }

    fn is_retired(&self) -> bool {
        self.book().retired.is_some()
    }

    /// Puts a published copy in the book (the publish has ended) and
    /// judges what was put off meanwhile. Returns its number and the
    /// copies answered, with their tasks to wake.
    fn enter(
        &self,
        confirm: PublisherConfirm,
        task: Waker,
        size: usize,
    ) -> (u64, Vec<(u64, Waker)>) {
        let mut book = self.book();
        book.publishing = false;
        let id = book.next_id;
        book.next_id += 1;
        let signal = Arc::new(Signal {
            id,
            ready: self.ready.clone(),
            task: Mutex::new(task),
        });
        let mut copy = Copy {
            confirm: Some(confirm),
            waker: Waker::from(signal.clone()),
            signal,
            verdict: None,
            abandoned: false,
            size,
        };
        // The first poll registers the signal; a confirm already resolved
        // is read here, before any judgement can run.
        if let Some(outcome) = copy.read() {
            book.unjudged.push((id, outcome));
        }
        book.copies.insert(id, copy);
        (id, book.judge(&self.ready))
    }

    /// Retires the lane: every copy in flight on it is refused, and the
    /// channel is closed.
    fn retire(&self, because: &str) {
        let wake = {
            let mut book = self.book();
            book.publishing = false;
            book.retire(because);
            book.judge(&self.ready)
        };
        wake.into_iter().for_each(|(_, w)| w.wake());
        self.close("dlqctl publishing channel retired");
    }

    /// Closes the channel in the background, when there is a runtime to
    /// do it (dropped with its runtime, the connection's close ends it).
    fn close(&self, why: &'static str) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let channel = self.channel.clone();
            rt.spawn(async move {
                let close = channel.close(200, why.into());
                let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
            });
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // No publisher holds the lane any more, and every copy has been
        // answered: close its channel.
        if self.channel.status().connected() {
            self.close("dlqctl publishing channel done");
        }
    }
}

/// A publish under way on a lane. Dropped before its confirm is in the
/// book (its task cancelled), it retires the lane: the confirm it cannot
/// see may carry another copy's return.
struct Publishing<'a> {
    lane: &'a Lane,
    open: bool,
}

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        if self.open {
            self.lane.retire("a publish was cancelled");
        }
    }
}

/// The wait for one copy's verdict.
struct Wait<'a> {
    lane: &'a Lane,
    id: u64,
    done: bool,
}

impl Future for Wait<'_> {
    type Output = Verdict;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        let id = self.id;
        let lane = self.lane;
        let (verdict, wake) = {
            let mut book = lane.book();
            let Some(c) = book.copies.get_mut(&id) else {
                // Not reached: a copy leaves the book with its verdict.
                return Poll::Ready(Err(Refusal::Channel("the copy left the book".into())));
            };
            let wake = if c.verdict.is_none() {
                let mut task = lock(&c.signal.task);
                if !task.will_wake(cx.waker()) {
                    *task = cx.waker().clone();
                }
                drop(task);
                book.judge(&lane.ready)
            } else {
                Vec::new()
            };
            let verdict = book.copies.get_mut(&id).and_then(|c| c.verdict.take());
            if verdict.is_some() {
                book.copies.remove(&id);
            }
            (verdict, wake)
        };
        // Every copy answered but this one (whose task is running; two
        // copies may share a task, so by copy, not by waker).
        for (other, w) in wake {
            if other != id {
                w.wake();
            }
        }
        match verdict {
            Some(v) => {
                self.done = true;
                Poll::Ready(v)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut book = self.lane.book();
        match book.copies.get_mut(&self.id) {
            Some(c) if c.verdict.is_none() => c.abandoned = true,
            Some(_) => {
                book.copies.remove(&self.id);
            }
            None => {}
        }
    }
}

impl Publisher {
    /// A publisher on `channels` confirm-mode channels of `conn`, each
    /// copy answered within `confirm_timeout`.
    pub fn new(conn: Arc<Connection>, channels: usize, confirm_timeout: Duration) -> Self {
        Publisher {
            conn,
            lanes: (0..channels.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            confirm_timeout,
        }
    }

    /// The next lane, round-robin, opening a channel where none is usable.
    async fn lane(&self) -> std::result::Result<Arc<Lane>, String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let mut slot = self.lanes[i].lock().await;
        if let Some(l) = slot.as_ref() {
            if !l.is_retired() && l.channel.status().connected() {
                return Ok(l.clone());
            }
        }
        let channel = self
            .conn
            .create_channel()
            .await
            .map_err(|e| describe_lapin_error(&e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| describe_lapin_error(&e))?;
        let lane = Arc::new(Lane {
            channel,
            gate: Arc::new(tokio::sync::Mutex::new(())),
            book: Mutex::new(Book::default()),
            ready: Arc::new(Mutex::new(Vec::new())),
        });
        *slot = Some(lane.clone());
        Ok(lane)
    }

    /// The connection's negotiated `frame_max`: the largest frame, the
    /// content header with every property included, either side accepts.
    pub fn frame_max(&self) -> u32 {
        self.conn.configuration().frame_max()
    }

    /// Checks that a publishing channel can be opened.
    pub async fn warm_up(&self) -> crate::error::Result<()> {
        self.lane()
            .await
            .map(|_| ())
            .map_err(|message| crate::error::Error::Broker {
                context: "cannot open the publishing channel".into(),
                message,
            })
    }

    /// Publishes `mandatory` and waits for the verdict, the whole within
    /// the confirm timeout.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> std::result::Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        // This task's waker, for the copy's entry in the book.
        let task = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        let mut tries = 0;
        // A lane that takes the copy, held (its gate) for the publish.
        let (lane, gate) = loop {
            tries += 1;
            let lane = tokio::time::timeout_at(deadline, self.lane())
                .await
                .map_err(|_| Refusal::Timeout)?
                .map_err(Refusal::Channel)?;
            let gate = tokio::time::timeout_at(deadline, lane.gate.clone().lock_owned())
                .await
                .map_err(|_| Refusal::Timeout)?;
            {
                let mut book = lane.book();
                if let Some(because) = book.retired.clone() {
                    drop(book);
                    drop(gate);
                    if tries <= self.lanes.len() {
                        continue;
                    }
                    return Err(Refusal::Channel(format!(
                        "publishing channel retired: {because}"
                    )));
                }
                book.publishing = true;
            }
            break (lane, gate);
        };
        // No await since `publishing` was set: from here the guard retires
        // the lane if this task is cancelled before the copy is in the book.
        let mut publishing = Publishing {
            lane: &lane,
            open: true,
        };
        let id = {
            let published = tokio::time::timeout_at(
                deadline,
                publish_mandatory(&lane.channel, exchange, routing_key, body, props),
            )
            .await;
            let confirm = match published {
                Err(_) => {
                    // Its confirm may exist but is not in the book: nothing
                    // on this lane can be trusted any more.
                    publishing.open = false;
                    lane.retire("a publish timed out");
                    return Err(Refusal::Timeout);
                }
                Ok(Err(e)) => {
                    publishing.open = false;
                    lane.retire("a publish failed");
                    return Err(
                        Refusal::of_channel(describe_lapin_error(&e)).for_copy_of(body.len())
                    );
                }
                Ok(Ok(c)) => c,
            };
            let (id, wake) = lane.enter(confirm, task, body.len());
            publishing.open = false;
            drop(gate);
            wake.into_iter().for_each(|(_, w)| w.wake());
            id
        };
        let wait = Wait {
            lane: &lane,
            id,
            done: false,
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Err(_) => {
                // A confirm may still come for this copy: retire the lane.
                lane.retire("a confirm timed out");
                Err(Refusal::Timeout)
            }
            Ok(v) => v,
        }
    }
}

/// A lapin confirm in the judgement's terms.
fn confirm_of(r: lapin::Result<Confirmation>) -> Confirm {
    match r {
        Ok(Confirmation::Ack(None)) => Confirm::Ack,
        Ok(Confirmation::Nack(None)) => Confirm::Nack,
        Ok(Confirmation::Ack(Some(m))) | Ok(Confirmation::Nack(Some(m))) => {
            Confirm::Returned(format!("{} {}", m.reply_code, m.reply_text))
        }
        Ok(Confirmation::NotRequested) => Confirm::NotRequested,
        Err(e) => Confirm::Failed(describe_lapin_error(&e)),
    }
}
