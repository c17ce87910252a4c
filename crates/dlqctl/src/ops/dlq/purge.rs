//! `dlq purge`: removes the selected messages of the DLQ's snapshot, with
//! no copy anywhere. The CLI asks for `--yes`; without it, it counts.

use super::{now_ms, selected, Progress, Target};
use crate::core::dlq::select::Selector;
use crate::error::{Error, Result};

/// What a purge did (or, counting, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PurgeReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages at the start.
    pub snapshot: u64,
    /// Messages read.
    pub read: u64,
    /// Messages the selectors took (up to the limit): removed, or, when
    /// only counting, that would be removed.
    pub selected: u64,
    /// Messages removed (0 when only counting).
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
/// `limit`. Every purge takes the DLQ's lock first, counting included.
/// Without a selector, counting is the snapshot itself and reads nothing.
pub async fn purge(
    t: &Target,
    selector: &Selector,
    limit: Option<u64>,
    remove: bool,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<PurgeReport> {
    if !remove && selector.is_empty() {
        // The count is the snapshot, read under the DLQ's lock like every
        // DLQ command's (waiting for it with `wait`): without the lock, a
        // replay in progress holds the messages unacked and the count
        // would say 0. Nothing is read.
        let mut counting = t.clone();
        counting.read.at_most = Some(0);
        let r = counting.open().await?;
        let stats = r.finish().await?;
        let snapshot = stats.snapshot;
        let removed = limit.map_or(snapshot, |l| l.min(snapshot));
        return Ok(PurgeReport {
            queue: t.dlq.clone(),
            snapshot,
            selected: removed,
            kept: snapshot - removed,
            counted_only: true,
            cancelled: stats.cancelled,
            ..Default::default()
        });
    }
    let mut r = t.open().await?;
    let mut p = Progress {
        total: r.snapshot(),
        ..Default::default()
    };
    let mut groups = crate::core::dlq::select::GroupCheck::new(selector);
    let outcome = async {
        loop {
            if limit.is_some_and(|l| p.selected >= l) {
                // The limit is reached: the rest stays where it is, unread.
                break;
            }
            let Some(m) = r.next().await? else { break };
            let now = now_ms();
            groups.see(&m.described);
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
    let stats = r.finish_after(outcome).await?;
    super::refuse_unknown_group(&groups, &t.dlq, stats.cancelled)?;
    Ok(PurgeReport {
        queue: t.dlq.clone(),
        snapshot: stats.snapshot,
        read: stats.read,
        selected: p.selected,
        removed: if remove { p.selected } else { 0 },
        kept: stats.read - p.selected,
        rotated: stats.rotated,
        counted_only: !remove,
        cancelled: stats.cancelled,
    })
}
