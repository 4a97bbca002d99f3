//! The daemon's rounds. A round is one run of the pipeline. It takes on the resync requests in
//! its plan (at the first start: every request there is, copied before streaming resumes); one
//! made while it runs gets a copy job beside it (`resync_watch.rs`, `pipeline/resync.rs`), whose
//! end ends the round cleanly (what is buffered is committed), and the next round replays the
//! table into its lineage.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::resync_watch::{start_online_resyncs_over, OnlineResync, ResyncWatch};
use crate::checkpoint::progress::{ProgressError, ProgressStore};
use crate::checkpoint::resync::{ResyncError, ResyncStore};
use crate::checkpoint::source_state::{SourceStateFile, SOURCE_STATE_FILE};
use crate::commands::build::settings;
use crate::commands::CommandError;
use crate::config::Config;
use crate::pipeline::{self, AckHold, PipelineError, ResyncPlan};
use crate::sinks::{ResyncMode, Sink};
use crate::sources::SourceStateStore;
use crate::storage::{Fence, Warehouse};

/// What every round runs with: the config, the sink and the pipeline's state stores, all
/// writing through the lease's fence.
pub(super) struct Rounds<'a> {
    config: &'a Config,
    sink: Arc<dyn Sink>,
    fence: Fence,
    progress: ProgressStore,
    source_state: Arc<dyn SourceStateStore>,
    resync: ResyncStore,
}

/// How a round ended.
enum RoundEnd {
    /// At shutdown, or the pipeline ended on its own: the daemon stops.
    Stopped,
    /// The resync watcher ended it, with what it did: the pipeline restarts.
    Restart(Option<OnlineResync>),
}

impl<'a> Rounds<'a> {
    /// Opens the state stores in `warehouse` behind `fence`: the progress file and the rest are
    /// pipeline state like the tables, written only while the lease holds.
    pub(super) fn open(
        config: &'a Config,
        warehouse: &Warehouse,
        fence: &Fence,
        sink: Arc<dyn Sink>,
    ) -> Result<Self, CommandError> {
        let fenced = warehouse.clone().fenced(fence.clone());
        let progress =
            ProgressStore::new(&fenced, &config.pipeline).map_err(PipelineError::from)?;
        let source_state: Arc<dyn SourceStateStore> = Arc::new(
            SourceStateFile::new(&fenced, &config.pipeline, SOURCE_STATE_FILE)
                .map_err(|e| PipelineError::from(ProgressError::from(e)))?,
        );
        let resync = ResyncStore::new(&fenced, &config.pipeline);
        Ok(Rounds {
            config,
            sink,
            fence: fence.clone(),
            progress,
            source_state,
            resync,
        })
    }

    /// Runs round after round until `shutdown`, the pipeline's own end, or an error.
    pub(super) async fn run(&self, shutdown: &CancellationToken) -> Result<(), CommandError> {
        let mut plan = self.plan_at_start().await?;
        loop {
            match self.round(&plan, shutdown).await? {
                RoundEnd::Stopped => return Ok(()),
                RoundEnd::Restart(why) => replan(&mut plan, why)?,
            }
        }
    }

    /// The first round's plan: every pending request, in the mode it resumes in.
    async fn plan_at_start(&self) -> Result<ResyncPlan, CommandError> {
        let mut plan = ResyncPlan::default();
        for request in self.resync.list().await.map_err(PipelineError::from)? {
            if let Some(mode) = pipeline::mode_at_start(&request) {
                plan.modes.insert(request.id.clone(), mode);
            }
        }
        Ok(plan)
    }

    /// A copy job that began before a stop held the stream: held again from the start, until
    /// its lineage takes over (`pipeline/resync.rs`).
    async fn hold_begun_copies(
        &self,
        plan: &ResyncPlan,
        hold: &AckHold,
    ) -> Result<(), CommandError> {
        for request in self.resync.list().await.map_err(PipelineError::from)? {
            if plan.modes.contains_key(&request.id) {
                continue;
            }
            let held = request.held_position().map_err(|detail| {
                PipelineError::from(ResyncError::Unreadable {
                    path: self.resync.request_location(&request.table()),
                    detail,
                })
            })?;
            if let Some(at) = held {
                hold.hold_at(&at);
            }
        }
        Ok(())
    }

    /// One run of the pipeline under `plan`, with the resync watcher beside it.
    async fn round(
        &self,
        plan: &ResyncPlan,
        shutdown: &CancellationToken,
    ) -> Result<RoundEnd, CommandError> {
        let round = shutdown.child_token();
        let hold = AckHold::default();
        self.hold_begun_copies(plan, &hold).await?;
        let outcome = Arc::new(Mutex::new(None));
        let copying = Arc::new(Mutex::new(None));
        let watch = ResyncWatch {
            copying: Arc::clone(&copying),
            store: self.resync.clone(),
            known: plan.modes.keys().cloned().collect(),
            round: round.clone(),
            hold: hold.clone(),
            config: self.config.clone(),
            fence: self.fence.clone(),
            outcome: Arc::clone(&outcome),
        };
        let _watch = AbortOnDropHandle::new(tokio::spawn(watch.run()));
        let source = crate::sources::build(&self.config.source);
        let mut settings = settings(self.config, source.as_ref());
        settings.progress = Some(self.progress.clone());
        settings.source_state = Some(self.source_state.clone());
        settings.resync = Some(self.resync.clone());
        settings.resyncs = Some(plan.clone());
        settings.ack_hold = Some(hold);
        let ran = pipeline::run(source, Arc::clone(&self.sink), settings, round.clone()).await;
        if let Err(e) = ran {
            let copying = copying.lock().unwrap_or_else(|p| p.into_inner()).take();
            start_online_resyncs_over(&self.resync, self.sink.as_ref(), plan, copying).await;
            return Err(e.into());
        }
        if shutdown.is_cancelled() || !round.is_cancelled() {
            return Ok(RoundEnd::Stopped);
        }
        let taken = outcome.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(RoundEnd::Restart(taken))
    }
}

/// The next round's plan after the watcher ended a round with `why`.
fn replan(plan: &mut ResyncPlan, why: Option<OnlineResync>) -> Result<(), CommandError> {
    match why {
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
    Ok(())
}
