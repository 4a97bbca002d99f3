//! The index manifest: which runs are live, which data files the file ids name, and which table
//! snapshot the persisted index reflects.
//!
//! Each persist writes `manifest-<seq>.json` (zero-padded, so names sort by seq) create-if-absent
//! through `storage::put_create`, like Iceberg table metadata in cdcd: atomic on local disk and
//! S3, never overwritten, so a crash leaves either the old manifest or the new one, complete (a
//! retried put that finds its own bytes counts as written). The newest
//! manifest is the index; run files it does not name are crash leftovers (written before a
//! manifest that never landed) and older manifests are superseded: open deletes both.

use object_store::path::Path;
use serde::{Deserialize, Serialize};

pub(crate) const FORMAT: u32 = 1;
const MANIFEST_PREFIX: &str = "manifest-";
const MANIFEST_SUFFIX: &str = ".json";
const RUN_PREFIX: &str = "run-";
const RUN_SUFFIX: &str = ".pki";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub(crate) format: u32,
    pub(crate) seq: u64,
    /// The table snapshot whose changes the index holds (all of them, and none later).
    pub(crate) covered_snapshot: Option<i64>,
    pub(crate) next_file_id: u32,
    pub(crate) next_run_id: u64,
    /// Live data files; an entry naming an id absent here is treated as removed.
    pub(crate) files: Vec<FileEntry>,
    /// Live runs, newest first (a newer run shadows older ones).
    pub(crate) runs: Vec<RunEntry>,
    /// A fresh id per persist. Two writers of one index can hold equal state, so without it
    /// their manifests could be byte-equal and a conflict would read as our own retried put
    /// (`storage::put_create`). Absent in manifests written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileEntry {
    pub(crate) id: u32,
    pub(crate) path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunEntry {
    pub(crate) id: u64,
    pub(crate) size: u64,
    pub(crate) meta_offset: u64,
    pub(crate) entries: u64,
}

pub(crate) fn manifest_path(root: &Path, seq: u64) -> Path {
    root.clone()
        .join(format!("{MANIFEST_PREFIX}{seq:020}{MANIFEST_SUFFIX}"))
}

pub(crate) fn run_path(root: &Path, id: u64) -> Path {
    root.clone()
        .join(format!("{RUN_PREFIX}{id:020}{RUN_SUFFIX}"))
}

/// What a file name under the index root is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Name {
    Manifest(u64),
    Run(u64),
    Other,
}

pub(crate) fn classify(file_name: &str) -> Name {
    let num = |s: &str, prefix: &str, suffix: &str| {
        s.strip_prefix(prefix)?
            .strip_suffix(suffix)?
            .parse::<u64>()
            .ok()
    };
    if let Some(seq) = num(file_name, MANIFEST_PREFIX, MANIFEST_SUFFIX) {
        Name::Manifest(seq)
    } else if let Some(id) = num(file_name, RUN_PREFIX, RUN_SUFFIX) {
        Name::Run(id)
    } else {
        Name::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let root = Path::from("wh/_cdcd/p/index/ns/t");
        let m = manifest_path(&root, 7);
        assert_eq!(
            m.as_ref(),
            "wh/_cdcd/p/index/ns/t/manifest-00000000000000000007.json"
        );
        assert_eq!(classify(m.filename().unwrap()), Name::Manifest(7));
        let r = run_path(&root, 12);
        assert_eq!(classify(r.filename().unwrap()), Name::Run(12));
        assert_eq!(classify("manifest-x.json"), Name::Other);
        assert_eq!(classify("notes.txt"), Name::Other);
    }
}
