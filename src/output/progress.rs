//! Progress of a long DLQ command on standard error: a bar with the rate
//! and the ETA on a terminal; off a terminal nothing, unless asked
//! (`--progress`: plain lines, at most one every 2 s, and the last);
//! nothing with `quiet`.

use dlqctl::ops::dlq::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Shows a command's progress.
pub struct Reporter {
    verb: &'static str,
    bar: Option<ProgressBar>,
    plain: bool,
    started: Instant,
    last_line: Option<Instant>,
    last: Progress,
}

impl Reporter {
    /// A reporter for `verb` ("replayed", "exported", ...): a bar when
    /// standard error is a terminal, plain lines otherwise when `lines`.
    pub fn new(verb: &'static str, quiet: bool, lines: bool) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = (tty && !quiet).then(|| {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} read, {msg} [{elapsed_precise}, ETA {eta}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Reporter {
            verb,
            bar,
            plain: !tty && !quiet && lines,
            started: Instant::now(),
            last_line: None,
            last: Progress::default(),
        }
    }

    /// Takes the latest figures.
    pub fn update(&mut self, p: &Progress) {
        self.last = p.clone();
        if let Some(b) = &self.bar {
            b.set_length(p.total.max(p.read));
            b.set_position(p.read);
            b.set_message(format!(
                "{} {} ({:.0}/s), {} failed",
                p.done,
                self.verb,
                rate(p.done, self.started.elapsed()),
                p.failed
            ));
        } else if self.plain
            && self
                .last_line
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
        {
            self.last_line = Some(Instant::now());
            super::stderr_line(&self.line());
        }
    }

    /// Ends the bar (or writes the last plain line).
    pub fn finish(self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        } else if self.plain && self.last_line.is_some() {
            super::stderr_line(&self.line());
        }
    }

    fn line(&self) -> String {
        let p = &self.last;
        let elapsed = self.started.elapsed();
        let per_s = rate(p.read, elapsed);
        let eta = if per_s > 0.0 && p.total > p.read {
            format!(", ETA {:.0}s", (p.total - p.read) as f64 / per_s)
        } else {
            String::new()
        };
        format!(
            "progress: {}/{} read, {} {}, {} failed, {:.0} msg/s{eta}",
            p.read, p.total, p.done, self.verb, p.failed, per_s
        )
    }
}

fn rate(n: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}
