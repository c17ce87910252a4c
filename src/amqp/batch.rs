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

use crate::amqp::connection::describe_lapin_error;
use crate::error::{Error, Result};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use std::time::Duration;

/// A confirm-mode channel publishing in strict batches.
pub struct BatchPublisher {
    ch: Channel,
    pending: Vec<PublisherConfirm>,
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

    /// The negotiated `frame_max`.
    pub fn frame_max(&self, conn: &Connection) -> u32 {
        conn.configuration().frame_max()
    }

    /// Copies published and not yet settled.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no copy waits for its confirm.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Publishes one copy, `mandatory`, into the current batch.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> std::result::Result<(), String> {
        let c = tokio::time::timeout(
            self.timeout,
            self.ch.basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            ),
        )
        .await
        .map_err(|_| "the publish timed out".to_string())?
        .map_err(|e| describe_lapin_error(&e))?;
        self.pending.push(c);
        Ok(())
    }

    /// Waits for every confirm of the batch: `Ok` only when each copy was
    /// acked and none returned. The batch is empty afterwards either way.
    pub async fn settle(&mut self) -> std::result::Result<(), String> {
        let mut verdict = Ok(());
        let deadline = tokio::time::Instant::now() + self.timeout;
        for c in self.pending.drain(..) {
            let got = tokio::time::timeout_at(deadline, c).await;
            let bad = match got {
                Err(_) => Some("no publisher confirm in time".to_string()),
                Ok(Err(e)) => Some(describe_lapin_error(&e)),
                Ok(Ok(Confirmation::Ack(None))) => None,
                Ok(Ok(Confirmation::Ack(Some(r)))) => Some(format!(
                    "the broker returned a copy as unroutable ({} {}): does the queue exist?",
                    r.reply_code, r.reply_text
                )),
                Ok(Ok(Confirmation::Nack(_))) => {
                    Some("the broker nacked a copy (is the queue full?)".to_string())
                }
                Ok(Ok(Confirmation::NotRequested)) => Some("no confirm was requested".to_string()),
            };
            if let (Some(why), Ok(())) = (bad, &verdict) {
                verdict = Err(why);
            }
        }
        verdict
    }

    /// Closes the channel.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.ch.close(200, "done".into()))
            .await;
    }
}
