//! Pipeline tests with a scripted source and a recording sink: commit policy, skipping what a
//! table already holds, acknowledgements, the initial-copy checkpoints, shutdown.

use std::collections::BTreeMap;
use std::sync::Mutex;

use arrow_array::builder::Int64Builder;
use async_trait::async_trait;

use super::*;
use crate::changelog::{Column, Op, TableChangesBuilder, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::sinks::{CommitStats, TableStatus};
use crate::test_fixtures::{self as fixtures, pg_position as pos};

fn schema(name: &str) -> Arc<TableSchema> {
    schema_as(name, "id", "int8")
}

/// A one-column schema of `table` whose key column is `column` of source type `source_type`.
fn schema_as(table: &str, column: &str, source_type: &str) -> Arc<TableSchema> {
    let key = fixtures::column(column, arrow_schema::DataType::Int64, false, source_type);
    Arc::new(fixtures::table("public", table, vec![key], vec![0]))
}

fn changes(table: &str, op: Op, ids: &[i64]) -> TableChanges {
    changes_as(schema(table), op, ids)
}

fn changes_as(schema: Arc<TableSchema>, op: Op, ids: &[i64]) -> TableChanges {
    let mut b = TableChangesBuilder::new(schema, ids.len());
    for &id in ids {
        b.begin(op);
        if let Some(col) = b.value(0) {
            if let Some(col) = col.as_any_mut().downcast_mut::<Int64Builder>() {
                col.append_value(id);
            }
        }
        b.no_old_key().unwrap();
    }
    b.finish().unwrap()
}

fn tx(n: u64, parts: Vec<TableChanges>) -> SourceEvent {
    SourceEvent::Transaction(Transaction {
        position: pos(n),
        commit_time_micros: 0,
        changes: parts,
    })
}

#[derive(Default)]
struct Record {
    resume: Option<Resume>,
    acks: Vec<Position>,
    /// (table, rows, position) per commit
    commits: Vec<(String, usize, String)>,
    /// The checkpoint and the ops of each commit.
    checkpoints: Vec<Checkpoint>,
    ops: Vec<Vec<Op>>,
    /// Per commit, the column count of the commit's schema and of each of its batches.
    widths: Vec<(usize, Vec<usize>)>,
}

struct ScriptedSource {
    slot_exists: bool,
    tables: Vec<TableId>,
    events: Vec<SourceEvent>,
    record: Arc<Mutex<Record>>,
    /// Cancel this when the script is done (ends the pipeline like SIGTERM).
    done: CancellationToken,
}

#[async_trait]
impl Source for ScriptedSource {
    async fn prepare(&mut self) -> Result<Prepared, SourceError> {
        Ok(Prepared {
            tables: self.tables.clone(),
            slot_exists: self.slot_exists,
            multiset: Vec::new(),
        })
    }

    async fn run(
        self: Box<Self>,
        resume: Resume,
        events: mpsc::Sender<SourceEvent>,
        mut acks: watch::Receiver<Option<Position>>,
        shutdown: CancellationToken,
    ) -> Result<(), SourceError> {
        self.record.lock().unwrap().resume = Some(resume);
        for e in self.events {
            events.send(e).await.map_err(|_| SourceError::Closed)?;
        }
        // Let the pipeline see everything, then ask it to stop.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.done.cancel();
        loop {
            tokio::select! {
                biased;
                changed = acks.changed() => {
                    if changed.is_err() { break; }
                    if let Some(p) = acks.borrow_and_update().clone() {
                        self.record.lock().unwrap().acks.push(p);
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
        if let Some(p) = acks.borrow().clone() {
            let mut r = self.record.lock().unwrap();
            if r.acks.last() != Some(&p) {
                r.acks.push(p);
            }
        }
        Ok(())
    }

    async fn check(&self) -> Vec<crate::sources::CheckProblem> {
        Vec::new()
    }

    async fn check_keys(&self) -> Vec<crate::changelog::TableKey> {
        Vec::new()
    }

    async fn tables(&self) -> Result<Vec<crate::changelog::TableKey>, SourceError> {
        Ok(self
            .tables
            .iter()
            .map(|t| crate::changelog::TableKey {
                table: t.clone(),
                columns: vec!["id".into()],
                origin: crate::changelog::KeyOrigin::PrimaryKey,
            })
            .collect())
    }

    fn snapshot_mode(&self) -> SnapshotMode {
        SnapshotMode::Never
    }

    fn stream_name(&self) -> String {
        "scripted".into()
    }

    fn heartbeat_period(&self) -> Duration {
        Duration::from_secs(10)
    }
}

struct RecordingSink {
    checkpoints: BTreeMap<TableId, Checkpoint>,
    record: Arc<Mutex<Record>>,
}

impl RecordingSink {
    /// The tables `a`..`f`, each committed at 0/5.
    fn at_5(record: Arc<Mutex<Record>>) -> RecordingSink {
        RecordingSink {
            checkpoints: ["a", "b", "c", "d", "e", "f"]
                .into_iter()
                .map(|t| (table(t), Checkpoint::new("p", pos(5))))
                .collect(),
            record,
        }
    }
}

#[async_trait]
impl Sink for RecordingSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        Ok(self.checkpoints.get(table).cloned())
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let rows = changes.iter().map(TableChanges::len).sum();
        let mut r = self.record.lock().unwrap();
        r.commits.push((
            schema.id.name.clone(),
            rows,
            checkpoint.position.to_string(),
        ));
        r.checkpoints.push(checkpoint.clone());
        r.ops
            .push(changes.iter().flat_map(|c| c.ops.iter().copied()).collect());
        r.widths.push((
            schema.columns.len(),
            changes.iter().map(|c| c.rows.num_columns()).collect(),
        ));
        Ok(CommitStats::default())
    }

    async fn status(&self, _: &TableId) -> Result<Option<TableStatus>, SinkError> {
        Ok(None)
    }

    async fn cleanup(
        &self,
        _: Duration,
        _: bool,
    ) -> Result<Vec<crate::storage::cleanup::TableCleanup>, SinkError> {
        Ok(Vec::new())
    }
}

fn settings(max_rows: usize, snapshot: SnapshotMode) -> Settings {
    Settings {
        pipeline: "p".into(),
        commit_interval: Duration::from_secs(3600),
        commit_max_rows: max_rows,
        snapshot_commit_rows: crate::pipeline::SNAPSHOT_BATCH_ROWS,
        commit_concurrency: 16,
        snapshot,
        slot: "cdcd_p".into(),
        progress: None,
        source_state: None,
        resync: None,
        resyncs: None,
        ack_hold: None,
        schema_change: Default::default(),
        memory_budget: Default::default(),
    }
}

async fn run_script(
    slot_exists: bool,
    checkpoints: &[(&str, u64)],
    events: Vec<SourceEvent>,
    settings: Settings,
) -> Record {
    let checkpoints = checkpoints
        .iter()
        .map(|(t, p)| (*t, Checkpoint::new("p", pos(*p))))
        .collect();
    run_with(slot_exists, checkpoints, events, settings).await
}

async fn run_with(
    slot_exists: bool,
    checkpoints: Vec<(&str, Checkpoint)>,
    events: Vec<SourceEvent>,
    settings: Settings,
) -> Record {
    let (record, outcome) = run_to_end(slot_exists, checkpoints, events, settings).await;
    outcome.unwrap();
    record
}

/// [`run_with`], returning how the pipeline ended beside what it did.
async fn run_to_end(
    slot_exists: bool,
    checkpoints: Vec<(&str, Checkpoint)>,
    events: Vec<SourceEvent>,
    settings: Settings,
) -> (Record, Result<(), PipelineError>) {
    let record = Arc::new(Mutex::new(Record::default()));
    let shutdown = CancellationToken::new();
    let source = ScriptedSource {
        slot_exists,
        tables: vec![TableId::new("public", "a"), TableId::new("public", "b")],
        events,
        record: record.clone(),
        done: shutdown.clone(),
    };
    let sink = RecordingSink {
        checkpoints: checkpoints
            .into_iter()
            .map(|(t, cp)| (TableId::new("public", t), cp))
            .collect(),
        record: record.clone(),
    };
    let outcome = run(Box::new(source), Arc::new(sink), settings, shutdown).await;
    let record = Arc::try_unwrap(record).ok().unwrap().into_inner().unwrap();
    (record, outcome)
}

// A DDL inside a transaction sends a new Relation message between the transaction's changes of
// that table. Committing the runs before it at the transaction's position made the table claim
// the whole transaction, and its later changes were skipped as committed (issue 17).
#[tokio::test]
async fn a_schema_change_inside_a_transaction_keeps_the_transaction_in_one_commit() {
    let widened = schema_as("a", "id", "int8 /* widened */");
    let r = run_script(
        true,
        &[("a", 5), ("b", 5)],
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1])]),
            tx(
                20,
                vec![
                    changes("a", Op::Insert, &[2]),
                    changes_as(widened.clone(), Op::Insert, &[3]),
                    changes("b", Op::Insert, &[1]),
                    changes_as(widened, Op::Insert, &[4]),
                ],
            ),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 4, "0/14".into()),
            ("b".into(), 1, "0/14".into())
        ]
    );
    assert_eq!(r.acks.last(), Some(&pos(20)));
}

/// `schema_as(table, "id", …)` plus a nullable text column `c` (an `ADD COLUMN`).
fn with_added_column(table: &str) -> Arc<TableSchema> {
    let mut s = (*schema_as(table, "id", "int8")).clone();
    s.columns.push(Column {
        name: "c".into(),
        data_type: arrow_schema::DataType::Utf8,
        nullable: true,
        source_type: "text".into(),
        initial_default: None,
        former_names: Vec::new(),
    });
    Arc::new(s)
}

/// Changes of `schema` (id, then nullable columns left NULL).
fn changes_wide(schema: Arc<TableSchema>, op: Op, ids: &[i64]) -> TableChanges {
    let width = schema.columns.len();
    let mut b = TableChangesBuilder::new(schema, ids.len());
    for &id in ids {
        b.begin(op);
        if let Some(col) = b.value(0) {
            if let Some(col) = col.as_any_mut().downcast_mut::<Int64Builder>() {
                col.append_value(id);
            }
        }
        for c in 1..width {
            if let Some(col) = b.value(c) {
                crate::changelog::append_null(col).unwrap();
            }
        }
        b.no_old_key().unwrap();
    }
    b.finish().unwrap()
}

// An ADD COLUMN inside a transaction: the transactions before it commit under the old schema,
// and the whole transaction commits as one, its runs before the ALTER rewritten to the new one.
#[tokio::test]
async fn an_added_column_inside_a_transaction_commits_it_whole_under_the_new_schema() {
    let added = with_added_column("a");
    let r = run_script(
        true,
        &[("a", 5), ("b", 5)],
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1])]),
            tx(
                20,
                vec![
                    changes("a", Op::Insert, &[2]),
                    changes("b", Op::Insert, &[1]),
                    changes_wide(added.clone(), Op::Insert, &[3]),
                    changes_wide(added, Op::Delete, &[2]),
                ],
            ),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 1, "0/A".into()),
            ("a".into(), 3, "0/14".into()),
            ("b".into(), 1, "0/14".into())
        ]
    );
    assert_eq!(r.widths[0], (1, vec![1]), "tx 10 under the old schema");
    assert_eq!(
        r.widths[1],
        (2, vec![2, 2, 2]),
        "tx 20 whole, under the new one"
    );
    assert_eq!(r.acks.last(), Some(&pos(20)));
}

#[tokio::test]
async fn a_schema_change_between_transactions_commits_the_earlier_ones_first() {
    let renamed = schema_as("a", "key", "int8");
    let r = run_script(
        true,
        &[("a", 5)],
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1])]),
            tx(20, vec![changes_as(renamed, Op::Insert, &[2])]),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 1, "0/A".into()),
            ("a".into(), 1, "0/14".into())
        ]
    );
}

#[tokio::test]
async fn a_schema_change_rows_cannot_cross_inside_a_transaction_stops_before_it() {
    let renamed = schema_as("a", "key", "int8");
    let (r, outcome) = run_to_end(
        true,
        vec![
            ("a", Checkpoint::new("p", pos(5))),
            ("b", Checkpoint::new("p", pos(5))),
        ],
        vec![
            tx(
                10,
                vec![
                    changes("a", Op::Insert, &[1]),
                    changes("b", Op::Insert, &[1]),
                ],
            ),
            tx(
                20,
                vec![
                    changes("a", Op::Insert, &[2]),
                    changes("b", Op::Insert, &[2]),
                    changes_as(renamed, Op::Insert, &[3]),
                ],
            ),
            tx(30, vec![changes("b", Op::Insert, &[3])]),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    match outcome {
        Err(PipelineError::SchemaChangedInTransaction(stop)) => {
            assert_eq!(stop.table, TableId::new("public", "a"));
            assert_eq!(stop.position, pos(20));
        }
        other => panic!("expected a stop at the transaction, got {other:?}"),
    }
    // Everything before the transaction is committed and acknowledged, nothing of it or after.
    assert_eq!(
        r.commits,
        vec![("a".into(), 1, "0/A".into()), ("b".into(), 1, "0/A".into())]
    );
    assert_eq!(r.acks.last(), Some(&pos(10)));
}

// A replayed transaction the table already holds is skipped whole, schema change and all.
#[tokio::test]
async fn a_committed_transaction_with_a_schema_change_inside_is_skipped() {
    let renamed = schema_as("a", "key", "int8");
    let r = run_script(
        true,
        &[("a", 20), ("b", 5)],
        vec![tx(
            20,
            vec![
                changes("a", Op::Insert, &[2]),
                changes("b", Op::Insert, &[2]),
                changes_as(renamed, Op::Insert, &[3]),
            ],
        )],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(r.commits, vec![("b".into(), 1, "0/14".into())]);
}

#[tokio::test]
async fn shutdown_commits_buffered_changes_then_acks() {
    let r = run_script(
        true,
        &[("a", 5), ("b", 5)],
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1, 2])]),
            tx(
                20,
                vec![
                    changes("a", Op::Update, &[1]),
                    changes("b", Op::Insert, &[7]),
                ],
            ),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 3, "0/14".into()),
            ("b".into(), 1, "0/14".into())
        ]
    );
    assert_eq!(r.acks.last(), Some(&pos(20)));
    let resume = r.resume.unwrap();
    assert_eq!(resume.start, Some(pos(5)));
    assert!(!resume.snapshot);
}

#[tokio::test]
async fn transactions_a_table_already_holds_are_skipped_for_that_table() {
    let r = run_script(
        true,
        &[("a", 15), ("b", 5)],
        vec![
            tx(
                10,
                vec![
                    changes("a", Op::Insert, &[1]),
                    changes("b", Op::Insert, &[1]),
                ],
            ),
            tx(20, vec![changes("a", Op::Insert, &[2])]),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 1, "0/14".into()),
            ("b".into(), 1, "0/A".into())
        ]
    );
    assert_eq!(
        r.resume.unwrap().start,
        Some(pos(5)),
        "resume from the oldest"
    );
}

#[tokio::test]
async fn commit_max_rows_commits_before_more_is_read() {
    let r = run_script(
        true,
        &[],
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1, 2])]),
            tx(20, vec![changes("a", Op::Insert, &[3, 4])]),
            tx(30, vec![changes("a", Op::Insert, &[5])]),
        ],
        settings(2, SnapshotMode::Never),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 2, "0/A".into()),
            ("a".into(), 2, "0/14".into()),
            ("a".into(), 1, "0/1E".into())
        ]
    );
    // A watch channel keeps only the newest ack: the source may skip intermediate ones.
    assert!(r
        .acks
        .windows(2)
        .all(|w| w[1].covers(&w[0]) && w[0] != w[1]));
    assert_eq!(r.acks.last(), Some(&pos(30)));
}

#[tokio::test]
async fn heartbeat_is_acked_only_when_nothing_is_buffered() {
    let r = run_script(
        true,
        &[],
        vec![
            SourceEvent::Heartbeat(pos(5)),
            tx(10, vec![changes("a", Op::Insert, &[1])]),
            SourceEvent::Heartbeat(pos(12)),
        ],
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(r.acks.first(), Some(&pos(5)));
    assert!(!r.acks.contains(&pos(10)) || r.commits.len() == 1);
    assert_eq!(r.acks.last(), Some(&pos(12)), "after the final commit");
    assert_eq!(r.commits, vec![("a".into(), 1, "0/A".into())]);
}

#[tokio::test]
async fn initial_copy_commits_incomplete_then_the_consistent_point() {
    let r = run_script(
        false,
        &[],
        vec![
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1, 2, 3])),
            SourceEvent::SnapshotDone {
                table: TableId::new("public", "a"),
                position: pos(100),
            },
            SourceEvent::SnapshotRows(changes("b", Op::Truncate, &[0])),
            SourceEvent::SnapshotDone {
                table: TableId::new("public", "b"),
                position: pos(100),
            },
            tx(110, vec![changes("a", Op::Insert, &[4])]),
        ],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    assert!(r.resume.as_ref().unwrap().snapshot);
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 3, "0/64".into()),
            ("b".into(), 1, "0/64".into()),
            ("a".into(), 1, "0/6E".into())
        ]
    );
}

/// A table copied exactly at a temporary slot's snapshot is complete past the point the stream
/// starts from; acknowledging that point would let the slot forget the other tables' changes
/// before it (a crash then loses them). Only positions the stream delivered are acknowledged.
#[tokio::test]
async fn a_copy_complete_past_the_stream_start_is_not_acknowledged() {
    let r = run_script(
        false,
        &[],
        vec![
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1, 2])),
            SourceEvent::SnapshotDone {
                table: TableId::new("public", "a"),
                position: pos(100),
            },
            SourceEvent::SnapshotRows(changes("b", Op::Insert, &[1])),
            SourceEvent::SnapshotDone {
                table: TableId::new("public", "b"),
                position: pos(300),
            },
            SourceEvent::Heartbeat(pos(150)),
            tx(
                200,
                vec![
                    changes("a", Op::Insert, &[3]),
                    changes("b", Op::Insert, &[9]),
                ],
            ),
        ],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    assert!(
        r.acks.iter().all(|a| pos(200).covers(a)),
        "acknowledged past what the stream delivered: {:?}",
        r.acks
    );
    assert_eq!(r.acks.first(), Some(&pos(150)));
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 2, "0/64".into()),
            ("b".into(), 1, "0/12C".into()),
            ("a".into(), 1, "0/C8".into())
        ],
        "b's change at 0/C8 is inside its copy and skipped"
    );
}

#[tokio::test]
async fn commit_max_rows_does_not_cut_copy_batches() {
    // Copy rows are committed by the snapshot batch size (default 1M rows): a streaming limit of
    // 2 rows must not turn the copy into commits of 2 rows awaited in place.
    let r = run_script(
        false,
        &[],
        vec![
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1, 2, 3])),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[4, 5, 6])),
            SourceEvent::SnapshotDone {
                table: TableId::new("public", "a"),
                position: pos(100),
            },
            tx(110, vec![changes("a", Op::Insert, &[7, 8, 9])]),
        ],
        settings(2, SnapshotMode::Initial),
    )
    .await;
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 6, "0/64".into()),
            ("a".into(), 3, "0/6E".into())
        ]
    );
}

#[tokio::test]
async fn an_incomplete_copy_is_resumed_and_a_lost_slot_is_an_error() {
    let progress = SnapshotProgress {
        chunks: vec!["x".into(), "y".into(), "z".into()],
        started: [1].into(),
        done: [0].into(),
    };
    let mut a = Checkpoint::new("p", pos(0));
    a.snapshot = Some(progress.to_json());
    let r = run_with(
        true,
        vec![("a", a), ("b", Checkpoint::new("p", pos(50)))],
        vec![],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    let resume = r.resume.unwrap();
    assert!(!resume.snapshot, "the slot stays");
    assert_eq!(resume.start, Some(pos(50)));
    assert_eq!(
        resume.copy,
        vec![TableCopy {
            table: TableId::new("public", "a"),
            progress: Some(progress),
        }]
    );
    // A table without any checkpoint (added to `tables`) is copied alone, from scratch.
    let r = run_script(
        true,
        &[("b", 50)],
        vec![],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    let resume = r.resume.unwrap();
    assert!(!resume.snapshot);
    assert_eq!(resume.copy.len(), 1);
    assert_eq!(resume.copy[0].table.name, "a");
    assert_eq!(resume.copy[0].progress, None);

    let shutdown = CancellationToken::new();
    let record = Arc::new(Mutex::new(Record::default()));
    let source = ScriptedSource {
        slot_exists: false,
        tables: vec![TableId::new("public", "a")],
        events: vec![],
        record: record.clone(),
        done: shutdown.clone(),
    };
    let sink = RecordingSink {
        checkpoints: [(TableId::new("public", "a"), Checkpoint::new("p", pos(50)))].into(),
        record,
    };
    let err = run(
        Box::new(source),
        Arc::new(sink),
        settings(10, SnapshotMode::Never),
        shutdown,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("cdcd_p"), "{err}");
}

fn table(name: &str) -> TableId {
    TableId::new("public", name)
}

fn chunk(name: &str, chunk: u32, state: crate::sources::ChunkState) -> SourceEvent {
    SourceEvent::SnapshotChunk {
        table: table(name),
        chunk,
        state,
    }
}

#[tokio::test]
async fn copy_progress_is_committed_with_the_rows() {
    use crate::sources::ChunkState::{Done, Started};
    let r = run_script(
        false,
        &[],
        vec![
            SourceEvent::SnapshotPlan {
                table: table("a"),
                chunks: vec!["c0".into(), "c1".into()],
                estimated_rows: 4,
                estimated_bytes: 0,
            },
            SourceEvent::SnapshotRows(changes("a", Op::Truncate, &[0])),
            chunk("a", 0, Started),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1, 2])),
            chunk("a", 0, Done),
            chunk("a", 1, Started),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[3])),
        ],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    assert_eq!(r.commits, vec![("a".into(), 4, "0/0".into())]);
    let progress = SnapshotProgress::from_json(r.checkpoints[0].snapshot.as_deref().unwrap());
    assert_eq!(
        progress,
        Some(SnapshotProgress {
            chunks: vec!["c0".into(), "c1".into()],
            started: [1].into(),
            done: [0].into(),
        })
    );
}

#[tokio::test]
async fn inserts_in_the_upsert_window_become_updates() {
    let r = run_script(
        true,
        &[("b", 5)],
        vec![
            SourceEvent::SnapshotPlan {
                table: table("a"),
                chunks: vec!["c0".into()],
                estimated_rows: 1,
                estimated_bytes: 0,
            },
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1])),
            SourceEvent::SnapshotUpsertUntil {
                table: table("a"),
                until: pos(30),
            },
            SourceEvent::SnapshotDone {
                table: table("a"),
                position: pos(5),
            },
            tx(20, vec![changes("a", Op::Insert, &[1])]),
        ],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    assert_eq!(r.commits[0], ("a".into(), 1, "0/5".into()));
    assert_eq!(r.checkpoints[0].upsert_until, Some(pos(30)));
    assert_eq!(r.checkpoints[0].snapshot, None, "the copy is complete");
    assert_eq!(r.ops[1], vec![Op::Update], "an insert inside the window");
    assert_eq!(
        r.checkpoints[1].upsert_until,
        Some(pos(30)),
        "still open at 0/14"
    );

    // Past the window: plain inserts, and the window is no longer recorded.
    let mut a = Checkpoint::new("p", pos(5));
    a.upsert_until = Some(pos(30));
    let r = run_with(
        true,
        vec![("a", a), ("b", Checkpoint::new("p", pos(5)))],
        vec![
            tx(20, vec![changes("a", Op::Insert, &[2])]),
            tx(40, vec![changes("a", Op::Insert, &[3])]),
        ],
        settings(1000, SnapshotMode::Initial),
    )
    .await;
    assert_eq!(r.ops[0], vec![Op::Update, Op::Insert]);
    assert_eq!(r.checkpoints[0].upsert_until, None);
}

/// Issue 7: copy batches are committed in the background while the copy goes on; commits stay in
/// order, each records the progress that its rows cover, and the end of the copy waits for them.
#[tokio::test]
async fn copy_batches_commit_in_the_background_in_order() {
    use crate::sources::ChunkState::{Done, Started};
    let record = Arc::new(Mutex::new(Record::default()));
    let shutdown = CancellationToken::new();
    let source = ScriptedSource {
        slot_exists: false,
        tables: vec![table("a")],
        events: vec![
            SourceEvent::SnapshotPlan {
                table: table("a"),
                chunks: vec!["c0".into(), "c1".into()],
                estimated_rows: 5,
                estimated_bytes: 0,
            },
            SourceEvent::SnapshotRows(changes("a", Op::Truncate, &[0])),
            chunk("a", 0, Started),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[1, 2])),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[3, 4])),
            chunk("a", 0, Done),
            chunk("a", 1, Started),
            SourceEvent::SnapshotRows(changes("a", Op::Insert, &[5, 6, 7])),
            chunk("a", 1, Done),
            SourceEvent::SnapshotDone {
                table: table("a"),
                position: pos(100),
            },
            tx(110, vec![changes("a", Op::Insert, &[8])]),
        ],
        record: record.clone(),
        done: shutdown.clone(),
    };
    let sink = RecordingSink {
        checkpoints: BTreeMap::new(),
        record: record.clone(),
    };
    let batch = SnapshotBatch {
        rows: 3,
        bytes: usize::MAX,
    };
    run_batched(
        Box::new(source),
        Arc::new(sink),
        settings(1000, SnapshotMode::Initial),
        shutdown,
        batch,
    )
    .await
    .unwrap();
    let r = Arc::try_unwrap(record).ok().unwrap().into_inner().unwrap();
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 3, "0/0".into()),
            ("a".into(), 5, "0/0".into()),
            ("a".into(), 0, "0/64".into()),
            ("a".into(), 1, "0/6E".into()),
        ]
    );
    let progress = |i: usize| {
        SnapshotProgress::from_json(r.checkpoints[i].snapshot.as_deref().unwrap()).unwrap()
    };
    assert!(
        progress(0).done.is_empty(),
        "no chunk was done when the first batch was cut"
    );
    assert_eq!(
        progress(1).done,
        [0].into(),
        "chunk 0 ended before the second cut"
    );
    assert_eq!(progress(1).started, [1].into());
    assert_eq!(r.checkpoints[2].snapshot, None, "the copy is complete");
    assert_eq!(r.acks.last(), Some(&pos(110)));
}

/// Issue 17 part 2: the acknowledged MariaDB position reaches `_cdcd/<pipeline>/progress.json`
/// after every table committed through it, and the next start raises the idle table's checkpoint
/// to it; without the file the idle table holds the start back.
#[tokio::test]
async fn acknowledged_progress_raises_an_idle_tables_start() {
    let g = |s: &str| -> Position { s.parse().unwrap() };
    let cp = |t, p: &str| (t, Checkpoint::new("p", g(p)));
    let wh = crate::storage::Warehouse::from_url("memory://").unwrap();
    let store = ProgressStore::new(&wh, "p").unwrap();
    let mut s = settings(1000, SnapshotMode::Never);
    s.progress = Some(store.clone());
    let events = vec![
        SourceEvent::Transaction(Transaction {
            position: g("0-1-10"),
            commit_time_micros: 0,
            changes: vec![changes("a", Op::Insert, &[1])],
        }),
        // While `a` is buffered nothing is acknowledged (nor recorded) past the committed tables.
        SourceEvent::Heartbeat(g("0-1-12")),
    ];
    let r = run_with(
        true,
        vec![cp("a", "0-1-5"), cp("b", "0-1-5")],
        events,
        s.clone(),
    )
    .await;
    assert_eq!(r.commits, vec![("a".into(), 1, "0-1-10".into())]);
    assert_eq!(r.acks.last(), Some(&g("0-1-12")));
    let stored = store.read().await.unwrap().unwrap();
    assert_eq!(stored.position, g("0-1-12"));
    assert_eq!(stored.tables.len(), 2);

    let restart = vec![cp("a", "0-1-10"), cp("b", "0-1-5")];
    let r = run_with(true, restart.clone(), Vec::new(), s).await;
    assert_eq!(r.resume.unwrap().start, Some(g("0-1-12")));
    let r = run_with(
        true,
        restart,
        Vec::new(),
        settings(1000, SnapshotMode::Never),
    )
    .await;
    assert_eq!(r.resume.unwrap().start, Some(g("0-1-5")));
}

/// A recording sink with `table` under resync: its lineage holds `lineage` (nothing: its copy
/// has not begun), `live` is the old table's checkpoint, and a commit of the table swaps as the
/// mode last handed to [`Sink::resync`] says (at a complete position; once caught up, at or past
/// `live`).
struct ResyncSink {
    inner: RecordingSink,
    table: TableId,
    live: Checkpoint,
    lineage: Option<Checkpoint>,
    modes: Arc<Mutex<Vec<crate::sinks::ResyncMode>>>,
}

#[async_trait]
impl Sink for ResyncSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        if *table == self.table {
            return Ok(self.lineage.clone());
        }
        self.inner.checkpoint(table).await
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let mut stats = self.inner.commit(schema, changes, checkpoint).await?;
        let position = &checkpoint.position;
        let swaps = match self.modes.lock().unwrap().last() {
            Some(crate::sinks::ResyncMode::SwapWhenCaughtUp) => {
                position.covers(&self.live.position)
            }
            _ => !position.is_snapshot_incomplete(),
        };
        stats.resync_swapped = schema.id == self.table && swaps;
        Ok(stats)
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        self.inner.status(table).await
    }

    async fn cleanup(
        &self,
        grace: Duration,
        dry_run: bool,
    ) -> Result<Vec<crate::storage::cleanup::TableCleanup>, SinkError> {
        self.inner.cleanup(grace, dry_run).await
    }

    fn resync_refusal(&self) -> Option<String> {
        None
    }

    async fn resync(
        &self,
        table: &TableId,
        _id: &str,
        mode: crate::sinks::ResyncMode,
    ) -> Result<crate::sinks::ResyncState, SinkError> {
        assert_eq!(*table, self.table);
        self.modes.lock().unwrap().push(mode);
        Ok(crate::sinks::ResyncState::UnderWay {
            live: Some(self.live.clone()),
        })
    }
}

// issue 20: a requested resync copies the table again (the source is asked to), skips the
// replayed changes the old table already held (the copy has them, possibly under an older
// schema), commits the newer ones to the lineage, and removes the request once the sink reports
// the swap. The other table is untouched by all of it.
#[tokio::test]
async fn a_resync_skips_what_the_old_table_held_and_ends_its_request_at_the_swap() {
    use crate::checkpoint::resync::ResyncStore;
    let dir = tempfile::tempdir().unwrap();
    let warehouse =
        crate::storage::Warehouse::from_url(&format!("file://{}", dir.path().display())).unwrap();
    let store = ResyncStore::new(&warehouse, "p");
    let b = TableId::new("public", "b");
    store.request(&b).await.unwrap();
    let record = Arc::new(Mutex::new(Record::default()));
    let shutdown = CancellationToken::new();
    let source = ScriptedSource {
        slot_exists: true,
        tables: vec![TableId::new("public", "a"), b.clone()],
        events: vec![
            tx(
                15,
                vec![
                    changes("b", Op::Insert, &[1]),
                    changes("a", Op::Insert, &[1]),
                ],
            ),
            tx(25, vec![changes("b", Op::Insert, &[2])]),
        ],
        record: record.clone(),
        done: shutdown.clone(),
    };
    let sink = ResyncSink {
        inner: RecordingSink {
            checkpoints: [(TableId::new("public", "a"), Checkpoint::new("p", pos(10)))].into(),
            record: record.clone(),
        },
        table: b.clone(),
        live: Checkpoint::new("p", pos(20)),
        lineage: None,
        modes: Arc::default(),
    };
    let mut s = settings(1000, SnapshotMode::Initial);
    s.resync = Some(store.clone());
    run(Box::new(source), Arc::new(sink), s, shutdown)
        .await
        .unwrap();
    let r = Arc::try_unwrap(record).ok().unwrap().into_inner().unwrap();
    let copy: Vec<TableId> = r
        .resume
        .unwrap()
        .copy
        .into_iter()
        .map(|c| c.table)
        .collect();
    assert_eq!(copy, vec![b]);
    let mut commits = r.commits.clone();
    commits.sort();
    assert_eq!(
        commits,
        vec![
            ("a".to_owned(), 1, "0/F".to_owned()),
            ("b".to_owned(), 1, "0/19".to_owned()),
        ]
    );
    assert!(
        store.list().await.unwrap().is_empty(),
        "request left behind"
    );
}

// issue 20: a table copied online (its live table streamed on past the copy's position) is not
// skipped up to the live table's checkpoint, unlike a copy made at start: its changes after the
// lineage's checkpoint replay into the lineage; an idle table then gets an empty commit once the
// stream is past the live table, which swaps, and the request ends.
#[tokio::test]
async fn an_online_resync_replays_past_the_lineage_and_swaps_once_caught_up() {
    use crate::checkpoint::resync::ResyncStore;
    use crate::sinks::ResyncMode;
    {
        let dir = tempfile::tempdir().unwrap();
        let warehouse =
            crate::storage::Warehouse::from_url(&format!("file://{}", dir.path().display()))
                .unwrap();
        let store = ResyncStore::new(&warehouse, "p");
        let b = TableId::new("public", "b");
        let request = match store.request(&b).await.unwrap() {
            crate::checkpoint::resync::Requested::Created(r) => r,
            other => panic!("{other:?}"),
        };
        let record = Arc::new(Mutex::new(Record::default()));
        let shutdown = CancellationToken::new();
        let source = ScriptedSource {
            slot_exists: true,
            tables: vec![TableId::new("public", "a"), b.clone()],
            events: vec![
                tx(
                    15,
                    vec![
                        changes("b", Op::Insert, &[1]),
                        changes("a", Op::Insert, &[1]),
                    ],
                ),
                tx(25, vec![changes("a", Op::Insert, &[2])]),
            ],
            record: record.clone(),
            done: shutdown.clone(),
        };
        let modes = Arc::new(Mutex::new(Vec::new()));
        let sink = ResyncSink {
            inner: RecordingSink {
                checkpoints: [(TableId::new("public", "a"), Checkpoint::new("p", pos(12)))].into(),
                record: record.clone(),
            },
            table: b.clone(),
            live: Checkpoint::new("p", pos(20)),
            lineage: Some(Checkpoint::new("p", pos(10))),
            modes: modes.clone(),
        };
        let mut s = settings(1000, SnapshotMode::Initial);
        s.resync = Some(store.clone());
        let mut plan = super::ResyncPlan::default();
        plan.modes
            .insert(request.id.clone(), ResyncMode::SwapWhenCaughtUp);
        s.resyncs = Some(plan);
        run(Box::new(source), Arc::new(sink), s, shutdown)
            .await
            .unwrap();
        let r = Arc::try_unwrap(record).ok().unwrap().into_inner().unwrap();
        assert_eq!(*modes.lock().unwrap(), vec![ResyncMode::SwapWhenCaughtUp]);
        let resume = r.resume.unwrap();
        assert!(resume.copy.is_empty());
        assert_eq!(resume.start, Some(pos(10)));
        let mut commits = r.commits.clone();
        commits.sort();
        assert_eq!(
            commits,
            vec![
                ("a".to_owned(), 2, "0/19".to_owned()),
                ("b".to_owned(), 0, "0/19".to_owned()),
                ("b".to_owned(), 1, "0/F".to_owned()),
            ]
        );
        assert!(
            store.list().await.unwrap().is_empty(),
            "request left behind"
        );
    }
}

/// A recording sink that can resync and refuses, like a format that cannot express the change,
/// every commit under a schema whose key column is named `key` (a rename).
struct RefusingSink(RecordingSink);

#[async_trait]
impl Sink for RefusingSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        self.0.checkpoint(table).await
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        if schema.columns[0].name == "key" {
            return Err(SinkError::SchemaChanged {
                table: schema.id.clone(),
                detail: "column key added, column id removed".into(),
            });
        }
        self.0.commit(schema, changes, checkpoint).await
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        self.0.status(table).await
    }

    async fn cleanup(
        &self,
        grace: Duration,
        dry_run: bool,
    ) -> Result<Vec<crate::storage::cleanup::TableCleanup>, SinkError> {
        self.0.cleanup(grace, dry_run).await
    }

    fn resync_refusal(&self) -> Option<String> {
        None
    }
}

/// Runs `events` over tables `a` and `b` (both committed at 0/5) into a [`RefusingSink`] with
/// `schema_change`, a resync store and an acknowledgement hold, as the daemon runs it.
async fn run_refusing(
    events: Vec<SourceEvent>,
    schema_change: crate::config::SchemaChange,
) -> (
    Record,
    Result<(), PipelineError>,
    Vec<crate::checkpoint::resync::ResyncRequest>,
) {
    let dir = tempfile::tempdir().unwrap();
    let warehouse =
        crate::storage::Warehouse::from_url(&format!("file://{}", dir.path().display())).unwrap();
    let store = crate::checkpoint::resync::ResyncStore::new(&warehouse, "p");
    let record = Arc::new(Mutex::new(Record::default()));
    let shutdown = CancellationToken::new();
    let source = ScriptedSource {
        slot_exists: true,
        tables: vec![TableId::new("public", "a"), TableId::new("public", "b")],
        events,
        record: record.clone(),
        done: shutdown.clone(),
    };
    let sink = RefusingSink(RecordingSink {
        checkpoints: ["a", "b"]
            .into_iter()
            .map(|t| (TableId::new("public", t), Checkpoint::new("p", pos(5))))
            .collect(),
        record: record.clone(),
    });
    let mut s = settings(1000, SnapshotMode::Initial);
    s.resync = Some(store.clone());
    s.ack_hold = Some(AckHold::default());
    s.schema_change = crate::config::SchemaChangePolicy::all(schema_change);
    let outcome = run(Box::new(source), Arc::new(sink), s, shutdown).await;
    let record = Arc::try_unwrap(record).ok().unwrap().into_inner().unwrap();
    (record, outcome, store.list().await.unwrap())
}

// issue 34: with `schema_change = "resync"`, a commit the sink refuses for a schema change
// parks the table and requests its resync, durable before anything past the change is
// acknowledged (the hold stays at the start, and the request records it and the refused
// buffer's position); the other table commits everything, the changing transactions included.
#[tokio::test]
async fn a_refused_schema_change_requests_the_resync_and_the_other_table_commits() {
    use crate::config::SchemaChange;
    let renamed = schema_as("a", "key", "int8");
    let events = || {
        vec![
            tx(
                10,
                vec![
                    changes("a", Op::Insert, &[1]),
                    changes("b", Op::Insert, &[1]),
                ],
            ),
            tx(
                20,
                vec![
                    changes_as(renamed.clone(), Op::Insert, &[2]),
                    changes("b", Op::Insert, &[2]),
                ],
            ),
            tx(
                30,
                vec![
                    changes_as(renamed.clone(), Op::Insert, &[3]),
                    changes("b", Op::Insert, &[3]),
                ],
            ),
        ]
    };
    let (r, outcome, requests) = run_refusing(events(), SchemaChange::Resync).await;
    outcome.unwrap();
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 1, "0/A".into()),
            ("b".into(), 3, "0/1E".into())
        ],
        "a's transaction before the change, then b whole"
    );
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].table(), TableId::new("public", "a"));
    assert_eq!(requests[0].held_at.as_deref(), Some("0/5"));
    assert_eq!(requests[0].received_at.as_deref(), Some("0/1E"));
    assert!(
        r.acks.iter().all(|a| pos(5).covers(a)),
        "acknowledged past the hold: {:?}",
        r.acks
    );

    // The refused table second in the flush: the first is committed once.
    let renamed_b = schema_as("b", "key", "int8");
    let (r, outcome, requests) = run_refusing(
        vec![
            tx(10, vec![changes("b", Op::Insert, &[1])]),
            tx(
                20,
                vec![
                    changes("a", Op::Insert, &[2]),
                    changes_as(renamed_b, Op::Insert, &[2]),
                ],
            ),
        ],
        SchemaChange::Resync,
    )
    .await;
    outcome.unwrap();
    assert_eq!(
        r.commits,
        vec![
            ("b".into(), 1, "0/A".into()),
            ("a".into(), 1, "0/14".into())
        ]
    );
    assert_eq!(requests[0].table(), TableId::new("public", "b"));

    // Under "evolve" the same refusal stops the pipeline, naming every way out.
    let (_, outcome, requests) = run_refusing(events(), SchemaChange::Evolve).await;
    let e = outcome.unwrap_err().to_string();
    for named in [
        "source.schema_change = \"resync\"",
        "cdcd resync --table public.a",
        "migrations/postgres/002_ddl_capture.sql",
    ] {
        assert!(e.contains(named), "{named:?} not in: {e}");
    }
    assert!(requests.is_empty());
}

// issue 34: a transaction that writes a table under two shapes, with `schema_change = "resync"`:
// no stop; the table is parked from that transaction on, the transaction's other rows commit.
#[tokio::test]
async fn two_shapes_in_one_transaction_request_the_resync_and_the_rest_commits() {
    use crate::config::SchemaChange;
    let renamed = schema_as("a", "key", "int8");
    let (r, outcome, requests) = run_refusing(
        vec![
            tx(10, vec![changes("a", Op::Insert, &[1])]),
            tx(
                20,
                vec![
                    changes("a", Op::Insert, &[2]),
                    changes("b", Op::Insert, &[2]),
                    changes_as(renamed.clone(), Op::Insert, &[3]),
                ],
            ),
            tx(
                30,
                vec![
                    changes_as(renamed, Op::Insert, &[4]),
                    changes("b", Op::Insert, &[3]),
                ],
            ),
        ],
        SchemaChange::Resync,
    )
    .await;
    outcome.unwrap();
    assert_eq!(
        r.commits,
        vec![
            ("a".into(), 1, "0/A".into()),
            ("b".into(), 2, "0/1E".into())
        ]
    );
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].received_at.as_deref(), Some("0/14"));
    assert!(r.acks.iter().all(|a| !a.covers(&pos(20))), "{:?}", r.acks);
}

// Issue 34, "Also seen": the lag is the age of the oldest change not yet committed. It used to
// be now − the newest committed commit time, which climbed 1 s per second once the source went
// quiet (to 3,700 s here after an hour of quiet).
#[tokio::test]
async fn the_lag_is_zero_once_everything_received_is_committed() {
    let sink = RecordingSink {
        checkpoints: BTreeMap::new(),
        record: Arc::new(Mutex::new(Record::default())),
    };
    let (acks, _acks_rx) = watch::channel(None);
    let mut committer = Committer {
        sink: Arc::new(sink),
        settings: settings(1000, SnapshotMode::Never),
        tables: Tables::default(),
        received: None,
        acked: None,
        acks,
        lag: Lag::default(),
        in_flight: InFlight::default(),
        snapshot_batch: SnapshotBatch::default(),
        progress: ProgressWriter::start(None),
    };
    let now = m::unix_now_micros();
    let hour = 3_600_000_000;
    assert_eq!(committer.lag.seconds(now), None, "nothing received yet");
    let committed_at = now - 100_000_000;
    let insert = SourceEvent::Transaction(Transaction {
        position: pos(10),
        commit_time_micros: committed_at,
        changes: vec![changes("a", Op::Insert, &[1])],
    });
    committer.handle(insert).await.unwrap();
    assert_eq!(
        committer.lag.seconds(now),
        Some(100.0),
        "buffered, not committed"
    );
    committer.flush().await.unwrap();
    assert_eq!(committer.lag.seconds(now), Some(0.0));
    assert_eq!(
        committer.lag.seconds(now + hour),
        Some(0.0),
        "an hour of quiet"
    );
    committer
        .handle(SourceEvent::Heartbeat(pos(20)))
        .await
        .unwrap();
    assert_eq!(committer.lag.seconds(now + hour), Some(0.0));
    // A transaction the table already holds leaves nothing waiting.
    committer.tables.committed.insert(table("a"), Some(pos(30)));
    let replayed = SourceEvent::Transaction(Transaction {
        position: pos(30),
        commit_time_micros: committed_at,
        changes: vec![changes("a", Op::Insert, &[2])],
    });
    committer.handle(replayed).await.unwrap();
    assert_eq!(committer.lag.seconds(now + hour), Some(0.0));
}

/// A sink whose commits take `delay` and whose commits of `fail` fail, counting how many run at
/// once; `concurrent` is its answer to [`Sink::commits_tables_concurrently`]. With a `gate`, each
/// commit first waits until the test lets it through ([`SlowSink::release`]), so a round stays
/// in flight while the test feeds the pipeline.
struct SlowSink {
    inner: RecordingSink,
    delay: Duration,
    fail: &'static [&'static str],
    concurrent: bool,
    running: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    gate: Option<tokio::sync::Semaphore>,
}

impl SlowSink {
    fn new(record: Arc<Mutex<Record>>, delay: Duration, fail: &'static [&'static str]) -> SlowSink {
        SlowSink {
            inner: RecordingSink::at_5(record),
            delay,
            fail,
            concurrent: true,
            running: Default::default(),
            most: Default::default(),
            gate: None,
        }
    }

    /// Lets `commits` commits through the gate.
    fn release(&self, commits: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(commits);
        }
    }
}

#[async_trait]
impl Sink for SlowSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        self.inner.checkpoint(table).await
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        use std::sync::atomic::Ordering::SeqCst;
        if let Some(gate) = &self.gate {
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        // The failing table fails early, while the others started with it are still committing.
        let failing = self.fail.contains(&schema.id.name.as_str());
        let delay = if failing { self.delay / 5 } else { self.delay };
        tokio::time::sleep(delay).await;
        self.running.fetch_sub(1, SeqCst);
        if failing {
            return Err(SinkError::Data {
                table: schema.id.clone(),
                detail: "injected failure".into(),
            });
        }
        self.inner.commit(schema, changes, checkpoint).await
    }

    fn commits_tables_concurrently(&self) -> bool {
        self.concurrent
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        self.inner.status(table).await
    }

    async fn cleanup(
        &self,
        grace: Duration,
        dry_run: bool,
    ) -> Result<Vec<crate::storage::cleanup::TableCleanup>, SinkError> {
        self.inner.cleanup(grace, dry_run).await
    }
}

/// A committer over `sink` with the tables `a`..`f` committed at 0/5, and the receiver of its
/// acknowledgements.
async fn committer_over(
    sink: Arc<dyn Sink>,
    concurrency: usize,
) -> (Committer, watch::Receiver<Option<Position>>) {
    let (acks, acks_rx) = watch::channel(None);
    let mut s = settings(1000, SnapshotMode::Never);
    s.commit_concurrency = concurrency;
    s.commit_interval = Duration::from_secs(1);
    let mut tables = Tables::default();
    for t in ["a", "b", "c", "d", "e", "f"] {
        let cp = sink
            .checkpoint(&table(t))
            .await
            .unwrap()
            .map(|c| c.position);
        tables.committed.insert(table(t), cp);
    }
    let committer = Committer {
        sink,
        settings: s,
        tables,
        received: None,
        acked: None,
        acks,
        lag: Lag::default(),
        in_flight: InFlight::default(),
        snapshot_batch: SnapshotBatch::default(),
        progress: ProgressWriter::start(None),
    };
    (committer, acks_rx)
}

/// Starts the round of the tables due and waits for it to land, as the loop's next turns do.
async fn land_due(c: &mut Committer, early: Duration) -> Result<(), PipelineError> {
    c.commit_due(early).await?;
    c.settle().await?;
    c.acknowledge();
    Ok(())
}

fn tx_at(n: u64, micros: i64, parts: Vec<TableChanges>) -> SourceEvent {
    SourceEvent::Transaction(Transaction {
        position: pos(n),
        commit_time_micros: micros,
        changes: parts,
    })
}

// Issue 37: a round's commits run concurrently, at most `commit_concurrency` at once, so a
// round costs about its slowest commit, not the sum; a sink that says it cannot gets them one
// after another.
#[tokio::test]
async fn a_rounds_commits_run_concurrently_up_to_the_limit() {
    let all = ["a", "b", "c", "d", "e", "f"];
    for (limit, concurrent, expected) in [(4, true, 4), (16, true, 6), (16, false, 1)] {
        let record = Arc::new(Mutex::new(Record::default()));
        let mut sink = SlowSink::new(record.clone(), Duration::from_millis(50), &[]);
        sink.concurrent = concurrent;
        let sink = Arc::new(sink);
        let (mut c, _acks) = committer_over(sink.clone(), limit).await;
        let parts = all.iter().map(|t| changes(t, Op::Insert, &[1])).collect();
        c.handle(tx(10, parts)).await.unwrap();
        c.flush().await.unwrap();
        let most = sink.most.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(most, expected, "limit {limit}, concurrent {concurrent}");
        assert_eq!(record.lock().unwrap().commits.len(), 6);
        for t in all {
            assert_eq!(c.tables.committed[&table(t)], Some(pos(10)));
        }
    }
}

// Issue 37: two tables' commits fail while the others of their round are still committing: the
// ones that landed are recorded (their checkpoints), the failed ones are not, and nothing past
// the failed tables' last commits is acknowledged.
#[tokio::test]
async fn a_failed_commit_in_a_concurrent_round_records_the_landed_ones_and_acks_nothing_past_it() {
    let record = Arc::new(Mutex::new(Record::default()));
    let sink = Arc::new(SlowSink::new(
        record.clone(),
        Duration::from_millis(50),
        &["b", "d"],
    ));
    let (mut c, acks) = committer_over(sink, 16).await;
    let parts = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|t| changes(t, Op::Insert, &[1]))
        .collect();
    c.handle(tx(10, parts)).await.unwrap();
    let err = c.flush().await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    let landed: Vec<String> = record
        .lock()
        .unwrap()
        .commits
        .iter()
        .map(|(t, _, _)| t.clone())
        .collect();
    assert_eq!(
        landed,
        ["a", "c", "e"],
        "the others' commits ran to the end"
    );
    for (t, at) in [("a", 10), ("b", 5), ("c", 10), ("d", 5), ("e", 10)] {
        assert_eq!(c.tables.committed[&table(t)], Some(pos(at)), "{t}");
    }
    assert_eq!(*acks.borrow(), None, "acknowledged past the failed table");
}

// Issue 37: tables commit on their own clocks. While a table waits for its commit, the
// acknowledgement stops at the position received just before its first waiting change, however
// far the other tables' commits have gone; once it lands, everything received goes.
#[tokio::test]
async fn the_ack_never_passes_a_table_still_waiting_for_its_commit() {
    let record = Arc::new(Mutex::new(Record::default()));
    let sink = Arc::new(SlowSink::new(record.clone(), Duration::ZERO, &[]));
    let (mut c, acks) = committer_over(sink, 16).await;
    let now = m::unix_now_micros();
    c.handle(SourceEvent::Heartbeat(pos(8))).await.unwrap();
    assert_eq!(*acks.borrow(), Some(pos(8)), "nothing buffered");
    c.handle(tx_at(
        10,
        now - 3_000_000,
        vec![changes("a", Op::Insert, &[1])],
    ))
    .await
    .unwrap();
    c.handle(tx_at(
        20,
        now - 500_000,
        vec![
            changes("b", Op::Insert, &[1]),
            changes("a", Op::Insert, &[2]),
        ],
    ))
    .await
    .unwrap();
    c.handle(tx_at(30, now, vec![changes("a", Op::Insert, &[3])]))
        .await
        .unwrap();
    // `a` has waited past the freshness target, `b` not.
    let past = std::time::Instant::now() - Duration::from_secs(2);
    c.tables.buffers.get_mut(&table("a")).unwrap().since = past;
    land_due(&mut c, Duration::from_millis(250)).await.unwrap();
    assert_eq!(
        record.lock().unwrap().commits,
        vec![("a".into(), 3, "0/1E".into())]
    );
    assert_eq!(
        *acks.borrow(),
        Some(pos(10)),
        "b holds everything up to 0/A, not its change at 0/14"
    );
    let lag = c.lag.seconds(now).unwrap();
    assert!((0.4..0.6).contains(&lag), "the lag is b's wait: {lag}");
    // A heartbeat moves nothing while b waits.
    c.handle(SourceEvent::Heartbeat(pos(35))).await.unwrap();
    assert_eq!(*acks.borrow(), Some(pos(10)));
    c.tables.buffers.get_mut(&table("b")).unwrap().since = past;
    land_due(&mut c, Duration::from_millis(250)).await.unwrap();
    assert_eq!(
        record.lock().unwrap().commits[1],
        ("b".into(), 1, "0/14".into())
    );
    assert_eq!(*acks.borrow(), Some(pos(35)));
    assert_eq!(c.lag.seconds(now), Some(0.0));
}

// Issue 37: a waiting table whose commit then fails keeps the acknowledgement where it was.
#[tokio::test]
async fn a_waiting_table_whose_commit_fails_holds_the_ack() {
    let record = Arc::new(Mutex::new(Record::default()));
    let sink = Arc::new(SlowSink::new(record.clone(), Duration::ZERO, &["b"]));
    let (mut c, acks) = committer_over(sink, 16).await;
    c.handle(SourceEvent::Heartbeat(pos(8))).await.unwrap();
    c.handle(tx(10, vec![changes("b", Op::Insert, &[1])]))
        .await
        .unwrap();
    c.handle(tx(20, vec![changes("a", Op::Insert, &[1])]))
        .await
        .unwrap();
    let past = std::time::Instant::now() - Duration::from_secs(2);
    c.tables.buffers.get_mut(&table("a")).unwrap().since = past;
    land_due(&mut c, Duration::ZERO).await.unwrap();
    assert_eq!(*acks.borrow(), Some(pos(8)), "b waits from 0/A");
    c.tables.buffers.get_mut(&table("b")).unwrap().since = past;
    assert!(land_due(&mut c, Duration::ZERO).await.is_err());
    assert_eq!(*acks.borrow(), Some(pos(8)));
    assert_eq!(c.tables.committed[&table("a")], Some(pos(20)));
    assert_eq!(c.tables.committed[&table("b")], Some(pos(5)));
}

/// Makes `t`'s buffer due: its first change is past the freshness target.
fn age(c: &mut Committer, t: &str) {
    c.tables.buffers.get_mut(&table(t)).unwrap().since =
        std::time::Instant::now() - Duration::from_secs(2);
}

/// `f`, which must not wait for a commit the test holds: it fails after 2 s instead of hanging.
async fn promptly<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(2), f).await {
        Ok(out) => out,
        Err(_) => panic!("{what} waited for a commit in flight"),
    }
}

fn committed_tables(record: &Mutex<Record>) -> Vec<(String, String)> {
    let r = record.lock().unwrap();
    r.commits
        .iter()
        .map(|(t, _, p)| (t.clone(), p.clone()))
        .collect()
}

/// A committer over a gated [`SlowSink`] whose commits of `fail` fail (its sink, record and
/// acknowledgements beside it) with a round in flight: `a`'s buffer of one row at 0/A, opened
/// after a heartbeat at 0/8.
async fn a_round_in_flight(
    fail: &'static [&'static str],
) -> (
    Committer,
    Arc<SlowSink>,
    Arc<Mutex<Record>>,
    watch::Receiver<Option<Position>>,
) {
    let record = Arc::new(Mutex::new(Record::default()));
    let mut sink = SlowSink::new(record.clone(), Duration::ZERO, fail);
    sink.gate = Some(tokio::sync::Semaphore::new(0));
    let sink = Arc::new(sink);
    let (mut c, acks) = committer_over(sink.clone(), 16).await;
    c.handle(SourceEvent::Heartbeat(pos(8))).await.unwrap();
    round_of_a(&mut c, 10, changes("a", Op::Insert, &[1])).await;
    (c, sink, record, acks)
}

/// Reads a transaction at `n` of `a_changes` alone and starts the round of `a`'s buffer.
async fn round_of_a(c: &mut Committer, n: u64, a_changes: TableChanges) {
    c.handle(tx(n, vec![a_changes])).await.unwrap();
    age(c, "a");
    promptly("starting a round", c.commit_due(Duration::ZERO))
        .await
        .unwrap();
    assert!(c.in_flight.is_round());
}

/// Reads `event`, which must wait for the round in flight: released 200 ms later.
async fn read_after_the_round(c: &mut Committer, sink: &Arc<SlowSink>, event: SourceEvent) {
    let gate = sink.clone();
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.release(1);
    });
    c.handle(event).await.unwrap();
    assert!(released.is_finished(), "read before the round landed");
    assert!(!c.in_flight.is_running());
}

// Issue 37: a round commits in the background while the pipeline reads on. Rows read for a table
// whose commit is in flight wait in a fresh buffer; the commit in flight holds the
// acknowledgement; when it fails, nothing read beside it is acknowledged or dropped (the restart
// reads it again from the table's checkpoint).
#[tokio::test]
async fn rows_read_beside_a_round_in_flight_are_kept_and_its_failure_acknowledges_none() {
    let (mut c, sink, record, acks) = a_round_in_flight(&["a"]).await;
    let beside = tx(
        20,
        vec![
            changes("a", Op::Insert, &[2, 3]),
            changes("b", Op::Insert, &[1]),
        ],
    );
    promptly("a plain transaction", c.handle(beside))
        .await
        .unwrap();
    promptly("a heartbeat", c.handle(SourceEvent::Heartbeat(pos(25))))
        .await
        .unwrap();
    promptly("a tick", c.commit_due(Duration::ZERO))
        .await
        .unwrap();
    assert!(c.in_flight.is_round(), "one round in flight at most");
    assert_eq!(c.tables.buffers[&table("a")].rows, 2, "a fresh buffer");
    assert_eq!(
        *acks.borrow(),
        Some(pos(8)),
        "a's commit in flight holds everything after 0/8"
    );
    sink.release(1);
    let err = c.settle().await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    // The pipeline stops here: it acknowledges nothing after an error.
    assert_eq!(*acks.borrow(), Some(pos(8)));
    assert_eq!(c.tables.committed[&table("a")], Some(pos(5)));
    assert_eq!(
        c.tables.buffers[&table("a")].rows,
        2,
        "nothing read was dropped"
    );
    assert!(committed_tables(&record).is_empty());
}

// Issue 37: a table whose commit is in flight holds the acknowledgement where its buffer opened,
// even once a newer buffer of the same table opened further on (which alone would claim the
// table holds everything before it); once the round lands, the acknowledgement moves to the
// tables still waiting, and each table's commits land in order.
#[tokio::test]
async fn the_ack_never_passes_a_table_whose_commit_is_in_flight() {
    let (mut c, sink, record, acks) = a_round_in_flight(&[]).await;
    for (n, t) in [(20, "b"), (30, "a")] {
        let read = c.handle(tx(n, vec![changes(t, Op::Insert, &[2])]));
        promptly("a plain transaction", read).await.unwrap();
    }
    c.acknowledge();
    assert_eq!(
        *acks.borrow(),
        Some(pos(8)),
        "not 0/A (b waiting) nor 0/14 (a's new buffer): a's commit is in flight"
    );
    sink.release(1);
    c.settle().await.unwrap();
    c.acknowledge();
    assert_eq!(*acks.borrow(), Some(pos(10)), "b waits from 0/A");
    age(&mut c, "a");
    age(&mut c, "b");
    sink.release(2);
    land_due(&mut c, Duration::ZERO).await.unwrap();
    assert_eq!(*acks.borrow(), Some(pos(30)));
    let commits = committed_tables(&record);
    let a: Vec<&str> = commits
        .iter()
        .filter(|(t, _)| t == "a")
        .map(|(_, p)| p.as_str())
        .collect();
    assert_eq!(a, ["0/A", "0/1E"]);
    assert_eq!(commits.len(), 3);
}

// Issue 37: the rows in flight count against `commit_max_rows` (and the memory share) with the
// buffers: past them the pipeline reads nothing until the round lands (backpressure).
#[tokio::test]
async fn past_the_buffer_limits_nothing_is_read_until_the_round_in_flight_lands() {
    let (mut c, sink, _record, _acks) = a_round_in_flight(&[]).await;
    c.settings.commit_max_rows = 3;
    c.handle(tx(20, vec![changes("b", Op::Insert, &[1, 2])]))
        .await
        .unwrap();
    assert!(c.over_buffer_limits(), "1 row in flight and 2 buffered");
    let period = Duration::from_millis(250);
    let waited = tokio::time::timeout(Duration::from_millis(200), c.relieve(period)).await;
    assert!(waited.is_err(), "read on past the limit");
    age(&mut c, "b");
    sink.release(1);
    c.relieve(period).await.unwrap();
    assert_eq!(c.tables.committed[&table("a")], Some(pos(10)));
    assert!(
        c.in_flight.is_round(),
        "b, due, started as soon as a landed"
    );
    sink.release(1);
    c.settle().await.unwrap();
    assert_eq!(c.tables.committed[&table("b")], Some(pos(20)));
}

// Issue 37: only plain row changes are read beside a round in flight. A schema change and a
// truncate of a table wait for the round to land first.
#[tokio::test]
async fn a_schema_change_or_a_truncate_waits_for_the_round_in_flight() {
    let (mut c, sink, record, _acks) = a_round_in_flight(&[]).await;
    let added = with_added_column("a");
    let altered = tx(20, vec![changes_wide(added.clone(), Op::Insert, &[2])]);
    read_after_the_round(&mut c, &sink, altered).await;
    assert_eq!(c.tables.committed[&table("a")], Some(pos(10)));
    round_of_a(&mut c, 30, changes_wide(added, Op::Insert, &[3])).await;
    let truncated = tx(40, vec![changes("b", Op::Truncate, &[0])]);
    read_after_the_round(&mut c, &sink, truncated).await;
    assert_eq!(c.tables.committed[&table("a")], Some(pos(30)));
    // a: 0/A under the old schema, then 0/14 and 0/1E under the new one.
    assert_eq!(
        record.lock().unwrap().widths,
        [(1, vec![1]), (2, vec![2, 2])]
    );
    assert_eq!(c.tables.buffers[&table("b")].rows, 1);
}
