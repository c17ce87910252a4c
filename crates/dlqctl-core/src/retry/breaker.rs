//! The circuit breaker: pause consumption while a dependency fails, instead
//! of burning every message's attempts against it. Pure: time is a
//! parameter (milliseconds on any monotonic clock).
//!
//! Three states (docs/worker.md, "The circuit breaker"):
//!
//! - **closed**: handlers run; their results fill a sliding window, and
//!   once it holds `min_calls` calls with `failure_rate` of them transient
//!   failures the breaker opens;
//! - **open** for `open_for`: no handler starts;
//! - **half-open**: [`Breaker::admit`] hands out at most `half_open_calls`
//!   [`Probe`]s, and no other call starts. A probe's transient failure
//!   opens the breaker again at once (no `min_calls` needed); as many
//!   successes as `half_open_calls` close it with an empty window. A probe
//!   may also be a health check instead of a message
//!   ([`Breaker::record_health`]): healthy closes, unhealthy reopens.
//!
//! Every change of state is returned as a [`Transition`], for the shell to
//! log and count.

use crate::topology::CircuitBreaker;

/// The three states, as the worker's `dlqctl_circuit_state` gauge shows
/// them (0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Handlers run.
    Closed,
    /// No handler starts until `open_for` is over.
    Open,
    /// Only probes run.
    HalfOpen,
}

impl Phase {
    /// `closed`, `open`, `half_open`: the `to` label of
    /// `dlqctl_circuit_transitions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }

    /// The gauge's value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> i64 {
        match self {
            Phase::Closed => 0,
            Phase::Open => 1,
            Phase::HalfOpen => 2,
        }
    }

    /// The phase a gauge value shows.
    pub fn from_gauge(v: f64) -> Option<Phase> {
        [Phase::Closed, Phase::Open, Phase::HalfOpen]
            .into_iter()
            .find(|p| p.gauge() as f64 == v)
    }
}

/// A change of state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Closed → open: `failures` of the window's `calls` failed transiently.
    Opened {
        /// Calls in the window.
        calls: u64,
        /// Transient failures among them.
        failures: u64,
    },
    /// Open → half-open: `open_for` is over.
    HalfOpened,
    /// Half-open → open: a probe failed (a transient failure, or the health
    /// check answered unhealthy).
    Reopened,
    /// Half-open → closed: the probes succeeded.
    Closed,
}

impl Transition {
    /// The state it leads to.
    pub fn to(self) -> Phase {
        match self {
            Transition::Opened { .. } | Transition::Reopened => Phase::Open,
            Transition::HalfOpened => Phase::HalfOpen,
            Transition::Closed => Phase::Closed,
        }
    }
}

/// Whether a call may start now.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Closed: start it.
    Run,
    /// Half-open: start it as a probe; give the ticket back with its
    /// result ([`Breaker::record`], [`Breaker::record_health`]) or, when
    /// it did not run after all, with [`Breaker::release`].
    Probe(Probe),
    /// Wait: this many ms (open), or until a probe comes back (`None`:
    /// half-open with every probe out).
    Wait(Option<u64>),
}

/// What [`Breaker::admit`] and [`Breaker::poll`] say.
#[derive(Debug, PartialEq, Eq)]
pub struct Admission {
    /// Whether the call may start.
    pub gate: Gate,
    /// The change of state that asking made (open → half-open).
    pub changed: Option<Transition>,
}

/// A probe's ticket: which half-open period it was admitted in. Not
/// `Clone`: each is given back once.
#[derive(Debug, PartialEq, Eq)]
pub struct Probe {
    period: u64,
}

/// What a handler run says about the dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// It succeeded.
    Success,
    /// It failed transiently: the dependency may be down.
    Transient,
    /// It failed permanently: that says nothing about the dependency.
    Permanent,
}

/// How many time buckets the window is cut into.
pub(crate) const BUCKETS: usize = 20;

/// Calls and transient failures seen in one slice of the window.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which slice of time (`now / width`) the counts belong to.
    slice: u64,
    calls: u64,
    failures: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Closed,
    Open {
        until: u64,
    },
    HalfOpen {
        /// Probes handed out and not yet back.
        out: u32,
        /// Probes that succeeded.
        passed: u32,
    },
}

/// Failure-rate breaker over a sliding window of calls, with a half-open
/// state of a few probes.
///
/// The window is kept as `BUCKETS` fixed time buckets of `window / 20`
/// each (at least 1 ms), so memory does not depend on traffic or on the
/// window's length. The rate is computed over the buckets of the last
/// window: calls leave it one bucket (a twentieth of the window) at a time.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: CircuitBreaker,
    width: u64,
    buckets: [Bucket; BUCKETS],
    mode: Mode,
    /// Counts half-open periods, so that a probe of an earlier one is
    /// told apart.
    period: u64,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: CircuitBreaker) -> Self {
        let width = cfg.window.div_ceil(BUCKETS as u64).max(1);
        Breaker {
            cfg,
            width,
            buckets: [Bucket::default(); BUCKETS],
            mode: Mode::Closed,
            period: 0,
        }
    }

    /// Calls and failures in the buckets of the window ending at `slice`.
    fn totals(&self, slice: u64) -> (u64, u64) {
        let oldest = slice.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| b.calls > 0 && b.slice >= oldest && b.slice <= slice)
            .fold((0, 0), |(c, f), b| (c + b.calls, f + b.failures))
    }

    /// Moves an open breaker whose `open_for` is over to half-open.
    fn tick(&mut self, now: u64) -> Option<Transition> {
        match self.mode {
            Mode::Open { until } if now >= until => {
                self.mode = Mode::HalfOpen { out: 0, passed: 0 };
                self.period += 1;
                Some(Transition::HalfOpened)
            }
            _ => None,
        }
    }

    fn open(&mut self, now: u64) {
        self.mode = Mode::Open {
            until: now.saturating_add(self.cfg.open_for),
        };
        self.buckets = [Bucket::default(); BUCKETS];
    }

    fn close(&mut self) -> Transition {
        self.mode = Mode::Closed;
        self.buckets = [Bucket::default(); BUCKETS];
        Transition::Closed
    }

    /// Asks whether a call may start at `now`, and takes a probe's place
    /// when half-open.
    pub fn admit(&mut self, now: u64) -> Admission {
        self.ask(now, true)
    }

    /// Like [`Breaker::admit`], without taking a place: half-open with a
    /// place free is [`Gate::Run`] (a place for a call not yet in hand).
    pub fn poll(&mut self, now: u64) -> Admission {
        self.ask(now, false)
    }

    fn ask(&mut self, now: u64, take: bool) -> Admission {
        let changed = self.tick(now);
        let gate = match &mut self.mode {
            Mode::Closed => Gate::Run,
            Mode::Open { until } => Gate::Wait(Some(*until - now)),
            Mode::HalfOpen { out, .. } if *out >= self.cfg.half_open_calls.max(1) => {
                Gate::Wait(None)
            }
            Mode::HalfOpen { out, .. } if take => {
                *out += 1;
                Gate::Probe(Probe {
                    period: self.period,
                })
            }
            Mode::HalfOpen { .. } => Gate::Run,
        };
        Admission { gate, changed }
    }

    /// Records one handler run that ended at `now`, with its ticket when
    /// it was a probe. Returns the change of state it made.
    ///
    /// Closed, a run fills the window and may open the breaker. Open, runs
    /// that started before it opened say nothing. Half-open, only the
    /// probes of this period count: a transient failure reopens it, a
    /// success counts toward closing it, a permanent failure frees the
    /// probe's place for another.
    pub fn record(&mut self, now: u64, probe: Option<Probe>, call: Call) -> Option<Transition> {
        let mine = probe.is_some_and(|p| p.period == self.period);
        match self.mode {
            Mode::Closed => self.record_closed(now, call),
            Mode::Open { .. } => None,
            Mode::HalfOpen { .. } if !mine => None,
            Mode::HalfOpen { out, passed } => match call {
                Call::Transient => {
                    self.open(now);
                    Some(Transition::Reopened)
                }
                Call::Success if passed + 1 >= self.cfg.half_open_calls.max(1) => {
                    Some(self.close())
                }
                Call::Success => {
                    self.mode = Mode::HalfOpen {
                        out: out.saturating_sub(1),
                        passed: passed + 1,
                    };
                    None
                }
                Call::Permanent => {
                    self.mode = Mode::HalfOpen {
                        out: out.saturating_sub(1),
                        passed,
                    };
                    None
                }
            },
        }
    }

    fn record_closed(&mut self, now: u64, call: Call) -> Option<Transition> {
        let slice = now / self.width;
        let bucket = &mut self.buckets[(slice % BUCKETS as u64) as usize];
        if bucket.slice != slice {
            *bucket = Bucket {
                slice,
                ..Bucket::default()
            };
        }
        bucket.calls += 1;
        if call == Call::Transient {
            bucket.failures += 1;
        }
        let (calls, failures) = self.totals(slice);
        let over = calls >= u64::from(self.cfg.min_calls)
            && failures as f64 / calls as f64 >= self.cfg.failure_rate;
        over.then(|| {
            self.open(now);
            Transition::Opened { calls, failures }
        })
    }

    /// Records a health check made with `probe` instead of a message:
    /// healthy closes the breaker, unhealthy opens it again for
    /// `open_for`. A ticket of an earlier period says nothing.
    pub fn record_health(&mut self, now: u64, probe: Probe, healthy: bool) -> Option<Transition> {
        if !matches!(self.mode, Mode::HalfOpen { .. }) || probe.period != self.period {
            return None;
        }
        if healthy {
            Some(self.close())
        } else {
            self.open(now);
            Some(Transition::Reopened)
        }
    }

    /// Gives back a probe that did not run a handler (a drill message, a
    /// message past its attempts, a run the lost connection interrupted):
    /// its place goes to the next call.
    pub fn release(&mut self, probe: Probe) {
        if let Mode::HalfOpen { out, .. } = &mut self.mode {
            if probe.period == self.period {
                *out = out.saturating_sub(1);
            }
        }
    }

    /// While open: the ms left of `open_for` at `now` (0 when it is over
    /// and the next look moves it to half-open); `None` otherwise.
    pub fn open_left(&self, now: u64) -> Option<u64> {
        match self.mode {
            Mode::Open { until } => Some(until.saturating_sub(now)),
            _ => None,
        }
    }

    /// The state as last moved (an open breaker whose `open_for` is over
    /// reads open until it is asked again).
    pub fn phase(&self) -> Phase {
        match self.mode {
            Mode::Closed => Phase::Closed,
            Mode::Open { .. } => Phase::Open,
            Mode::HalfOpen { .. } => Phase::HalfOpen,
        }
    }
}

#[cfg(test)]
#[path = "breaker_tests.rs"]
mod tests;
