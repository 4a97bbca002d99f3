//! Tables whose sink asks for maintenance before the next scheduled cycle (Flink's Iceberg
//! `TableMaintenance` triggers on file counts the same way): the sink marks a table after a
//! commit that leaves it with enough small files (`cdcd.compaction.trigger-small-files`, 64), and the
//! daemon's background task (`daemon/maintenance.rs`) runs a cycle of those tables then instead
//! of waiting for `sink.maintenance_interval_ms`.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::changelog::TableId;

/// The tables that asked, and a wake-up for the task that serves them.
#[derive(Debug, Default)]
pub struct MaintenanceWanted {
    tables: Mutex<BTreeSet<TableId>>,
    wake: Notify,
}

impl MaintenanceWanted {
    /// Asks for a cycle of `table`.
    pub fn want(&self, table: &TableId) {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables.insert(table.clone());
        self.wake.notify_one();
    }

    /// The tables that asked since the last call, emptied (none: nothing asked).
    pub fn take(&self) -> Vec<TableId> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *tables).into_iter().collect()
    }

    /// Waits until a table asks; the tables that asked, emptied.
    pub async fn next(&self) -> Vec<TableId> {
        loop {
            let asked = self.take();
            if !asked.is_empty() {
                return asked;
            }
            self.wake.notified().await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn asks_gather_until_taken() {
        let w = MaintenanceWanted::default();
        assert!(w.take().is_empty());
        let (a, b) = (TableId::new("s", "a"), TableId::new("s", "b"));
        w.want(&b);
        w.want(&a);
        w.want(&b);
        assert_eq!(w.next().await, [a.clone(), b]);
        assert!(w.take().is_empty());
        // An ask while nobody waits is not lost.
        w.want(&a);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), w.next()).await;
        assert_eq!(got.unwrap(), [a]);
    }
}
