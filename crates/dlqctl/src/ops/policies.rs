//! The policies that apply to the planned queues, as `provision --check`,
//! `status`, `doctor` and `drill` see them: worked out from the policy
//! definitions (current at once) by [`crate::core::audit::effective`],
//! compared with each queue's own report (refreshed only with its
//! statistics, seconds later). When the definitions cannot be read (a
//! user without permissions in the vhost nor the `administrator` tag gets
//! HTTP 403), the queues' reports are used, with one warning that they may
//! be a few seconds old.

use crate::amqp::mgmt::Management;
use crate::core::audit::effective::{queue_view_note, resolve_against, PolicySet};
use crate::core::audit::policy::AppliedPolicies;
use crate::core::topology::plan::QueueSpec;
use crate::core::topology::ArgValue;

/// The policy definitions of a vhost, or why they could not be read.
#[derive(Debug, Clone)]
pub(crate) struct PolicyView(Result<PolicySet, String>);

impl PolicyView {
    /// Reads the definitions of `vhost`'s policies through `m`.
    pub(crate) async fn read(m: &Management, vhost: &str) -> PolicyView {
        PolicyView(m.policy_set(vhost).await.map_err(|e| {
            tracing::debug!(error = %e, "cannot read the policy definitions");
            match e.to_string() {
                s if s.contains("HTTP 403") || s.contains("HTTP 401") => format!(
                    "the management API refused them: reading them needs permissions in the \
                     vhost or the `administrator` tag ({})",
                    s.split(": the management API refused").next().unwrap_or(&s)
                ),
                s => s,
            }
        }))
    }

    /// True when the definitions were read: the queues' own reports need
    /// not be waited for.
    pub(crate) fn has_definitions(&self) -> bool {
        self.0.is_ok()
    }

    /// What applies to `queue` (its type `kind` as the broker lists it,
    /// else as planned), given its own report `reported`; `None` only when
    /// the definitions are unreadable and the queue has not reported yet.
    /// In that fallback the queue's report is taken as it is: the warning
    /// that it may be a few seconds old is given once
    /// ([`PolicyView::fallback_note`]).
    pub(crate) fn applied(
        &self,
        queue: &QueueSpec,
        kind: Option<&str>,
        reported: Option<&AppliedPolicies>,
    ) -> Option<AppliedPolicies> {
        match &self.0 {
            Ok(set) => Some(resolve_against(
                &queue.name,
                kind.unwrap_or(planned_type(queue)),
                set,
                reported,
            )),
            Err(_) => reported.cloned(),
        }
    }

    /// The warning to give once when the policies come from the queues'
    /// own fields (the definitions could not be read); `None` otherwise.
    pub(crate) fn fallback_note(&self) -> Option<String> {
        self.0.as_ref().err().map(|why| queue_view_note(why))
    }
}

/// A queue's type as the plan declares it.
pub(crate) fn planned_type(q: &QueueSpec) -> &str {
    match q.arguments.get("x-queue-type") {
        Some(ArgValue::Str(t)) => t.as_str(),
        _ => "classic",
    }
}
