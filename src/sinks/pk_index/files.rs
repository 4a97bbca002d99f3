//! The file table: data file paths interned as compact `u32` ids.
//!
//! Runs store a file id per key instead of a path (4 bytes, varint-coded, instead of ~100), and
//! the manifest stores the id → path table once. Ids are never reused: removing a file (data-file
//! compaction, expiry) drops its id from the table, and any entry still naming it reads as absent
//! and is turned into a tombstone the next time its run is merged.

use std::collections::HashMap;
use std::sync::Arc;

use super::manifest::FileEntry;
use super::memtable::{Slot, TOMBSTONE};
use super::{IndexError, RowLocation};

#[derive(Debug, Default)]
pub(crate) struct FileTable {
    by_path: HashMap<Arc<str>, u32>,
    by_id: HashMap<u32, Arc<str>>,
    next_id: u32,
    /// The last file interned: a commit's rows arrive grouped by file, so this skips hashing the
    /// path for nearly every row.
    last: Option<(Arc<str>, u32)>,
}

impl FileTable {
    pub(crate) fn from_entries(entries: &[FileEntry], next_id: u32) -> FileTable {
        let mut t = FileTable {
            next_id,
            ..FileTable::default()
        };
        for e in entries {
            let path: Arc<str> = Arc::from(e.path.as_str());
            t.by_path.insert(Arc::clone(&path), e.id);
            t.by_id.insert(e.id, path);
            t.next_id = t.next_id.max(e.id.saturating_add(1));
        }
        t
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id
    }

    pub(crate) fn intern(&mut self, path: &Arc<str>) -> Result<u32, IndexError> {
        if let Some((last, id)) = &self.last {
            if Arc::ptr_eq(last, path) {
                return Ok(*id);
            }
        }
        self.intern_str(path)
    }

    /// [`intern`](Self::intern) for a path not yet shared: allocates only for a new file.
    pub(crate) fn intern_str(&mut self, path: &str) -> Result<u32, IndexError> {
        if let Some((last, id)) = &self.last {
            if **last == *path {
                return Ok(*id);
            }
        }
        let (path, id) = match self.by_path.get_key_value(path) {
            Some((p, id)) => (Arc::clone(p), *id),
            None => {
                let id = self.next_id;
                if id == TOMBSTONE {
                    return Err(IndexError::FileIdsExhausted);
                }
                self.next_id += 1;
                let path: Arc<str> = Arc::from(path);
                self.by_path.insert(Arc::clone(&path), id);
                self.by_id.insert(id, Arc::clone(&path));
                (path, id)
            }
        };
        self.last = Some((path, id));
        Ok(id)
    }

    /// The location a slot names, or `None` for a tombstone or a removed file.
    pub(crate) fn resolve(&self, slot: Slot) -> Option<RowLocation> {
        self.by_id.get(&slot.file).map(|file| RowLocation {
            file: Arc::clone(file),
            position: slot.position,
        })
    }

    /// `slot`, or a tombstone when its file was removed.
    pub(crate) fn live_or_tombstone(&self, slot: Slot) -> Slot {
        if self.by_id.contains_key(&slot.file) {
            slot
        } else {
            Slot::REMOVED
        }
    }

    /// The live file ids, sorted (a merge checks block file-id ranges against them).
    pub(crate) fn live_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.by_id.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn remove(&mut self, path: &str) {
        if let Some(id) = self.by_path.remove(path) {
            self.by_id.remove(&id);
        }
        self.last = None;
    }

    pub(crate) fn clear(&mut self) {
        self.by_path.clear();
        self.by_id.clear();
        self.last = None;
    }

    pub(crate) fn entries(&self) -> Vec<FileEntry> {
        let mut out: Vec<FileEntry> = self
            .by_id
            .iter()
            .map(|(id, path)| FileEntry {
                id: *id,
                path: path.to_string(),
            })
            .collect();
        out.sort_unstable_by_key(|e| e.id);
        out
    }

    /// The paths of the files the table knows, in no order.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Arc<str>> {
        self.by_id.values()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.by_id.values().map(|p| p.len() + 64).sum()
    }
}
