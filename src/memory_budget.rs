//! The process's memory budget (`pipeline.memory_budget`) and how it is shared out (issue 37):
//! one budget for the whole process, whatever the number of tables, where each table used to
//! bring its own 64 MiB of primary-key index memory.
//!
//! | share | of the budget | held by | past it |
//! |---|---|---|---|
//! | buffered rows | 1/4 | the pipeline's buffers (streamed changes and initial-copy batches, Arrow bytes) | the largest buffers commit (`pipeline/cadence.rs`); while they do, nothing is read: backpressure |
//! | index memtables | 1/16 | every table's primary-key index memtable together | a sizeable memtable flushes as a run |
//! | index cache | 1/4 | one LRU block cache over every index, and the run metas (bloom filters, sparse indexes) | the least recently used blocks of any table are evicted |
//! | streamed transactions | 1/8 | Postgres: a transaction streamed in progress (`source.stream_memory_bytes` unless set) | spilled to `pipeline.spill_dir` |
//! | the rest | 5/16 | not accounted: the commits in flight (Parquet encoding, lookups), the sinks' per-table state, the runtime, the allocator's slack | |
//!
//! The shares are fixed fractions so that each part's bound is known from the budget alone; the
//! last part is headroom, measured rather than counted (docs/performance.md, "Memory budget").
//! The index part is process-wide state ([`index_memory`]): every table's index shares it,
//! however the sink reaches them.

use std::sync::{Arc, OnceLock};

use crate::sinks::pk_index::IndexMemory;

/// The default budget: a 1,000-table pipeline stays under it (docs/performance.md).
pub const DEFAULT_MEMORY_BUDGET: usize = 512 << 20;
/// The least budget accepted: below this the fixed floors (a 256 KiB cache, one copy batch)
/// are most of it.
pub const MIN_MEMORY_BUDGET: usize = 16 << 20;

/// A process's memory budget in bytes, and its shares (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    pub total: usize,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget {
            total: DEFAULT_MEMORY_BUDGET,
        }
    }
}

impl MemoryBudget {
    pub fn new(total: usize) -> MemoryBudget {
        MemoryBudget { total }
    }

    /// Arrow bytes of rows the pipeline buffers, streamed and initial-copy together.
    pub fn buffered_rows(&self) -> usize {
        self.total / 4
    }

    /// Bytes every table's index memtable may hold together.
    pub fn index_memtables(&self) -> usize {
        self.total / 16
    }

    /// Bytes of the shared block cache plus every index's run metas.
    pub fn index_cache(&self) -> usize {
        self.total / 4
    }

    /// Bytes of one streamed transaction a source keeps in memory before spilling it.
    pub fn streamed_transaction(&self) -> usize {
        self.total / 8
    }
}

static INDEX_MEMORY: OnceLock<Arc<IndexMemory>> = OnceLock::new();

/// Sets the budget the process's primary-key indexes share. The first call wins (the daemon's
/// rounds build their sink again from the same config); an index opened before any call
/// shares the default budget's.
pub fn install(budget: MemoryBudget) {
    let _ = INDEX_MEMORY.set(index_memory_of(budget));
}

/// The index memory every table's primary-key index in this process shares.
pub fn index_memory() -> Arc<IndexMemory> {
    Arc::clone(INDEX_MEMORY.get_or_init(|| index_memory_of(MemoryBudget::default())))
}

fn index_memory_of(budget: MemoryBudget) -> Arc<IndexMemory> {
    IndexMemory::split(budget.index_memtables(), budget.index_cache())
}

/// Parses a byte size as the config writes it: a whole number of bytes, or a number with a unit
/// (`"512MiB"`, `"1 GiB"`, `"64MB"`; `KiB`/`MiB`/`GiB` are powers of 1024, `KB`/`MB`/`GB` of 1000,
/// `B` or none: bytes).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    let n: usize = digits.parse().map_err(|_| {
        format!("{text:?} is not a size: write bytes, or a number with KiB, MiB or GiB")
    })?;
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (KiB, MiB, GiB, KB, MB, GB or B)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size(" 1 GiB ").unwrap(), 1 << 30);
        assert_eq!(parse_size("64mb").unwrap(), 64_000_000);
        assert_eq!(parse_size("1_048_576").unwrap(), 1 << 20);
        assert_eq!(parse_size("100").unwrap(), 100);
        for bad in ["", "MiB", "12 parsecs", "-1MiB", "99999999999999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_shares_leave_headroom() {
        let b = MemoryBudget::new(512 << 20);
        let counted =
            b.buffered_rows() + b.index_memtables() + b.index_cache() + b.streamed_transaction();
        assert_eq!(counted, 11 * b.total / 16);
    }
}
