//! Tests of the circuit breaker: the window, then the three states.

use super::*;

fn cfg() -> CircuitBreaker {
    CircuitBreaker {
        failure_rate: 0.5,
        window: 1000,
        min_calls: 4,
        open_for: 300,
        half_open_calls: 1,
    }
}

/// A closed breaker's record of a run that is not a probe.
fn run(b: &mut Breaker, now: u64, transient: bool) -> Option<Transition> {
    let call = if transient {
        Call::Transient
    } else {
        Call::Success
    };
    b.record(now, None, call)
}

fn opened(t: Option<Transition>) -> bool {
    matches!(t, Some(Transition::Opened { .. }))
}

/// Opens `b` at `now` with `min_calls` transient failures.
fn open_it(b: &mut Breaker, now: u64) {
    for k in 0..3 {
        assert_eq!(run(b, now + k, true), None);
    }
    assert_eq!(
        run(b, now + 3, true),
        Some(Transition::Opened {
            calls: 4,
            failures: 4
        })
    );
}

/// The probe `b` hands out at `now`, after the half-open transition.
fn probe(b: &mut Breaker, now: u64) -> Probe {
    match b.admit(now) {
        Admission {
            gate: Gate::Probe(p),
            ..
        } => p,
        other => panic!("no probe at {now}: {other:?}"),
    }
}

#[test]
fn opens_at_the_failure_rate_once_min_calls_are_seen() {
    let mut b = Breaker::new(cfg());
    assert!(!opened(run(&mut b, 0, true)));
    assert!(!opened(run(&mut b, 1, true)));
    assert!(!opened(run(&mut b, 2, true))); // 3 calls < min_calls
    assert_eq!(b.admit(2).gate, Gate::Run);
    assert_eq!(
        run(&mut b, 3, false), // 3/4 ≥ 0.5
        Some(Transition::Opened {
            calls: 4,
            failures: 3
        })
    );
    assert_eq!(b.phase(), Phase::Open);
    assert_eq!(b.admit(3).gate, Gate::Wait(Some(300)));
    assert_eq!(b.admit(302).gate, Gate::Wait(Some(1)));
    assert_eq!(b.phase(), Phase::Open);
}

#[test]
fn stays_closed_below_the_rate() {
    let mut b = Breaker::new(cfg());
    for t in 0..100 {
        // one failure in three
        assert_eq!(run(&mut b, t, t % 3 == 1), None, "changed at {t}");
    }
    assert_eq!(b.admit(100).gate, Gate::Run);
}

#[test]
fn old_calls_leave_the_window() {
    let mut b = Breaker::new(cfg());
    run(&mut b, 0, true);
    run(&mut b, 1, true);
    run(&mut b, 2, true);
    // Long after: the three failures are gone; one failure among four
    // fresh calls is under the rate.
    assert_eq!(run(&mut b, 5000, false), None);
    assert_eq!(run(&mut b, 5001, false), None);
    assert_eq!(run(&mut b, 5002, true), None);
    assert_eq!(run(&mut b, 5003, false), None);
    assert_eq!(b.phase(), Phase::Closed);
}

#[test]
fn memory_does_not_grow_with_traffic_or_a_long_window() {
    let mut b = Breaker::new(CircuitBreaker {
        failure_rate: 0.5,
        window: 14 * 24 * 3_600_000, // two weeks
        min_calls: 10,
        open_for: 300,
        half_open_calls: 1,
    });
    // No heap: its state is a fixed array, whatever the traffic.
    assert!(!std::mem::needs_drop::<Breaker>());
    for t in 0..1_000_000u64 {
        run(&mut b, t, t % 4 == 0);
    }
    assert_eq!(b.phase(), Phase::Closed);
    // A failure burst still opens it.
    for t in 0..3_000_000u64 {
        if opened(run(&mut b, 1_000_000 + t, true)) {
            return;
        }
    }
    panic!("a burst of failures never opened the breaker");
}

#[test]
fn calls_leave_the_window_one_bucket_at_a_time() {
    let mut b = Breaker::new(cfg()); // window 1000 ms: buckets of 50 ms
    run(&mut b, 0, true);
    run(&mut b, 0, true);
    run(&mut b, 0, true);
    // 999 ms later the failures are still in the window: 3 of 4.
    assert!(opened(run(&mut b, 999, false)));
    let mut b = Breaker::new(cfg());
    run(&mut b, 0, true);
    run(&mut b, 0, true);
    run(&mut b, 0, true);
    // 1000 ms later their bucket has left the window: 0 of 1.
    assert_eq!(run(&mut b, 1000, false), None);
}

#[test]
fn permanent_failures_and_successes_do_not_open_it() {
    let mut b = Breaker::new(cfg());
    for t in 0..50 {
        let call = if t % 2 == 0 {
            Call::Permanent
        } else {
            Call::Success
        };
        assert_eq!(b.record(t, None, call), None);
    }
}

#[test]
fn after_open_for_it_is_half_open_and_admits_one_probe_only() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    // Still open one ms before open_for is over.
    assert_eq!(b.admit(302).gate, Gate::Wait(Some(1)));
    let a = b.admit(303);
    assert_eq!(a.changed, Some(Transition::HalfOpened));
    assert!(matches!(a.gate, Gate::Probe(_)));
    assert_eq!(b.phase(), Phase::HalfOpen);
    // While the probe is out nothing else starts, however long it takes.
    for t in [303, 400, 10_000] {
        assert_eq!(
            b.admit(t),
            Admission {
                gate: Gate::Wait(None),
                changed: None
            }
        );
        assert_eq!(b.poll(t).gate, Gate::Wait(None));
    }
}

#[test]
fn a_probes_transient_failure_reopens_it_at_once_for_open_for() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    let p = probe(&mut b, 303);
    // One failure is enough: min_calls does not apply half-open.
    assert_eq!(
        b.record(350, Some(p), Call::Transient),
        Some(Transition::Reopened)
    );
    assert_eq!(b.phase(), Phase::Open);
    assert_eq!(b.admit(351).gate, Gate::Wait(Some(299)));
    // And again: each open_for costs one probe, not min_calls runs.
    let a = b.admit(650);
    assert_eq!(a.changed, Some(Transition::HalfOpened));
    let Gate::Probe(p) = a.gate else {
        panic!("{a:?}")
    };
    assert_eq!(
        b.record(651, Some(p), Call::Transient),
        Some(Transition::Reopened)
    );
}

#[test]
fn a_probes_success_closes_it_with_an_empty_window() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    let p = probe(&mut b, 303);
    assert_eq!(
        b.record(310, Some(p), Call::Success),
        Some(Transition::Closed)
    );
    assert_eq!(b.phase(), Phase::Closed);
    assert_eq!(b.admit(311).gate, Gate::Run);
    // The window was cleared: it takes min_calls again to reopen.
    assert_eq!(run(&mut b, 401, true), None);
    assert_eq!(run(&mut b, 402, true), None);
    assert_eq!(run(&mut b, 403, true), None);
    assert!(opened(run(&mut b, 404, true)));
}

#[test]
fn a_probes_permanent_failure_frees_its_place_for_another_probe() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    let p = probe(&mut b, 303);
    assert_eq!(b.record(310, Some(p), Call::Permanent), None);
    assert_eq!(b.phase(), Phase::HalfOpen);
    let p = probe(&mut b, 311);
    assert_eq!(
        b.record(312, Some(p), Call::Success),
        Some(Transition::Closed)
    );
}

#[test]
fn a_released_probe_frees_its_place() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    let p = probe(&mut b, 303);
    b.release(p);
    assert_eq!(b.phase(), Phase::HalfOpen);
    let p = probe(&mut b, 304);
    assert_eq!(
        b.record(305, Some(p), Call::Transient),
        Some(Transition::Reopened)
    );
}

#[test]
fn half_open_calls_probes_may_run_at_once_and_all_must_succeed() {
    let mut b = Breaker::new(CircuitBreaker {
        half_open_calls: 3,
        ..cfg()
    });
    open_it(&mut b, 0);
    let p1 = probe(&mut b, 303);
    let p2 = probe(&mut b, 303);
    let p3 = probe(&mut b, 303);
    assert_eq!(b.admit(303).gate, Gate::Wait(None));
    assert_eq!(b.record(304, Some(p1), Call::Success), None);
    // A place came free, but two successes of three are not enough yet;
    // a fourth probe may take the place.
    let p4 = probe(&mut b, 305);
    assert_eq!(b.record(306, Some(p2), Call::Success), None);
    assert_eq!(
        b.record(307, Some(p3), Call::Success),
        Some(Transition::Closed)
    );
    // The fourth comes back after the close: a run like any other.
    assert_eq!(b.record(308, Some(p4), Call::Transient), None);
    assert_eq!(b.phase(), Phase::Closed);
}

#[test]
fn one_failure_among_several_probes_reopens_and_the_others_are_ignored() {
    let mut b = Breaker::new(CircuitBreaker {
        half_open_calls: 2,
        ..cfg()
    });
    open_it(&mut b, 0);
    let p1 = probe(&mut b, 303);
    let p2 = probe(&mut b, 303);
    assert_eq!(
        b.record(304, Some(p1), Call::Transient),
        Some(Transition::Reopened)
    );
    // The other probe comes back while open: it says nothing.
    assert_eq!(b.record(305, Some(p2), Call::Success), None);
    assert_eq!(b.phase(), Phase::Open);
}

#[test]
fn a_probe_of_an_earlier_half_open_period_says_nothing() {
    let mut b = Breaker::new(CircuitBreaker {
        half_open_calls: 2,
        ..cfg()
    });
    open_it(&mut b, 0);
    let old = probe(&mut b, 303);
    let p = probe(&mut b, 303);
    assert_eq!(
        b.record(304, Some(p), Call::Transient),
        Some(Transition::Reopened)
    );
    // The next half-open period: the old ticket neither closes nor
    // reopens it, nor frees a place of this period.
    let p = probe(&mut b, 604);
    assert_eq!(b.record(605, Some(old), Call::Transient), None);
    assert_eq!(b.phase(), Phase::HalfOpen);
    let again = probe(&mut b, 606);
    assert_eq!(b.admit(606).gate, Gate::Wait(None));
    b.release(Probe { period: 1 });
    assert_eq!(b.admit(606).gate, Gate::Wait(None));
    assert_eq!(b.record(607, Some(p), Call::Success), None);
    assert_eq!(
        b.record(608, Some(again), Call::Success),
        Some(Transition::Closed)
    );
}

#[test]
fn runs_that_started_before_it_opened_say_nothing_open_or_half_open() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    // Open: late results of runs started while closed.
    assert_eq!(run(&mut b, 10, true), None);
    assert_eq!(run(&mut b, 11, false), None);
    let p = probe(&mut b, 303);
    // Half-open: a run without a ticket neither closes nor reopens it.
    assert_eq!(run(&mut b, 304, false), None);
    assert_eq!(run(&mut b, 305, true), None);
    assert_eq!(b.phase(), Phase::HalfOpen);
    assert_eq!(
        b.record(306, Some(p), Call::Success),
        Some(Transition::Closed)
    );
}

#[test]
fn a_health_check_closes_or_reopens_it() {
    let mut b = Breaker::new(CircuitBreaker {
        half_open_calls: 3,
        ..cfg()
    });
    open_it(&mut b, 0);
    let p = probe(&mut b, 303);
    assert_eq!(b.record_health(310, p, false), Some(Transition::Reopened));
    assert_eq!(b.admit(311).gate, Gate::Wait(Some(299)));
    let p = probe(&mut b, 610);
    // Healthy closes it at once, whatever half_open_calls says.
    assert_eq!(b.record_health(620, p, true), Some(Transition::Closed));
    assert_eq!(b.admit(621).gate, Gate::Run);
    // A ticket of an earlier period: nothing.
    open_it(&mut b, 1000);
    let p = probe(&mut b, 1303);
    assert_eq!(
        b.record(1304, Some(p), Call::Transient),
        Some(Transition::Reopened)
    );
    assert_eq!(b.record_health(1305, Probe { period: 2 }, true), None);
    assert_eq!(b.phase(), Phase::Open);
}

#[test]
fn open_left_counts_down_while_open_only() {
    let mut b = Breaker::new(cfg());
    assert_eq!(b.open_left(0), None);
    open_it(&mut b, 0);
    assert_eq!(b.open_left(3), Some(300));
    assert_eq!(b.open_left(300), Some(3));
    // Over, not yet looked at: 0 until the next look moves it.
    assert_eq!(b.open_left(1000), Some(0));
    assert_eq!(b.poll(1000).changed, Some(Transition::HalfOpened));
    assert_eq!(b.open_left(1000), None);
}

#[test]
fn poll_moves_to_half_open_without_taking_a_place() {
    let mut b = Breaker::new(cfg());
    open_it(&mut b, 0);
    assert_eq!(b.poll(100).gate, Gate::Wait(Some(203)));
    let a = b.poll(303);
    assert_eq!(
        a,
        Admission {
            gate: Gate::Run,
            changed: Some(Transition::HalfOpened)
        }
    );
    assert_eq!(b.poll(304).changed, None);
    // The place is still free for the call in hand.
    let _p = probe(&mut b, 305);
    assert_eq!(b.poll(305).gate, Gate::Wait(None));
}

#[test]
fn phases_read_as_labels_and_gauge_values() {
    for (p, label, v) in [
        (Phase::Closed, "closed", 0),
        (Phase::Open, "open", 1),
        (Phase::HalfOpen, "half_open", 2),
    ] {
        assert_eq!(p.label(), label);
        assert_eq!(p.gauge(), v);
        assert_eq!(Phase::from_gauge(v as f64), Some(p));
    }
    assert_eq!(Phase::from_gauge(3.0), None);
    assert_eq!(Phase::from_gauge(f64::NAN), None);
    assert_eq!(Transition::Reopened.to(), Phase::Open);
    assert_eq!(
        Transition::Opened {
            calls: 1,
            failures: 1
        }
        .to(),
        Phase::Open
    );
    assert_eq!(Transition::HalfOpened.to(), Phase::HalfOpen);
    assert_eq!(Transition::Closed.to(), Phase::Closed);
}

/// The outage, replayed on the pure breaker: 30 messages, tiers
/// 1 s / 5 s / 10 s (4 attempts), min_calls 5, open_for 15 s, a dependency
/// down for 5 minutes, handler runs of 100 ms one at a time. Before the
/// half-open state each open_for let min_calls runs through (the window
/// was empty); now one probe.
#[test]
fn a_five_minute_outage_costs_min_calls_and_one_probe_per_open_for() {
    let mut b = Breaker::new(CircuitBreaker {
        failure_rate: 0.5,
        window: 60_000,
        min_calls: 5,
        open_for: 15_000,
        half_open_calls: 1,
    });
    let mut attempts = 0;
    let mut t = 0;
    while t < 300_000 {
        let a = b.admit(t);
        match a.gate {
            Gate::Run => {
                attempts += 1;
                run(&mut b, t + 100, true);
                t += 100;
            }
            Gate::Probe(p) => {
                attempts += 1;
                b.record(t + 100, Some(p), Call::Transient);
                t += 100;
            }
            Gate::Wait(Some(ms)) => t += ms,
            Gate::Wait(None) => unreachable!("one call at a time"),
        }
    }
    // 5 to open (by 0.5 s), then one probe each 15.1 s (open_for and the
    // probe's run): at 15.5 s, 30.6 s, ... 287.3 s, 19 of them. Before,
    // each open_for let min_calls runs through: about 5 × 20.
    assert_eq!(attempts, 5 + 19);
}
