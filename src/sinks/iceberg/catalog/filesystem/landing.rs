//! Where a filesystem-catalog commit of `v<N>.metadata.json` stands among the versions listed
//! in the table's `metadata/` directory: the pure decisions of `filesystem.rs`.
//!
//! The create-if-absent put of `v<N>` only proves that no file of that name exists. Another
//! writer that deletes old metadata files (`write.metadata.delete-after-commit.enabled`, as
//! Iceberg-Java's `HadoopTableOperations` does after each commit) leaves names below its newest
//! version free, so a commit built on a stale base can create `v<N>` in such a gap, beside newer
//! versions that do not contain it. These decisions keep that from counting as a commit.

/// What the listing before the create says about committing version `version` (base + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BeforeCreate {
    /// No version at or above `version`: the base is the newest, go ahead.
    Free,
    /// Version `newest` (at or above `version`) exists: another writer committed on top of the
    /// base (its files may already have left the directory). A conflict.
    Taken { newest: u64 },
    /// No version at all, though the base had one: the table's metadata is gone (dropped
    /// elsewhere). A conflict: a lone `v<N>` would bring back a table someone removed.
    Gone,
}

/// Decides [`BeforeCreate`] for committing `version` when `newest` is the highest version
/// listed.
pub(crate) fn before_create(version: u64, newest: Option<u64>) -> BeforeCreate {
    match newest {
        Some(newest) if newest >= version => BeforeCreate::Taken { newest },
        Some(_) => BeforeCreate::Free,
        None if version > 1 => BeforeCreate::Gone,
        None => BeforeCreate::Free,
    }
}

/// What the listing after a create of `version` that succeeded says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCreate {
    /// Nothing above `version`: it is the table's newest version, the commit stands.
    Newest,
    /// Version `newest` above it exists: another writer went past our base between the
    /// listing and the create, and ours sits in a gap beside the table's history, not in it.
    /// (Or, rarer, a writer built on ours in the moment since: the file name and timestamp its
    /// metadata log would name cannot tell that apart from the other writer's own deleted file of
    /// the same name written in the same millisecond, so it is treated alike, as a conflict. For
    /// a streaming commit the newest version then holds this pipeline's newer checkpoint, so the
    /// conflict stops the pipeline and the restart resumes from that checkpoint: no row is lost
    /// or applied twice either way.)
    Beside { newest: u64 },
}

/// Decides [`AfterCreate`] for our `version` when `newest` is the highest version listed after
/// its create. A listing that does not show ours yet (`newest` below it) shows nothing newer.
pub(crate) fn after_create(version: u64, newest: Option<u64>) -> AfterCreate {
    match newest {
        Some(newest) if newest > version => AfterCreate::Beside { newest },
        _ => AfterCreate::Newest,
    }
}

/// The version to write into `version-hint.text` again after writing `written`, when the
/// listing after that write shows a newer version `newest`: a writer that built on ours between
/// our listing and our hint may have written its hint first, and ours would then name a version
/// below an existing one. `None`: the hint stands.
pub(crate) fn hint_again(written: u64, newest: Option<u64>) -> Option<u64> {
    newest.filter(|&n| n > written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn any_version_above_the_base_is_taken() {
        // Base v3, committing v4.
        assert_eq!(before_create(4, Some(3)), BeforeCreate::Free);
        assert_eq!(before_create(4, Some(4)), BeforeCreate::Taken { newest: 4 });
        // v4…v6 deleted by the other writer's metadata-log trimming, v7 its newest: v4's name is
        // free, the version is not.
        assert_eq!(before_create(4, Some(7)), BeforeCreate::Taken { newest: 7 });
        // A new table, and a table whose metadata vanished.
        assert_eq!(before_create(1, None), BeforeCreate::Free);
        assert_eq!(before_create(1, Some(1)), BeforeCreate::Taken { newest: 1 });
        assert_eq!(before_create(4, None), BeforeCreate::Gone);
    }

    #[test]
    fn a_create_beside_a_newer_version_is_not_the_newest() {
        assert_eq!(after_create(4, Some(4)), AfterCreate::Newest);
        // A listing that lags behind our own create shows nothing newer either.
        assert_eq!(after_create(4, Some(3)), AfterCreate::Newest);
        assert_eq!(after_create(4, None), AfterCreate::Newest);
        assert_eq!(after_create(4, Some(5)), AfterCreate::Beside { newest: 5 });
        assert_eq!(after_create(4, Some(9)), AfterCreate::Beside { newest: 9 });
    }

    #[test]
    fn a_hint_below_a_newer_version_is_written_again() {
        assert_eq!(hint_again(4, Some(4)), None);
        assert_eq!(hint_again(4, Some(3)), None);
        assert_eq!(hint_again(4, None), None);
        assert_eq!(hint_again(4, Some(5)), Some(5));
    }
}
