//! Checkpoints: the source position stored in the same table snapshot as the data.
//!
//! Every snapshot cdcd commits carries two keys (Iceberg: the snapshot summary; Paimon: snapshot
//! `properties`):
//! - `cdcd.pipeline`: the pipeline name, so two pipelines writing one warehouse never read each
//!   other's positions;
//! - `cdcd.position`: the source position up to which the table is complete, in the text form of
//!   [`Position`].
//!
//! On start the pipeline reads each table's checkpoint back; a transaction whose position is at or
//! below its table's checkpoint is already in the table and is skipped. The source is acknowledged
//! only up to positions every table has committed, so a crash at any instant neither loses nor
//! duplicates a change.

use std::collections::HashMap;

use crate::changelog::{ParsePositionError, Position};

pub mod lease;

/// Snapshot property naming the pipeline that wrote the snapshot.
pub const PIPELINE_KEY: &str = "cdcd.pipeline";
/// Snapshot property holding the position up to which the table is complete.
pub const POSITION_KEY: &str = "cdcd.position";

/// A pipeline's position as stored in one table snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub pipeline: String,
    pub position: Position,
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
}

impl Checkpoint {
    /// The properties to store in a snapshot.
    pub fn to_properties(&self) -> [(String, String); 2] {
        [
            (PIPELINE_KEY.to_owned(), self.pipeline.clone()),
            (POSITION_KEY.to_owned(), self.position.to_string()),
        ]
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
        Ok(Some(Checkpoint {
            pipeline: pipeline.to_owned(),
            position,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::Lsn;

    #[test]
    fn round_trips_through_properties() {
        let cp = Checkpoint {
            pipeline: "shop".into(),
            position: Position::Postgres(Lsn(0x16B3748)),
        };
        let props: HashMap<String, String> = cp.to_properties().into_iter().collect();
        assert_eq!(props["cdcd.position"], "0/16B3748");
        assert_eq!(
            Checkpoint::from_properties("shop", &props).unwrap(),
            Some(cp)
        );
        assert_eq!(Checkpoint::from_properties("other", &props).unwrap(), None);
    }
}
