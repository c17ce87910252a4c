//! What a provision or a check found about one object.

use crate::topology::plan::BindingSpec;

/// What kind of object a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    /// An exchange.
    Exchange,
    /// A queue.
    Queue,
    /// A binding.
    Binding,
}

impl ObjectKind {
    /// `exchange`, `queue` or `binding`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Exchange => "exchange",
            ObjectKind::Queue => "queue",
            ObjectKind::Binding => "binding",
        }
    }
}

/// One thing that is not as the topology wants it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// The object does not exist (`--check` only).
    Missing {
        /// Object kind.
        object: ObjectKind,
        /// Object name (a binding: `exchange -> queue [key]`).
        name: String,
    },
    /// An argument or property differs.
    Differs {
        /// Object kind.
        object: ObjectKind,
        /// Object name.
        name: String,
        /// The argument (`x-message-ttl`) or property (`type`, `durable`).
        argument: String,
        /// What the topology wants (`none`: the argument should be absent).
        wanted: String,
        /// What the broker has (`none`: it is absent there).
        actual: String,
    },
    /// A binding that could not be checked (no management API).
    Unverified {
        /// Object kind.
        object: ObjectKind,
        /// Binding description.
        name: String,
        /// Why.
        reason: String,
    },
    /// An object with dlqctl's generated names for a pipeline of the file
    /// that the file no longer describes (`--check` only; see
    /// [`crate::audit::stale`]). `provision` never deletes it.
    NotInTopology {
        /// Object kind.
        object: ObjectKind,
        /// Object name (a binding: `exchange -> queue [key]`).
        name: String,
        /// Messages it holds (queues, when the broker said).
        #[serde(skip_serializing_if = "Option::is_none")]
        messages: Option<u64>,
    },
    /// A policy or operator policy makes the queue differ from the
    /// topology (see [`crate::audit::policy`]).
    PolicyOverrides {
        /// Object kind (a queue).
        object: ObjectKind,
        /// Object name.
        name: String,
        /// Which kind of policy set the key.
        policy_kind: PolicyKind,
        /// The policy's name.
        policy: String,
        /// The policy key (`message-ttl`, `overflow`, ...).
        key: String,
        /// What the queue ends up with.
        effective: String,
        /// What the topology wants (`none`: no such argument).
        wanted: String,
        /// A note on the effect (empty when there is none).
        #[serde(skip_serializing_if = "String::is_empty")]
        note: String,
    },
    /// A policy key that applies to the queue but changes nothing the
    /// topology relies on (information, not a difference).
    PolicyInfo {
        /// Object kind (a queue).
        object: ObjectKind,
        /// Object name.
        name: String,
        /// Which kind of policy set the key.
        policy_kind: PolicyKind,
        /// The policy's name.
        policy: String,
        /// The policy key.
        key: String,
        /// Its value, as JSON.
        value: String,
        /// Why it changes nothing.
        note: String,
    },
    /// A warning on how the policies of a queue were worked out: a tie of
    /// priorities, two views that disagree, a view possibly a few seconds
    /// old (neither a difference nor information).
    PolicyWarning {
        /// Object kind (a queue).
        object: ObjectKind,
        /// Object name.
        name: String,
        /// The warning.
        note: String,
    },
    /// The broker refused the operation for another reason (permissions...).
    Failed {
        /// Object kind.
        object: ObjectKind,
        /// Object name.
        name: String,
        /// The broker's words.
        message: String,
        /// The AMQP reply code of the refusal, when the broker sent one
        /// (403 ACCESS_REFUSED: no permission).
        #[serde(skip_serializing_if = "Option::is_none")]
        reply_code: Option<u16>,
    },
}

impl Finding {
    /// The name of the object the finding is about.
    pub fn name(&self) -> &str {
        match self {
            Finding::Missing { name, .. }
            | Finding::Differs { name, .. }
            | Finding::Unverified { name, .. }
            | Finding::NotInTopology { name, .. }
            | Finding::PolicyOverrides { name, .. }
            | Finding::PolicyInfo { name, .. }
            | Finding::PolicyWarning { name, .. }
            | Finding::Failed { name, .. } => name,
        }
    }

    /// True for findings that mean "the broker is not as wanted" (not
    /// merely unverified, nor information).
    pub fn is_difference(&self) -> bool {
        !matches!(
            self,
            Finding::Unverified { .. } | Finding::PolicyInfo { .. } | Finding::PolicyWarning { .. }
        )
    }

    /// True for a warning on how policies were worked out.
    pub fn is_warning(&self) -> bool {
        matches!(self, Finding::PolicyWarning { .. })
    }

    /// True for information that is neither a difference nor unverified.
    pub fn is_info(&self) -> bool {
        matches!(self, Finding::PolicyInfo { .. })
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Missing { object, name } => write!(f, "missing {} {name}", object.as_str()),
            Finding::Differs {
                object,
                name,
                argument,
                wanted,
                actual,
            } => write!(
                f,
                "{} {name}: {argument} differs: wanted {wanted}, broker has {actual}",
                object.as_str()
            ),
            Finding::Unverified {
                object,
                name,
                reason,
            } => write!(f, "unverified {} {name}: {reason}", object.as_str()),
            Finding::NotInTopology {
                object,
                name,
                messages,
            } => {
                write!(f, "not in the topology: {} {name}", object.as_str())?;
                match messages {
                    Some(1) => write!(f, " (1 message)"),
                    Some(n) => write!(f, " ({n} messages)"),
                    None if *object == ObjectKind::Queue => write!(f, " (depth unknown)"),
                    None => Ok(()),
                }
            }
            Finding::PolicyOverrides {
                object,
                name,
                policy_kind,
                policy,
                key,
                effective,
                wanted,
                note,
            } => {
                write!(
                    f,
                    "{} {name}: {} `{policy}` overrides {key}: effective {effective}, wanted {wanted}",
                    object.as_str(),
                    policy_kind.as_str()
                )?;
                if !note.is_empty() {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Finding::PolicyInfo {
                object,
                name,
                policy_kind,
                policy,
                key,
                value,
                note,
            } => write!(
                f,
                "info: {} {name}: {} `{policy}` sets {key} = {value} ({note})",
                object.as_str(),
                policy_kind.as_str()
            ),
            Finding::PolicyWarning { object, name, note } => {
                write!(f, "warning: {} {name}: {note}", object.as_str())
            }
            Finding::Failed {
                object,
                name,
                message,
                ..
            } => write!(f, "{} {name}: {message}", object.as_str()),
        }
    }
}

/// The name a binding is reported under.
pub fn binding_name(b: &BindingSpec) -> String {
    format!("{} -> {} [{}]", b.exchange, b.queue, b.routing_key)
}

/// Which kind of policy set a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// A plain policy (`rabbitmqctl set_policy`).
    Policy,
    /// An operator policy (`rabbitmqctl set_operator_policy`).
    OperatorPolicy,
    /// Both apply and dlqctl could not tell which one set the key (their
    /// definitions could not be read).
    Either,
}

impl PolicyKind {
    /// `policy`, `operator policy`, or `policy or operator policy`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Policy => "policy",
            PolicyKind::OperatorPolicy => "operator policy",
            PolicyKind::Either => "policy or operator policy",
        }
    }
}
