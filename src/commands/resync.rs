//! `cdcd resync --table T`: stores a resync request (`checkpoint/resync.rs`) that the daemon
//! holding the lease carries out (`daemon/resync_watch.rs`), and says so.

use super::build::{build_sink, open_warehouse};
use super::{parse_table, CommandError};
use crate::changelog::TableId;
use crate::checkpoint::resync::{Requested, ResyncStore};
use crate::config::{Config, SnapshotMode};
use crate::sinks::SinkError;

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

/// Requests the resync and prints whether it is new or was pending already.
pub async fn run(config: &Config, table: &str) -> Result<(), CommandError> {
    match resync(config, table).await? {
        ResyncRequested::Created {
            table,
            id,
            location,
        } => println!(
            "resync of {table} requested (id {id}, {location}): a running cdcd starts it within a few seconds, otherwise the next start does; readers see the current table until the new copy replaces it"
        ),
        ResyncRequested::Pending {
            table,
            id,
            location,
        } => println!(
            "a resync of {table} is already requested (id {id}, {location}) and not finished; it goes on"
        ),
    }
    Ok(())
}

/// Checks that the pipeline captures `table` and that the sink can resync it, then stores a
/// request that the daemon holding the lease picks up within a few seconds (the next start, when
/// none runs). Takes no lease: the request is a create-if-absent put, and the copy itself runs
/// in the daemon.
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
