//! Doctor's items on the connecting user: each command it could or could
//! not run on a pipeline ([`crate::audit::permissions`]).

use crate::audit::doctor_item::{Area, Item, Level};
use crate::audit::doctor_snapshot::Snapshot;
use crate::audit::permissions::{verdicts, Verdict};
use crate::topology::plan::Plan;

/// An item per command on pipeline `p`, or one skip when the user's
/// permissions are unknown.
pub(super) fn permission_checks(plan: &Plan, s: &Snapshot, p: &str) -> Vec<Item> {
    let perms = match &s.permissions {
        Ok(perms) => perms,
        Err(why) => {
            return vec![Item {
                area: Area::Permissions,
                level: Level::Skip,
                subject: format!("user {}", s.user),
                message: format!("unknown: {why}"),
            }]
        }
    };
    verdicts(perms, plan, p)
        .into_iter()
        .map(|(command, verdict)| {
            let (level, message) = match verdict {
                Verdict::Allowed => (Level::Pass, format!("user {} may run it", s.user)),
                Verdict::Denied { missing } => {
                    let shown: Vec<String> = missing
                        .iter()
                        .take(3)
                        .map(|n| format!("{} on `{}`", n.access.as_str(), n.resource))
                        .collect();
                    let more = match missing.len() {
                        n if n > 3 => format!(" and {} more", n - 3),
                        _ => String::new(),
                    };
                    let message = format!(
                        "user {} may not run it: lacks {}{more} (see the permissions table in \
                         docs/production.md)",
                        s.user,
                        shown.join(", ")
                    );
                    (Level::Warn, message)
                }
                Verdict::Unknown { reason } => (
                    Level::Skip,
                    format!("unknown for user {}: {reason}", s.user),
                ),
            };
            Item {
                area: Area::Permissions,
                level,
                subject: format!("dlqctl {command}"),
                message,
            }
        })
        .collect()
}
