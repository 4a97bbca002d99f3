//! Online-resync supervision: during a round, a watcher over `_cdcd/<pipeline>/resync/` starts
//! a copy job beside the pipeline for a request made while it streams (`pipeline/resync.rs`),
//! and ends the round once the copy is done; a round that failed while resyncs were online
//! starts them over.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::changelog::TableId;
use crate::checkpoint::resync::{ResyncRequest, ResyncStore};
use crate::commands::build::{build_sink, settings};
use crate::commands::CommandError;
use crate::config::Config;
use crate::pipeline::{self, ResyncPlan};
use crate::sinks::{ResyncMode, Sink};
use crate::storage::Fence;

/// How often the daemon looks for new resync requests (`cdcd resync`).
const RESYNC_POLL: Duration = Duration::from_secs(2);

/// The pipeline stopped on an error while resyncs were carried out online (a copy job running,
/// or a lineage catching up): each starts over under a new id, copied at the next start. A
/// lineage copied online is complete at a position before the error, so its catch-up replays
/// the changes before it, and a schema change among them that the lineage (copied under the
/// newer schema) cannot take would stop every restart; a copy at start skips what the live table
/// holds (`pipeline/resync.rs`), which is the way out of such a stop. Best effort: a failure is
/// logged, and the online resync resumes at the next start instead.
pub(super) async fn start_online_resyncs_over(
    store: &ResyncStore,
    sink: &dyn Sink,
    plan: &ResyncPlan,
    copying: Option<ResyncRequest>,
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
pub(super) enum OnlineResync {
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
pub(super) struct ResyncWatch {
    pub(super) store: ResyncStore,
    pub(super) known: Vec<String>,
    pub(super) round: CancellationToken,
    pub(super) hold: pipeline::AckHold,
    pub(super) config: Config,
    pub(super) fence: Fence,
    pub(super) outcome: Arc<std::sync::Mutex<Option<OnlineResync>>>,
    /// The request whose copy job runs, if one does.
    pub(super) copying: Arc<std::sync::Mutex<Option<ResyncRequest>>>,
}

impl ResyncWatch {
    pub(super) async fn run(mut self) {
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
                    let held = ResyncRequest {
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
        request: &ResyncRequest,
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
