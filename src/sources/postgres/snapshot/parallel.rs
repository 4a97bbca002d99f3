//! Runs an initial copy: plans each table as key ranges, copies the ranges on several connections
//! that import one snapshot, and tells the pipeline what is started and done.
//!
//! Where it sits: the source's copies (`copy.rs`) call [`plan_table`] for each table to copy, at
//! the copy's snapshot, then [`copy_tables`] with that snapshot's name (a new slot's, a temporary
//! slot's, or one exported by `held::NewSnapshot` when the slot already exists), then stream.
//! Events go out on the pipeline's bounded channel, so a slow sink stops the workers (memory
//! stays bounded: at most the channel's batches plus one batch per worker, each cut at
//! [`BatchLimits`]).
//!
//! Each worker locks a table and checks its shape against the plan's before its first chunk of
//! it (`verify`): a DDL between the snapshot and the lock makes the copy at the snapshot wrong,
//! and such a table is left to the caller to copy again ([`Copied::changed`]).
//!
//! Why one queue of chunks across tables: small tables finish while a big one is still split
//! among all workers, and a resumed copy simply has fewer chunks in the queue.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::plan::{chunk_count, ranges_from_samples, sample_percent, KeyColumns, KeyRange};
use super::progress::Meter;
use super::{
    copy_chunk, import_snapshot, marker_batch, plan_for_copy, quote_ident, supports_binary,
    BatchLimits, ChunkCopy, CopySession, SnapshotError,
};
use crate::changelog::{Op, TableId, TableSchema};
use crate::config::PostgresConfig;
use crate::failpoints;
use crate::sources::postgres::catalog::TableShape;
use crate::sources::postgres::types::ColumnType;
use crate::sources::postgres::{catalog, setup};
use crate::sources::{ChunkState, SnapshotProgress, SourceError, SourceEvent};

/// Samples (pages, one key each) taken per planned chunk to place the range bounds.
const SAMPLES_PER_CHUNK: u64 = 32;
/// At most this many pages are sampled (~400 MiB of random reads), except that every chunk gets
/// at least `MIN_SAMPLES_PER_CHUNK`: a plan of thousands of chunks (a table of a billion rows)
/// settles for chunks that vary by about half rather than read gigabytes to plan.
const MAX_SAMPLES: u64 = 50_000;
const MIN_SAMPLES_PER_CHUNK: u64 = 4;
/// Progress is logged (or the bar redrawn) this often.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// One table's copy: what to copy and how.
pub struct TablePlan {
    pub schema: Arc<TableSchema>,
    pub types: Vec<ColumnType>,
    /// The table's shape at the copy's snapshot (what `schema` was built from); a worker copies
    /// the table only while its shape now is the same (`verify`).
    pub shape: TableShape,
    pub key: KeyColumns,
    /// Binary COPY (every column has a binary decoder).
    pub binary: bool,
    pub chunks: Vec<KeyRange>,
    /// Chunks to copy now, each with its op (Update: it may be partly committed already).
    pub todo: Vec<(u32, Op)>,
    /// Starts from scratch: the first batch truncates what the table holds.
    pub fresh: bool,
    pub estimated_rows: u64,
    pub estimated_bytes: u64,
}

impl TablePlan {
    /// The event announcing this plan.
    pub fn plan_event(&self) -> SourceEvent {
        SourceEvent::SnapshotPlan {
            table: self.schema.id.clone(),
            chunks: self.chunks.iter().map(KeyRange::to_description).collect(),
            estimated_rows: self.estimated_rows,
            estimated_bytes: self.estimated_bytes,
        }
    }
}

/// Plans the copy of `schema`'s table: from `progress` (a resumed copy: the same ranges, the
/// chunks not done) or from a sample of the table's keys.
pub async fn plan_table(
    client: &Client,
    schema: Arc<TableSchema>,
    types: Vec<ColumnType>,
    shape: TableShape,
    progress: Option<&SnapshotProgress>,
    chunk_rows: u64,
) -> Result<TablePlan, SourceError> {
    let table = schema.id.clone();
    let key_names: Vec<String> = schema.key_names().into_iter().map(str::to_owned).collect();
    let key = KeyColumns {
        names: key_names.iter().map(|n| quote_ident(n)).collect(),
        types: catalog::column_type_names(client, &table, &key_names).await?,
    };
    let size = catalog::table_size(client, &table).await?;
    let estimated_rows = size.rows;
    let estimated_bytes = size.bytes;
    let binary = types.iter().all(supports_binary);
    let resumed = progress.and_then(|p| {
        let chunks: Option<Vec<KeyRange>> = p
            .chunks
            .iter()
            .map(|d| KeyRange::from_description(d))
            .collect();
        chunks.filter(|c| !c.is_empty()).map(|c| (c, p))
    });
    // A resumed copy keeps its chunks and redoes what was not done; a fresh one samples them.
    let (chunks, todo, fresh) = match resumed {
        Some((chunks, p)) => {
            let todo = (0..chunks.len() as u32)
                .filter(|i| !p.done.contains(i))
                .map(|i| {
                    (
                        i,
                        if p.started.contains(&i) {
                            Op::Update
                        } else {
                            Op::Insert
                        },
                    )
                })
                .collect();
            (chunks, todo, false)
        }
        None => {
            let n = chunk_count(estimated_rows, chunk_rows);
            let chunks = if n > 1 && !key.names.is_empty() {
                let samples = sample_keys(client, &schema, &key, size, n as u64).await?;
                ranges_from_samples(&samples, n)
            } else {
                vec![KeyRange::default()]
            };
            let todo = (0..chunks.len() as u32).map(|i| (i, Op::Insert)).collect();
            (chunks, todo, true)
        }
    };
    Ok(TablePlan {
        schema,
        types,
        shape,
        key,
        binary,
        chunks,
        todo,
        fresh,
        estimated_rows,
        estimated_bytes,
    })
}

/// About `SAMPLES_PER_CHUNK × chunks` keys (see `MAX_SAMPLES`) as text, in key order, each from
/// a different page.
///
/// One key per sampled page, because SYSTEM sampling picks whole pages: a sample of `n` rows from
/// pages of ~90 rows each came from a handful of pages, so the bounds picked from it bunched up
/// there, and a plan of 21 chunks held several of a few dozen rows beside some of 600,000. Tiny
/// chunks cost a cut in every LSM copy commit (too many fall back to level 0) and uneven ones
/// leave readers idle; with `SAMPLES_PER_CHUNK` pages behind each chunk, chunk sizes vary by
/// about a fifth.
async fn sample_keys(
    client: &Client,
    schema: &TableSchema,
    key: &KeyColumns,
    size: catalog::TableSize,
    chunks: u64,
) -> Result<Vec<Vec<String>>, SourceError> {
    let wanted = chunks
        .saturating_mul(SAMPLES_PER_CHUNK)
        .min(MAX_SAMPLES)
        .max(chunks.saturating_mul(MIN_SAMPLES_PER_CHUNK));
    // Aliased, and ORDER BY the key columns' own values: an output column named like the key
    // would make ORDER BY sort the text, whose order is not the key's.
    let mut inner = Vec::new();
    let mut out = Vec::new();
    let mut order = Vec::new();
    for (i, n) in key.names.iter().enumerate() {
        inner.push(format!("s.{n}::text AS k{i}, s.{n} AS o{i}"));
        out.push(format!("d.k{i}"));
        order.push(format!("d.o{i}"));
    }
    let (inner, out, order) = (inner.join(", "), out.join(", "), order.join(", "));
    let table = format!(
        "{}.{}",
        quote_ident(&schema.id.namespace),
        quote_ident(&schema.id.name)
    );
    let sample = |distinct: &str, method: &str, pct: f64| {
        format!(
            "SELECT {out} FROM (SELECT {distinct}{inner} FROM {table} AS s \
             TABLESAMPLE {method} ({pct})) AS d ORDER BY {order}"
        )
    };
    // SYSTEM samples whole pages (cheap; one key kept per page: its partition and block number)
    // but may hit very few of a small table's pages; BERNOULLI samples rows (reads every page)
    // and is the fallback when SYSTEM found too few.
    let system = sample(
        "DISTINCT ON (s.tableoid, (s.ctid::text::point)[0]) ",
        "SYSTEM",
        sample_percent(size.pages, wanted),
    );
    let bernoulli = sample("", "BERNOULLI", sample_percent(size.rows, wanted));
    let mut samples = Vec::new();
    for sql in [system, bernoulli] {
        let rows = client
            .query(sql.as_str(), &[])
            .await
            .map_err(|e| SourceError::Server {
                context: format!("sampling the keys of {}", schema.id),
                detail: e.to_string(),
            })?;
        samples = rows
            .iter()
            .map(|r| {
                (0..key.names.len())
                    .map(|i| r.get::<_, String>(i))
                    .collect()
            })
            .collect();
        if samples.len() as u64 >= wanted / 4 {
            break;
        }
    }
    Ok(samples)
}

/// What [`copy_tables`] needs besides the plans.
pub struct CopyRun<'a> {
    pub cfg: &'a PostgresConfig,
    pub snapshot: &'a str,
    pub events: &'a mpsc::Sender<SourceEvent>,
    pub shutdown: &'a CancellationToken,
    pub limits: BatchLimits,
}

/// How a copy run ended (unless shutdown interrupted it).
pub struct Copied {
    /// The tables copied whole at the run's snapshot (their plans, for their ids).
    pub tables: Vec<TablePlan>,
    /// The tables whose shape changed after the run's snapshot was taken and before a worker
    /// locked them (`verify`): what the run copied of them cannot be trusted, and no chunk of
    /// theirs was reported done. The caller copies them again at a newer snapshot.
    pub changed: Vec<TableId>,
}

struct Job {
    table: usize,
    chunk: u32,
    op: Op,
}

struct Shared {
    cfg: PostgresConfig,
    snapshot: String,
    tables: Vec<TablePlan>,
    jobs: Mutex<VecDeque<Job>>,
    events: mpsc::Sender<SourceEvent>,
    limits: BatchLimits,
    /// Rows copied per table (same order as `tables`), for progress.
    copied: Vec<AtomicU64>,
    /// A plain connection (its own snapshot per statement): the tables' shapes now.
    now: Client,
    /// Tables (indexes into `tables`) found changed since the snapshot: no worker copies them.
    changed: Mutex<BTreeSet<usize>>,
}

impl Shared {
    fn is_changed(&self, table: usize) -> bool {
        self.changed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&table)
    }
}

/// Copies every chunk in `plans` at `run.snapshot` on up to `cfg.snapshot_parallelism`
/// connections. Sends each plan, the Truncate marker of fresh tables, and chunk events with the
/// rows; not `SnapshotDone` (the caller knows the position). Returns `None` if shutdown
/// interrupted the copy.
pub async fn copy_tables(
    plans: Vec<TablePlan>,
    run: CopyRun<'_>,
) -> Result<Option<Copied>, SourceError> {
    announce(&plans, run.events).await?;
    let jobs = jobs_of(&plans);
    let workers = run.cfg.snapshot_parallelism.clamp(1, jobs.len().max(1));
    tracing::info!(
        tables = plans.len(),
        chunks = jobs.len(),
        workers,
        binary = plans.iter().filter(|p| p.binary).count(),
        "initial copy starting"
    );
    failpoints::pause_point(failpoints::COPY_PLANNED).await;
    let shared = Arc::new(Shared {
        cfg: run.cfg.clone(),
        snapshot: run.snapshot.to_owned(),
        copied: plans.iter().map(|_| AtomicU64::new(0)).collect(),
        tables: plans,
        jobs: Mutex::new(jobs),
        events: run.events.clone(),
        limits: run.limits,
        now: setup::connect(run.cfg).await?,
        changed: Mutex::new(BTreeSet::new()),
    });
    let mut meter = Meter::new(
        shared
            .tables
            .iter()
            .map(|t| (t.schema.id.to_string(), t.estimated_rows))
            .collect(),
    );
    let mut set = JoinSet::new();
    for _ in 0..workers {
        set.spawn(worker(shared.clone()));
    }
    let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
    tick.tick().await;
    let started = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = run.shutdown.cancelled() => {
                set.abort_all();
                meter.clear();
                return Ok(None);
            }
            _ = tick.tick() => meter.report(&counts(&shared), started.elapsed()),
            joined = set.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    set.abort_all();
                    meter.clear();
                    return Err(e);
                }
                Some(Err(e)) => {
                    set.abort_all();
                    meter.clear();
                    return Err(SourceError::Protocol(format!("initial copy worker failed: {e}")));
                }
            },
        }
    }
    meter.finish(&counts(&shared), started.elapsed());
    let shared = Arc::try_unwrap(shared)
        .map_err(|_| SourceError::Protocol("initial copy workers still running".into()))?;
    Ok(Some(copied_of(shared)))
}

/// Sends each plan, and the Truncate marker of fresh tables, before any rows.
async fn announce(
    plans: &[TablePlan],
    events: &mpsc::Sender<SourceEvent>,
) -> Result<(), SourceError> {
    for plan in plans {
        send(events, plan.plan_event()).await?;
        if plan.fresh {
            send(
                events,
                SourceEvent::SnapshotRows(marker_batch(&plan.schema)?),
            )
            .await?;
        }
    }
    Ok(())
}

/// Every chunk still to copy, as jobs for the workers, table by table.
fn jobs_of(plans: &[TablePlan]) -> VecDeque<Job> {
    plans
        .iter()
        .enumerate()
        .flat_map(|(t, p)| {
            p.todo.iter().map(move |&(chunk, op)| Job {
                table: t,
                chunk,
                op,
            })
        })
        .collect()
}

/// The run's outcome once every worker is done: the tables copied, apart from those whose
/// shape changed under the copy.
fn copied_of(shared: Shared) -> Copied {
    let changed = shared
        .changed
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let mut copied = Copied {
        tables: Vec::new(),
        changed: Vec::new(),
    };
    for (i, plan) in shared.tables.into_iter().enumerate() {
        if changed.contains(&i) {
            copied.changed.push(plan.schema.id.clone());
        } else {
            copied.tables.push(plan);
        }
    }
    copied
}

fn counts(shared: &Shared) -> Vec<u64> {
    shared
        .copied
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect()
}

async fn send(events: &mpsc::Sender<SourceEvent>, event: SourceEvent) -> Result<(), SourceError> {
    events.send(event).await.map_err(|_| SourceError::Closed)
}

/// Whether `plan`'s table may be copied at the snapshot by this worker's transaction, called
/// before the worker's first chunk of it: locks the table (`ACCESS SHARE`, held until the
/// worker's transaction ends, as its `COPY` would) and compares its shape now with its shape at
/// the snapshot.
///
/// Why: the workers' snapshot was taken before any of them locked the table, and a DDL that
/// commits in between is not in the snapshot but is in the table: a rewrite leaves the snapshot
/// an empty heap, a column added and filled is missing from the plan's column list
/// ([`TableShape`]). Once the lock is held no DDL can commit on the table (every `ALTER TABLE`
/// that changes columns or storage, `TRUNCATE`, `CLUSTER` and `VACUUM FULL` need `ACCESS
/// EXCLUSIVE`), so a shape that is the same now stays the same for this transaction's chunks.
/// Each worker checks for itself: another worker's lock ends with its transaction, possibly
/// before this worker's chunk starts.
async fn verify(
    session: &mut CopySession,
    now: &Client,
    plan: &TablePlan,
) -> Result<bool, SourceError> {
    let table = &plan.schema.id;
    let lock = format!(
        "LOCK TABLE {}.{} IN ACCESS SHARE MODE",
        quote_ident(&table.namespace),
        quote_ident(&table.name)
    );
    session.execute(&lock).await.map_err(SnapshotError::query(
        table,
        "locking the table for its copy",
    ))?;
    let shape = catalog::table_shape(now, table).await?;
    if shape == plan.shape {
        return Ok(true);
    }
    tracing::warn!(table = %table, "the table changed after the copy's snapshot was taken (DDL, TRUNCATE, CLUSTER or VACUUM FULL before the copy reached it); it is copied again at a new snapshot");
    Ok(false)
}

/// One connection: imports the snapshot, then copies chunks from the queue until it is empty.
async fn worker(shared: Arc<Shared>) -> Result<(), SourceError> {
    let Some(first) = shared.tables.first() else {
        return Ok(());
    };
    let mut session = CopySession::connect(&shared.cfg).await?;
    plan_for_copy(&mut session, &first.schema.id).await?;
    import_snapshot(&mut session, &shared.snapshot, &first.schema.id).await?;
    let mut verified: HashSet<usize> = HashSet::new();
    loop {
        let job = shared
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(job) = job else { break };
        let Some(plan) = shared.tables.get(job.table) else {
            continue;
        };
        let Some(range) = plan.chunks.get(job.chunk as usize) else {
            continue;
        };
        if shared.is_changed(job.table) {
            continue;
        }
        if !verified.contains(&job.table) {
            if !verify(&mut session, &shared.now, plan).await? {
                shared
                    .changed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(job.table);
                continue;
            }
            verified.insert(job.table);
        }
        let table = plan.schema.id.clone();
        let chunk_event = |state| SourceEvent::SnapshotChunk {
            table: table.clone(),
            chunk: job.chunk,
            state,
        };
        send(&shared.events, chunk_event(ChunkState::Started)).await?;
        let copied = shared.copied.get(job.table);
        let emit = |mut batch: crate::changelog::TableChanges| {
            batch.copy_chunk = Some(job.chunk);
            let events = shared.events.clone();
            if let Some(c) = copied {
                c.fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            async move {
                events
                    .send(SourceEvent::SnapshotRows(batch))
                    .await
                    .map_err(|_| SnapshotError::Closed)
            }
        };
        let started = Instant::now();
        let spec = ChunkCopy {
            schema: plan.schema.clone(),
            types: &plan.types,
            filter: range.where_clause(&plan.key),
            binary: plan.binary,
            op: job.op,
            marker: false,
            limits: shared.limits,
        };
        let rows = copy_chunk(&mut session, spec, emit).await?;
        send(&shared.events, chunk_event(ChunkState::Done)).await?;
        tracing::debug!(table = %table, chunk = job.chunk, of = plan.chunks.len(), rows, ms = started.elapsed().as_millis() as u64, upsert = job.op == Op::Update, "chunk copied");
        failpoints::pause_point(failpoints::COPY_CHUNK_COPIED).await;
    }
    // The transaction only read; ending it releases the snapshot.
    let _ = session.execute("COMMIT").await;
    session.close().await;
    Ok(())
}
