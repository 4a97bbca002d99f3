//! Rows in commit order cut into data files at the [`FileLimits`]: a file closes after the row
//! that brings it to `max_rows` rows or `max_bytes` estimated bytes. The append plan and the
//! in-order insert plan fill files this way; the general planner closes its own (it also
//! tracks fills and live rows per file).

use super::{FileLimits, PlannedFile, RowRef};

/// The files cut so far and the one being filled.
pub(super) struct FileCutter {
    limits: FileLimits,
    files: Vec<PlannedFile>,
    open: PlannedFile,
    open_bytes: usize,
}

impl FileCutter {
    pub(super) fn new(limits: FileLimits) -> FileCutter {
        FileCutter {
            limits,
            files: Vec::new(),
            open: PlannedFile::default(),
            open_bytes: 0,
        }
    }

    /// The file being filled (to reserve room for its rows).
    pub(super) fn open(&mut self) -> &mut PlannedFile {
        &mut self.open
    }

    /// Adds `row` of an estimated `bytes` to the open file, closing it when it is full.
    pub(super) fn push(&mut self, row: RowRef, bytes: usize) {
        self.open.rows.push(row);
        self.open_bytes = self.open_bytes.saturating_add(bytes);
        if self.open.rows.len() >= self.limits.max_rows || self.open_bytes >= self.limits.max_bytes
        {
            self.files.push(std::mem::take(&mut self.open));
            self.open_bytes = 0;
        }
    }

    /// Drops every row cut so far (a truncate).
    pub(super) fn clear(&mut self) {
        *self = FileCutter::new(self.limits);
    }

    /// The files, the open one last if it has rows.
    pub(super) fn finish(mut self) -> Vec<PlannedFile> {
        if !self.open.rows.is_empty() {
            self.files.push(self.open);
        }
        self.files
    }
}
