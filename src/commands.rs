//! What the CLI's commands do: `run` (the daemon, under the pipeline's lease, with the sink's
//! maintenance in the background), `check` (preflight), `status`, `cleanup` (orphan files),
//! `maintain` (one maintenance cycle, under the lease) and `resync` (a request the daemon picks
//! up: `checkpoint/resync.rs`), built from the configured source and sink.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::changelog::{KeyOrigin, TableId, TableKey};
use crate::checkpoint::lease::{Lease, LeaseError, LeaseSettings};
use crate::checkpoint::progress::{ProgressError, ProgressStore};
use crate::checkpoint::resync::{Requested, ResyncError, ResyncStore};
use crate::checkpoint::source_state::{SourceStateFile, SOURCE_STATE_FILE};
use crate::config::{Config, SnapshotMode};
use crate::pipeline::{self, PipelineError, ResyncPlan, Settings};
use crate::sinks::{MaintenanceReport, ResyncMode, Sink, SinkError};
use crate::sources::{Source, SourceError};
use crate::storage::cleanup::{CleanupError, TableCleanup};
use crate::storage::{Fence, StorageError, Warehouse};

/// One table in `cdcd status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusRow {
    pub table: String,
    /// The key columns (empty: keyless).
    pub key: Vec<String>,
    /// Where the key came from: `primary_key`, `replica_identity_index`, `key_columns`, `none`
    /// (keyless, insert-only), `full_row` (keyless, updates and deletes applied as a multiset).
    pub key_origin: &'static str,
    /// The replica identity index, when `key_origin` is `replica_identity_index`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_index: Option<String>,
    pub location: Option<String>,
    pub position: Option<String>,
    pub snapshot_id: Option<i64>,
    pub rows: Option<u64>,
    /// Live data and delete files, their bytes, snapshots kept.
    pub live_files: Option<u64>,
    pub live_bytes: Option<u64>,
    pub snapshots: Option<u64>,
    /// A pending `cdcd resync` of the table: `requested <id>`, or `online <id> since <position>`
    /// once a copy job began (the pipeline holds its acknowledgements there until it is done).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync: Option<String>,
}

/// A command failed before or while running the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] Box<SinkError>),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Cleanup(#[from] CleanupError),
    #[error(transparent)]
    Warehouse(#[from] StorageError),
    #[error("--table {0:?}: name a table as schema.table (Postgres) or database.table (MySQL)")]
    TableName(String),
    #[error(transparent)]
    Resync(#[from] ResyncError),
    #[error("table {table} is not captured by pipeline {pipeline} (source.tables matches: {captured}); add it to source.tables, or name one of these")]
    NotCaptured {
        table: TableId,
        pipeline: String,
        captured: String,
    },
    #[error("cannot resync {table}: source.snapshot = \"never\" copies no table; set source.snapshot = \"initial\"")]
    ResyncWithoutCopy { table: TableId },
}

/// How often the daemon looks for new resync requests (`cdcd resync`).
const RESYNC_POLL: Duration = Duration::from_secs(2);

/// How long a stop waits for a running maintenance cycle before aborting it. A cycle is
/// crash-safe at every await, so the abort loses nothing; waiting lets the usual short cycle
/// end with its outputs committed (or its snapshot create's retry answered) instead of leaving
/// orphans for `cdcd cleanup`.
const MAINTENANCE_GRACE: Duration = Duration::from_secs(10);

fn settings(config: &Config, source: &dyn Source) -> Settings {
    Settings {
        pipeline: config.pipeline.clone(),
        commit_interval: Duration::from_millis(config.commit_interval_ms),
        commit_max_rows: config.commit_max_rows,
        snapshot_commit_rows: config.snapshot_commit_rows,
        snapshot: source.snapshot_mode(),
        slot: source.stream_name(),
        progress: None,
        source_state: None,
        resync: None,
        resyncs: None,
        ack_hold: None,
        schema_change: config.schema_change.clone(),
    }
}

/// `schema.table` (Postgres) or `database.table` (MySQL) as given to `--table`.
fn parse_table(t: &str) -> Result<TableId, CommandError> {
    let (ns, name) = t
        .split_once('.')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| CommandError::TableName(t.to_owned()))?;
    Ok(TableId::new(ns, name))
}

/// The configured sink; with `fence`, every write it makes passes the lease's fence.
fn build_sink(config: &Config, fence: Option<Fence>) -> Result<Arc<dyn Sink>, CommandError> {
    let mut warehouse = open_warehouse(config)?;
    if let Some(fence) = fence {
        warehouse = warehouse.fenced(fence);
    }
    crate::sinks::build(
        &config.sink,
        &config.pipeline,
        warehouse,
        config.schema_change.clone(),
    )
    .map_err(|e| Box::new(e).into())
}

/// The configured warehouse with `[sink.s3]` applied.
pub fn open_warehouse(config: &Config) -> Result<Warehouse, StorageError> {
    Warehouse::open(config.sink.warehouse(), &config.s3)
}

/// Runs the pipeline until `shutdown`, with the metrics endpoint (`[metrics] listen`) and systemd
/// notification beside it, holding the pipeline's lease (`checkpoint::lease`): waits as a standby
/// while another cdcd holds it, and stops at once, without committing what is buffered, if the
/// lease is lost or not renewed in time. The sinks write through the lease's fence
/// (`storage/fence.rs`), so nothing is written after the lease's deadline, also by a commit
/// already under way or one running in the background.
pub async fn run(config: &Config, shutdown: CancellationToken) -> Result<(), CommandError> {
    let (ops, notifier) = start_operations(config, &shutdown).await?;
    let result = run_leased(config, shutdown).await;
    // The endpoint and notifier end with the pipeline, also when it failed.
    ops.cancel();
    // Let STOPPING=1 out before the process exits.
    let _ = tokio::time::timeout(Duration::from_secs(1), notifier).await;
    result
}

async fn run_leased(config: &Config, shutdown: CancellationToken) -> Result<(), CommandError> {
    let warehouse = open_warehouse(config)?;
    let lease_settings = LeaseSettings {
        pipeline: config.pipeline.clone(),
        ttl: Duration::from_millis(config.lease_ttl_ms),
        standby: config.standby,
    };
    let standing_by = || crate::metrics::Health::global().set_standby();
    let Some(mut lease) =
        Lease::acquire_or_stand_by(&warehouse, lease_settings, &shutdown, standing_by).await?
    else {
        return Ok(());
    };
    let fence = lease.fence();
    let sink = build_sink(config, Some(fence.clone()))?;
    let renewing = CancellationToken::new();
    // The progress file is pipeline state like the tables: written only while the lease holds.
    let fenced = warehouse.clone().fenced(fence.clone());
    let progress = ProgressStore::new(&fenced, &config.pipeline).map_err(PipelineError::from)?;
    let source_state: Arc<dyn crate::sources::SourceStateStore> = Arc::new(
        SourceStateFile::new(&fenced, &config.pipeline, SOURCE_STATE_FILE)
            .map_err(|e| PipelineError::from(ProgressError::from(e)))?,
    );
    let resync = ResyncStore::new(&fenced, &config.pipeline);
    // The sink's maintenance runs beside the pipeline, through the same fenced store. A stop
    // lets a running cycle finish (`MAINTENANCE_GRACE`); a lost lease or a panic drops it where
    // it is (a cycle is crash-safe at every await).
    let maintenance_stop = CancellationToken::new();
    let mut maintenance = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
        maintain_in_background(Arc::clone(&sink), maintenance_stop.clone()),
    ));
    let outcome = {
        let pipeline = async {
            // A round is one run of the pipeline. It takes on the resync requests in `plan`
            // (at the first start: every request there is, copied before streaming resumes);
            // one made while it runs gets a copy job beside it (`pipeline/resync.rs`), whose end
            // ends the round cleanly (what is buffered is committed), and the next round
            // replays the table into its lineage.
            let mut plan = ResyncPlan::default();
            for request in resync.list().await.map_err(PipelineError::from)? {
                if let Some(mode) = pipeline::mode_at_start(&request) {
                    plan.modes.insert(request.id.clone(), mode);
                }
            }
            loop {
                let round = shutdown.child_token();
                let hold = pipeline::AckHold::default();
                // A copy job that began before a stop held the stream: held again from the
                // start, until its lineage takes over (`pipeline/resync.rs`).
                for request in resync.list().await.map_err(PipelineError::from)? {
                    if plan.modes.contains_key(&request.id) {
                        continue;
                    }
                    let held = request.held_position().map_err(|detail| {
                        PipelineError::from(crate::checkpoint::resync::ResyncError::Unreadable {
                            path: resync.request_location(&request.table()),
                            detail,
                        })
                    })?;
                    if let Some(at) = held {
                        hold.hold_at(&at);
                    }
                }
                let outcome = Arc::new(std::sync::Mutex::new(None));
                let copying = Arc::new(std::sync::Mutex::new(None));
                let watch = ResyncWatch {
                    copying: Arc::clone(&copying),
                    store: resync.clone(),
                    known: plan.modes.keys().cloned().collect(),
                    round: round.clone(),
                    hold: hold.clone(),
                    config: config.clone(),
                    fence: fence.clone(),
                    outcome: Arc::clone(&outcome),
                };
                let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(watch.run()));
                let source = crate::sources::build(&config.source);
                let mut settings = settings(config, source.as_ref());
                settings.progress = Some(progress.clone());
                settings.source_state = Some(source_state.clone());
                settings.resync = Some(resync.clone());
                settings.resyncs = Some(plan.clone());
                settings.ack_hold = Some(hold);
                let ran = pipeline::run(source, Arc::clone(&sink), settings, round.clone()).await;
                if let Err(e) = ran {
                    let copying = copying.lock().unwrap_or_else(|p| p.into_inner()).take();
                    start_online_resyncs_over(&resync, sink.as_ref(), &plan, copying).await;
                    return Err(e.into());
                }
                if shutdown.is_cancelled() || !round.is_cancelled() {
                    return Ok::<(), CommandError>(());
                }
                let taken = outcome.lock().unwrap_or_else(|p| p.into_inner()).take();
                match taken {
                    Some(OnlineResync::Copied { id, table, schema }) => {
                        plan.modes.insert(id, ResyncMode::SwapWhenCaughtUp);
                        if let Some(schema) = schema {
                            plan.schemas.insert(table, schema);
                        }
                        tracing::info!("restarting the pipeline: a resync's copy is complete, its table's changes since now replay into the new lineage");
                    }
                    Some(OnlineResync::AtStart { id }) => {
                        plan.modes.insert(id, ResyncMode::SwapAtCopyEnd);
                        tracing::info!("restarting the pipeline to start a requested resync");
                    }
                    Some(OnlineResync::Failed(e)) => return Err(e),
                    None => tracing::info!("restarting the pipeline"),
                }
            }
        };
        let keep = lease.keep(&renewing);
        tokio::pin!(pipeline, keep);
        tokio::select! {
            biased;
            // Lost or expired: drop the pipeline future mid-flight. A commit is one
            // create-if-absent put, so dropping never leaves half a commit; files written for
            // it become orphans for `cdcd cleanup`.
            kept = &mut keep => match kept {
                Err(e) => return Err(e.into()),
                Ok(()) => Ok(()),
            },
            done = &mut pipeline => done,
        }
    };
    let outcome: Result<(), CommandError> = outcome;
    // A pipeline that failed because the fence refused its writes lost the lease: say that,
    // not which write was refused (that is in the log), and do not release what is not ours.
    if outcome.is_err() {
        if let Err(fenced) = fence.check() {
            return Err(LeaseError::Fenced(fenced).into());
        }
    }
    maintenance_stop.cancel();
    if tokio::time::timeout(MAINTENANCE_GRACE, &mut maintenance)
        .await
        .is_err()
    {
        tracing::info!("stopping a maintenance cycle that is still running (its outputs become orphans for `cdcd cleanup`)");
    }
    renewing.cancel();
    lease.release().await;
    outcome?;
    Ok(())
}

/// The pipeline stopped on an error while resyncs were carried out online (a copy job running,
/// or a lineage catching up): each starts over under a new id, copied at the next start. A
/// lineage copied online is complete at a position before the error, so its catch-up replays
/// the changes before it, and a schema change among them that the lineage (copied under the
/// newer schema) cannot take would stop every restart; a copy at start skips what the live table
/// holds (`pipeline/resync.rs`), which is the way out of such a stop. Best effort: a failure is
/// logged, and the online resync resumes at the next start instead.
async fn start_online_resyncs_over(
    store: &ResyncStore,
    sink: &dyn Sink,
    plan: &ResyncPlan,
    copying: Option<crate::checkpoint::resync::ResyncRequest>,
) {
    let Ok(pending) = store.list().await else {
        return;
    };
    for request in pending {
        let online = plan.modes.get(&request.id) == Some(&ResyncMode::SwapWhenCaughtUp)
            || copying.as_ref().is_some_and(|c| c.id == request.id);
        if !online {
            continue;
        }
        match store.start_over(&request).await {
            Ok(fresh) => {
                sink.abandon_resync(&request.table(), &request.id).await;
                tracing::warn!(table = %request.table(), id = %request.id, new_id = %fresh.id, "the pipeline stopped while this table was resynced online: its resync starts over, copied at the next start");
            }
            Err(e) => {
                tracing::warn!(table = %request.table(), error = %e, "cannot start the resync over; it resumes online at the next start");
            }
        }
    }
}

/// What the watcher did about a resync requested while a round ran.
enum OnlineResync {
    /// Its copy job filled the lineage, complete at the position the round was held at.
    Copied {
        id: String,
        table: TableId,
        schema: Option<Arc<crate::changelog::TableSchema>>,
    },
    /// The round had no position to hold at yet: the next round copies it before streaming.
    AtStart {
        id: String,
    },
    Failed(CommandError),
}

/// Watches `_cdcd/<pipeline>/resync/` during a round: the first request the round did not take
/// on gets a copy job beside it (`pipeline::copy_for_resync`), with the round's
/// acknowledgements held where the copy is declared complete; once the job is done, the round
/// ends so the next one replays the table into its lineage. An unreadable folder is retried.
struct ResyncWatch {
    store: ResyncStore,
    known: Vec<String>,
    round: CancellationToken,
    hold: pipeline::AckHold,
    config: Config,
    fence: Fence,
    outcome: Arc<std::sync::Mutex<Option<OnlineResync>>>,
    /// The request whose copy job runs, if one does.
    copying: Arc<std::sync::Mutex<Option<crate::checkpoint::resync::ResyncRequest>>>,
}

impl ResyncWatch {
    async fn run(mut self) {
        loop {
            tokio::select! {
                _ = self.round.cancelled() => return,
                _ = tokio::time::sleep(RESYNC_POLL) => {}
            }
            let new = match self.store.list().await {
                Ok(now) => now.into_iter().find(|r| !self.known.contains(&r.id)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the resync requests; trying again");
                    continue;
                }
            };
            let Some(request) = new else {
                continue;
            };
            tracing::info!(table = %request.table(), id = %request.id, "a resync was requested");
            let outcome = match self.hold.hold() {
                None => OnlineResync::AtStart { id: request.id },
                Some(at) => {
                    // Recorded before any copy: a restart resumes the copy from there.
                    let held = crate::checkpoint::resync::ResyncRequest {
                        held_at: Some(at.to_string()),
                        ..request.clone()
                    };
                    if let Err(e) = self.store.update(&held).await {
                        tracing::warn!(table = %request.table(), error = %e, "cannot record where the resync's copy starts; trying again");
                        self.release_hold(&request.id).await;
                        continue;
                    }
                    *self.copying.lock().unwrap_or_else(|p| p.into_inner()) = Some(held.clone());
                    match self.copy(&held, at).await {
                        Ok(pipeline::ResyncCopy::Complete(schema)) => {
                            crate::failpoints::crash_point(crate::failpoints::RESYNC_COPIED);
                            OnlineResync::Copied {
                                table: request.table(),
                                id: request.id,
                                schema,
                            }
                        }
                        Ok(pipeline::ResyncCopy::Stopped) => return,
                        Ok(pipeline::ResyncCopy::Done) => {
                            self.release_hold(&request.id).await;
                            if let Err(e) = self.store.remove(&request).await {
                                tracing::warn!(table = %request.table(), error = %e, "cannot remove a finished resync's request; trying again");
                                continue;
                            }
                            tracing::info!(table = %request.table(), id = %request.id, "resync finished: the table is its new copy");
                            self.known.push(request.id);
                            continue;
                        }
                        Ok(pipeline::ResyncCopy::Nothing) => {
                            self.release_hold(&request.id).await;
                            self.known.push(request.id);
                            continue;
                        }
                        Err(e) => OnlineResync::Failed(e),
                    }
                }
            };
            *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
            self.round.cancel();
            return;
        }
    }

    /// Holds only where the requests a copy job began before a stop, and no copy job has taken
    /// again yet, still need (their `held_at`), now that `done` needs nothing. An unreadable
    /// request keeps the hold as it is.
    async fn release_hold(&self, done: &str) {
        let Ok(pending) = self.store.list().await else {
            return;
        };
        let mut keep: Option<crate::changelog::Position> = None;
        // Requests this round took on (`known`) have their lineage marked: they need no hold.
        for r in pending
            .iter()
            .filter(|r| r.id != done && !self.known.contains(&r.id))
        {
            let at = match r.held_position() {
                Ok(Some(at)) => at,
                Ok(None) => continue,
                Err(_) => return,
            };
            keep = Some(match keep {
                Some(k) => k.meet(&at).unwrap_or(at),
                None => at,
            });
        }
        self.hold.release_to(keep);
    }

    /// The copy job, through a source and a sink of its own.
    async fn copy(
        &self,
        request: &crate::checkpoint::resync::ResyncRequest,
        at: crate::changelog::Position,
    ) -> Result<pipeline::ResyncCopy, CommandError> {
        let source = crate::sources::build(&self.config.source);
        let sink = build_sink(&self.config, Some(self.fence.clone()))?;
        let settings = settings(&self.config, source.as_ref());
        let copied = pipeline::copy_for_resync(
            source,
            sink,
            settings,
            request,
            at,
            self.round.child_token(),
        )
        .await?;
        Ok(copied)
    }
}

/// What `cdcd resync` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResyncRequested {
    /// The request is stored under this id.
    Created {
        table: TableId,
        id: String,
        location: String,
    },
    /// A request for the table was pending already (its resync has not finished).
    Pending {
        table: TableId,
        id: String,
        location: String,
    },
}

/// `cdcd resync --table T`: checks that the pipeline captures `table` and that the sink can
/// resync it, then stores a request (`checkpoint/resync.rs`) that the daemon holding the lease
/// picks up within [`RESYNC_POLL`] (or the next start, when none runs). Takes no lease: the
/// request is a create-if-absent put, and the copy itself runs in the daemon.
pub async fn resync(config: &Config, table: &str) -> Result<ResyncRequested, CommandError> {
    let table = parse_table(table)?;
    let sink = build_sink(config, None)?;
    if let Some(why) = sink.resync_refusal() {
        return Err(Box::new(SinkError::ResyncUnsupported { table, why }).into());
    }
    let source = crate::sources::build(&config.source);
    if source.snapshot_mode() == SnapshotMode::Never {
        return Err(CommandError::ResyncWithoutCopy { table });
    }
    let captured: Vec<TableId> = source
        .tables()
        .await?
        .into_iter()
        .map(|k| k.table)
        .collect();
    if !captured.contains(&table) {
        let mut names: Vec<String> = captured.iter().take(10).map(ToString::to_string).collect();
        if captured.len() > names.len() {
            names.push(format!("… {} more", captured.len() - names.len()));
        }
        if names.is_empty() {
            names.push("no table".to_owned());
        }
        return Err(CommandError::NotCaptured {
            table,
            pipeline: config.pipeline.clone(),
            captured: names.join(", "),
        });
    }
    let store = ResyncStore::new(&open_warehouse(config)?, &config.pipeline);
    let location = store.request_location(&table);
    Ok(match store.request(&table).await? {
        Requested::Created(r) => ResyncRequested::Created {
            table,
            id: r.id,
            location,
        },
        Requested::Pending(r) => ResyncRequested::Pending {
            table,
            id: r.id,
            location,
        },
    })
}

/// Runs the sink's maintenance every [`Sink::maintenance_interval`] on the tables it commits to,
/// and when commits ask for it; ends at `stop`, which it notices between cycles (the caller
/// bounds how long it waits for the running one), or at an error (a broken fence: the daemon
/// is stopping then).
async fn maintain_in_background(sink: Arc<dyn Sink>, stop: CancellationToken) {
    let Some(interval) = sink.maintenance_interval() else {
        return;
    };
    let wanted = sink.maintenance_wanted();
    // Asked cycles (`sinks/wanted.rs`) come at most this often, so a table that stays above its
    // trigger (a cycle that cannot rewrite enough) does not take a core.
    let gap = interval / 20;
    let mut scheduled = tokio::time::Instant::now() + interval;
    loop {
        let asked = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(scheduled) => None,
            asked = asked_tables(wanted.as_deref()) => Some(asked),
        };
        let outcome = match &asked {
            None => {
                scheduled = tokio::time::Instant::now() + interval;
                sink.maintain(None).await
            }
            Some(tables) => sink.maintain(Some(tables)).await,
        };
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "maintenance stopped");
            return;
        }
        if asked.is_some() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(gap) => {}
            }
        }
    }
}

/// The next tables that ask for a cycle; never, for a sink that asks for none.
async fn asked_tables(wanted: Option<&crate::sinks::MaintenanceWanted>) -> Vec<TableId> {
    match wanted {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// One maintenance cycle on `table` (`schema.table`) or on every captured table, holding the
/// pipeline's lease (so it refuses while a daemon runs the pipeline: the daemon maintains its
/// tables itself) and writing through its fence.
pub async fn maintain(
    config: &Config,
    table: Option<&str>,
) -> Result<Vec<MaintenanceReport>, CommandError> {
    let tables: Vec<TableId> = match table {
        Some(t) => vec![parse_table(t)?],
        None => crate::sources::build(&config.source)
            .tables()
            .await?
            .into_iter()
            .map(|key| key.table)
            .collect(),
    };
    let warehouse = open_warehouse(config)?;
    let lease_settings = LeaseSettings {
        pipeline: config.pipeline.clone(),
        ttl: Duration::from_millis(config.lease_ttl_ms),
        standby: false,
    };
    let never = CancellationToken::new();
    let Some(mut lease) = Lease::acquire(&warehouse, lease_settings, &never).await? else {
        return Ok(Vec::new());
    };
    let fence = lease.fence();
    let sink = build_sink(config, Some(fence.clone()))?;
    let renewing = CancellationToken::new();
    let outcome = {
        let cycle = sink.maintain(Some(&tables));
        let keep = lease.keep(&renewing);
        tokio::pin!(cycle, keep);
        tokio::select! {
            biased;
            kept = &mut keep => match kept {
                Err(e) => return Err(e.into()),
                Ok(()) => Ok(Vec::new()),
            },
            done = &mut cycle => done,
        }
    };
    if outcome.is_err() {
        if let Err(fenced) = fence.check() {
            return Err(LeaseError::Fenced(fenced).into());
        }
    }
    renewing.cancel();
    lease.release().await;
    Ok(outcome.map_err(Box::new)?)
}

/// Configures [`Health`]'s stall limits, serves `/metrics` `/healthz` `/readyz` when
/// `[metrics] listen` is set, and starts systemd notification. Returns the token that stops both.
async fn start_operations(
    config: &Config,
    shutdown: &CancellationToken,
) -> Result<(CancellationToken, tokio::task::JoinHandle<()>), CommandError> {
    use crate::metrics::{self as m, Health};
    let health = Health::global();
    let commit_interval = Duration::from_millis(config.commit_interval_ms);
    // Silence is normal for up to a heartbeat or status period; three of them is a stall.
    let beat = crate::sources::build(&config.source).heartbeat_period();
    health.configure(beat * 3, commit_interval);
    let ops = shutdown.child_token();
    if let Some(addr) = &config.metrics_listen {
        let handle = m::install(&config.pipeline)?;
        let listener = tokio::net::TcpListener::bind(addr.as_str())
            .await
            .map_err(|source| m::MetricsError::Listen {
                addr: addr.clone(),
                source,
            })?;
        let bound = listener
            .local_addr()
            .map_or_else(|_| addr.clone(), |a| a.to_string());
        tracing::info!(listen = %bound, "serving /metrics, /healthz and /readyz");
        tokio::spawn(m::http::serve(listener, handle, health, ops.clone()));
    }
    let notifier = tokio::spawn(m::notify::supervise(health, ops.clone()));
    Ok((ops, notifier))
}

/// Finds orphan files in every table of the configured sink's format in the warehouse (files no
/// metadata references, older than `grace`) and deletes them unless `dry_run`.
pub async fn cleanup(
    config: &Config,
    grace: Duration,
    dry_run: bool,
) -> Result<Vec<TableCleanup>, CommandError> {
    let sink = build_sink(config, None)?;
    Ok(sink.cleanup(grace, dry_run).await.map_err(Box::new)?)
}

/// Every problem found, one line each with how to fix it; empty when ready.
pub async fn check(config: &Config) -> Vec<String> {
    let source = crate::sources::build(&config.source);
    let mut problems: Vec<String> = source
        .check()
        .await
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    if let Err(e) = probe_warehouse(config).await {
        problems.push(e);
    }
    problems.extend(multiset_problems(config, source.as_ref()).await);
    problems
}

/// The Postgres keyless REPLICA IDENTITY FULL tables (multisets) a sink that cannot store them
/// would refuse at start, as the start refuses them. MySQL keyless tables are left out: they
/// replicate insert-only on such a sink until an update arrives (`Prepared::multiset`).
async fn multiset_problems(config: &Config, source: &dyn Source) -> Vec<String> {
    let crate::config::SourceConfig::Postgres(_) = &config.source else {
        return Vec::new();
    };
    let Some(why) = build_sink(config, None)
        .ok()
        .and_then(|sink| sink.multiset_refusal())
    else {
        return Vec::new();
    };
    source
        .check_keys()
        .await
        .into_iter()
        .filter(|k| k.origin == KeyOrigin::FullRow)
        .map(|k| {
            PipelineError::MultisetUnsupported {
                table: k.table,
                why,
            }
            .to_string()
        })
        .collect()
}

/// `cdcd check`'s lines about the sink beyond the warehouse (`catalog sql <uri>: ok`), or the
/// problem found there.
pub async fn check_sink(config: &Config) -> Result<Vec<String>, String> {
    let sink = build_sink(config, None).map_err(|e| e.to_string())?;
    sink.check().await
}

/// The settings `cdcd check` shows before its verdict (the source's TLS, and where it came from).
pub fn check_settings(config: &Config) -> Vec<String> {
    crate::sources::build(&config.source).settings()
}

/// `cdcd check`'s line per captured table with a usable key: the key and where it came from.
pub async fn check_keys(config: &Config) -> Vec<String> {
    crate::sources::build(&config.source)
        .check_keys()
        .await
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Writes and removes a small object under `<warehouse>/_cdcd/<pipeline>/` to prove the warehouse
/// is reachable and writable.
async fn probe_warehouse(config: &Config) -> Result<(), String> {
    use object_store::ObjectStoreExt;
    let warehouse = open_warehouse(config).map_err(|e| e.to_string())?;
    let location = warehouse.location(&["_cdcd", &config.pipeline, "check-probe"]);
    let path = warehouse.path(&location).map_err(|e| e.to_string())?;
    let unwritable = |e: object_store::Error| {
        format!(
            "warehouse {} is not writable ({e}): check the path and its permissions (sink.warehouse)",
            warehouse.url()
        )
    };
    warehouse
        .store()
        .put(&path, bytes::Bytes::from_static(b"cdcd check").into())
        .await
        .map_err(unwritable)?;
    warehouse.store().delete(&path).await.map_err(unwritable)?;
    Ok(())
}

/// The committed state of every captured table.
pub async fn status(config: &Config) -> Result<Vec<StatusRow>, CommandError> {
    let sink = build_sink(config, None)?;
    let tables: Vec<TableKey> = crate::sources::build(&config.source).tables().await?;
    let resyncs = ResyncStore::new(&open_warehouse(config)?, &config.pipeline)
        .list()
        .await?;
    let mut rows = Vec::new();
    for key in tables {
        let table = &key.table;
        let status = sink.status(table).await.map_err(Box::new)?;
        rows.push(StatusRow {
            table: table.to_string(),
            key_origin: key.origin.label(),
            key_index: match &key.origin {
                KeyOrigin::IdentityIndex(index) => Some(index.clone()),
                _ => None,
            },
            key: key.columns,
            location: status.as_ref().map(|s| s.location.clone()),
            position: status
                .as_ref()
                .and_then(|s| s.checkpoint.as_ref())
                .map(|c| c.position.to_string()),
            snapshot_id: status.as_ref().map(|s| s.snapshot_id),
            rows: status.as_ref().and_then(|s| s.rows),
            live_files: status.as_ref().and_then(|s| s.files).map(|f| f.live_files),
            live_bytes: status.as_ref().and_then(|s| s.files).map(|f| f.live_bytes),
            snapshots: status.as_ref().and_then(|s| s.files).map(|f| f.snapshots),
            resync: resyncs
                .iter()
                .find(|r| r.table() == *table)
                .map(|r| match &r.held_at {
                    Some(at) => format!("online {} since {at}", r.id),
                    None => format!("requested {}", r.id),
                }),
        });
    }
    Ok(rows)
}
