//! Settings that are valid but cannot do what they are for, which
//! `validate` warns about (exit 0) at their pipeline's line: an
//! idempotency `keep` too short to remember a handled key until a
//! duplicate comes, and a circuit breaker whose `min_calls` no worker
//! reaches within its `window`, so that it never opens.

use crate::topology::Topology;
use crate::values::duration::tier_name;

/// A `keep` below this (1 minute) forgets a handled key before the
/// duplicates it is for arrive: a publisher's retry, a redelivery after
/// a lost connection.
pub const MIN_USEFUL_KEEP_MS: u64 = 60_000;

/// Calls per second past which a breaker's `min_calls` within its
/// `window` is out of reach: 1000 (one handler run a millisecond, each
/// counted in the window).
pub const MAX_REACHABLE_CALLS_PER_S: u64 = 1000;

/// The warnings, as `(line of the pipeline, sentence)`.
pub fn futile_settings(t: &Topology) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for p in &t.pipelines {
        if let Some(block) = &p.idempotency {
            if block.keep_ms < MIN_USEFUL_KEEP_MS {
                out.push((
                    p.line,
                    format!(
                        "warning: pipeline {}: idempotency.keep {} forgets a handled key \
                         almost at once: a duplicate that comes later (a publisher's retry, a \
                         redelivery after a lost connection) runs the handler again; keep is \
                         meant in hours or days (the default is 7d)",
                        p.name,
                        tier_name(block.keep_ms)
                    ),
                ));
            }
        }
        if let Some(cb) = &p.circuit_breaker {
            // min_calls / (window in s) > MAX: min_calls * 1000 > MAX * window.
            if u64::from(cb.min_calls) * 1000 > MAX_REACHABLE_CALLS_PER_S * cb.window {
                out.push((
                    p.line,
                    format!(
                        "warning: pipeline {}: circuit_breaker needs min_calls {} calls within \
                         window {} before it looks at the failure rate: more than {} calls a \
                         second, which no worker makes, so it will never open; widen window or \
                         lower min_calls",
                        p.name,
                        cb.min_calls,
                        tier_name(cb.window),
                        MAX_REACHABLE_CALLS_PER_S
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::parse_topology;

    fn warnings(pipeline: &str) -> Vec<String> {
        let yaml = format!("version: 1\npipelines:\n  - name: p\n{pipeline}");
        let t = parse_topology(&yaml, "t.yaml").expect("valid");
        futile_settings(&t).into_iter().map(|(_, w)| w).collect()
    }

    #[test]
    fn a_keep_under_a_minute_is_warned_about() {
        let w = warnings("    idempotency: {keep: 1ms}\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("warning: pipeline p: idempotency.keep 1ms forgets"),
            "{w:?}"
        );
        assert_eq!(warnings("    idempotency: {keep: 59s}\n").len(), 1);
        assert!(warnings("    idempotency: {keep: 1m}\n").is_empty());
        assert!(warnings("    idempotency: true\n").is_empty());
        assert!(warnings("").is_empty());
    }

    #[test]
    fn a_breaker_that_cannot_reach_min_calls_in_its_window_is_warned_about() {
        let w = warnings("    circuit_breaker: {window: 1ms, min_calls: 100000000}\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("min_calls 100000000 calls within window 1ms"),
            "{w:?}"
        );
        assert!(w[0].contains("never open"), "{w:?}");
        // 1000 calls a second is the edge: reachable.
        assert!(warnings("    circuit_breaker: {window: 1s, min_calls: 1000}\n").is_empty());
        assert_eq!(
            warnings("    circuit_breaker: {window: 1s, min_calls: 1001}\n").len(),
            1
        );
        // The defaults open.
        assert!(warnings("    circuit_breaker: {}\n").is_empty());
    }
}
