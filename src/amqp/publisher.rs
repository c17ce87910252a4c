//! Confirmed, `mandatory` publishing of copies on confirm-mode channels.

use crate::error::describe_lapin_error;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

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
/// flight and a collector task that owns their confirms.
///
/// lapin does not tie a `basic.return` to the publish it belongs to: it
/// hands the oldest waiting return to the next confirm it completes (a
/// multiple ack completes its tags in no set order). So a returned copy
/// can read as `Ack(None)` while another copy's confirm carries its return.
/// What holds: the broker sends a copy's return before its ack, and the
/// confirm that takes that return is resolved no later than the copy's own
/// (earlier in the same frame, or in an earlier frame). So the collector
/// decides in batches: it takes the lane's gate (held by publishers from
/// `basic.publish` until the confirm is handed over, so every published
/// confirm is known), takes every confirm that is ready, and when any of
/// them carries a return, no verdict on that lane can be trusted: every
/// copy of the batch and every copy still in flight is refused, and the
/// lane is retired (its copies are published again elsewhere; a duplicate
/// is possible, a loss is not).
pub struct Publisher {
    conn: Arc<Connection>,
    lanes: Vec<tokio::sync::Mutex<Option<Arc<Lane>>>>,
    next: AtomicUsize,
    confirm_timeout: Duration,
}

/// One publishing channel, as publishers see it.
struct Lane {
    channel: Channel,
    /// Registers a published confirm with the collector.
    register: mpsc::UnboundedSender<Pending>,
    state: Arc<LaneState>,
}

/// What a lane's publishers and its collector share.
struct LaneState {
    /// Held from `basic.publish` until its confirm is registered, and by
    /// the collector while it takes a batch.
    gate: tokio::sync::Mutex<()>,
    /// No new copy goes to a retired lane; it is closed once answered.
    retired: AtomicBool,
    /// Why it was retired (a return, a confirm timeout).
    retired_because: Mutex<String>,
    /// Wakes the collector when a publisher retires the lane.
    retire: Notify,
}

impl LaneState {
    fn retire(&self, because: &str) {
        if let Ok(mut b) = self.retired_because.lock() {
            if b.is_empty() {
                *b = because.to_string();
            }
        }
        self.retired.store(true, Ordering::SeqCst);
        self.retire.notify_one();
    }

    fn because(&self) -> String {
        self.retired_because
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default()
    }
}

/// A confirm as the collector holds it: (its number, the confirm).
type Done = (u64, lapin::Result<Confirmation>);

/// A published copy waiting for its confirm.
struct Pending {
    confirm: PublisherConfirm,
    reply: oneshot::Sender<Verdict>,
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
            if !l.state.retired.load(Ordering::SeqCst) && l.channel.status().connected() {
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
        let (register, registered) = mpsc::unbounded_channel();
        let state = Arc::new(LaneState {
            gate: tokio::sync::Mutex::new(()),
            retired: AtomicBool::new(false),
            retired_because: Mutex::new(String::new()),
            retire: Notify::new(),
        });
        tokio::spawn(collect(channel.clone(), state.clone(), registered));
        let lane = Arc::new(Lane {
            channel,
            register,
            state,
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
        let mut tries = 0;
        let (lane, verdict) = loop {
            tries += 1;
            let lane = tokio::time::timeout_at(deadline, self.lane())
                .await
                .map_err(|_| Refusal::Timeout)?
                .map_err(Refusal::Channel)?;
            let gate = tokio::time::timeout_at(deadline, lane.state.gate.lock())
                .await
                .map_err(|_| Refusal::Timeout)?;
            if lane.state.retired.load(Ordering::SeqCst) {
                drop(gate);
                if tries <= self.lanes.len() {
                    continue;
                }
                return Err(Refusal::Channel(format!(
                    "publishing channel retired: {}",
                    lane.state.because()
                )));
            }
            let published = tokio::time::timeout_at(
                deadline,
                publish_mandatory(&lane.channel, exchange, routing_key, body, props.clone()),
            )
            .await;
            let confirm = match published {
                Err(_) => {
                    // Its confirm may exist but is lost to the collector:
                    // nothing on this lane can be trusted any more.
                    lane.state.retire("a publish timed out");
                    return Err(Refusal::Timeout);
                }
                Ok(Err(e)) => {
                    lane.state.retire("a publish failed");
                    return Err(Refusal::of_channel(describe_lapin_error(&e)));
                }
                Ok(Ok(c)) => c,
            };
            let (reply, verdict) = oneshot::channel();
            if lane.register.send(Pending { confirm, reply }).is_err() {
                lane.state.retire("its collector stopped");
                return Err(Refusal::Channel(
                    "the publishing channel's collector stopped".into(),
                ));
            }
            drop(gate);
            break (lane, verdict);
        };
        match tokio::time::timeout_at(deadline, verdict).await {
            Err(_) => {
                // A confirm may still come for this copy: retire the lane.
                lane.state.retire("a confirm timed out");
                Err(Refusal::Timeout)
            }
            Ok(Err(_)) => Err(Refusal::Channel(
                "the publishing channel's collector stopped".into(),
            )),
            Ok(Ok(v)) => v,
        }
    }
}

/// A lane's collector: answers each copy once its confirm, and every
/// confirm that could carry its return, has been seen (see [`Publisher`]).
async fn collect(
    channel: Channel,
    state: Arc<LaneState>,
    mut registered: mpsc::UnboundedReceiver<Pending>,
) {
    let mut confirms: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
    let mut replies: HashMap<u64, oneshot::Sender<Verdict>> = HashMap::new();
    let mut next_id: u64 = 0;
    let mut add = |p: Pending,
                   confirms: &mut FuturesUnordered<BoxFuture<'static, Done>>,
                   replies: &mut HashMap<u64, oneshot::Sender<Verdict>>| {
        let id = next_id;
        next_id += 1;
        replies.insert(id, p.reply);
        confirms.push(p.confirm.map(move |r| (id, r)).boxed());
    };
    let mut open = true;
    loop {
        // Every publisher is gone and every copy answered.
        if !open && confirms.is_empty() {
            break;
        }
        let first: Option<Done> = tokio::select! {
            _ = state.retire.notified() => None,
            p = registered.recv(), if open => {
                match p {
                    Some(p) => add(p, &mut confirms, &mut replies),
                    None => open = false,
                }
                continue;
            }
            Some(d) = confirms.next(), if !confirms.is_empty() => Some(d),
        };
        // Under the gate: every published confirm is registered, then
        // every ready one is taken (a confirm that carries the return of a
        // copy taken here is resolved before that copy's).
        let gate = state.gate.lock().await;
        while let Ok(p) = registered.try_recv() {
            add(p, &mut confirms, &mut replies);
        }
        let mut batch: Vec<Done> = first.into_iter().collect();
        while let Some(Some(d)) = confirms.next().now_or_never() {
            batch.push(d);
        }
        let batch: Vec<(u64, Confirm)> = batch
            .into_iter()
            .map(|(id, r)| (id, confirm_of(r)))
            .collect();
        let retired_because = state
            .retired
            .load(Ordering::SeqCst)
            .then(|| state.because());
        let outcome = judge_batch(&batch, retired_because.as_deref());
        if let BatchOutcome::Retire(Refusal::Returned(why)) = &outcome {
            state.retire(&format!("a copy was returned ({why})"));
        }
        drop(gate);
        match outcome {
            BatchOutcome::Retire(refusal) => {
                for (_, reply) in replies.drain() {
                    let _ = reply.send(Err(refusal.clone()));
                }
                break;
            }
            BatchOutcome::Answer(verdicts) => {
                for (id, verdict) in verdicts {
                    if let Some(reply) = replies.remove(&id) {
                        let _ = reply.send(verdict);
                    }
                }
            }
        }
    }
    drop(confirms);
    let close = channel.close(200, "dlqctl publishing channel retired".into());
    let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
}

/// A lapin confirm in the collector's terms.
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
