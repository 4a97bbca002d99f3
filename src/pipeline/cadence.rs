//! When each table commits: on its own clock, not in a round over every table; and what the
//! source may forget while some tables still wait for theirs.
//!
//! A table's buffer of streamed changes is due when its first change would pass the freshness
//! target (`commit_interval_ms`) before the next tick, so no change waits longer than the target
//! plus its commit. When the tables' streamed rows together reach `commit_max_rows`, or their
//! Arrow bytes the buffered rows' share of `pipeline.memory_budget`, the largest buffers are due
//! as well, until at most half of each is left (memory, not freshness). A table
//! with nothing buffered costs nothing: no commit, no snapshot, no checkpoint. The due tables of
//! a tick commit together, concurrently, as one round in the background while the pipeline reads
//! on (`pipeline/commit.rs`); while a round is in flight no other starts, and the tables due
//! meanwhile go in the next one, started as soon as it lands. Where the sink commits several
//! tables in one catalog transaction, a due table brings every buffered one with it (one request
//! per round, and a source transaction visible in all its tables at once). Why this and not a
//! flush of every table whenever the oldest change is due: docs/many-tables.md.
//!
//! Acknowledgement (STYLE rule 6): the source may forget a position only when every table holds
//! everything up to it. A table waiting for its commit holds every change up to the position
//! received just before its buffer's first change (its earlier changes are committed), so the
//! acknowledgement is the meet of those positions over the waiting tables ([`durable_bound`]).
//! A waiting table therefore holds the acknowledgement back by at most the freshness target.
//! A table whose commit is in flight holds it the same way, from where that commit's buffer
//! opened, until the commit lands (a newer buffer of the same table, read beside it, opened
//! later). Initial-copy rows and a copy batch committing in the background hold it whole, as
//! before (their tables are acknowledged by the commit at the copy's end).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::tables::{Opened, TableBuffer};
use super::{Committer, PipelineError};
use crate::changelog::{Position, TableId};

/// What makes a table due.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cadence {
    /// `commit_interval_ms`: the oldest change of a table waits at most this long.
    pub freshness: Duration,
    /// The tick: a table due before the next one commits at this one.
    pub early: Duration,
    /// `commit_max_rows`: streamed rows buffered over all tables.
    pub max_rows: usize,
    /// The memory budget's buffered rows share: Arrow bytes of streamed rows over all tables.
    pub max_bytes: usize,
}

impl Cadence {
    /// The tables to commit at `now`. With initial-copy rows buffered, a due table brings every
    /// buffered table with it (a flush, as before per-table commits: the copy's rows are
    /// committed by size and at its end, and acknowledged only when nothing is buffered).
    pub(super) fn pick(
        &self,
        buffers: &BTreeMap<TableId, TableBuffer>,
        now: Instant,
    ) -> Vec<TableId> {
        let deadline = now + self.early;
        let mut due: Vec<TableId> = Vec::new();
        // (table, rows, bytes)
        let mut waiting: Vec<(&TableId, usize, usize)> = Vec::new();
        let (mut streamed_rows, mut streamed_bytes, mut left_rows, mut left_bytes) = (0, 0, 0, 0);
        for (table, buffer) in buffers.iter().filter(|(_, b)| b.opened.is_some()) {
            streamed_rows += buffer.rows;
            streamed_bytes += buffer.bytes;
            if buffer.since + self.freshness <= deadline {
                due.push(table.clone());
            } else {
                waiting.push((table, buffer.rows, buffer.bytes));
                left_rows += buffer.rows;
                left_bytes += buffer.bytes;
            }
        }
        let over_bytes = streamed_bytes >= self.max_bytes;
        if streamed_rows >= self.max_rows || over_bytes {
            // Largest first (by what is over): the fewest commits that free the memory.
            if over_bytes {
                waiting.sort_by_key(|w| std::cmp::Reverse(w.2));
            } else {
                waiting.sort_by_key(|w| std::cmp::Reverse(w.1));
            }
            for (table, rows, bytes) in waiting {
                if left_rows <= self.max_rows / 2 && left_bytes <= self.max_bytes / 2 {
                    break;
                }
                due.push(table.clone());
                left_rows -= rows;
                left_bytes -= bytes;
            }
        }
        let copying = buffers.values().any(|b| b.opened.is_none());
        if copying && !due.is_empty() {
            return buffers.keys().cloned().collect();
        }
        due
    }
}

/// The newest position every table holds, given where each buffer still waiting and each commit
/// in flight opened (`waiting`; `None`: initial-copy rows) and `received` (everything up to it
/// has been received): `received` when nothing waits, else the meet of where each waiting one
/// opened. `None`: nothing may be acknowledged (initial-copy rows wait, or a buffer opened before
/// anything was received).
///
/// A buffer opened for a table while the table's previous commit is in flight opened later than
/// that commit's buffer did, so the commit in flight is what bounds the table until it lands.
pub(super) fn durable_bound<'a>(
    waiting: impl IntoIterator<Item = Option<&'a Opened>>,
    received: Option<&Position>,
) -> Option<Position> {
    let mut bound = received.cloned()?;
    for opened in waiting {
        let after = opened?.after.as_ref()?;
        // `None` for positions of different kinds (no source sends them): acknowledge nothing.
        bound = bound.meet(after)?;
    }
    Some(bound)
}

/// The source commit time of the oldest change still waiting for its table's commit.
pub(super) fn oldest_waiting<'a>(
    waiting: impl IntoIterator<Item = Option<&'a Opened>>,
) -> Option<i64> {
    waiting
        .into_iter()
        .filter_map(|o| o.map(|o| o.commit_micros))
        .min()
}

impl Committer {
    fn cadence(&self, early: Duration) -> Cadence {
        Cadence {
            freshness: self.settings.commit_interval,
            early,
            max_rows: self.settings.commit_max_rows,
            max_bytes: self.settings.memory_budget.buffered_rows(),
        }
    }

    /// Starts committing the tables that are due (within `early`) in the background, unless a
    /// round is in flight (at most one is: the next starts once it has landed), then
    /// acknowledges what every table holds.
    pub(super) async fn commit_due(&mut self, early: Duration) -> Result<(), PipelineError> {
        if !self.in_flight.is_running() {
            let mut due = self
                .cadence(early)
                .pick(&self.tables.buffers, Instant::now());
            if !due.is_empty() && self.sink.commits_tables_together().await {
                // One catalog transaction over every buffered table: a source transaction that
                // touched several tables becomes visible in all of them at once (docs/catalogs.md,
                // "Multi-table commits"), so no table is left for a later round.
                due = self.tables.buffers.keys().cloned().collect();
            }
            self.round_in_background(&due).await?;
        }
        self.acknowledge();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pipeline::tables::Opened;
    use crate::test_fixtures::{self as fixtures, pg_position as pos};
    use std::sync::Arc;

    fn buffer(
        name: &str,
        rows: usize,
        age_ms: u64,
        after: Option<u64>,
        now: Instant,
    ) -> (TableId, TableBuffer) {
        let key = fixtures::column("id", arrow_schema::DataType::Int64, false, "int8");
        let schema = Arc::new(fixtures::table("public", name, vec![key], vec![0]));
        let mut b = TableBuffer::new(schema, &pos(100));
        b.rows = rows;
        b.since = now - Duration::from_millis(age_ms);
        b.opened = after.map(|a| Opened {
            after: Some(pos(a)),
            commit_micros: a as i64,
        });
        (TableId::new("public", name), b)
    }

    const CADENCE: Cadence = Cadence {
        freshness: Duration::from_millis(1000),
        early: Duration::from_millis(250),
        max_rows: 100,
        max_bytes: 1000,
    };

    fn names(tables: Vec<TableId>) -> Vec<String> {
        tables.into_iter().map(|t| t.name).collect()
    }

    #[test]
    fn a_table_commits_on_its_own_clock_and_idle_tables_cost_nothing() {
        let now = Instant::now() + Duration::from_secs(10);
        let buffers: BTreeMap<_, _> = [
            buffer("old", 1, 1200, Some(5), now),
            buffer("due_by_next_tick", 1, 800, Some(6), now),
            buffer("young", 3, 100, Some(7), now),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            names(CADENCE.pick(&buffers, now)),
            ["due_by_next_tick", "old"]
        );
        assert!(CADENCE.pick(&BTreeMap::new(), now).is_empty());
    }

    #[test]
    fn past_commit_max_rows_the_largest_buffers_commit_until_half_is_left() {
        let now = Instant::now() + Duration::from_secs(10);
        let buffers: BTreeMap<_, _> = [
            buffer("a", 10, 10, Some(5), now),
            buffer("b", 60, 10, Some(6), now),
            buffer("c", 35, 10, Some(7), now),
        ]
        .into_iter()
        .collect();
        // 105 rows: b (60) leaves 45, at most half of 100.
        assert_eq!(names(CADENCE.pick(&buffers, now)), ["b"]);
    }

    #[test]
    fn past_the_memory_share_the_largest_buffers_by_bytes_commit_until_half_is_left() {
        let now = Instant::now() + Duration::from_secs(10);
        let sized = |name, rows, bytes| {
            let (t, mut b) = buffer(name, rows, 10, Some(5), now);
            b.bytes = bytes;
            (t, b)
        };
        // Few rows, wide ones: 1,100 bytes over a share of 1,000.
        let buffers: BTreeMap<_, _> = [
            sized("narrow", 9, 100),
            sized("wide", 1, 700),
            sized("mid", 1, 300),
        ]
        .into_iter()
        .collect();
        // wide (700) leaves 400, at most half of 1,000; rows (11) were never over.
        assert_eq!(names(CADENCE.pick(&buffers, now)), ["wide"]);
        let under: BTreeMap<_, _> = [sized("a", 1, 400), sized("b", 1, 500)]
            .into_iter()
            .collect();
        assert!(CADENCE.pick(&under, now).is_empty());
    }

    #[test]
    fn copy_rows_buffered_make_a_due_round_a_flush() {
        let now = Instant::now() + Duration::from_secs(10);
        let buffers: BTreeMap<_, _> = [
            buffer("copy", 10, 5000, None, now),
            buffer("young", 1, 10, Some(6), now),
        ]
        .into_iter()
        .collect();
        assert!(
            CADENCE.pick(&buffers, now).is_empty(),
            "copy rows are not due by age"
        );
        let buffers: BTreeMap<_, _> = [
            buffer("copy", 10, 5000, None, now),
            buffer("old", 1, 2000, Some(6), now),
        ]
        .into_iter()
        .collect();
        assert_eq!(names(CADENCE.pick(&buffers, now)), ["copy", "old"]);
    }

    #[test]
    fn the_acknowledgement_stops_before_the_oldest_waiting_buffer() {
        let now = Instant::now();
        let buffers: BTreeMap<_, _> = [
            buffer("a", 1, 10, Some(30), now),
            buffer("b", 1, 10, Some(20), now),
        ]
        .into_iter()
        .collect();
        let opened = |buffers: &BTreeMap<TableId, TableBuffer>| {
            buffers
                .values()
                .map(|b| b.opened.clone())
                .collect::<Vec<_>>()
        };
        let waiting = opened(&buffers);
        assert_eq!(
            durable_bound(waiting.iter().map(Option::as_ref), Some(&pos(50))),
            Some(pos(20))
        );
        assert_eq!(durable_bound([], Some(&pos(50))), Some(pos(50)));
        assert_eq!(
            durable_bound(waiting.iter().map(Option::as_ref), None),
            None
        );
        let copying: BTreeMap<_, _> = [buffer("a", 1, 10, None, now)].into_iter().collect();
        let copying = opened(&copying);
        assert_eq!(
            durable_bound(copying.iter().map(Option::as_ref), Some(&pos(50))),
            None
        );
        assert_eq!(oldest_waiting(waiting.iter().map(Option::as_ref)), Some(20));
    }
}
