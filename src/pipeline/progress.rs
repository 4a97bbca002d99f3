//! The pipeline-level position (`checkpoint::progress`, `_cdcd/<pipeline>/progress.json`): where
//! the source starts on a restart, and the background writer that keeps the file up to date.
//!
//! Start: each table with a complete checkpoint resumes from that checkpoint, raised to the stored
//! progress where the file's claim holds for the table ([`Progress::resume_point`]); the source
//! starts at the meet of those (GTID sets and lists are partially ordered: the intersection, per
//! domain the minimum, so no table misses a change). The skip rule stays per table: a change is
//! skipped only where its own table's checkpoint covers it.
//!
//! Writes: [`ProgressWriter::acked`] is called with each position acknowledged to the source (so
//! every table holds everything up to it) and the tables' checkpoints at that moment; a task
//! writes the newest one at most every [`WRITE_INTERVAL`], and [`ProgressWriter::finish`] writes
//! the last one at a stop. Acknowledged positions only grow and one task writes them in order, so
//! the file never goes back, and it never runs ahead of the tables.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::changelog::{Position, TableId};
use crate::checkpoint::progress::{Progress, ProgressStore};

/// The file is rewritten at most this often: one small put, where acknowledgements come every
/// second or so (an S3 put per second would cost more than the re-read it saves); a crash loses at
/// most this much progress, which a restart re-reads.
const WRITE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a stop waits for the last write.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the source starts: the meet of every complete checkpoint, each raised by `progress`
/// where that is sound. `None` when no table has a complete checkpoint.
pub(super) fn start_position(
    committed: &BTreeMap<TableId, Option<Position>>,
    progress: Option<&Progress>,
) -> Option<Position> {
    committed
        .iter()
        .filter_map(|(t, cp)| cp.as_ref().map(|cp| (t, cp)))
        .filter(|(_, cp)| !cp.is_snapshot_incomplete())
        .map(|(t, cp)| match progress {
            Some(p) => p.resume_point(t, cp),
            None => cp.clone(),
        })
        .reduce(|a, b| match a.meet(&b) {
            Some(m) => m,
            // Positions of different kinds: no pipeline produces them; keep the older-looking.
            None => match b.partial_cmp(&a) {
                Some(std::cmp::Ordering::Less) => b,
                _ => a,
            },
        })
}

/// Keeps the progress file up to date in the background. Inert without a store.
pub(super) struct ProgressWriter {
    latest: watch::Sender<Option<Progress>>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ProgressWriter {
    pub(super) fn start(store: Option<ProgressStore>) -> ProgressWriter {
        let (latest, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let task = store.map(|store| tokio::spawn(write_loop(store, rx, stop.clone())));
        ProgressWriter { latest, stop, task }
    }

    /// `position` was acknowledged to the source, with the tables at `committed`. Tables whose
    /// copy is incomplete are left out (they keep their own rules); Postgres positions are not
    /// recorded (the slot keeps them; see `checkpoint::progress`).
    pub(super) fn acked(
        &self,
        position: &Position,
        committed: &BTreeMap<TableId, Option<Position>>,
    ) {
        if self.task.is_none() || matches!(position, Position::Postgres(_)) {
            return;
        }
        let tables = committed
            .iter()
            .filter_map(|(t, cp)| cp.as_ref().map(|cp| (t, cp)))
            .filter(|(_, cp)| !cp.is_snapshot_incomplete())
            .map(|(t, cp)| (t.clone(), cp.clone()))
            .collect();
        self.latest.send_replace(Some(Progress {
            position: position.clone(),
            tables,
        }));
    }

    /// Writes the newest acknowledged progress, if not yet written, and stops the writer.
    pub(super) async fn finish(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            if tokio::time::timeout(FINAL_WRITE_TIMEOUT, task)
                .await
                .is_err()
            {
                warn!("the pipeline progress was not written within {FINAL_WRITE_TIMEOUT:?} of the stop");
            }
        }
    }
}

impl Drop for ProgressWriter {
    fn drop(&mut self) {
        // A pipeline dropped mid-flight (its lease lost) must not leave a writer behind.
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn write_loop(
    store: ProgressStore,
    mut rx: watch::Receiver<Option<Progress>>,
    stop: CancellationToken,
) {
    let mut written: Option<Progress> = None;
    loop {
        let stopping = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            changed = rx.changed() => changed.is_err(),
        };
        let latest = rx.borrow_and_update().clone();
        if let Some(p) = latest.filter(|p| written.as_ref() != Some(p)) {
            match store.write(&p).await {
                Ok(()) => {
                    debug!(position = %p.position, "pipeline progress written");
                    written = Some(p);
                }
                Err(e) => {
                    warn!(error = %e, "writing the pipeline progress failed; retrying with the next acknowledgement")
                }
            }
        }
        if stopping {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(WRITE_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Warehouse;
    use crate::test_fixtures::{position as pos, progress};

    fn books(cps: &[(&str, Option<&str>)]) -> BTreeMap<TableId, Option<Position>> {
        cps.iter()
            .map(|(t, p)| (TableId::new("db", *t), p.map(pos)))
            .collect()
    }

    /// Issue 17 part 2: an idle table no longer pins the start at its old checkpoint.
    #[test]
    fn start_is_raised_by_progress_only_for_listed_tables() {
        let committed = books(&[("a", Some("0-1-90")), ("b", Some("0-1-3")), ("c", None)]);
        assert_eq!(start_position(&committed, None), Some(pos("0-1-3")));
        let progress = progress("0-1-95", &[("a", "0-1-90"), ("b", "0-1-3")]);
        assert_eq!(
            start_position(&committed, Some(&progress)),
            Some(pos("0-1-95"))
        );
        // A table the file does not list (added since) keeps the start at its checkpoint.
        let mut more = committed.clone();
        more.insert(TableId::new("db", "d"), Some(pos("0-1-7")));
        assert_eq!(start_position(&more, Some(&progress)), Some(pos("0-1-7")));
        // An incomplete copy does not take part.
        more.insert(TableId::new("db", "d"), Some(pos(":0")));
        assert_eq!(start_position(&more, Some(&progress)), Some(pos("0-1-95")));
    }

    #[test]
    fn start_is_the_meet_of_incomparable_checkpoints() {
        let committed = books(&[("a", Some("0-1-10,1-1-5")), ("b", Some("0-1-5,1-1-8"))]);
        // Either checkpoint alone would skip the other table's changes in one domain.
        assert_eq!(start_position(&committed, None), Some(pos("0-1-5,1-1-5")));
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let sets = books(&[
            ("a", Some(&format!("{u}:1-10")[..])),
            ("b", Some(&format!("{u}:1-5:7-12")[..])),
        ]);
        assert_eq!(
            start_position(&sets, None),
            Some(pos(&format!("{u}:1-5:7-10")))
        );
    }

    #[tokio::test]
    async fn writer_records_acknowledged_positions_and_the_last_at_finish() {
        let wh = Warehouse::from_url("memory://").unwrap();
        let store = ProgressStore::new(&wh, "p").unwrap();
        let mut writer = ProgressWriter::start(Some(store.clone()));
        let committed = books(&[("a", Some("0-1-4")), ("b", Some(":0"))]);
        writer.acked(&pos("0-1-5"), &committed);
        writer.acked(&pos("0-1-6"), &committed);
        writer.finish().await;
        let got = store.read().await.unwrap().unwrap();
        assert_eq!(got.position, pos("0-1-6"));
        // The table still being copied is not listed.
        assert_eq!(
            got.tables.keys().cloned().collect::<Vec<_>>(),
            vec![TableId::new("db", "a")]
        );
        // Postgres positions are left to the slot.
        let mut pg = ProgressWriter::start(Some(store.clone()));
        pg.acked(&Position::Postgres(crate::changelog::Lsn(9)), &committed);
        pg.finish().await;
        assert_eq!(store.read().await.unwrap().unwrap().position, pos("0-1-6"));
    }
}
