//! Doctor's items on a pipeline's health: quorum members online,
//! `messages_dlx` over two samples, the DLX's binding to the DLQ,
//! consumers on the main queue, `--max-dlq`, the worker's circuit breaker
//! (from `--metrics-url`) and the automatic redrive's last run.

use crate::audit::doctor_item::{plural, Area, Item, Level};
use crate::audit::doctor_limits::{int_arg, int_policy, lowest};
use crate::audit::doctor_snapshot::{ManagementState, Snapshot};
use crate::topology::plan::{QueueSpec, Role};
use crate::values::text::count;

/// Members, the DLX's binding, held messages, consumers, the DLQ's depth.
pub(super) fn health_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let mut out = Vec::new();
    let known = s.management == ManagementState::Answers;
    let dlq = queues.iter().find(|q| q.role == Role::DeadLetterQueue);
    out.extend(member_checks(queues, s));
    // The DLX's binding to the DLQ.
    let bound = s.dlx_bound.get(p).copied().flatten();
    if let (Some(false), Some(d)) = (bound, dlq) {
        out.push(Item {
            area: Area::Health,
            level: Level::Fail,
            subject: format!("binding {p}.dlx -> {}", d.name),
            message: "missing: dead letters route nowhere (the worker's copies come back \
                      unroutable and it keeps retrying them; the broker's own dead-lettering \
                      holds them in a quorum source as messages_dlx and drops them from a \
                      classic one); run `dlqctl provision`"
                .into(),
        });
    }
    out.extend(held_checks(queues, s, dlq, bound, known));
    // Consumers on the main queue.
    if let Some(main) = queues.iter().find(|q| q.role == Role::MainQueue) {
        if let Some(n) = s.queue(&main.name).map(|f| f.consumers) {
            out.push(Item {
                area: Area::Health,
                level: if n == 0 { Level::Warn } else { Level::Pass },
                subject: format!("queue {}", main.name),
                message: if n == 0 {
                    "no consumer: messages wait until a worker runs; start `dlqctl work`".into()
                } else {
                    format!("{n} consumer{}", plural(n as usize))
                },
            });
        }
    }
    // The DLQ's depth.
    if let (Some(max), Some(d)) = (s.max_dlq, dlq) {
        if let Some(f) = s.queue(&d.name) {
            let depth = f.ready.max(f.messages.unwrap_or(0));
            let held = count(depth, "message");
            out.push(Item {
                area: Area::Health,
                level: if depth > max {
                    Level::Fail
                } else {
                    Level::Pass
                },
                subject: format!("queue {}", d.name),
                message: if depth > max {
                    format!("holds {held}, over --max-dlq {max}: triage with `dlqctl dlq summary`")
                } else {
                    format!("holds {held} (--max-dlq {max})")
                },
            });
        }
    }
    out
}

/// The automatic redrive, from the pipeline's shared state: a warn when its
/// last run did not move what it could (a failed canary, an unhealthy
/// probe, an error: the dependency may still be down), naming how many
/// runs in a row, or when messages wait for a person; a pass otherwise.
pub(super) fn redrive_check(s: &Snapshot, p: &str) -> Option<Item> {
    let (level, message) = match s.redrive.get(p)? {
        Err(why) => (
            Level::Skip,
            format!("the shared state is unreadable: {why}"),
        ),
        Ok(None) => (Level::Pass, "no run yet".into()),
        Ok(Some(state)) => {
            let (look, text) = state.summary(s.now_ms)?;
            (if look { Level::Warn } else { Level::Pass }, text)
        }
    };
    Some(Item {
        area: Area::Health,
        level,
        subject: "redrive".into(),
        message,
    })
}

/// The worker's circuit breaker, when its metrics page was read: a warn
/// while it is open or half-open (messages wait), a fail when its health
/// URL is one no request can be built from, else a pass.
pub(super) fn circuit_check(s: &Snapshot, p: &str) -> Option<Item> {
    let c = s.circuit.get(p)?;
    let (level, message) = match c.pause_sentence(p) {
        // A configuration error: the breaker cannot close once open.
        Some(sentence) if c.probe_unusable => (Level::Fail, sentence),
        Some(sentence) => (Level::Warn, sentence),
        None => (Level::Pass, c.describe()),
    };
    Some(Item {
        area: Area::Health,
        level,
        subject: "circuit breaker".into(),
        message,
    })
}

/// Quorum members online, per queue.
fn member_checks(queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    let mut out = Vec::new();
    let mut complete = 0;
    for q in queues {
        let Some((online, total)) = s.queue(&q.name).and_then(|f| f.members) else {
            continue;
        };
        if online >= total {
            complete += 1;
            continue;
        }
        let majority = online * 2 > total;
        out.push(Item {
            area: Area::Health,
            level: if majority { Level::Warn } else { Level::Fail },
            subject: format!("queue {}", q.name),
            message: format!(
                "{online} of {total} quorum members online{}; bring the missing nodes back",
                if majority {
                    ""
                } else {
                    ": no majority, the queue is unavailable"
                }
            ),
        });
    }
    if complete > 0 {
        out.push(Item {
            area: Area::Health,
            level: Level::Pass,
            subject: "quorum members".into(),
            message: format!("all online on {complete} quorum queue{}", plural(complete)),
        });
    }
    out
}

/// Messages held for the DLX over two samples, and why.
fn held_checks(
    queues: &[&QueueSpec],
    s: &Snapshot,
    dlq: Option<&&QueueSpec>,
    bound: Option<bool>,
    known: bool,
) -> Vec<Item> {
    let mut out = Vec::new();
    let dlq_full = dlq.and_then(|d| {
        let max = int_arg(d, "x-max-length");
        let held = s.queue(&d.name)?;
        let max = lowest(max, int_policy(Some(held), "max-length"))?;
        let depth = held.messages.unwrap_or(held.ready);
        (depth as i64 >= max).then_some(max)
    });
    let mut held_any = false;
    for q in queues {
        let Some(f) = s.queue(&q.name) else {
            continue;
        };
        if f.messages_dlx.len() < 2 || f.messages_dlx.contains(&0) {
            continue;
        }
        held_any = true;
        let last = f.messages_dlx.last().copied().unwrap_or(0);
        let why = match (dlq_full, bound) {
            (Some(max), _) => format!(
                "the DLQ is full ({}, reject-publish): make room with `dlqctl dlq export \
                 --remove` or `purge`; they move within 3 minutes after",
                count(max.max(0) as u64, "message")
            ),
            (None, Some(false)) => "the DLX routes to no queue (see the binding above)".into(),
            (None, _) => "the DLQ has room and is bound: the broker's dead-letter worker looks \
                          stalled (rabbitmq-server#12625, #16652); if it stays, restart the \
                          queue's leader"
                .into(),
        };
        out.push(Item {
            area: Area::Health,
            level: Level::Fail,
            subject: format!("queue {}", q.name),
            message: format!(
                "holds {last} message{} for its DLX (messages_dlx) over two samples {}s apart: {why}",
                plural(last as usize),
                s.sample_gap_s
            ),
        });
    }
    if !held_any && known {
        out.push(Item {
            area: Area::Health,
            level: Level::Pass,
            subject: "messages_dlx".into(),
            message: "no queue holds messages for its DLX".into(),
        });
    }
    out
}
