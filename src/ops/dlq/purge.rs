//! `dlq purge`: removes the selected messages of the DLQ's snapshot, with
//! no copy anywhere. The CLI asks for `--yes`; without it, it counts.

use super::{now_ms, selected, Progress, Target};
use crate::core::dlq::select::Selector;
use crate::error::{Error, Result};

/// What a purge did (or, counting, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PurgeReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages at the start.
    pub snapshot: u64,
    /// Messages read.
    pub read: u64,
    /// Messages removed (counting: that would be removed).
    pub removed: u64,
    /// Messages kept (not selected, or past the limit).
    pub kept: u64,
    /// Kept messages rotated to the tail (past the window).
    pub rotated: u64,
    /// Only counted; nothing was removed.
    pub counted_only: bool,
    /// Stopped by SIGINT/SIGTERM.
    pub cancelled: bool,
}

/// Removes (with `remove`) or counts the messages `selector` takes, at most
/// `limit`. Without a selector, counting is the snapshot itself and reads
/// nothing.
pub async fn purge(
    t: &Target,
    selector: &Selector,
    limit: Option<u64>,
    remove: bool,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<PurgeReport> {
    if !remove && selector.is_empty() {
        let counts = crate::amqp::declare::passive_queue(&t.conn, &t.dlq)
            .await?
            .ok_or_else(|| Error::Broker {
                context: format!("cannot read {}", t.dlq),
                message: "the queue does not exist".into(),
            })?;
        let snapshot = u64::from(counts.ready);
        let removed = limit.map_or(snapshot, |l| l.min(snapshot));
        return Ok(PurgeReport {
            queue: t.dlq.clone(),
            snapshot,
            removed,
            kept: snapshot - removed,
            counted_only: true,
            ..Default::default()
        });
    }
    let mut r = t.open().await?;
    let mut p = Progress {
        total: r.snapshot(),
        ..Default::default()
    };
    let outcome = async {
        loop {
            if limit.is_some_and(|l| p.selected >= l) {
                // The limit is reached: the rest stays where it is, unread.
                break;
            }
            let Some(m) = r.next().await? else { break };
            let now = now_ms();
            p.read += 1;
            let wanted = limit.is_none_or(|l| p.selected < l);
            if wanted && selected(selector, &m, now) {
                p.selected += 1;
                p.done += 1;
                if remove {
                    r.take(m.tag);
                } else {
                    r.keep(m, now).await?;
                }
            } else {
                r.keep(m, now).await?;
            }
            progress(&p);
        }
        Ok::<_, Error>(())
    }
    .await;
    let stats = r.finish().await;
    outcome?;
    let stats = stats?;
    Ok(PurgeReport {
        queue: t.dlq.clone(),
        snapshot: stats.snapshot,
        read: stats.read,
        removed: p.selected,
        kept: stats.read - p.selected,
        rotated: stats.rotated,
        counted_only: !remove,
        cancelled: stats.cancelled,
    })
}
