//! How far the initial copies are, per table and overall: rows and bytes copied against the
//! source's estimates, as metrics (`cdcd_snapshot_{rows,bytes}_total`, `…_estimated`,
//! `cdcd_snapshot_eta_seconds`) and a log line every [`LOG_INTERVAL`] while a copy runs (rows,
//! bytes, rates and ETA of each table under way, then of all of them).
//!
//! Where it sits: the pipeline feeds it the copy's events (`copy.rs`: a table's plan, each batch
//! of rows, the table done), so both sources report the same way whatever copies the rows
//! (Postgres's parallel workers, MySQL's connections). Bytes are the Arrow bytes of the copied
//! values (what cdcd holds and encodes); the estimate is the source's size on disk, which also
//! holds row headers, page slack and indexes' neighbours, so a table's bytes end near its
//! estimate, not at it. The ETA follows rows: the rows still estimated at the rate so far; a
//! source that plans its tables one after the other (MySQL) adds each table's estimate when it
//! starts copying it, so until then the overall ETA counts only the tables planned.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::changelog::TableId;
use crate::metrics as m;

/// How often the progress line is logged while rows arrive.
pub(super) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The copies of one run of the pipeline.
#[derive(Default)]
pub(super) struct CopyMeter {
    tables: BTreeMap<TableId, TableCopy>,
    /// The first plan of the copies under way (`None`: none under way).
    started: Option<Instant>,
    logged: Option<Instant>,
}

/// One table's copy in this run.
#[derive(Debug, Clone, PartialEq)]
struct TableCopy {
    estimated_rows: u64,
    estimated_bytes: u64,
    rows: u64,
    bytes: u64,
    started: Instant,
    done: bool,
}

/// Rows and bytes so far against their estimates, for one table or all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Progress {
    pub rows: u64,
    pub estimated_rows: u64,
    pub bytes: u64,
    pub estimated_bytes: u64,
    pub rows_per_s: f64,
    pub bytes_per_s: f64,
    /// Seconds left at the rate so far (`None`: no row yet).
    pub eta_s: Option<f64>,
}

impl Progress {
    /// The progress line of `scope` (a table, or all of them).
    fn log(&self, scope: &str) {
        tracing::info!(
            table = scope,
            rows = self.rows,
            estimated_rows = self.estimated_rows,
            bytes = self.bytes,
            estimated_bytes = self.estimated_bytes,
            rows_per_s = self.rows_per_s as u64,
            bytes_per_s = self.bytes_per_s as u64,
            eta_s = self.eta_s.map(|s| s.round() as u64),
            "initial copy progress"
        );
    }

    fn of(
        rows: u64,
        estimated_rows: u64,
        bytes: u64,
        estimated_bytes: u64,
        elapsed: Duration,
    ) -> Self {
        let secs = elapsed.as_secs_f64();
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let rows_per_s = per_s(rows);
        let left = estimated_rows.saturating_sub(rows);
        let eta_s = if left == 0 {
            Some(0.0)
        } else if rows_per_s > 0.0 {
            Some(left as f64 / rows_per_s)
        } else {
            None
        };
        Progress {
            rows,
            estimated_rows,
            bytes,
            estimated_bytes,
            rows_per_s,
            bytes_per_s: per_s(bytes),
            eta_s,
        }
    }
}

impl CopyMeter {
    /// The tables this run copies, known before their plans (MySQL plans one table after the
    /// other): the copies are done when all of them are, and the overall rate counts from now.
    pub(super) fn expect<'a>(&mut self, tables: impl IntoIterator<Item = &'a TableId>) {
        let now = Instant::now();
        for table in tables {
            self.started.get_or_insert(now);
            self.tables.entry(table.clone()).or_insert(TableCopy {
                estimated_rows: 0,
                estimated_bytes: 0,
                rows: 0,
                bytes: 0,
                started: now,
                done: false,
            });
        }
    }

    /// `table`'s copy is planned: its estimates, and its counts from zero for this run (a
    /// resumed copy counts what this run copies).
    pub(super) fn plan(
        &mut self,
        pipeline: &str,
        table: &TableId,
        estimated_rows: u64,
        estimated_bytes: u64,
    ) {
        metrics::gauge!(m::SNAPSHOT_ROWS_ESTIMATED, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_TABLE => table.to_string())
            .set(estimated_rows as f64);
        metrics::gauge!(m::SNAPSHOT_BYTES_ESTIMATED, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_TABLE => table.to_string())
            .set(estimated_bytes as f64);
        let now = Instant::now();
        self.started.get_or_insert(now);
        self.tables.insert(
            table.clone(),
            TableCopy {
                estimated_rows,
                estimated_bytes,
                rows: 0,
                bytes: 0,
                started: now,
                done: false,
            },
        );
    }

    /// A batch of `rows` copied rows holding `bytes`; logs the progress if it is due.
    pub(super) fn copied(&mut self, pipeline: &str, table: &TableId, rows: u64, bytes: u64) {
        metrics::counter!(m::SNAPSHOT_ROWS_TOTAL, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_TABLE => table.to_string())
            .increment(rows);
        metrics::counter!(m::SNAPSHOT_BYTES_TOTAL, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_TABLE => table.to_string())
            .increment(bytes);
        if let Some(t) = self.tables.get_mut(table) {
            t.rows += rows;
            t.bytes += bytes;
        }
        if rows == 0 {
            // A truncate marker: nothing copied yet, no news to log.
            return;
        }
        let now = Instant::now();
        let due = match (self.logged, self.started) {
            (Some(at), _) | (None, Some(at)) => now.duration_since(at) >= LOG_INTERVAL,
            (None, None) => false,
        };
        if due {
            self.logged = Some(now);
            self.log(pipeline, now);
        }
    }

    /// `table`'s copy is complete. Once every planned table is, the copies' totals are logged
    /// and the meter starts afresh (a table added later is a new copy).
    pub(super) fn done(&mut self, pipeline: &str, table: &TableId) {
        if let Some(t) = self.tables.get_mut(table) {
            t.done = true;
        }
        if self.tables.is_empty() || !self.tables.values().all(|t| t.done) {
            return;
        }
        let now = Instant::now();
        let all = self.overall(now);
        tracing::info!(
            tables = self.tables.len(),
            rows = all.rows,
            bytes = all.bytes,
            rows_per_s = all.rows_per_s as u64,
            bytes_per_s = all.bytes_per_s as u64,
            seconds = self
                .started
                .map(|s| now.duration_since(s).as_secs_f64())
                .unwrap_or(0.0),
            "initial copies done"
        );
        metrics::gauge!(m::SNAPSHOT_ETA_SECONDS, m::LABEL_PIPELINE => pipeline.to_owned()).set(0.0);
        *self = CopyMeter::default();
    }

    /// One table's progress (`None`: not planned in this run).
    pub(super) fn table(&self, table: &TableId, now: Instant) -> Option<Progress> {
        let t = self.tables.get(table)?;
        Some(Progress::of(
            t.rows,
            t.estimated_rows,
            t.bytes,
            t.estimated_bytes,
            now.duration_since(t.started),
        ))
    }

    /// Every planned table's progress together; a table done counts as its rows copied (its
    /// estimate no longer matters).
    pub(super) fn overall(&self, now: Instant) -> Progress {
        let (mut rows, mut est_rows, mut bytes, mut est_bytes) = (0, 0, 0, 0);
        for t in self.tables.values() {
            rows += t.rows;
            bytes += t.bytes;
            est_rows += if t.done {
                t.rows
            } else {
                t.estimated_rows.max(t.rows)
            };
            est_bytes += if t.done {
                t.bytes
            } else {
                t.estimated_bytes.max(t.bytes)
            };
        }
        let elapsed = self
            .started
            .map(|s| now.duration_since(s))
            .unwrap_or_default();
        Progress::of(rows, est_rows, bytes, est_bytes, elapsed)
    }

    fn log(&self, pipeline: &str, now: Instant) {
        for (table, t) in &self.tables {
            if t.done || t.rows == 0 {
                continue;
            }
            if let Some(p) = self.table(table, now) {
                p.log(&table.to_string());
            }
        }
        let all = self.overall(now);
        let done = self.tables.values().filter(|t| t.done).count();
        all.log(&format!("all tables ({}, {done} done)", self.tables.len()));
        if let Some(eta) = all.eta_s {
            metrics::gauge!(m::SNAPSHOT_ETA_SECONDS, m::LABEL_PIPELINE => pipeline.to_owned())
                .set(eta);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(name: &str) -> TableId {
        TableId {
            namespace: "public".into(),
            name: name.into(),
        }
    }

    #[test]
    fn eta_is_the_rows_left_at_the_rate_so_far() {
        let p = Progress::of(250, 1000, 50, 400, Duration::from_secs(5));
        assert_eq!((p.rows_per_s, p.bytes_per_s), (50.0, 10.0));
        assert_eq!(p.eta_s, Some(15.0));
        // Past the estimate: nothing left.
        assert_eq!(
            Progress::of(1200, 1000, 0, 0, Duration::from_secs(1)).eta_s,
            Some(0.0)
        );
        // No row yet: unknown.
        assert_eq!(
            Progress::of(0, 1000, 0, 0, Duration::from_secs(1)).eta_s,
            None
        );
    }

    #[test]
    fn copies_are_done_when_every_expected_table_is() {
        let mut meter = CopyMeter::default();
        meter.expect([&t("a"), &t("b")]);
        meter.plan("p", &t("a"), 10, 100);
        meter.copied("p", &t("a"), 10, 100);
        meter.done("p", &t("a"));
        assert!(meter.started.is_some(), "b is still to copy");
        meter.plan("p", &t("b"), 10, 100);
        meter.done("p", &t("b"));
        assert!(meter.tables.is_empty() && meter.started.is_none());
    }

    #[test]
    fn overall_sums_the_tables_and_a_done_table_counts_what_it_copied() {
        let mut meter = CopyMeter::default();
        meter.plan("p", &t("a"), 100, 1000);
        meter.plan("p", &t("b"), 300, 3000);
        meter.copied("p", &t("a"), 80, 900);
        meter.copied("p", &t("b"), 150, 1200);
        meter.copied("p", &t("c"), 5, 5); // not planned: counted in metrics only
        let now = Instant::now();
        let all = meter.overall(now);
        assert_eq!(
            (all.rows, all.estimated_rows, all.bytes, all.estimated_bytes),
            (230, 400, 2100, 4000)
        );
        meter.done("p", &t("a"));
        let all = meter.overall(now);
        assert_eq!((all.estimated_rows, all.estimated_bytes), (380, 3900));
        assert_eq!(meter.table(&t("b"), now).unwrap().rows, 150);
        // Every table done: the meter starts afresh.
        meter.done("p", &t("b"));
        assert!(meter.tables.is_empty() && meter.started.is_none());
    }
}
