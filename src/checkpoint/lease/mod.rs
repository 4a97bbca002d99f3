//! Fencing: one active cdcd per pipeline and warehouse, through a lease object at
//! `<warehouse>/_cdcd/<pipeline>/lease.json` renewed by conditional put.
//!
//! Where it sits: around the whole pipeline (`daemon::run`): acquire before reading the
//! source, renew while running, release on a clean stop. Why a lease as well as conditional
//! commits: a commit by create-if-absent already guarantees that two writers never both publish
//! version N of a table (the loser gets a conflict, nothing of it becomes visible), so a second
//! daemon can never corrupt or duplicate data. But two daemons would fight over the replication
//! slot and fail each other's commits forever; the lease makes the second one wait as a standby
//! (or refuse, `pipeline.standby = false`) and take over only when the active one is gone.
//!
//! Protocol (every write is conditional, so two candidates cannot both win):
//! - absent → create it (`PutMode::Create`, S3 `If-None-Match: *`);
//! - present → watch it. It is dead when its content has not changed for `ttl` as measured by the
//!   watcher's own monotonic clock (no wall-clock comparison between hosts, so clock skew does
//!   not matter), or when it says `released`. Then take it over with `PutMode::Update` on the
//!   etag that was read (S3 `If-Match`): if someone else renewed or took it meanwhile, the put
//!   fails and we keep watching;
//! - holder renews every `ttl / 3` with `PutMode::Update` on its last etag. A precondition
//!   failure means another daemon took the lease: stop at once without committing. If renewals
//!   keep failing (network) for `3/4 ttl` since the last successful one was *sent*, the holder
//!   stops too, before any standby can consider the lease dead (it needs a full `ttl` without
//!   change). That deadline is a timer of its own ([`Lease::keep`] races every renewal against
//!   it), not a check after the renewal returns: object_store retries a request for minutes;
//! - the deadline is also the lease's [`Fence`] (`storage/fence/mod.rs`, which holds the argument
//!   and its limits): every write the sinks make checks it right before it is sent, so a holder
//!   that wakes from SIGSTOP or a VM freeze past its deadline writes nothing, even if its
//!   commit runs before the renewal task has noticed;
//! - each acquisition writes `epoch` = the previous holder's + 1 (renewals keep it), like
//!   Kafka's producer epochs: every snapshot carries it (`cdcd.lease-epoch`), a commit that
//!   loses to a newer epoch's snapshot stops the daemon, and what a holder names by its epoch
//!   (the primary-key index's run ids, `sinks/index/`) never collides with what an older,
//!   fenced holder still had in flight.
//! - clean stop: write `released: true` so a standby takes over without waiting for `ttl`.
//! - a conditional write retried by object_store after a lost response fails its precondition
//!   against its own first attempt; reading back our own holder and counter counts as success.
//! - a holder on the same machine and pid namespace (same `/proc/sys/kernel/random/boot_id` and
//!   `/proc/self/ns/pid`) whose process is gone (no `/proc/<pid>`, or a pid reused by another
//!   program) is dead at once: a restart after `kill -9` on the same host need not wait `ttl`.

use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::storage::{Fence, Fenced, Warehouse};

/// The lease could not be taken or was lost.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("pipeline {pipeline} is already running: {holder} holds the lease {path} (renewed within the last {ttl_ms} ms); stop it first, or set pipeline.standby = true to wait as a standby")]
    Held {
        pipeline: String,
        holder: String,
        path: String,
        ttl_ms: u64,
    },
    #[error("lost the lease {path}: {holder} took over pipeline {pipeline}; this daemon stopped without committing further")]
    Lost {
        pipeline: String,
        holder: String,
        path: String,
    },
    #[error("lost the lease {path}: not renewed for {elapsed_ms} ms, past 3/4 of its ttl (last error: {detail}); stopped before a standby could take over, publishing nothing more")]
    Expired {
        path: String,
        elapsed_ms: u64,
        detail: String,
    },
    #[error("lease {path}: storage error: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error(transparent)]
    Location(#[from] crate::storage::StorageError),
    /// A write of the pipeline was refused by the lease's fence.
    #[error(transparent)]
    Fenced(#[from] Fenced),
}

/// The lease object's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// `host:pid:random`: unique per daemon start.
    pub holder: String,
    /// Increases with every renewal, so each renewal changes the content (and the etag).
    pub counter: u64,
    pub ttl_ms: u64,
    /// Wall-clock time of the write (for people reading the file; not used to decide).
    pub written_at: String,
    #[serde(default)]
    pub released: bool,
    /// `<boot id>/<pid namespace>` of the holder's machine, and its pid: see the module doc.
    #[serde(default)]
    pub machine: Option<String>,
    #[serde(default)]
    pub pid: u32,
    /// One more than the previous holder's at each acquisition; unchanged by renewals.
    #[serde(default)]
    pub epoch: u64,
}

/// `<boot id>/<pid namespace>`, or `None` off Linux.
fn machine_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()))
}

/// Whether `record`'s holder is a process of this machine and pid namespace that no longer runs.
fn holder_gone_locally(record: &LeaseRecord) -> bool {
    let (Some(theirs), Some(ours)) = (&record.machine, machine_id()) else {
        return false;
    };
    if *theirs != ours || record.pid == 0 || record.pid == std::process::id() {
        return false;
    }
    let ours_comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    match std::fs::read_to_string(format!("/proc/{}/comm", record.pid)) {
        Err(_) => true,
        // A reused pid runs another program.
        Ok(comm) => comm.trim() != ours_comm.trim(),
    }
}

/// Settings of a lease.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub pipeline: String,
    pub ttl: Duration,
    /// Wait while another daemon holds it (true) or fail with [`LeaseError::Held`] (false).
    pub standby: bool,
}

/// A held lease. Call [`Lease::keep`] to renew it until shutdown, then [`Lease::release`].
#[derive(Debug)]
pub struct Lease {
    warehouse: Warehouse,
    path: Path,
    location: String,
    settings: LeaseSettings,
    record: LeaseRecord,
    version: UpdateVersion,
    /// When the last successful renewal (or the acquisition) was sent.
    renewed_at: Instant,
    fence: Fence,
}

/// `<warehouse>/_cdcd/<pipeline>/lease.json`.
pub fn lease_location(warehouse: &Warehouse, pipeline: &str) -> String {
    warehouse.location(&["_cdcd", pipeline, "lease.json"])
}

fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    format!(
        "{host}:{}:{}",
        std::process::id(),
        nonce.get(..8).unwrap_or(&nonce)
    )
}

fn version_of(r: &object_store::PutResult) -> UpdateVersion {
    UpdateVersion {
        e_tag: r.e_tag.clone(),
        version: r.version.clone(),
    }
}

impl Lease {
    /// Takes the lease, waiting as a standby while another live daemon holds it (if
    /// `settings.standby`). Returns `Ok(None)` when `shutdown` fires first.
    pub async fn acquire(
        warehouse: &Warehouse,
        settings: LeaseSettings,
        shutdown: &CancellationToken,
    ) -> Result<Option<Lease>, LeaseError> {
        Lease::acquire_or_stand_by(warehouse, settings, shutdown, || {}).await
    }

    /// [`Lease::acquire`], calling `on_standby` once when it starts waiting as a standby (the
    /// binary tells systemd and `/readyz`).
    pub async fn acquire_or_stand_by(
        warehouse: &Warehouse,
        settings: LeaseSettings,
        shutdown: &CancellationToken,
        on_standby: impl FnOnce(),
    ) -> Result<Option<Lease>, LeaseError> {
        let mut on_standby = Some(on_standby);
        let location = lease_location(warehouse, &settings.pipeline);
        let path = warehouse.path(&location)?;
        let me = holder_id();
        let ttl_ms = u64::try_from(settings.ttl.as_millis()).unwrap_or(u64::MAX);
        let storage = |source| LeaseError::Storage {
            path: location.clone(),
            source,
        };
        let mut watched = Watch::default();
        let mut announced = false;
        // When our last create or takeover put was sent.
        let mut last_sent: Option<Instant> = None;
        loop {
            let current = read_record(warehouse, &path, ttl_ms)
                .await
                .map_err(storage)?;
            let mine = claim(&me, ttl_ms, current.as_ref().map(|(r, _)| r));
            // Our own create or takeover landed although its response was lost (then retried).
            if let Some((record, version)) = &current {
                if record.holder == me && !record.released {
                    // It landed after the put that carried it was sent.
                    let sent = last_sent.unwrap_or_else(Instant::now);
                    return Ok(Some(Lease::held(
                        warehouse,
                        path,
                        location,
                        settings,
                        record.clone(),
                        version.clone(),
                        sent,
                    )));
                }
            }
            let take = match &current {
                None => Some(PutMode::Create),
                Some((record, version)) => {
                    if watched.holder_gone(record, version, ttl_ms) {
                        Some(PutMode::Update(version.clone()))
                    } else if !settings.standby {
                        return Err(LeaseError::Held {
                            pipeline: settings.pipeline.clone(),
                            holder: record.holder.clone(),
                            path: location.clone(),
                            ttl_ms: record.ttl_ms,
                        });
                    } else {
                        if !announced {
                            tracing::info!(pipeline = %settings.pipeline, holder = %record.holder, lease = %location,
                                "standby: another cdcd holds the lease; waiting until it stops renewing it");
                            announced = true;
                            if let Some(f) = on_standby.take() {
                                f();
                            }
                        }
                        None
                    }
                }
            };
            if let Some(mode) = take {
                let sent = Instant::now();
                last_sent = Some(sent);
                match put_claim(warehouse, &location, &path, mode, &mine).await {
                    Ok(version) => {
                        tracing::info!(pipeline = %settings.pipeline, holder = %me, lease = %location, epoch = mine.epoch,
                            previous = ?current.as_ref().map(|(r, _)| r.holder.as_str()), "lease acquired");
                        return Ok(Some(Lease::held(
                            warehouse, path, location, settings, mine, version, sent,
                        )));
                    }
                    // Someone else created or renewed it between our read and our put.
                    Err(LeaseError::Storage {
                        source:
                            object_store::Error::AlreadyExists { .. }
                            | object_store::Error::Precondition { .. },
                        ..
                    }) => {
                        watched = Watch::default();
                    }
                    Err(e) => return Err(e),
                }
            }
            let poll = (settings.ttl / 3).max(Duration::from_millis(200));
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn held(
        warehouse: &Warehouse,
        path: Path,
        location: String,
        settings: LeaseSettings,
        record: LeaseRecord,
        version: UpdateVersion,
        sent: Instant,
    ) -> Lease {
        let fence = Fence::new(
            &settings.pipeline,
            record.epoch,
            sent + settings.ttl * 3 / 4,
        );
        Lease {
            warehouse: warehouse.clone(),
            path,
            location,
            settings,
            record,
            version,
            renewed_at: sent,
            fence,
        }
    }

    /// Who holds it (this daemon).
    pub fn holder(&self) -> &str {
        &self.record.holder
    }

    /// This holder's epoch (see the module doc).
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The fence the pipeline's writes must pass while this lease is held; [`Lease::keep`]
    /// moves its deadline on with every renewal and breaks it when the lease is lost.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Renews the lease until `stop` fires (then returns `Ok`), or until it is lost or cannot be
    /// renewed in time (then returns the error and breaks the fence; the caller must stop).
    ///
    /// The deadline (3/4 ttl after the last successful renewal was sent) is raced against the
    /// wait and against every renewal request, so it fires on time whatever the store does.
    pub async fn keep(&mut self, stop: &CancellationToken) -> Result<(), LeaseError> {
        let every = self.settings.ttl / 3;
        let give_up = self.settings.ttl * 3 / 4;
        // After a failed renewal, try again sooner: there is only until the deadline.
        let retry = (self.settings.ttl / 12).max(Duration::from_millis(50));
        let mut next_at = self.renewed_at + every;
        let mut last_error = String::new();
        loop {
            let deadline = self.fence.deadline();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(deadline) => return Err(self.expired(&last_error, None)),
                _ = tokio::time::sleep_until(next_at) => {}
            }
            let sent = Instant::now();
            if sent >= deadline {
                return Err(self.expired(&last_error, None));
            }
            let mut next = self.record.clone();
            next.counter += 1;
            next.written_at = chrono::Utc::now().to_rfc3339();
            let outcome = tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(deadline) => return Err(self.expired(&last_error, Some(sent))),
                r = self.renew(&next) => r,
            };
            match outcome {
                Ok(version) => {
                    self.record = next;
                    self.version = version;
                    // From when it was sent: the renewal may have landed at any point after.
                    self.renewed_at = sent;
                    self.fence.renewed(sent + give_up);
                    next_at = sent + every;
                }
                Err(LeaseError::Lost {
                    pipeline,
                    holder,
                    path,
                }) => {
                    self.fence
                        .break_with(format!("{holder} took it over ({path})"));
                    return Err(LeaseError::Lost {
                        pipeline,
                        holder,
                        path,
                    });
                }
                Err(e) => {
                    tracing::warn!(lease = %self.location, error = %e, "could not renew the lease; retrying");
                    last_error = e.to_string();
                    next_at = Instant::now() + retry;
                }
            }
        }
    }

    /// The lease expired (`in_flight`: when the renewal still unanswered was sent): break the
    /// fence (for good) and say so.
    fn expired(&self, last_error: &str, in_flight: Option<Instant>) -> LeaseError {
        let elapsed = self.renewed_at.elapsed();
        let detail = match (in_flight, last_error.is_empty()) {
            (Some(sent), _) => format!(
                "the renewal sent {} ms earlier was still unanswered{}",
                sent.elapsed().as_millis(),
                if last_error.is_empty() {
                    String::new()
                } else {
                    format!("; before it: {last_error}")
                }
            ),
            (None, true) => {
                "none: no renewal could be sent in time (was this process paused?)".into()
            }
            (None, false) => last_error.to_owned(),
        };
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.fence.break_with(format!(
            "not renewed for {elapsed_ms} ms, past 3/4 of its ttl ({detail})"
        ));
        LeaseError::Expired {
            path: self.location.clone(),
            elapsed_ms,
            detail,
        }
    }

    /// One renewal to `next`: its new version, or [`LeaseError::Lost`] when someone else wrote
    /// the lease since our last write.
    async fn renew(&self, next: &LeaseRecord) -> Result<UpdateVersion, LeaseError> {
        match self.write(next).await {
            Err(LeaseError::Storage {
                source: object_store::Error::Precondition { .. },
                ..
            }) => {
                // A renewal retried after a lost response finds its own first attempt.
                if let Some((current, version)) = self.read().await {
                    if current == *next {
                        return Ok(version);
                    }
                }
                Err(LeaseError::Lost {
                    pipeline: self.settings.pipeline.clone(),
                    holder: self.current_holder().await,
                    path: self.location.clone(),
                })
            }
            other => other,
        }
    }

    /// Marks the lease released so a standby takes over at once. Best effort: a failure only
    /// makes the standby wait for the ttl.
    pub async fn release(mut self) {
        let mut next = self.record.clone();
        next.counter += 1;
        next.released = true;
        next.written_at = chrono::Utc::now().to_rfc3339();
        match self.write(&next).await {
            Ok(version) => {
                self.version = version;
                tracing::info!(lease = %self.location, "lease released");
            }
            Err(e) => {
                tracing::warn!(lease = %self.location, error = %e, "could not release the lease")
            }
        }
    }

    async fn write(&self, record: &LeaseRecord) -> Result<UpdateVersion, LeaseError> {
        let body = serde_json::to_vec(record).unwrap_or_default();
        put_update(
            &self.warehouse,
            &self.location,
            &self.path,
            body,
            &self.version,
        )
        .await
    }

    async fn read(&self) -> Option<(LeaseRecord, UpdateVersion)> {
        let got = self.warehouse.store().get(&self.path).await.ok()?;
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.ok()?;
        Some((serde_json::from_slice(&bytes).ok()?, version))
    }

    async fn current_holder(&self) -> String {
        let read = async {
            let got = self.warehouse.store().get(&self.path).await.ok()?;
            let bytes = got.bytes().await.ok()?;
            serde_json::from_slice::<LeaseRecord>(&bytes).ok()
        };
        read.await
            .map(|r| r.holder)
            .unwrap_or_else(|| "another cdcd".into())
    }
}

/// The lease record at `path` and its version; `None` when there is none. An unreadable lease
/// (hand-edited, truncated) is treated like a dead one whose holder is unknown: it is still
/// replaced only by conditional put.
async fn read_record(
    warehouse: &Warehouse,
    path: &Path,
    ttl_ms: u64,
) -> Result<Option<(LeaseRecord, UpdateVersion)>, object_store::Error> {
    let got = match warehouse.store().get(path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let bytes = got.bytes().await?;
    let record = serde_json::from_slice::<LeaseRecord>(&bytes).unwrap_or_else(|_| LeaseRecord {
        holder: "<unreadable lease>".into(),
        counter: 0,
        ttl_ms,
        written_at: String::new(),
        released: true,
        machine: None,
        pid: 0,
        epoch: 0,
    });
    Ok(Some((record, version)))
}

/// The record `me` writes to take the lease over `current` (the next counter and epoch).
fn claim(me: &str, ttl_ms: u64, current: Option<&LeaseRecord>) -> LeaseRecord {
    LeaseRecord {
        holder: me.to_owned(),
        counter: current.map_or(0, |r| r.counter + 1),
        ttl_ms,
        written_at: chrono::Utc::now().to_rfc3339(),
        released: false,
        machine: machine_id(),
        pid: std::process::id(),
        epoch: current.map_or(1, |r| r.epoch + 1),
    }
}

/// The holder's record as last seen (content and etag) and since when it has been unchanged:
/// a standby's clock for deciding that the holder stopped renewing.
#[derive(Default)]
struct Watch {
    seen: Option<(LeaseRecord, UpdateVersion, Instant)>,
}

impl Watch {
    /// Whether the lease may be taken over: released, its holder's process gone from this
    /// machine, or unchanged for a whole ttl (the holder's own, if longer: it renews at its
    /// ttl / 3).
    fn holder_gone(&mut self, record: &LeaseRecord, version: &UpdateVersion, ttl_ms: u64) -> bool {
        let now = Instant::now();
        let unchanged_since = match &self.seen {
            Some((r, v, since)) if r == record && v == version => *since,
            _ => now,
        };
        self.seen = Some((record.clone(), version.clone(), unchanged_since));
        let their_ttl = Duration::from_millis(record.ttl_ms.max(ttl_ms));
        record.released
            || holder_gone_locally(record)
            || now.duration_since(unchanged_since) >= their_ttl
    }
}

/// Writes `mine` with `mode`: a create where there is no lease, a conditional update over the
/// version read.
async fn put_claim(
    warehouse: &Warehouse,
    location: &str,
    path: &Path,
    mode: PutMode,
    mine: &LeaseRecord,
) -> Result<UpdateVersion, LeaseError> {
    let body = serde_json::to_vec(mine).unwrap_or_default();
    match mode {
        PutMode::Update(v) => put_update(warehouse, location, path, body, &v).await,
        mode => warehouse
            .store()
            .put_opts(path, PutPayload::from(body), PutOptions::from(mode))
            .await
            .map(|r| version_of(&r))
            .map_err(|source| LeaseError::Storage {
                path: location.to_owned(),
                source,
            }),
    }
}

/// `PutMode::Update` (S3 `If-Match`). object_store's local file system has no conditional
/// update, so on `file://` warehouses the compare-and-swap runs under an exclusive `flock` on
/// `lease.json.lock` (every cdcd on that disk takes the same lock), comparing the etag first.
async fn put_update(
    warehouse: &Warehouse,
    location: &str,
    path: &Path,
    body: Vec<u8>,
    expected: &UpdateVersion,
) -> Result<UpdateVersion, LeaseError> {
    let storage = |source| LeaseError::Storage {
        path: location.to_owned(),
        source,
    };
    let Some(file) = warehouse.local_file(location) else {
        return warehouse
            .store()
            .put_opts(
                path,
                PutPayload::from(body),
                PutOptions::from(PutMode::Update(expected.clone())),
            )
            .await
            .map(|r| version_of(&r))
            .map_err(storage);
    };
    let lock_path = file.with_extension("json.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        f.lock()?;
        Ok::<_, std::io::Error>(f)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r)
    .map_err(|e| {
        storage(object_store::Error::Generic {
            store: "lease lock",
            source: Box::new(e),
        })
    })?;
    let result = async {
        let head = warehouse.store().head(path).await.map_err(storage)?;
        if head.e_tag != expected.e_tag {
            return Err(storage(object_store::Error::Precondition {
                path: location.to_owned(),
                source: "the lease changed since it was read".into(),
            }));
        }
        warehouse
            .store()
            .put(path, PutPayload::from(body))
            .await
            .map(|r| version_of(&r))
            .map_err(storage)
    }
    .await;
    drop(lock);
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
