//! Read-ahead of the primary-key index for the changes waiting for their table's next commit
//! (`Sink::prefetch`): the keys of their updates and deletes are looked up in the index's runs
//! as they arrive, so the blocks their commit's `locate` wants are in the block cache by then.
//!
//! Why: on a large table nearly every updated key wants a block of the index's oldest run from
//! storage, and a commit read them one wave after another at its start: 80 % of `locate`,
//! 0.4-0.8 s of each commit of a 100M-row table under TPC-B, while the next commit's changes
//! came in with nothing else to do (docs/performance.md, "A 100M-row table"). The reads are the
//! same; they move out of the commit, which is what a change waits for.
//!
//! What keeps it harmless: warming only reads into the shared block cache (`BlockWarmer`), whose
//! blocks are keyed by immutable run; the commit still looks every key up itself. It is best
//! effort: a table whose index is not open yet, a key the codec cannot encode, a read that fails
//! (a run merged away since the warmer was made) or keys past [`MAX_PENDING`] are skipped, and
//! the commit reads what was not warmed. One warming task per table at a time, so the reads never
//! pile up behind a slow store; it stops once nothing is pending. A cache at its floor (run metas
//! taking the whole share) is not warmed: the blocks would be evicted before their commit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::Array;
use arrow_row::RowConverter;
use arrow_schema::SchemaRef;

use super::TableIndex;
use crate::changelog::{Op, TableChanges, TableId};
use crate::sinks::iceberg::rows::row_converter;
use crate::sinks::pk_index::BlockWarmer;

/// Keys waiting to be warmed, per table, beyond which new ones are dropped: a commit's worth at
/// the rates a 2-core machine sees, and a bound on what a stalled store can make it hold.
const MAX_PENDING: usize = 65_536;

/// The warming of every table with an open index.
#[derive(Default)]
pub(crate) struct IndexWarmers {
    tables: Mutex<HashMap<TableId, Arc<TableWarming>>>,
}

/// One table's warming: its index's runs as of its last commit, the key encoding, the keys
/// waiting.
struct TableWarming {
    keys_schema: SchemaRef,
    codec: RowConverter,
    state: Mutex<Warming>,
    /// Blocks read so far (tests).
    read_blocks: AtomicUsize,
}

struct Warming {
    warmer: BlockWarmer,
    /// Encoded keys not warmed yet.
    pending: Vec<Vec<u8>>,
    /// A task is warming (it takes `pending` until it finds it empty).
    running: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only plain data behind it: a panic elsewhere cannot leave it half updated.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl IndexWarmers {
    /// Warms for `table` through `index`'s runs from now on (a commit readied it).
    pub(crate) fn update(&self, table: &TableId, index: &TableIndex) {
        let warmer = index.warmer();
        let keys_schema = index.keys_schema();
        let mut tables = lock(&self.tables);
        if let Some(t) = tables.get(table) {
            if t.keys_schema == *keys_schema {
                lock(&t.state).warmer = warmer;
                return;
            }
        }
        let Ok(codec) = row_converter(keys_schema) else {
            tables.remove(table);
            return;
        };
        tables.insert(
            table.clone(),
            Arc::new(TableWarming {
                keys_schema: Arc::clone(keys_schema),
                codec,
                state: Mutex::new(Warming {
                    warmer,
                    pending: Vec::new(),
                    running: false,
                }),
                read_blocks: AtomicUsize::new(0),
            }),
        );
    }

    /// Warms the keys `changes` will look up: the keys of their updates and deletes, and the
    /// old keys of updates that changed theirs. Returns at once; a task does the reads.
    pub(crate) fn prefetch(&self, changes: &TableChanges) {
        let looked_up = |op: &Op| matches!(op, Op::Update | Op::Delete);
        if !changes.ops.iter().any(looked_up) {
            return;
        }
        let Some(table) = lock(&self.tables).get(&changes.schema.id).cloned() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let key: Vec<_> = changes
            .schema
            .primary_key
            .iter()
            .filter_map(|&k| changes.rows.columns().get(k).cloned())
            .collect();
        let Ok(new_keys) = table.codec.convert_columns(&key) else {
            return;
        };
        let changed = changes.key_changed.iter().any(|c| *c);
        let old_keys = changed
            .then(|| table.codec.convert_columns(changes.old_keys.columns()).ok())
            .flatten();
        let mut keys = Vec::new();
        for (row, op) in changes.ops.iter().enumerate() {
            if !looked_up(op) {
                continue;
            }
            keys.push(new_keys.row(row).data().to_vec());
            let old = old_keys.as_ref().filter(|_| {
                changes.key_changed.get(row).copied().unwrap_or(false)
                    && changes.old_keys.columns().iter().all(|c| c.is_valid(row))
            });
            if let Some(old) = old {
                keys.push(old.row(row).data().to_vec());
            }
        }
        let start = {
            let mut state = lock(&table.state);
            if !state.warmer.useful() {
                return;
            }
            let room = MAX_PENDING.saturating_sub(state.pending.len());
            keys.truncate(room);
            state.pending.append(&mut keys);
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            runtime.spawn(warm(changes.schema.id.clone(), table));
        }
    }

    /// Waits until nothing is pending for `table`; the blocks its warming read so far.
    #[cfg(test)]
    pub(crate) async fn idle(&self, table: &TableId) -> usize {
        let Some(t) = lock(&self.tables).get(table).cloned() else {
            return 0;
        };
        for _ in 0..500 {
            if !lock(&t.state).running {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        t.read_blocks.load(Ordering::Relaxed)
    }
}

/// Warms what is pending for `table` until nothing is.
async fn warm(table_id: TableId, table: Arc<TableWarming>) {
    loop {
        let (keys, warmer) = {
            let mut state = lock(&table.state);
            if state.pending.is_empty() {
                state.running = false;
                return;
            }
            (std::mem::take(&mut state.pending), state.warmer.clone())
        };
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        match warmer.warm(&refs).await {
            Ok(read) => {
                table.read_blocks.fetch_add(read, Ordering::Relaxed);
                tracing::trace!(table = %table_id, keys = refs.len(), read, "index blocks warmed")
            }
            Err(e) => {
                tracing::debug!(table = %table_id, error = %e, "index warming skipped a batch; its commit reads what it needs")
            }
        }
    }
}
