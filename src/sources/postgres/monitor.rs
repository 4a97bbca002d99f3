//! The slot watch: heartbeats into the WAL, and the slot's lag, retained WAL and validity.
//!
//! Where it sits: a task beside the replication stream, on a regular connection of its own,
//! started by [`super::PostgresSource`] when streaming begins. It feeds metrics and
//! [`Health`]; it never touches the stream, except that a lost slot ends it with an error.
//!
//! Why heartbeats: a slot advances only when the walsender reports a position and cdcd
//! acknowledges it. When the captured tables are idle (or the database's traffic is all in other
//! tables or databases), nothing decodable may pass, the slot's `restart_lsn` stays put and the
//! server keeps WAL for it. `pg_logical_emit_message(false, …)` writes a small non-transactional
//! WAL record in this database; pgoutput does not forward it (cdcd starts with `messages` off),
//! but decoding it moves the walsender past it and its keepalive reports the new end, which the
//! pipeline acknowledges once everything before it is committed (PG docs §9.28.6, "Replication
//! Management Functions"; §55.4, "Primary keepalive message"). The same keepalives tell the
//! pipeline that it is caught up, so `cdcd_source_lag_seconds` falls to about 0 when idle.
//!
//! Why watch `wal_status`: with `max_slot_wal_keep_size` set, Postgres invalidates a slot whose
//! retained WAL exceeds it (`wal_status = 'lost'`, PG docs §54.19 `pg_replication_slots`); the
//! changes it held are gone, so cdcd stops with the error and the way out.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::setup::{self, CheckProblem};
use crate::config::PostgresConfig;
use crate::metrics::{self as m, Health};
use crate::sources::SourceError;

/// Slot statistics are read this often when heartbeats are off.
pub(super) const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(10);
/// The prefix of cdcd's heartbeat messages in the WAL (visible to other decoders).
pub const HEARTBEAT_PREFIX: &str = "cdcd_heartbeat";

/// A slot's row of `pg_replication_slots`, as the watch reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotStats {
    /// `reserved`, `extended`, `unreserved`, `lost` (PG ≥ 13); `None` before.
    pub wal_status: Option<String>,
    /// Current WAL LSN minus `confirmed_flush_lsn`: what cdcd has not confirmed.
    pub lag_bytes: Option<i64>,
    /// Current WAL LSN minus `restart_lsn`: the WAL the server keeps for this slot.
    pub retained_bytes: Option<i64>,
}

impl SlotStats {
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// Reads the slot's statistics (`None`: no such slot).
pub async fn slot_stats(client: &Client, slot: &str) -> Result<Option<SlotStats>, SourceError> {
    let row = client
        .query_opt(
            // `to_jsonb(s)`: `wal_status` exists from PG 13 on. On a standby (logical decoding
            // there is PG ≥ 16) the current position is the replayed one.
            "WITH w AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                    ELSE pg_current_wal_lsn() END AS lsn)
             SELECT to_jsonb(s) ->> 'wal_status',
                    (w.lsn - s.confirmed_flush_lsn)::int8,
                    (w.lsn - s.restart_lsn)::int8
             FROM pg_replication_slots s, w WHERE s.slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| query_error(&format!("reading replication slot {slot}"), &e))?;
    Ok(row.map(|r| SlotStats {
        wal_status: r.get(0),
        lag_bytes: r.get(1),
        retained_bytes: r.get(2),
    }))
}

/// The problem and its fix when `slot` was invalidated.
pub fn slot_lost_problem(slot: &str) -> CheckProblem {
    CheckProblem {
        problem: format!(
            "replication slot {slot} was invalidated by Postgres (wal_status = lost: it retained more WAL than max_slot_wal_keep_size), so changes made since cdcd last confirmed are gone"
        ),
        fix: format!(
            "drop it with SELECT pg_drop_replication_slot('{slot}') and restart cdcd with source.snapshot = \"initial\" to copy the tables again; raise max_slot_wal_keep_size (or set it to -1) so it does not happen again"
        ),
    }
}

/// The error that stops cdcd on a lost slot (counted by the pipeline as
/// `cdcd_errors_total{kind="slot_lost"}`); also sets `cdcd_replication_slot_lost`.
pub fn slot_lost_error(slot: &str) -> SourceError {
    metrics::gauge!(m::REPLICATION_SLOT_LOST).set(1.0);
    SourceError::SlotLost(slot_lost_problem(slot).to_string())
}

/// What `cdcd check` says about an existing slot's `wal_status`.
pub fn wal_status_problem(slot: &str, wal_status: Option<&str>) -> Option<CheckProblem> {
    match wal_status {
        Some("lost") => Some(slot_lost_problem(slot)),
        Some("unreserved") => Some(CheckProblem {
            problem: format!(
                "replication slot {slot} retains more WAL than max_wal_size and will be invalidated at the next checkpoint past max_slot_wal_keep_size (wal_status = unreserved)"
            ),
            fix: "start cdcd so the slot catches up, or raise max_slot_wal_keep_size".to_owned(),
        }),
        _ => None,
    }
}

/// After `START_REPLICATION` failed with `err`: the slot-lost error if that is why, else `err`.
pub async fn explain_start_error(client: &Client, slot: &str, err: SourceError) -> SourceError {
    match slot_stats(client, slot).await {
        Ok(Some(stats)) if stats.is_lost() => {
            error!(slot, "{}", slot_lost_problem(slot));
            slot_lost_error(slot)
        }
        _ => err,
    }
}

/// Heartbeats and the slot watch, until `shutdown`; returns `Err` only for a lost slot. Failed
/// queries mark the source unhealthy and are retried on a new connection next period.
pub async fn run(cfg: PostgresConfig, shutdown: CancellationToken) -> Result<(), SourceError> {
    let period = cfg.heartbeat_interval.unwrap_or(DEFAULT_WATCH_INTERVAL);
    let mut heartbeats = cfg.heartbeat_interval.is_some();
    let health = Health::global();
    let mut client: Option<Client> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned_unreserved = false;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let c = match &client {
            Some(c) if !c.is_closed() => c,
            _ => match setup::connect(&cfg).await {
                Ok(c) => client.insert(c),
                Err(e) => {
                    warn!(error = %e, "slot watch: cannot connect");
                    health.source_failed(e.to_string());
                    continue;
                }
            },
        };
        if heartbeats {
            match c
                .execute(
                    "SELECT pg_logical_emit_message(false, $1, '')",
                    &[&HEARTBEAT_PREFIX],
                )
                .await
            {
                Ok(_) => metrics::counter!(m::HEARTBEATS_TOTAL).increment(1),
                Err(e) if e.as_db_error().is_some() => {
                    // A privilege problem does not heal by retrying; `cdcd check` names the grant.
                    warn!(error = %query_error("writing a heartbeat", &e), "heartbeats off: idle slots advance only with other WAL traffic");
                    heartbeats = false;
                }
                Err(e) => {
                    health.source_failed(e.to_string());
                    client = None;
                    continue;
                }
            }
        }
        match slot_stats(c, &cfg.slot).await {
            Ok(Some(stats)) => {
                if let Some(b) = stats.lag_bytes {
                    m::set_source_lag_bytes(u64::try_from(b).unwrap_or(0));
                }
                if let Some(b) = stats.retained_bytes {
                    metrics::gauge!(m::REPLICATION_SLOT_RETAINED_BYTES).set(b.max(0) as f64);
                }
                if stats.is_lost() {
                    error!(slot = %cfg.slot, "{}", slot_lost_problem(&cfg.slot));
                    return Err(slot_lost_error(&cfg.slot));
                }
                metrics::gauge!(m::REPLICATION_SLOT_LOST).set(0.0);
                let unreserved = stats.wal_status.as_deref() == Some("unreserved");
                if unreserved && !warned_unreserved {
                    if let Some(p) = wal_status_problem(&cfg.slot, stats.wal_status.as_deref()) {
                        warn!("{p}");
                    }
                } else if !unreserved && warned_unreserved {
                    info!(slot = %cfg.slot, "replication slot no longer at risk (wal_status = {})", stats.wal_status.as_deref().unwrap_or("?"));
                }
                warned_unreserved = unreserved;
                health.source_ok();
            }
            // Gone while streaming: the stream itself fails with the server's error.
            Ok(None) => health.source_ok(),
            Err(e) => {
                health.source_failed(e.to_string());
                client = None;
            }
        }
    }
}

fn query_error(context: &str, e: &tokio_postgres::Error) -> SourceError {
    SourceError::Server {
        context: context.to_owned(),
        detail: e
            .as_db_error()
            .map_or_else(|| e.to_string(), |db| db.message().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_slot_says_what_to_do() {
        let line = slot_lost_problem("cdcd_shop").to_string();
        assert!(line.contains("wal_status = lost"), "{line}");
        assert!(
            line.contains("pg_drop_replication_slot('cdcd_shop')"),
            "{line}"
        );
        assert!(line.contains("max_slot_wal_keep_size"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn lost_slot_error_kind() {
        assert_eq!(slot_lost_error("s").kind(), m::ERROR_KIND_SLOT_LOST);
    }

    #[test]
    fn wal_status_lines() {
        assert_eq!(wal_status_problem("s", Some("reserved")), None);
        assert_eq!(wal_status_problem("s", Some("extended")), None);
        assert_eq!(wal_status_problem("s", None), None);
        assert!(wal_status_problem("s", Some("unreserved"))
            .unwrap()
            .to_string()
            .contains("unreserved"));
        assert_eq!(
            wal_status_problem("s", Some("lost")),
            Some(slot_lost_problem("s"))
        );
    }
}
