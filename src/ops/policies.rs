//! The policies that apply to the planned queues, as `provision --check`,
//! `status`, `doctor` and `drill` see them: worked out from the policy
//! definitions (current at once) by [`crate::core::check::effective`],
//! compared with each queue's own report (refreshed only with its
//! statistics, seconds later). When the definitions cannot be read (a
//! user without the `policymaker` or `administrator` tag), the queue's
//! report is used and marked as possibly a few seconds old.

use crate::amqp::mgmt::Management;
use crate::core::check::effective::{from_queue_view, resolve_against, PolicySet};
use crate::core::check::policy::AppliedPolicies;
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
            e.to_string()
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
            Err(why) => reported.map(|r| from_queue_view(r, why)),
        }
    }
}

/// A queue's type as the plan declares it.
pub(crate) fn planned_type(q: &QueueSpec) -> &str {
    match q.arguments.get("x-queue-type") {
        Some(ArgValue::Str(t)) => t.as_str(),
        _ => "classic",
    }
}
