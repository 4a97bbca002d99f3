//! Where a commit's time goes: the duration of each step of [`RowDelta`](super::RowDelta) and the
//! files it wrote, logged at debug level when the commit ends
//! (`CDCD_LOG=cdcd::sinks::iceberg::commit=debug`). Issue 37 found the cost of a many-tables
//! run this way; it costs a clock read per step.

use std::time::{Duration, Instant};

/// The laps of one commit.
pub(super) struct Steps {
    last: Instant,
    laps: Vec<(&'static str, Duration)>,
    /// Files written by kind: `(kind, count)`.
    written: Vec<(&'static str, usize)>,
}

impl Steps {
    pub(super) fn start() -> Steps {
        Steps {
            last: Instant::now(),
            laps: Vec::with_capacity(12),
            written: Vec::with_capacity(6),
        }
    }

    /// Ends the step `name` (the time since the previous lap).
    pub(super) fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.laps.push((name, now - self.last));
        self.last = now;
    }

    /// Counts `n` files of `kind` written by the step running.
    pub(super) fn wrote(&mut self, kind: &'static str, n: usize) {
        if n > 0 {
            self.written.push((kind, n));
        }
    }

    /// One debug line: total and per-step milliseconds, and the files written.
    pub(super) fn log(&self, table: &crate::changelog::TableId) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let total: Duration = self.laps.iter().map(|(_, d)| *d).sum();
        let steps = self
            .laps
            .iter()
            .map(|(n, d)| format!("{n}={:.1}", d.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(" ");
        let written = self
            .written
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        tracing::debug!(table = %table, total_ms = total.as_secs_f64() * 1000.0, steps = %steps, written = %written, "commit steps");
    }
}
