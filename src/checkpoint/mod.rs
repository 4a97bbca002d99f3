//! Checkpoints: the source position stored in the same table snapshot as the data.
//!
//! Every snapshot cdcd commits carries two keys (Iceberg: the snapshot summary; Paimon: snapshot
//! `properties`):
//! - `cdcd.pipeline`: the pipeline name, so two pipelines writing one warehouse never read each
//!   other's positions;
//! - `cdcd.position`: the source position up to which the table is complete, in the text form of
//!   [`Position`].
//!
//! - `cdcd.snapshot` (only while a table's initial copy is under way, with `cdcd.position = 0/0`):
//!   which chunks of the copy are started and done, so a restart copies only the rest;
//! - `cdcd.upsert_until` (only after a copy taken at a snapshot newer than the stream's start):
//!   changes at or below this position may already be in the copied rows, so they are applied as
//!   upserts (see `sources/postgres/snapshot/mod.rs` for why that converges);
//! - `cdcd.changelog_seq` (only on an Iceberg changelog table, `sinks/iceberg/changelog/`): the
//!   last `_cdc_seq` the changelog has given. Part of the checkpoint so that every commit that
//!   carries the checkpoint forward (compaction, retention) carries it too, and expiry, which
//!   keeps the newest snapshot with a checkpoint, keeps it;
//! - `cdcd.changelog_resync` (same table): the last resync of its table the changelog has marked
//!   with a `resync` row, so the marker is written once.
//!
//! On start the pipeline reads each table's checkpoint back; a transaction whose position is at or
//! below its table's checkpoint is already in the table and is skipped. The source is acknowledged
//! only up to positions every table has committed, so a crash at any instant neither loses nor
//! duplicates a change.

use std::collections::HashMap;

use crate::changelog::{ParsePositionError, Position};

pub mod lease;
pub mod progress;
pub mod resync;
pub mod source_state;

/// Snapshot property naming the pipeline that wrote the snapshot.
pub const PIPELINE_KEY: &str = "cdcd.pipeline";
/// Snapshot property holding the position up to which the table is complete.
pub const POSITION_KEY: &str = "cdcd.position";
/// Snapshot property holding the progress of an unfinished initial copy (JSON, source-defined).
pub const SNAPSHOT_KEY: &str = "cdcd.snapshot";
/// Snapshot property: changes at or below this position are applied as upserts.
pub const UPSERT_UNTIL_KEY: &str = "cdcd.upsert_until";
/// Snapshot property: the lease epoch of the daemon that committed the snapshot
/// (`checkpoint/lease/mod.rs`); absent when written without a lease.
pub const LEASE_EPOCH_KEY: &str = "cdcd.lease-epoch";
/// Snapshot property of a changelog table: the last `_cdc_seq` it has given.
pub const CHANGELOG_SEQ_KEY: &str = "cdcd.changelog_seq";
/// Snapshot property of a changelog table: the last resync of its table it has marked.
pub const CHANGELOG_RESYNC_KEY: &str = "cdcd.changelog_resync";

/// A pipeline's position as stored in one table snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub pipeline: String,
    pub position: Position,
    /// Progress of an unfinished initial copy ([`SNAPSHOT_KEY`]), as the pipeline encoded it.
    pub snapshot: Option<String>,
    /// [`UPSERT_UNTIL_KEY`]: changes at or below it may already be in the table.
    pub upsert_until: Option<Position>,
    /// [`CHANGELOG_SEQ_KEY`]: a changelog table's last `_cdc_seq`.
    pub changelog_seq: Option<i64>,
    /// [`CHANGELOG_RESYNC_KEY`]: the last resync a changelog table has marked.
    pub changelog_resync: Option<String>,
}

/// A snapshot's properties did not hold a readable checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("snapshot property {key} = {value:?} is not a position: {source}")]
    BadPosition {
        key: &'static str,
        value: String,
        source: ParsePositionError,
    },
    #[error("snapshot property {CHANGELOG_SEQ_KEY} = {value:?} is not a count")]
    BadSeq { value: String },
}

impl Checkpoint {
    /// A checkpoint with no copy in progress and no upsert window.
    pub fn new(pipeline: impl Into<String>, position: Position) -> Self {
        Checkpoint {
            pipeline: pipeline.into(),
            position,
            snapshot: None,
            upsert_until: None,
            changelog_seq: None,
            changelog_resync: None,
        }
    }

    /// The properties to store in a snapshot.
    pub fn to_properties(&self) -> Vec<(String, String)> {
        let mut p = vec![
            (PIPELINE_KEY.to_owned(), self.pipeline.clone()),
            (POSITION_KEY.to_owned(), self.position.to_string()),
        ];
        if let Some(s) = &self.snapshot {
            p.push((SNAPSHOT_KEY.to_owned(), s.clone()));
        }
        if let Some(u) = &self.upsert_until {
            p.push((UPSERT_UNTIL_KEY.to_owned(), u.to_string()));
        }
        if let Some(seq) = self.changelog_seq {
            p.push((CHANGELOG_SEQ_KEY.to_owned(), seq.to_string()));
        }
        if let Some(id) = &self.changelog_resync {
            p.push((CHANGELOG_RESYNC_KEY.to_owned(), id.clone()));
        }
        p
    }

    /// Reads the checkpoint of `pipeline` from snapshot properties. `Ok(None)` when the snapshot was
    /// not written by this pipeline (another pipeline, another writer, or none).
    pub fn from_properties(
        pipeline: &str,
        properties: &HashMap<String, String>,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        if properties.get(PIPELINE_KEY).map(String::as_str) != Some(pipeline) {
            return Ok(None);
        }
        let Some(value) = properties.get(POSITION_KEY) else {
            return Ok(None);
        };
        let position =
            value
                .parse::<Position>()
                .map_err(|source| CheckpointError::BadPosition {
                    key: POSITION_KEY,
                    value: value.clone(),
                    source,
                })?;
        let upsert_until = match properties.get(UPSERT_UNTIL_KEY) {
            Some(v) => {
                Some(
                    v.parse::<Position>()
                        .map_err(|source| CheckpointError::BadPosition {
                            key: UPSERT_UNTIL_KEY,
                            value: v.clone(),
                            source,
                        })?,
                )
            }
            None => None,
        };
        let changelog_seq = match properties.get(CHANGELOG_SEQ_KEY) {
            Some(v) => Some(
                v.parse::<i64>()
                    .map_err(|_| CheckpointError::BadSeq { value: v.clone() })?,
            ),
            None => None,
        };
        Ok(Some(Checkpoint {
            pipeline: pipeline.to_owned(),
            position,
            snapshot: properties.get(SNAPSHOT_KEY).cloned(),
            upsert_until,
            changelog_seq,
            changelog_resync: properties.get(CHANGELOG_RESYNC_KEY).cloned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::Lsn;

    #[test]
    fn round_trips_through_properties() {
        let mut cp = Checkpoint::new("shop", Position::Postgres(Lsn(0x16B3748)));
        let props: HashMap<String, String> = cp.to_properties().into_iter().collect();
        assert_eq!(props["cdcd.position"], "0/16B3748");
        assert_eq!(
            Checkpoint::from_properties("shop", &props).unwrap(),
            Some(cp.clone())
        );
        assert_eq!(Checkpoint::from_properties("other", &props).unwrap(), None);
        cp.snapshot = Some("{}".into());
        cp.upsert_until = Some(Position::Postgres(Lsn(7)));
        cp.changelog_seq = Some(42);
        cp.changelog_resync = Some("r1".into());
        let props: HashMap<String, String> = cp.to_properties().into_iter().collect();
        assert_eq!(props["cdcd.upsert_until"], "0/7");
        assert_eq!(props["cdcd.changelog_seq"], "42");
        assert_eq!(
            Checkpoint::from_properties("shop", &props).unwrap(),
            Some(cp)
        );
    }
}
