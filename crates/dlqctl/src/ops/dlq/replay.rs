//! `dlq replay`: moves a bounded snapshot of the DLQ (or the messages of an
//! export file) back to a main queue, with selectors, a limit, a rate and
//! an optional canary. Each copy goes to the default exchange with the
//! queue's name as routing key, `mandatory`, persistent and confirmed; the
//! DLQ message is acked only after its copy is confirmed and not returned.

use super::canary::{Probes, StoreGuard};
use super::reader::{BATCH, CONFIRM_TIMEOUT, LANES};
use super::{now_ms, selected, DlqReader, Message, Progress, Target};
use crate::amqp::batch::{BatchPipeline, Settled};
use crate::amqp::declare::passive_queue;
use crate::core::dlq::rate::TokenBucket;
use crate::core::dlq::replay::{replay_copy, replay_id_of};
use crate::core::dlq::run::unproven;
pub use crate::core::dlq::run::{CanaryRule, ReplayEnd, Stop};
use crate::core::dlq::select::{GroupCheck, Selector};
use crate::core::retry::fit::fit_retry_copy;
use crate::error::{Error, Result};
use crate::idempotency::KeyState;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to replay, and how.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Which messages.
    pub selector: Selector,
    /// At most this many (canaries included).
    pub limit: Option<u64>,
    /// Messages per second at most.
    pub rate: Option<f64>,
    /// The queue the copies go to (the pipeline's main queue by default).
    pub to: String,
    /// Count what would move; publish and remove nothing.
    pub dry_run: bool,
    /// Replay this many first, wait, and go on only if at most half came
    /// back to the DLQ.
    pub canary: Option<Canary>,
    /// This run's id (`dlqctl-replay-id`).
    pub replay_id: String,
    /// Run handled messages again (`--rerun`): each copy carries the
    /// replay's id in `dlqctl-rerun`, which joins its idempotency key.
    pub rerun: bool,
    /// With `dry_run`: collect the idempotency keys (read this way) of
    /// the messages that would move, in [`ReplayReport::keys`].
    pub keys_of: Option<crate::core::idempotency::KeySource>,
}

impl ReplayOptions {
    /// Every message of the snapshot to `to`, at no rate limit, with no
    /// canary, under `replay_id` ([`new_replay_id`] for a person's run);
    /// set the fields that differ.
    pub fn new(to: impl Into<String>, selector: Selector, replay_id: impl Into<String>) -> Self {
        ReplayOptions {
            selector,
            limit: None,
            rate: None,
            to: to.into(),
            dry_run: false,
            canary: None,
            replay_id: replay_id.into(),
            rerun: false,
            keys_of: None,
        }
    }
}

/// A replay copy with `dlqctl-rerun` set to `replay_id` when `rerun`.
fn with_rerun(
    props: lapin::BasicProperties,
    rerun: bool,
    replay_id: &str,
) -> lapin::BasicProperties {
    if !rerun {
        return props;
    }
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        crate::core::wire::RERUN_HEADER.into(),
        lapin::types::AMQPValue::LongString(replay_id.into()),
    );
    props.with_headers(headers)
}

/// On a dry run with [`ReplayOptions::keys_of`]: the idempotency key
/// of `m`, which the store may mark handled (with `--rerun` the copy's
/// key also holds the replay's id, which no mark has: the count is of
/// the messages `--rerun` runs again).
fn dry_run_key(opts: &ReplayOptions, m: &super::Message) -> Option<Vec<u8>> {
    let source = opts.keys_of.as_ref()?;
    crate::core::idempotency::key_of(source, &m.record.properties, &m.record.body)
}

/// The canary of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canary {
    /// Messages replayed first.
    pub count: u64,
    /// How long to wait before looking for them in the DLQ.
    pub wait: Duration,
}

/// What became of the canaries.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CanaryReport {
    /// Canaries replayed.
    pub sent: u64,
    /// Of them, found back in the DLQ after the wait.
    pub came_back: u64,
    /// Whether at most half came back (the replay then went on). On a
    /// pipeline with idempotent handling, a canary that did not come back
    /// counts only when its key is marked handled too ([`CanaryReport::handled`]).
    pub passed: bool,
    /// On a pipeline with idempotent handling (its store opened): of the
    /// canaries, those whose key the store marked handled by the end of
    /// the wait (a handler ran them), and those without a key that did
    /// not come back. Not in the JSON form when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handled: Option<u64>,
}

/// What a replay did. Its JSON form (`dlq replay --json`, the web page's
/// job) says how it ended as `stopped` (the stop's words, or `null`) and
/// `cancelled`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The DLQ (or the file replayed).
    pub from: String,
    /// The queue the copies went to.
    pub to: String,
    /// This run's id (`dlqctl-replay-id`).
    pub replay_id: String,
    /// The DLQ's ready messages at the start (the lines of a file).
    pub snapshot: u64,
    /// Messages read.
    pub read: u64,
    /// Copies confirmed and their originals acked (with `dry_run`: the
    /// messages that would move).
    pub moved: u64,
    /// Messages read and left in place: not selected, past the limit, or
    /// replayed by this run already and back again.
    pub skipped: u64,
    /// Selected messages whose copy was refused or too large; they stay in
    /// the DLQ (from a file: they were not published).
    pub failed: u64,
    /// Why the first of them failed: its copy did not fit (the run went
    /// on) or was refused (the run stopped: see [`ReplayReport::ended`]).
    pub why_failed: Option<String>,
    /// A selected message read but not copied because the run was stopped
    /// (SIGINT, SIGTERM) while it waited for its turn; it stays in place.
    pub interrupted: u64,
    /// The messages came from an export file (`--from-file`), not a DLQ.
    pub from_file: bool,
    /// Kept messages rotated to the DLQ's tail (past the window).
    pub rotated: u64,
    /// Nothing was published or removed.
    pub dry_run: bool,
    /// The canary, when asked for.
    pub canary: Option<CanaryReport>,
    /// How the run ended: through, stopped before the end, or cancelled.
    pub ended: ReplayEnd,
    /// Wall time, in ms.
    pub elapsed_ms: u64,
    /// With [`ReplayOptions::keys_of`] on a dry run: the idempotency keys
    /// of the messages that would move (the command counts the marked).
    /// Not in the JSON form.
    pub keys: Vec<Vec<u8>>,
    /// Of the messages that would move (a dry run) or that moved, those
    /// whose key was marked handled (a plain replay's copies of them are
    /// acked without running; `--rerun` runs them again). `None` when
    /// the pipeline has no idempotency store open.
    pub already_handled: Option<u64>,
    /// The copies were made with `--rerun` ([`ReplayOptions::rerun`]).
    /// Not in the JSON form.
    pub rerun: bool,
}

/// The JSON form of a [`ReplayReport`], field by field as it always was.
#[derive(serde::Serialize)]
struct ReplayReportJson<'a> {
    from: &'a str,
    to: &'a str,
    replay_id: &'a str,
    snapshot: u64,
    read: u64,
    moved: u64,
    skipped: u64,
    failed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    why_failed: Option<&'a str>,
    interrupted: u64,
    from_file: bool,
    rotated: u64,
    dry_run: bool,
    canary: Option<&'a CanaryReport>,
    /// Why the run stopped before the end, if it did.
    stopped: Option<&'a str>,
    /// Stopped by SIGINT/SIGTERM.
    cancelled: bool,
    elapsed_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    already_handled: Option<u64>,
}

impl serde::Serialize for ReplayReport {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        ReplayReportJson {
            from: &self.from,
            to: &self.to,
            replay_id: &self.replay_id,
            snapshot: self.snapshot,
            read: self.read,
            moved: self.moved,
            skipped: self.skipped,
            failed: self.failed,
            why_failed: self.why_failed.as_deref(),
            interrupted: self.interrupted,
            from_file: self.from_file,
            rotated: self.rotated,
            dry_run: self.dry_run,
            canary: self.canary.as_ref(),
            stopped: self.ended.stop().map(Stop::why),
            cancelled: self.ended.is_cancelled(),
            elapsed_ms: self.elapsed_ms,
            already_handled: self.already_handled,
        }
        .serialize(s)
    }
}

/// The canary's default wait: the pipeline's retry delays summed (the
/// longest a replayed message can take to fail again) plus 30 s, at most
/// [`MAX_CANARY_WAIT`].
pub fn default_canary_wait(p: &crate::core::topology::Pipeline) -> Duration {
    let delays: u64 = p
        .retry
        .delays
        .iter()
        .take(p.retry.max_attempts.saturating_sub(1) as usize)
        .fold(0u64, |a, d| a.saturating_add(*d));
    Duration::from_millis(delays.saturating_add(30_000)).min(MAX_CANARY_WAIT)
}

/// A fresh replay id: 16 random hex digits.
pub fn new_replay_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// What a replay does with each message read, beyond its options: a
/// person's replay ([`ManualReplay`]) takes what the selector takes, copies
/// with [`replay_copy`] and accepts a canary when at most half came back;
/// automatic redrive (`ops::dlq::redrive`) brings its own choices. The
/// reading, the lock, the window, the rate and the confirms stay the
/// replay's.
pub trait ReplayHooks: Send {
    /// A pass over the DLQ starts: the canary's, the rest's, or the
    /// canary's count (which reads the whole DLQ).
    fn pass_started(&mut self) {}
    /// Every message a pass reads, before anything else is decided.
    fn seen(&mut self, _m: &super::Message, _now_unix_ms: u64) {}
    /// Whether [`ReplayHooks::select`] and [`ReplayHooks::seen`] read the
    /// headers (the messages are then described even without selectors).
    fn reads_headers(&self) -> bool {
        false
    }
    /// Whether a message the options' selector took is to move.
    fn select(&mut self, _m: &super::Message, _now_unix_ms: u64) -> bool {
        true
    }
    /// The properties of a message's copy.
    fn copy(
        &self,
        original: &lapin::BasicProperties,
        connection_user: &str,
        replay_id: &str,
        now_unix_ms: u64,
    ) -> lapin::BasicProperties {
        replay_copy(original, connection_user, replay_id, now_unix_ms)
    }
    /// The rule that says whether the canary passed.
    fn canary_rule(&self) -> CanaryRule {
        CanaryRule::Manual
    }
}

/// A person's replay (`dlq replay`, the web page's replay job).
#[derive(Debug, Clone, Copy, Default)]
pub struct ManualReplay;

impl ReplayHooks for ManualReplay {}

/// Replays the DLQ of `t` (see the module docs).
pub async fn replay(
    t: &Target,
    opts: &ReplayOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<ReplayReport> {
    replay_with(t, opts, &mut ManualReplay, progress).await
}

/// Replays the DLQ of `t` with `hooks` choosing what moves and how it is
/// copied.
pub async fn replay_with(
    t: &Target,
    opts: &ReplayOptions,
    hooks: &mut dyn ReplayHooks,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<ReplayReport> {
    let started = Instant::now();
    check_options(opts)?;
    check_destination(&t.conn, &opts.to).await?;
    let guard = t.guard.as_ref().filter(|g| g.applies_to(&opts.to));
    let mut report = ReplayReport {
        from: t.dlq.clone(),
        to: opts.to.clone(),
        replay_id: opts.replay_id.clone(),
        dry_run: opts.dry_run,
        rerun: opts.rerun,
        already_handled: guard.filter(|_| !opts.dry_run).map(|_| 0),
        ..Default::default()
    };
    let mut p = Progress::default();
    let canary = opts.canary.filter(|c| c.count > 0 && !opts.dry_run);
    let mut limit = opts.limit;
    let mut at_most = None;
    if let Some(c) = canary {
        let first = limit.map_or(c.count, |l| l.min(c.count));
        let mut probes = guard.map(|_| Probes::default());
        let snapshot = pass(
            &reading_at_most(t, None),
            opts,
            hooks,
            (Some(first), probes.as_mut()),
            &mut p,
            progress,
            &mut report,
        )
        .await?;
        report.snapshot = snapshot;
        let sent = report.moved;
        let mut cr = CanaryReport {
            sent,
            ..Default::default()
        };
        if sent > 0 && report.ended == ReplayEnd::Completed {
            tokio::select! {
                _ = t.read.cancel.cancelled() => report.ended.cancel(),
                _ = tokio::time::sleep(c.wait) => {}
            }
            if !report.ended.is_cancelled() {
                cr.came_back = count_replay_id(t, &opts.replay_id, hooks).await?;
                if let (Some(g), Some(probes)) = (guard, &probes) {
                    cr.handled = Some(g.proven(probes).await?);
                }
            }
        }
        let cancelled = report.ended.is_cancelled();
        let failed = unproven(cr.sent, cr.came_back, cr.handled);
        // No canary sent: the canary's pass read the whole snapshot and
        // found nothing to move, so there is no rest to move either.
        cr.passed = !cancelled && (cr.sent == 0 || hooks.canary_rule().passed(cr.sent, failed));
        let go_on = cr.passed && report.ended == ReplayEnd::Completed && cr.sent > 0;
        if let Some(stop) = canary_stop(t, c, &cr, probes.as_ref(), &report.ended) {
            // A canary waited for, or none found, only when nothing
            // stopped the pass: this is the run's stop.
            cr.passed = false;
            report.ended = ReplayEnd::Stopped(stop);
        }
        report.canary = Some(cr);
        if !go_on || report.ended.is_cancelled() {
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            return Ok(report);
        }
        limit = limit.map(|l| l.saturating_sub(sent));
        at_most = Some(snapshot.saturating_sub(sent));
    }
    let snapshot = pass(
        &reading_at_most(t, at_most),
        opts,
        hooks,
        (limit, None),
        &mut p,
        progress,
        &mut report,
    )
    .await?;
    if canary.is_none() {
        report.snapshot = snapshot;
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// How the canary stopped the run, if it did: no message could be a
/// canary (on a pipeline with idempotent handling, every key was marked
/// or leased), or too many did not prove the dependency. `None` when it
/// passed, or when something else (a refusal, a signal) stopped the run.
fn canary_stop(
    t: &Target,
    c: Canary,
    cr: &CanaryReport,
    probes: Option<&Probes>,
    ended: &ReplayEnd,
) -> Option<Stop> {
    if *ended != ReplayEnd::Completed {
        return None;
    }
    let store = t.guard.as_ref().map_or("", StoreGuard::describe);
    if let Some(over) = probes
        .map(|p| p.passed_over)
        .filter(|&n| n > 0 && cr.sent == 0)
    {
        return Some(Stop::NoCanary(format!(
            "no message could be the canary: the keys of all {over} selected message(s) are \
             already marked handled or leased in the idempotency store {store} (their copies \
             would be acked as duplicates or deferred, running no handler); nothing moved"
        )));
    }
    if cr.passed || cr.sent == 0 {
        return None;
    }
    let within = crate::core::values::duration::tier_name(c.wait.as_millis() as u64);
    Some(Stop::CanaryFailed(match cr.handled {
        None => format!(
            "the canary failed: {} of {} replayed messages came back to {} within {within}",
            cr.came_back, cr.sent, t.dlq
        ),
        Some(handled) => format!(
            "the canary failed: {handled} of {} replayed messages were handled (marked in {store}) \
             within {within}; {} came back to {}",
            cr.sent, cr.came_back, t.dlq
        ),
    }))
}

/// The longest a canary waits: 24 h (the DLQ's lock is held meanwhile).
pub const MAX_CANARY_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Refuses a rate or a canary wait that would hold the DLQ's lock for days
/// (bad usage).
fn check_options(opts: &ReplayOptions) -> Result<()> {
    if let Some(r) = opts.rate {
        crate::core::dlq::rate::check_rate(r).map_err(|e| Error::Usage(format!("--rate: {e}")))?;
    }
    if let Some(c) = opts.canary.filter(|c| c.wait > MAX_CANARY_WAIT) {
        return Err(Error::Usage(format!(
            "the canary would wait {} s: at most {} h (the DLQ stays locked meanwhile)",
            c.wait.as_secs(),
            MAX_CANARY_WAIT.as_secs() / 3600
        )));
    }
    Ok(())
}

/// The destination must exist: a copy to a missing queue would only be
/// returned.
async fn check_destination(conn: &lapin::Connection, to: &str) -> Result<()> {
    match passive_queue(conn, to).await? {
        Some(_) => Ok(()),
        None => Err(Error::Usage(format!(
            "the queue {to} does not exist: --to must name an existing queue"
        ))),
    }
}

/// `t`, reading at most `at_most` messages ([`ReadOptions::at_most`]).
///
/// [`ReadOptions::at_most`]: super::ReadOptions::at_most
fn reading_at_most(t: &Target, at_most: Option<u64>) -> Target {
    let mut t = t.clone();
    t.read.at_most = at_most;
    t
}

/// One pass over the DLQ of `t` (at most [`ReadOptions::at_most`] read):
/// replays up to `limit` selected messages in strict batches
/// ([`BatchPipeline`]): a batch's originals are acked once every copy of
/// it is confirmed and routed; a refused batch stops the run and its
/// originals stay. Returns the snapshot.
///
/// [`ReadOptions::at_most`]: super::ReadOptions::at_most
async fn pass(
    t: &Target,
    opts: &ReplayOptions,
    hooks: &mut dyn ReplayHooks,
    (limit, probes): (Option<u64>, Option<&mut Probes>),
    p: &mut Progress,
    progress: &mut (dyn FnMut(&Progress) + Send),
    report: &mut ReplayReport,
) -> Result<u64> {
    let mut target = t.clone();
    // Without selectors nothing here reads the headers (a rotation reads
    // what it needs itself).
    target.read.describe = !opts.selector.is_empty() || hooks.reads_headers();
    hooks.pass_started();
    // Only the first pass checks `--group` (after a canary, the group's
    // messages may all be gone): the first is the one with no total yet.
    let check_group = p.total == 0;
    let mut r = target.open().await?;
    if p.total == 0 {
        p.total = r.snapshot();
    }
    let snapshot = r.snapshot();
    let publisher = if opts.dry_run {
        None
    } else {
        Some(BatchPipeline::open(&t.conn, LANES, BATCH, CONFIRM_TIMEOUT).await?)
    };
    let mut run = Pass {
        t,
        opts,
        hooks,
        limit,
        guard: t.guard.as_ref().filter(|g| g.applies_to(&opts.to)),
        probes,
        p,
        progress,
        report,
        publisher,
        frame_max: t.conn.configuration().frame_max(),
        bucket: opts.rate.map(|rate| TokenBucket::new(rate, 0)),
        clock: Instant::now(),
        taken: 0,
        groups: if check_group {
            GroupCheck::new(&opts.selector)
        } else {
            GroupCheck::default()
        },
    };
    let outcome = run.all(&mut r).await;
    let Pass {
        publisher,
        groups,
        report,
        ..
    } = run;
    if let Some(publisher) = publisher {
        publisher.close().await;
    }
    let cancelled = t.read.cancel.is_cancelled();
    let stats = r.finish_after(outcome).await?;
    report.rotated += stats.rotated;
    if cancelled || stats.cancelled {
        report.ended.cancel();
    }
    super::refuse_unknown_group(&groups, &t.dlq, report.ended.is_cancelled())?;
    Ok(snapshot)
}

/// A pass under way: what it copies with (none in a dry run), its pace,
/// and what it counted.
struct Pass<'a> {
    t: &'a Target,
    opts: &'a ReplayOptions,
    hooks: &'a mut dyn ReplayHooks,
    /// At most this many selected in this pass.
    limit: Option<u64>,
    /// The pipeline's store, when the copies go to its main queue.
    guard: Option<&'a StoreGuard>,
    /// A canary's pass on a pipeline with a store: what it chose.
    probes: Option<&'a mut Probes>,
    p: &'a mut Progress,
    progress: &'a mut (dyn FnMut(&Progress) + Send),
    report: &'a mut ReplayReport,
    /// The copies' publisher; none in a dry run.
    publisher: Option<BatchPipeline<u64>>,
    frame_max: u32,
    bucket: Option<TokenBucket>,
    /// The bucket's clock.
    clock: Instant,
    /// Messages selected so far.
    taken: u64,
    /// Whether `--group` names a group of the snapshot.
    groups: GroupCheck,
}

impl Pass<'_> {
    /// Reads until the snapshot, the limit, a refusal or a cancel, then
    /// settles the copies still in flight.
    async fn all(&mut self, r: &mut DlqReader) -> Result<()> {
        loop {
            // Copies in flight hold their originals unacked: settle them
            // before they could fill what the broker may send.
            let out = self.publisher.as_ref().map_or(0, |b| b.unsettled() as u64);
            if out > 0 && out + 1 > r.free_slots() {
                self.drain(r).await?;
            }
            if self.limit.is_some_and(|l| self.taken >= l) {
                // The limit is reached: the rest stays where it is, unread.
                break;
            }
            let Some(m) = r.next().await? else { break };
            if !self.one(r, m).await? {
                break;
            }
        }
        if let Some(publisher) = self.publisher.as_mut() {
            let done = publisher.drain().await;
            self.settle(r, done);
        }
        self.show();
        Ok(())
    }

    /// Copies one message if it is selected, else keeps it. `false` when
    /// the pass is to stop (a refusal, or a cancel while it waited for the
    /// rate).
    async fn one(&mut self, r: &mut DlqReader, m: Message) -> Result<bool> {
        let now = now_ms();
        self.groups.see(&m.described);
        self.p.read += 1;
        self.report.read += 1;
        self.hooks.seen(&m, now);
        if !self.wanted(&m, now) || !self.may_probe(&m, now).await? {
            self.report.skipped += 1;
            r.keep(m, now).await?;
            self.show();
            return Ok(true);
        }
        self.taken += 1;
        self.p.selected += 1;
        if self.publisher.is_none() {
            // Dry run.
            self.report.keys.extend(dry_run_key(self.opts, &m));
            self.report.moved += 1;
            self.p.done += 1;
            r.keep(m, now).await?;
            self.show();
            return Ok(true);
        }
        if !self.wait_turn(r).await? {
            if self.report.ended.stop().is_none() {
                self.report.interrupted += 1;
            }
            r.keep(m, now).await?;
            return Ok(false);
        }
        let props = self.hooks.copy(
            &m.record.properties,
            &self.t.user,
            &self.opts.replay_id,
            now,
        );
        self.count_handled(&props, &m).await;
        let props = with_rerun(props, self.opts.rerun, &self.opts.replay_id);
        let props = match fit_retry_copy(props, self.frame_max) {
            Ok((props, _)) => props,
            Err(too_large) => {
                self.report.failed += 1;
                self.p.failed += 1;
                let why = too_large_why(m.message_id.as_deref(), &too_large);
                tracing::warn!("not replayed, it stays in the DLQ: {why}");
                self.report.why_failed.get_or_insert(why);
                r.keep(m, now).await?;
                self.show();
                return Ok(true);
            }
        };
        self.publish(r, &m, props).await?;
        self.show();
        Ok(self.report.ended.stop().is_none())
    }

    /// Whether `m` is to move: not a copy of this run come back, within
    /// the limit, taken by the selector and by the hooks.
    fn wanted(&mut self, m: &Message, now: u64) -> bool {
        let ours = replay_id_of(&m.record.properties).as_deref() == Some(&self.opts.replay_id);
        let within = self.limit.is_none_or(|l| self.taken < l);
        !ours && within && selected(&self.opts.selector, m, now) && self.hooks.select(m, now)
    }

    /// In a canary's pass on a pipeline with a store: whether `m`'s copy
    /// can be a canary (its key free, and not a chosen canary's); it is
    /// then recorded as one. Always true elsewhere.
    async fn may_probe(&mut self, m: &Message, now: u64) -> Result<bool> {
        let Some(guard) = self.guard.filter(|_| self.probes.is_some()) else {
            return Ok(true);
        };
        let props = self.hooks.copy(
            &m.record.properties,
            &self.t.user,
            &self.opts.replay_id,
            now,
        );
        let props = with_rerun(props, self.opts.rerun, &self.opts.replay_id);
        let key = guard.key(&props, &m.record.body);
        let state = match &key {
            Some(k) => guard.look(k).await?,
            None => KeyState::Free,
        };
        Ok(self.probes.as_mut().is_some_and(|p| p.take(key, state)))
    }

    /// Counts `m` in [`ReplayReport::already_handled`] when its copy's key
    /// (`props`, before `--rerun` joins it) is marked handled. A store
    /// that does not answer ends the count (`None`), not the run.
    async fn count_handled(&mut self, props: &lapin::BasicProperties, m: &Message) {
        let (Some(guard), Some(n)) = (self.guard, self.report.already_handled) else {
            return;
        };
        let Some(key) = guard.key(props, &m.record.body) else {
            return;
        };
        match guard.look(&key).await {
            Ok(KeyState::Handled) => self.report.already_handled = Some(n + 1),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot count the messages already handled: the idempotency store does not answer");
                self.report.already_handled = None;
            }
        }
    }

    /// Waits for the rate's next token, if the pass is paced and short of
    /// one. `false` when the run stopped or was cancelled meanwhile.
    async fn wait_turn(&mut self, r: &mut DlqReader) -> Result<bool> {
        let clock = self.clock;
        let short = self
            .bucket
            .as_mut()
            .is_some_and(|b| b.take(clock.elapsed().as_micros() as u64).is_err());
        if !short {
            return Ok(true);
        }
        // Before waiting for the rate, what is in flight is confirmed and
        // its originals acked: a kill during the wait leaves no message
        // both copied and in the DLQ.
        self.drain(r).await?;
        if self.report.ended.stop().is_some() {
            return Ok(false);
        }
        Ok(match self.bucket.as_mut() {
            Some(b) => wait_token(b, clock, &self.t.read.cancel).await,
            None => true,
        })
    }

    /// Publishes `m`'s copy; the originals of a batch it completes are
    /// acked at once.
    async fn publish(
        &mut self,
        r: &mut DlqReader,
        m: &Message,
        props: lapin::BasicProperties,
    ) -> Result<()> {
        let Some(publisher) = self.publisher.as_mut() else {
            return Ok(());
        };
        publisher.set_batch(r.batch_size());
        let done = publisher
            .publish("", &self.opts.to, &m.record.body, props, m.tag)
            .await;
        let finished = !done.is_empty();
        self.settle(r, done);
        if finished {
            // The originals of a confirmed batch are acked at once: what a
            // kill leaves duplicated stays within the copies in flight
            // (README, "Operating the DLQ").
            r.flush_acks().await?;
        }
        Ok(())
    }

    /// Waits for every copy in flight and acks the originals of those
    /// confirmed.
    async fn drain(&mut self, r: &mut DlqReader) -> Result<()> {
        if let Some(publisher) = self.publisher.as_mut() {
            let done = publisher.drain().await;
            self.settle(r, done);
            r.flush_acks().await?;
        }
        Ok(())
    }

    fn settle(&mut self, r: &mut DlqReader, done: Vec<Settled<u64>>) {
        settle(r, done, self.p, self.report, &self.opts.to);
    }

    fn show(&mut self) {
        (self.progress)(self.p);
    }
}

/// Takes finished batches: a confirmed batch's originals are acked (its
/// copies are at the destination); a refused one's are kept, and the run
/// stops.
fn settle(
    r: &mut super::DlqReader,
    done: Vec<Settled<u64>>,
    p: &mut Progress,
    report: &mut ReplayReport,
    to: &str,
) {
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    tally(done, p, report, to, |t| ok.push(t), |t| refused.push(t));
    for tag in ok {
        r.take(tag);
    }
    for tag in refused {
        r.hold(tag);
    }
}

/// Counts finished batches as moved or failed (the first refusal stops the
/// run) and hands each token to `ok` or `refused`.
fn tally<T>(
    done: Vec<Settled<T>>,
    p: &mut Progress,
    report: &mut ReplayReport,
    to: &str,
    mut ok: impl FnMut(T),
    mut refused: impl FnMut(T),
) {
    for (tokens, verdict) in done {
        let n = tokens.len() as u64;
        match verdict {
            Ok(()) => {
                report.moved += n;
                p.done += n;
                tokens.into_iter().for_each(&mut ok);
            }
            Err(why) => {
                let why = format!("{to} refused a copy: {why}");
                report.why_failed.get_or_insert_with(|| why.clone());
                report.ended.stop_at(Stop::Refused(why));
                report.failed += n;
                p.failed += n;
                tokens.into_iter().for_each(&mut refused);
            }
        }
    }
}

/// Messages in the whole DLQ carrying `replay_id` (read, all kept;
/// each shown to `hooks`).
async fn count_replay_id(t: &Target, replay_id: &str, hooks: &mut dyn ReplayHooks) -> Result<u64> {
    let mut target = t.clone();
    target.read.at_most = None;
    target.read.describe = hooks.reads_headers();
    hooks.pass_started();
    let mut r = target.open().await?;
    let mut n = 0;
    let outcome = async {
        while let Some(m) = r.next().await? {
            hooks.seen(&m, now_ms());
            if replay_id_of(&m.record.properties).as_deref() == Some(replay_id) {
                n += 1;
            }
            r.keep(m, now_ms()).await?;
        }
        Ok::<_, Error>(())
    }
    .await;
    r.finish_after(outcome).await?;
    Ok(n)
}

/// Why a message cannot be copied: its properties do not fit.
fn too_large_why(message_id: Option<&str>, t: &crate::core::retry::fit::TooLarge) -> String {
    format!(
        "message {}: its properties ({} bytes) do not fit the broker's frame_max ({} bytes \
         allowed, leaving room for what the broker adds) even without its error history",
        message_id.unwrap_or("without an id"),
        t.size,
        t.budget
    )
}

/// The messages of an export file, blank lines skipped; a line that does
/// not read, is not UTF-8 or is longer than
/// [`crate::core::dlq::export::MAX_LINE_BYTES`] is bad usage naming `FILE:LINE`
/// (no line is held in memory beyond that bound).
fn export_records(
    path: &std::path::Path,
) -> Result<impl Iterator<Item = Result<crate::core::dlq::export::Record>> + '_> {
    let shown = path.display().to_string();
    let read_err = move |source| Error::Read {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let lines = crate::core::dlq::export::BoundedLines::new(
        std::io::BufReader::new(file),
        crate::core::dlq::export::MAX_LINE_BYTES,
    );
    Ok(lines.enumerate().filter_map(move |(i, line)| match line {
        Err(crate::core::dlq::export::FileLineError::Io(source)) => Some(Err(read_err(source))),
        Err(e) => Some(Err(Error::Usage(format!("{shown}:{}: {e}", i + 1)))),
        Ok(line) if line.trim().is_empty() => None,
        Ok(line) => Some(
            crate::core::dlq::export::from_line(&line)
                .map_err(|e| Error::Usage(format!("{shown}:{}: {e}", i + 1))),
        ),
    }))
}

/// Waits for a token of `bucket` when the replay is paced. What is
/// published goes to be confirmed first, so it is confirmed during the
/// wait. Returns the batches that finished, and `false` when cancelled
/// during the wait.
async fn pace<T: Send + 'static>(
    bucket: &mut Option<TokenBucket>,
    clock: Instant,
    publisher: &mut BatchPipeline<T>,
    cancel: &tokio_util::sync::CancellationToken,
) -> (Vec<Settled<T>>, bool) {
    let Some(b) = bucket.as_mut() else {
        return (Vec::new(), true);
    };
    let mut done = Vec::new();
    if b.take(clock.elapsed().as_micros() as u64).is_err() {
        publisher.seal();
        done = publisher.ready();
        while let Err(wait) = b.take(clock.elapsed().as_micros() as u64) {
            tokio::select! {
                _ = cancel.cancelled() => return (done, false),
                _ = tokio::time::sleep(Duration::from_micros(wait)) => {}
            }
        }
    }
    (done, true)
}

/// Waits until `bucket` gives a token (and takes it); `false` when
/// cancelled meanwhile.
async fn wait_token(
    bucket: &mut TokenBucket,
    clock: Instant,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    while let Err(wait) = bucket.take(clock.elapsed().as_micros() as u64) {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_micros(wait)) => {}
        }
    }
    true
}

/// Replays the messages of an export file (`--from-file`) to `opts.to`.
/// The whole file is read and checked first: a line that is not a valid
/// export line stops the run before anything is published (exit 2, naming
/// the line). The canary does not apply (nothing to look for in a DLQ).
pub async fn replay_file(
    conn: Arc<lapin::Connection>,
    user: &str,
    path: &std::path::Path,
    opts: &ReplayOptions,
    cancel: &tokio_util::sync::CancellationToken,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<ReplayReport> {
    let started = Instant::now();
    check_options(opts)?;
    // First pass: every line must read.
    let mut total = 0u64;
    for record in export_records(path)? {
        record?;
        total += 1;
    }
    check_destination(&conn, &opts.to).await?;
    let mut report = ReplayReport {
        from: path.display().to_string(),
        to: opts.to.clone(),
        replay_id: opts.replay_id.clone(),
        snapshot: total,
        dry_run: opts.dry_run,
        from_file: true,
        ..Default::default()
    };
    let mut p = Progress {
        total,
        ..Default::default()
    };
    let mut publisher = if opts.dry_run {
        None
    } else {
        Some(BatchPipeline::<()>::open(&conn, LANES, BATCH, CONFIRM_TIMEOUT).await?)
    };
    let frame_max = conn.configuration().frame_max();
    let mut bucket = opts.rate.map(|rate| TokenBucket::new(rate, 0));
    let clock = Instant::now();
    for record in export_records(path)? {
        if cancel.is_cancelled() {
            report.ended.cancel();
            break;
        }
        if report.ended.stop().is_some() {
            break;
        }
        let m = super::Message::new(0, record?, !opts.selector.is_empty());
        p.read += 1;
        report.read += 1;
        let now = now_ms();
        if !selected(&opts.selector, &m, now) || opts.limit.is_some_and(|l| p.selected >= l) {
            report.skipped += 1;
            progress(&p);
            continue;
        }
        p.selected += 1;
        let Some(publisher) = publisher.as_mut() else {
            report.keys.extend(dry_run_key(opts, &m));
            report.moved += 1;
            p.done += 1;
            progress(&p);
            continue;
        };
        let (done, go_on) = pace(&mut bucket, clock, publisher, cancel).await;
        file_settle(done, &mut report, &mut p, &opts.to);
        if !go_on {
            report.ended.cancel();
            report.interrupted += 1;
            break;
        }
        let props = replay_copy(&m.record.properties, user, &opts.replay_id, now);
        let props = with_rerun(props, opts.rerun, &opts.replay_id);
        let props = match fit_retry_copy(props, frame_max) {
            Ok((props, _)) => props,
            Err(too_large) => {
                report.failed += 1;
                p.failed += 1;
                let why = too_large_why(m.message_id.as_deref(), &too_large);
                tracing::warn!("not replayed: {why}");
                report.why_failed.get_or_insert(why);
                progress(&p);
                continue;
            }
        };
        let done = publisher
            .publish("", &opts.to, &m.record.body, props, ())
            .await;
        file_settle(done, &mut report, &mut p, &opts.to);
        progress(&p);
    }
    if let Some(mut publisher) = publisher.take() {
        let done = publisher.drain().await;
        file_settle(done, &mut report, &mut p, &opts.to);
        publisher.close().await;
    }
    progress(&p);
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Takes finished batches of copies from a file (there is no original
/// to ack): a refused batch stops the run. Some of its copies may have
/// arrived: the file is still there to replay again (a duplicate, never a
/// loss).
fn file_settle(done: Vec<Settled<()>>, report: &mut ReplayReport, p: &mut Progress, to: &str) {
    tally(done, p, report, to, |_| {}, |_| {});
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON form as the derived one of the report with `stopped` and
    /// `cancelled` fields wrote it: the same fields, in the same order.
    #[test]
    fn the_json_form_says_how_the_run_ended_as_it_always_did() {
        let report = |ended: ReplayEnd, why_failed: Option<&str>| ReplayReport {
            from: "orders.dlq".into(),
            to: "orders".into(),
            replay_id: "r1".into(),
            snapshot: 5,
            read: 4,
            moved: 3,
            skipped: 0,
            failed: 1,
            why_failed: why_failed.map(str::to_string),
            interrupted: 0,
            from_file: false,
            rotated: 0,
            dry_run: false,
            canary: None,
            ended,
            elapsed_ms: 12,
            keys: vec![b"k".to_vec()],
            already_handled: None,
            rerun: false,
        };
        let head = r#"{"from":"orders.dlq","to":"orders","replay_id":"r1","snapshot":5,"read":4,"moved":3,"skipped":0,"failed":1,"#;
        let tail =
            r#""interrupted":0,"from_file":false,"rotated":0,"dry_run":false,"canary":null,"#;
        let refused = Stop::Refused("orders refused a copy: nacked".into());
        let cases = [
            (
                ReplayEnd::Completed,
                None,
                r#""stopped":null,"cancelled":false,"elapsed_ms":12}"#,
            ),
            (
                ReplayEnd::Stopped(refused.clone()),
                Some("orders refused a copy: nacked"),
                r#""stopped":"orders refused a copy: nacked","cancelled":false,"elapsed_ms":12}"#,
            ),
            (
                ReplayEnd::Stopped(Stop::CanaryFailed("the canary failed".into())),
                None,
                r#""stopped":"the canary failed","cancelled":false,"elapsed_ms":12}"#,
            ),
            (
                ReplayEnd::Cancelled { stop: None },
                None,
                r#""stopped":null,"cancelled":true,"elapsed_ms":12}"#,
            ),
            (
                ReplayEnd::Cancelled {
                    stop: Some(refused),
                },
                None,
                r#""stopped":"orders refused a copy: nacked","cancelled":true,"elapsed_ms":12}"#,
            ),
        ];
        for (ended, why_failed, end) in cases {
            let why = match why_failed {
                Some(w) => format!(r#""why_failed":"{w}","#),
                None => String::new(),
            };
            assert_eq!(
                serde_json::to_string(&report(ended, why_failed)).unwrap(),
                format!("{head}{why}{tail}{end}")
            );
        }
        let mut r = report(ReplayEnd::Completed, None);
        r.canary = Some(CanaryReport {
            sent: 2,
            came_back: 0,
            passed: true,
            handled: None,
        });
        r.already_handled = Some(7);
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.contains(r#""canary":{"sent":2,"came_back":0,"passed":true},"stopped":null"#),
            "{json}"
        );
        assert!(
            json.ends_with(r#""elapsed_ms":12,"already_handled":7}"#),
            "{json}"
        );
    }
}
