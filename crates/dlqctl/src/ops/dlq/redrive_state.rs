//! Reading and writing a pipeline's shared redrive state
//! ([`crate::core::dlq::redrive_state`]) in its classic queue
//! `NAME.redrive-state`.
//!
//! A run that holds the redrive lock takes every message of the queue
//! with `basic.get` (unacked), decides, publishes the new state to the
//! queue (mandatory, persistent, confirmed) and only then acks what it
//! read, with one `multiple` ack: a crash at any point leaves the old
//! state, or both (the newest wins). A reader without the lock (`status`,
//! `dlqctl serve`) takes the message the same way and hands it back by
//! closing its channel; a run that finds the queue empty looks again for
//! up to 2 s, in case such a reader held the message just then, and a
//! write after a run falls back to the state the run started from. A
//! reader that finds it empty looks again too, for up to 0.5 s, in case a
//! worker looking whether its run is due held it just then.

use crate::amqp::batch::BatchPublisher;
use crate::core::dlq::redrive_state::{newest, RedriveState};
use crate::error::{Error, Result};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::{BasicProperties, Channel, Connection};
use std::time::Duration;

/// How many messages a read takes at most (there is one, two after a
/// crash between a write and its ack).
const MAX_READ: usize = 16;

/// How long a write waits for its confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a run waits before looking again at a queue it found empty,
/// and how many times it looks again: a reader without the lock (`status`,
/// `dlqctl serve`) holds the message for a few round trips, which over a
/// slow link is some hundreds of milliseconds. Only a queue that never
/// held a state (the first run) costs the whole 2 s.
const EMPTY_RETRY: Duration = Duration::from_millis(200);
const EMPTY_LOOKS: u32 = 10;

/// The state as read, with the messages it came from still unacked on
/// their channel: [`Held::replace`] writes the next state and acks them,
/// [`Held::release`] hands them back.
pub struct Held {
    ch: Channel,
    queue: String,
    last_tag: Option<u64>,
    /// The newest state read (`None`: the queue held none).
    pub state: Option<RedriveState>,
}

/// Reads the state of `queue`: `Ok(None)` when the queue does not exist
/// (a topology provisioned before the shared wait: `dlqctl provision`
/// adds it). `look_twice`: when the queue holds no state, look again for
/// a while (a run does, since a reader may hold the message just then; a
/// reader does not need to).
pub async fn read(conn: &Connection, queue: &str, look_twice: bool) -> Result<Option<Held>> {
    if crate::amqp::declare::passive_queue(conn, queue)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| Error::broker("cannot open a channel", &e))?;
    let mut held = Held {
        ch,
        queue: queue.to_string(),
        last_tag: None,
        state: None,
    };
    let mut states = take(&held.ch, queue, &mut held.last_tag).await?;
    let mut looks = 0;
    while states.is_empty() && look_twice && looks < EMPTY_LOOKS {
        tokio::time::sleep(EMPTY_RETRY).await;
        states = take(&held.ch, queue, &mut held.last_tag).await?;
        looks += 1;
    }
    held.state = newest(&states).cloned();
    Ok(Some(held))
}

/// Takes up to [`MAX_READ`] messages, unacked; returns the states among
/// them (a body that is no state is taken too, and acked with the rest
/// at the next write).
async fn take(ch: &Channel, queue: &str, last_tag: &mut Option<u64>) -> Result<Vec<RedriveState>> {
    let mut states = Vec::new();
    for _ in 0..MAX_READ {
        let got = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(|e| Error::broker(format!("cannot read {queue}"), &e))?;
        let Some(m) = got else { break };
        *last_tag = Some(m.delivery.delivery_tag);
        if let Some(s) = RedriveState::decode(&m.delivery.data) {
            states.push(s);
        }
    }
    Ok(states)
}

impl Held {
    /// Publishes `next` to the queue, confirmed, then acks every message
    /// read; the channel is closed either way. On an error the old state
    /// stays (its messages go back to the queue when the channel closes).
    pub async fn replace(self, conn: &Connection, next: &RedriveState) -> Result<()> {
        let written = self.publish(conn, next).await;
        if written.is_ok() {
            if let Some(tag) = self.last_tag {
                self.ch
                    .basic_ack(tag, BasicAckOptions { multiple: true })
                    .await
                    .map_err(|e| Error::broker(format!("cannot ack {}", self.queue), &e))?;
            }
        }
        self.release().await;
        written
    }

    async fn publish(&self, conn: &Connection, next: &RedriveState) -> Result<()> {
        let mut p = BatchPublisher::open(conn, CONFIRM_TIMEOUT).await?;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        let sent = match p.publish("", &self.queue, &next.encode(), props).await {
            Ok(()) => p.settle().await,
            Err(r) => Err(r),
        };
        p.close().await;
        sent.map_err(|r| Error::Broker {
            context: format!("cannot write the redrive state to {}", self.queue),
            message: r.to_string(),
        })
    }

    /// Hands what was read back to the queue (closes the channel; an ack
    /// before the close would undo nothing on a classic queue, and there
    /// is none).
    pub async fn release(self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.ch.close(200, "done".into())).await;
    }
}

/// The state of `queue` for a reader without the lock: `Ok(None)` when
/// the queue does not exist or holds no state.
pub async fn peek(conn: &Connection, queue: &str) -> Result<Option<RedriveState>> {
    // A worker looking whether its run is due holds the message for a few
    // round trips, several times a second with a fleet: a reader that
    // finds the queue empty looks again, a little (a queue that never
    // held a state costs it the whole [`PEEK_LOOKS`] × [`PEEK_RETRY`]).
    for look in 0..=PEEK_LOOKS {
        let Some(held) = read(conn, queue, false).await? else {
            return Ok(None);
        };
        let state = held.state.clone();
        held.release().await;
        if state.is_some() || look == PEEK_LOOKS {
            return Ok(state);
        }
        tokio::time::sleep(PEEK_RETRY).await;
    }
    Ok(None)
}

/// How often, and how long apart, a reader without the lock looks again
/// at a queue it found empty (seen: `status` read no state while three
/// workers looked in turn).
const PEEK_LOOKS: u32 = 5;
const PEEK_RETRY: Duration = Duration::from_millis(100);
