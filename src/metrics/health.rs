//! Health and readiness: what `/healthz`, `/readyz` and the systemd watchdog report.
//!
//! Where it sits: the source reports that its server answered ([`Health::source_ok`]), the
//! pipeline reports each turn of its loop with the age of its oldest buffered change
//! ([`Health::pipeline_turn`]) and each commit ([`Health::sink_ok`]). Readers ask
//! [`Health::readiness`].
//!
//! Why one process-wide handle: these signs of life come from tasks that share nothing else, and a
//! cdcd process runs one pipeline. The state sits behind one std `Mutex`, held for a few field
//! writes and never across `.await` (STYLE rule 12). The decision itself is the pure
//! [`State::readiness`], tested without clocks.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Ready unless a sign of life is older than this (raised by [`Health::configure`]).
const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(60);

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Not ready, and why (one line).
    NotReady(String),
}

/// The signs of life, as last reported.
#[derive(Debug, Clone)]
pub struct State {
    /// The pipeline prepared its source and read the sink's checkpoints.
    pub started: bool,
    /// Waiting as a lease standby while another cdcd runs the pipeline.
    pub standby: bool,
    pub stopping: bool,
    pub source_seen: Option<Instant>,
    pub source_error: Option<String>,
    pub sink_error: Option<String>,
    /// The pipeline loop's last turn.
    pub pipeline_seen: Option<Instant>,
    /// When the oldest change still buffered arrived.
    pub oldest_buffered: Option<Instant>,
    /// A sign of life older than this, or a buffered change older than this plus
    /// `commit_interval`, means stalled.
    pub stall_after: Duration,
    pub commit_interval: Duration,
}

impl State {
    fn new() -> State {
        State {
            started: false,
            standby: false,
            stopping: false,
            source_seen: None,
            source_error: None,
            sink_error: None,
            pipeline_seen: None,
            oldest_buffered: None,
            stall_after: DEFAULT_STALL_AFTER,
            commit_interval: Duration::from_secs(1),
        }
    }

    /// Ready: started, not stopping, no outstanding source or sink error, and neither the source,
    /// the pipeline loop nor the oldest buffered change older than the stall limits.
    pub fn readiness(&self, now: Instant) -> Readiness {
        let not = |why: String| Readiness::NotReady(why);
        let age = |t: Instant| now.saturating_duration_since(t);
        if self.stopping {
            return not("stopping".into());
        }
        if !self.started && self.standby {
            return not("standby: another cdcd holds the pipeline's lease".into());
        }
        if !self.started {
            return not("starting: source not prepared or sink checkpoints not read yet".into());
        }
        if let Some(e) = &self.source_error {
            return not(format!("source unreachable: {e}"));
        }
        if let Some(e) = &self.sink_error {
            return not(format!("sink failing: {e}"));
        }
        match self.source_seen {
            Some(t) if age(t) <= self.stall_after => {}
            Some(t) => return not(format!("source silent for {} s", age(t).as_secs())),
            None => return not("source not heard from yet".into()),
        }
        if let Some(t) = self.pipeline_seen {
            if age(t) > self.stall_after {
                return not(format!("pipeline loop stalled for {} s", age(t).as_secs()));
            }
        }
        if let Some(t) = self.oldest_buffered {
            if age(t) > self.stall_after + self.commit_interval {
                return not(format!(
                    "changes buffered for {} s without a commit",
                    age(t).as_secs()
                ));
            }
        }
        Readiness::Ready
    }
}

/// The process-wide health handle; see the module doc.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
    started: Notify,
}

impl Health {
    /// The process's handle.
    pub fn global() -> &'static Health {
        static GLOBAL: OnceLock<Health> = OnceLock::new();
        GLOBAL.get_or_init(Health::new)
    }

    pub fn new() -> Health {
        Health {
            state: Mutex::new(State::new()),
            started: Notify::new(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A panic while holding the lock cannot leave these plain fields half-written in a way
        // that matters; keep serving health rather than propagating the poison.
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Sets the stall limits: `stall_after` for silence, plus `commit_interval` for buffered
    /// changes.
    pub fn configure(&self, stall_after: Duration, commit_interval: Duration) {
        self.with(|s| {
            s.stall_after = stall_after.max(DEFAULT_STALL_AFTER);
            s.commit_interval = commit_interval;
        });
    }

    /// The pipeline has prepared its source and read every checkpoint: source and sink answered.
    pub fn set_started(&self) {
        self.with(|s| {
            s.started = true;
            s.standby = false;
            // A pipeline started again in-process (a resync request) is no longer stopping.
            s.stopping = false;
            let now = Instant::now();
            s.source_seen = Some(now);
            s.pipeline_seen = Some(now);
        });
        self.started.notify_waiters();
    }

    /// The process waits as a lease standby: it is up (for systemd) but runs no pipeline yet.
    pub fn set_standby(&self) {
        self.with(|s| s.standby = true);
        self.started.notify_waiters();
    }

    /// Waits until [`Health::set_started`] or [`Health::set_standby`]: the process is up, and
    /// systemd may consider the service started. Returns whether it is a standby.
    pub async fn wait_up(&self) -> bool {
        loop {
            let notified = self.started.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (started, standby) = self.with(|s| (s.started, s.standby));
            if started || standby {
                return !started;
            }
            notified.await;
        }
    }

    /// Waits until [`Health::set_started`].
    pub async fn wait_started(&self) {
        loop {
            let notified = self.started.notified();
            tokio::pin!(notified);
            // Register before checking, so a `set_started` in between is not missed.
            notified.as_mut().enable();
            if self.with(|s| s.started) {
                return;
            }
            notified.await;
        }
    }

    pub fn set_stopping(&self) {
        self.with(|s| s.stopping = true);
    }

    /// The source's server answered (a replication message, a query).
    pub fn source_ok(&self) {
        self.with(|s| {
            s.source_seen = Some(Instant::now());
            s.source_error = None;
        });
    }

    /// The source's server did not answer a query; cleared by the next [`Health::source_ok`].
    pub fn source_failed(&self, error: impl Into<String>) {
        let e = error.into();
        self.with(|s| s.source_error = Some(e));
    }

    pub fn sink_ok(&self) {
        self.with(|s| s.sink_error = None);
    }

    pub fn sink_failed(&self, error: impl Into<String>) {
        let e = error.into();
        self.with(|s| s.sink_error = Some(e));
    }

    /// One turn of the pipeline loop, with when its oldest buffered change arrived.
    pub fn pipeline_turn(&self, oldest_buffered: Option<Instant>) {
        self.with(|s| {
            s.pipeline_seen = Some(Instant::now());
            s.oldest_buffered = oldest_buffered;
        });
    }

    /// Whether the pipeline loop turned within `within` (or has not started: startup has its own
    /// timeout). The watchdog pets systemd only then.
    pub fn alive(&self, within: Duration) -> bool {
        self.with(|s| !s.started || s.pipeline_seen.is_some_and(|t| t.elapsed() <= within))
    }

    pub fn readiness(&self) -> Readiness {
        self.with(|s| s.readiness(Instant::now()))
    }

    pub fn snapshot(&self) -> State {
        self.with(|s| s.clone())
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_state(now: Instant) -> State {
        let mut s = State::new();
        s.started = true;
        s.source_seen = Some(now);
        s.pipeline_seen = Some(now);
        s
    }

    #[test]
    fn not_ready_before_start() {
        let s = State::new();
        assert!(
            matches!(s.readiness(Instant::now()), Readiness::NotReady(m) if m.contains("starting"))
        );
    }

    #[test]
    fn ready_when_everything_is_fresh() {
        let now = Instant::now();
        assert_eq!(ready_state(now).readiness(now), Readiness::Ready);
    }

    #[test]
    fn silent_source_is_not_ready() {
        let now = Instant::now();
        let s = ready_state(now);
        let later = now + Duration::from_secs(61);
        assert!(
            matches!(s.readiness(later), Readiness::NotReady(m) if m.contains("source silent"))
        );
    }

    #[test]
    fn old_buffered_changes_mean_stalled() {
        let now = Instant::now();
        let mut s = ready_state(now);
        s.oldest_buffered = Some(now);
        let later = now + Duration::from_secs(62);
        s.source_seen = Some(later);
        s.pipeline_seen = Some(later);
        assert!(matches!(s.readiness(later), Readiness::NotReady(m) if m.contains("buffered")));
    }

    #[test]
    fn errors_and_stopping_win() {
        let now = Instant::now();
        let mut s = ready_state(now);
        s.sink_error = Some("disk full".into());
        assert!(matches!(s.readiness(now), Readiness::NotReady(m) if m.contains("disk full")));
        s.sink_error = None;
        s.source_error = Some("refused".into());
        assert!(matches!(s.readiness(now), Readiness::NotReady(m) if m.contains("refused")));
        s.stopping = true;
        assert_eq!(s.readiness(now), Readiness::NotReady("stopping".into()));
    }

    #[tokio::test]
    async fn wait_started_returns_after_set_started() {
        let h = std::sync::Arc::new(Health::new());
        let waiter = tokio::spawn({
            let h = h.clone();
            async move { h.wait_started().await }
        });
        tokio::task::yield_now().await;
        h.set_started();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(h.alive(Duration::from_secs(1)));
    }
}
