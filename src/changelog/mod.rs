//! The changelog: the one normalized model every source produces and every sink consumes.
//!
//! A source yields [`Transaction`]s; each holds [`TableChanges`] (Arrow batches with per-column
//! presence, so an *absent* column is never confused with NULL) and the [`Position`] at which the
//! transaction is complete.

mod change;
mod gtid;
mod key;
mod position;
mod schema;

pub use change::{append_null, Op, TableChanges, TableChangesBuilder};
pub use gtid::{BinlogFile, GtidList, GtidSet, MariaGtid};
pub use key::{KeyOrigin, TableKey};
pub use position::{Lsn, ParsePositionError, Position};
pub use schema::{widens, Column, TableId, TableSchema};

/// One committed source transaction, in source order.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// The position at which this transaction is entirely applied (Postgres: the commit's end LSN).
    pub position: Position,
    /// Commit time at the source, microseconds since the Unix epoch.
    pub commit_time_micros: i64,
    /// The changes, in order; consecutive changes to one table share one `TableChanges`.
    pub changes: Vec<TableChanges>,
}

impl Transaction {
    /// Number of row changes in the transaction.
    pub fn change_count(&self) -> usize {
        self.changes.iter().map(TableChanges::len).sum()
    }
}
