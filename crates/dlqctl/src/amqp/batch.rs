//! Copies published in strict batches on one confirm-mode channel, for
//! the DLQ commands (replay, rotation), where throughput matters and a
//! refused copy stops the run.
//!
//! lapin does not tie a `basic.return` to its publish: it hands a return to
//! the next confirm it completes, in any order within a multiple ack (see
//! [`crate::amqp::publisher`]). A return is sent before its copy's ack, so
//! while batches never overlap (a batch is published whole, then every one
//! of its confirms awaited before the next is published), a return always
//! lands on a confirm of its own batch. So a return or a nack anywhere in a
//! batch fails the whole batch, and a batch that passes is wholly
//! confirmed and routed.

use crate::amqp::publisher::publish_mandatory;
use crate::core::retry::confirm::Refusal;
use crate::error::describe_lapin_error;
use crate::error::{Error, Result};
use lapin::options::ConfirmSelectOptions;
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use std::time::Duration;

/// A copy's publish and then its confirm, as one future.
type Copy = futures_util::future::BoxFuture<'static, lapin::Result<Confirmation>>;

/// A confirm-mode channel publishing in strict batches.
///
/// A copy is not awaited until its frames are written: lapin queues them
/// (and numbers the confirm) on the publish future's first poll, then waits
/// for its I/O thread to write them. Awaiting that write copy by copy made
/// each copy a round trip between two threads (the profile of a 50,000
/// replay: most of the time in context switches, the lapin I/O thread and
/// the replay taking turns). So [`BatchPublisher::publish`] polls the
/// future once, which queues the copy in order, and keeps it; the write and
/// the confirm are awaited together in [`BatchPublisher::settle`]. What is
/// in flight stays the batch.
pub struct BatchPublisher {
    ch: Channel,
    pending: Vec<Copy>,
    timeout: Duration,
}

impl BatchPublisher {
    /// Opens the channel. Each batch's confirms must all come within
    /// `timeout`.
    pub async fn open(conn: &Connection, timeout: Duration) -> Result<Self> {
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| Error::broker("cannot open a publishing channel", &e))?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| Error::broker("cannot enable publisher confirms", &e))?;
        Ok(BatchPublisher {
            ch,
            pending: Vec::new(),
            timeout,
        })
    }

    /// Publishes one copy, `mandatory`, into the current batch.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> std::result::Result<(), Refusal> {
        let ch = self.ch.clone();
        let (exchange, routing_key, body) =
            (exchange.to_string(), routing_key.to_string(), body.to_vec());
        let mut copy: Copy = Box::pin(async move {
            let confirm = publish_mandatory(&ch, &exchange, &routing_key, &body, props).await?;
            // Written: the body's copy is not kept while the confirm is
            // awaited (at most a batch of them are in flight).
            drop((body, exchange, routing_key));
            confirm.await
        });
        // The first poll queues the frames (in publish order) and numbers
        // the confirm; it never completes a confirmed publish.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(copy.as_mut().poll(cx))).await;
        match first {
            std::task::Poll::Pending => {
                self.pending.push(copy);
                Ok(())
            }
            std::task::Poll::Ready(Err(e)) => Err(Refusal::of_channel(describe_lapin_error(&e))),
            std::task::Poll::Ready(Ok(c)) => {
                self.pending.push(Box::pin(std::future::ready(Ok(c))));
                Ok(())
            }
        }
    }

    /// Waits for every confirm of the batch: `Ok` only when each copy was
    /// acked and none returned. The batch is empty afterwards either way.
    pub async fn settle(&mut self) -> std::result::Result<(), Refusal> {
        let mut verdict = Ok(());
        let deadline = tokio::time::Instant::now() + self.timeout;
        for c in self.pending.drain(..) {
            let got = tokio::time::timeout_at(deadline, c).await;
            let bad = match got {
                Err(_) => Some(Refusal::Timeout),
                Ok(Err(e)) => Some(Refusal::of_channel(describe_lapin_error(&e))),
                Ok(Ok(Confirmation::Ack(None))) => None,
                Ok(Ok(Confirmation::Ack(Some(r)))) => Some(Refusal::Returned(format!(
                    "{} {} (does the queue exist?)",
                    r.reply_code, r.reply_text
                ))),
                Ok(Ok(Confirmation::Nack(_))) => Some(Refusal::Nacked),
                Ok(Ok(Confirmation::NotRequested)) => {
                    Some(Refusal::Channel("no confirm was requested".to_string()))
                }
            };
            if let (Some(why), Ok(())) = (bad, &verdict) {
                verdict = Err(why);
            }
        }
        verdict
    }

    /// Closes the channel.
    pub async fn close(self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.ch.close(200, "done".into())).await;
    }
}

/// What a finished batch hands back: the tokens given with its copies, in
/// order, and its verdict.
pub type Settled<T> = (Vec<T>, std::result::Result<(), Refusal>);

type InFlight<T> = futures_util::future::BoxFuture<
    'static,
    (BatchPublisher, Vec<T>, std::result::Result<(), Refusal>),
>;

/// Several [`BatchPublisher`]s ("lanes") with a batch in flight on each:
/// while one lane's batch waits for its confirms, the next lane publishes.
/// A return can only land on a confirm of its own channel and batch, so
/// each batch's verdict stays its own. Batches finish in the order they
/// were sealed.
pub struct BatchPipeline<T> {
    idle: Vec<BatchPublisher>,
    current: Option<(BatchPublisher, Vec<T>)>,
    in_flight: futures_util::stream::FuturesOrdered<InFlight<T>>,
    batch: usize,
    /// Copies published whose batch has not been handed back.
    unsettled: usize,
}

impl<T: Send + 'static> BatchPipeline<T> {
    /// `lanes` channels on `conn`, batches of `batch` copies.
    pub async fn open(
        conn: &Connection,
        lanes: usize,
        batch: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let mut idle = Vec::new();
        for _ in 0..lanes.max(1) {
            idle.push(BatchPublisher::open(conn, timeout).await?);
        }
        Ok(BatchPipeline {
            idle,
            current: None,
            in_flight: futures_util::stream::FuturesOrdered::new(),
            batch: batch.max(1),
            unsettled: 0,
        })
    }

    /// Publishes one copy carrying `token`. Returns the batches that
    /// finished meanwhile (waiting for the oldest when every lane is busy).
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
        token: T,
    ) -> Vec<Settled<T>> {
        let mut done = self.ready();
        if self.current.is_none() {
            use futures_util::StreamExt;
            while self.idle.is_empty() {
                match self.in_flight.next().await {
                    Some((lane, tokens, verdict)) => {
                        self.idle.push(lane);
                        self.unsettled -= tokens.len();
                        done.push((tokens, verdict));
                    }
                    None => break,
                }
            }
            match self.idle.pop() {
                Some(lane) => self.current = Some((lane, Vec::new())),
                None => {
                    done.push((
                        vec![token],
                        Err(Refusal::Channel("no publishing channel is left".into())),
                    ));
                    return done;
                }
            }
        }
        let Some((mut lane, mut tokens)) = self.current.take() else {
            return done;
        };
        let sent = lane.publish(exchange, routing_key, body, props).await;
        tokens.push(token);
        self.unsettled += 1;
        if let Err(why) = sent {
            // The batch fails as a whole; settle what it holds now.
            let _ = lane.settle().await;
            self.idle.push(lane);
            self.unsettled -= tokens.len();
            done.push((tokens, Err(why)));
            return done;
        }
        self.current = Some((lane, tokens));
        if self
            .current
            .as_ref()
            .is_some_and(|(_, t)| t.len() >= self.batch)
        {
            self.seal();
        }
        done
    }

    /// Copies published whose verdict has not been handed back yet.
    pub fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// Changes the batch size (at least 1) from the next copy on.
    pub fn set_batch(&mut self, batch: usize) {
        self.batch = batch.max(1);
    }

    /// Sends the current batch off for confirmation (before a pause, say).
    pub fn seal(&mut self) {
        if let Some((mut lane, tokens)) = self.current.take() {
            self.in_flight.push_back(Box::pin(async move {
                let verdict = lane.settle().await;
                (lane, tokens, verdict)
            }));
        }
    }

    /// The batches already finished, without waiting.
    pub fn ready(&mut self) -> Vec<Settled<T>> {
        use futures_util::{FutureExt, StreamExt};
        let mut done = Vec::new();
        while let Some(Some((lane, tokens, verdict))) = self.in_flight.next().now_or_never() {
            self.idle.push(lane);
            self.unsettled -= tokens.len();
            done.push((tokens, verdict));
        }
        done
    }

    /// Seals the current batch and waits for every batch.
    pub async fn drain(&mut self) -> Vec<Settled<T>> {
        use futures_util::StreamExt;
        self.seal();
        let mut done = Vec::new();
        while let Some((lane, tokens, verdict)) = self.in_flight.next().await {
            self.idle.push(lane);
            self.unsettled -= tokens.len();
            done.push((tokens, verdict));
        }
        done
    }

    /// Closes every lane (after [`BatchPipeline::drain`]).
    pub async fn close(mut self) {
        let _ = self.drain().await;
        for lane in self.idle {
            lane.close().await;
        }
    }
}
