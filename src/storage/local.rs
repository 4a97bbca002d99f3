//! [`LocalFiles`]: the local-disk store (object_store's `LocalFileSystem`), with small files
//! under fresh names ([`fresh`]) written in place.
//!
//! object_store writes every local put to a staging file (`<path>#<n>`) on tokio's blocking pool
//! and renames it onto the path, so that a reader never sees a file half written and a put
//! replaces an existing file atomically. A file named after its commit's id (a data file, a
//! deletion vector's Puffin file, a manifest, a manifest list) needs neither: nothing names it
//! until the commit that wrote it is published, after its put returned, and no file had its name
//! before. A commit of moving updates on a day-partitioned table writes ~1,200 such files a
//! second (issue 36), and per file the hand-off to the blocking pool and back and the rename
//! were a fifth of cdcd's CPU. So a put marked [`fresh`] of at most [`IN_PLACE_BYTES`] is
//! created under its own name (`O_EXCL`) and written on the calling thread: a few tens of
//! microseconds of system calls, less than the hand-off. If the name exists after all, the put
//! goes the staged way and replaces it, as any put does. A crash mid-write leaves a partial file
//! no metadata names, as it left a staging file before (`cdcd cleanup` removes both).
//!
//! A listing after an offset ([`list_after`]) compares names before it looks at any file. The
//! filesystem catalog lists a table's `metadata/` after `metadata/v` three times per commit, to
//! find the `v<N>.metadata.json` files among the table's manifests and manifest lists (thousands
//! on a busy table). object_store walks the directory following links, so it `stat`s every entry
//! twice and turns every entry's absolute path into a location before comparing it: with 1,000
//! tables (issue 37) that was a fifth of cdcd's CPU for a few dozen files each time. Here a
//! directory is read (names and types, no `stat`), each name is compared as a location, and only
//! the files after the offset are `stat`ed, with the same answer object_store gives: every file
//! under the prefix (recursively, links followed) whose location sorts after the offset, except
//! object_store's own staging files (`<name>#<digits>`), with its size, time and ETag.

use std::fmt;
use std::io::{ErrorKind, Write};
use std::time::SystemTime;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, PutMode, PutOptions, PutPayload, PutResult, Result};

use super::layer::{Answers, Layer, Layered};

/// Fresh puts up to this size are written in place on the calling thread.
pub const IN_PLACE_BYTES: usize = 256 * 1024;

/// Marks a put as one of a file under a name no file had before ([`fresh`]).
#[derive(Debug, Clone, Copy)]
struct FreshName;

/// Options of a put of a file under a name no file had before, e.g. named after its commit's
/// id; other stores than [`LocalFiles`] ignore the mark.
pub fn fresh() -> PutOptions {
    let mut opts = PutOptions::default();
    opts.extensions.insert(FreshName);
    opts
}

/// The local store; see the module doc.
#[derive(Debug)]
pub struct LocalFiles {
    inner: LocalFileSystem,
}

impl LocalFiles {
    #[allow(clippy::new_ret_no_self)] // the wrapper is only ever used as a store
    pub fn new() -> Layered<LocalFiles> {
        Layered(LocalFiles {
            inner: LocalFileSystem::new(),
        })
    }
}

impl fmt::Display for LocalFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
impl Layer for LocalFiles {
    fn inner(&self) -> &dyn ObjectStore {
        &self.inner
    }

    async fn put(&self, path: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let in_place = matches!(opts.mode, PutMode::Overwrite)
            && opts.extensions.get::<FreshName>().is_some()
            && opts.attributes.is_empty()
            && payload.content_length() <= IN_PLACE_BYTES;
        if in_place {
            let file = self.inner.path_to_filesystem(path)?;
            match write_new(&file, &payload) {
                Ok(()) => {
                    // Written without yielding: give the runtime its turn as a put that
                    // waited on the blocking pool would have.
                    tokio::task::consume_budget().await;
                    return Ok(PutResult {
                        e_tag: None,
                        version: None,
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(source) => return Err(local_error(source)),
            }
        }
        self.inner.put_opts(path, payload, opts).await
    }

    fn list_after(&self, prefix: Option<&Path>, offset: &Path) -> Answers<ObjectMeta> {
        let prefix = prefix.cloned().unwrap_or_default();
        let dir = match self.inner.path_to_filesystem(&prefix) {
            Ok(dir) => dir,
            Err(e) => return stream::once(async move { Err(e) }).boxed(),
        };
        let offset = offset.clone();
        stream::once(async move {
            let listed = tokio::task::spawn_blocking(move || list_after(&dir, &prefix, &offset))
                .await
                .map_err(|e| local_error(std::io::Error::other(e.to_string())))?;
            listed.map(|objects| stream::iter(objects.into_iter().map(Ok)))
        })
        .map(|listed| match listed {
            Ok(objects) => objects.boxed(),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .boxed()
    }
}

/// The files under `dir` (the location `prefix`) whose locations sort after `offset`, in no
/// particular order (as object_store's listing); see the module doc.
fn list_after(dir: &std::path::Path, prefix: &Path, offset: &Path) -> Result<Vec<ObjectMeta>> {
    let mut found = Vec::new();
    let mut dirs = vec![(dir.to_path_buf(), prefix.clone())];
    while let Some((dir, at)) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(local_error(e)),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(local_error(e)),
            };
            let name = entry.file_name();
            // A name that is not UTF-8 is not plain: object_store's conversion below fails the
            // listing for it, as object_store's own listing does.
            let name = name.to_str();
            let plain = name.filter(|n| is_plain(n));
            let mut kind = match entry.file_type() {
                Ok(kind) => kind,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(local_error(e)),
            };
            let linked = kind.is_symlink();
            if linked {
                // Followed, as object_store does; a broken link is left out.
                match std::fs::metadata(entry.path()) {
                    Ok(target) => kind = target.file_type(),
                    Err(_) => continue,
                }
            }
            // A plain name's location is `at/name`: compared in place, no location is built
            // for the many entries before the offset.
            if kind.is_file() && plain.is_some_and(|n| !sorts_after(&at, n, offset)) {
                continue;
            }
            if !kind.is_dir() && !kind.is_file() {
                continue;
            }
            let location = if let Some(name) = plain {
                at.clone().join(name)
            } else {
                Path::from_absolute_path(entry.path())?
            };
            if kind.is_dir() {
                dirs.push((entry.path(), location));
                continue;
            }
            if location <= *offset || location.filename().is_some_and(is_staging) {
                continue;
            }
            // The entry's own metadata is looked up from its directory, not along its path.
            let meta = if linked {
                std::fs::metadata(entry.path())
            } else {
                entry.metadata()
            };
            match meta {
                Ok(meta) => found.push(object_meta(location, &meta)),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(local_error(e)),
            }
        }
    }
    Ok(found)
}

/// A name whose location part is itself (no encoding, which all of cdcd's names need not);
/// other names take object_store's own conversion of the whole path, whose encoding of unusual
/// characters is not `PathPart`'s.
fn is_plain(name: &str) -> bool {
    !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'='))
}

/// Whether the location `at/name` sorts after `offset` (locations order as their strings).
fn sorts_after(at: &Path, name: &str, offset: &Path) -> bool {
    let at: &str = at.as_ref();
    let separator: &[u8] = if at.is_empty() { b"" } else { b"/" };
    let location = at
        .bytes()
        .chain(separator.iter().copied())
        .chain(name.bytes());
    location.cmp(offset.as_ref().bytes()) == std::cmp::Ordering::Greater
}

/// object_store's staging file of a put in progress: `<name>#<digits>`.
fn is_staging(name: &str) -> bool {
    name.split_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What object_store's listing says of a local file: its size, modification time and ETag
/// (`<inode>-<mtime µs>-<size>` in hex, as `LocalFileSystem` makes it).
fn object_meta(location: Path, meta: &std::fs::Metadata) -> ObjectMeta {
    use std::os::unix::fs::MetadataExt;
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let micros = modified
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    ObjectMeta {
        location,
        last_modified: modified.into(),
        size: meta.len(),
        e_tag: Some(format!("{:x}-{:x}-{:x}", meta.ino(), micros, meta.len())),
        version: None,
    }
}

fn local_error(source: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(source),
    }
}

/// Creates `file` (never over an existing one), its directories as needed, and writes `payload`
/// into it; a failed write leaves no file behind.
fn write_new(file: &std::path::Path, payload: &PutPayload) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    let mut out = match options.open(file) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            options.open(file)?
        }
        opened => opened?,
    };
    let written = payload.iter().try_for_each(|chunk| out.write_all(chunk));
    drop(out);
    if let Err(e) = written {
        let _ = std::fs::remove_file(file);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;

    fn path_of(dir: &std::path::Path, rest: &str) -> Path {
        Path::from_absolute_path(dir.join(rest)).unwrap()
    }

    async fn read(store: &Layered<LocalFiles>, path: &Path) -> bytes::Bytes {
        store.get(path).await.unwrap().bytes().await.unwrap()
    }

    /// A fresh put creates its directories and writes in place: no staging file is left, and
    /// the bytes read back.
    #[tokio::test]
    async fn a_fresh_put_writes_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFiles::new();
        let path = path_of(dir.path(), "t/data/a=1/f.parquet");
        store
            .put_opts(&path, PutPayload::from_static(b"abc"), fresh())
            .await
            .unwrap();
        let got = read(&store, &path).await;
        assert_eq!(&got[..], b"abc");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("t/data/a=1"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["f.parquet"]);
    }

    /// A listing after an offset answers what object_store's does (the same files, sizes,
    /// times and ETags): names on both sides of the offset, a subdirectory, a staging file, a
    /// name that needs encoding, a link to a file and a broken one, and a prefix that does not
    /// exist.
    #[tokio::test]
    async fn a_listing_after_an_offset_answers_what_object_stores_does() {
        use futures::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("t/metadata");
        std::fs::create_dir_all(meta.join("sub/a=1")).unwrap();
        for name in [
            "snap-1-abc.avro",
            "0b1-m0.avro",
            "v1.metadata.json",
            "v12.metadata.json",
            "version-hint.text",
            "v2.metadata.json#3",
            "v3 odd%name.json",
            "sub/v9.metadata.json",
            "sub/a=1/x-y_z.parquet",
        ] {
            std::fs::write(meta.join(name), name.as_bytes()).unwrap();
        }
        std::os::unix::fs::symlink(meta.join("v1.metadata.json"), meta.join("vlink.json")).unwrap();
        std::os::unix::fs::symlink(meta.join("gone"), meta.join("vbroken.json")).unwrap();
        let ours = LocalFiles::new();
        let theirs = LocalFileSystem::new();
        let listed = |store: &dyn ObjectStore, prefix: Path, offset: Path| {
            let mut got: Vec<ObjectMeta> = futures::executor::block_on(
                store
                    .list_with_offset(Some(&prefix), &offset)
                    .try_collect::<Vec<_>>(),
            )
            .unwrap();
            got.sort_by(|a, b| a.location.cmp(&b.location));
            got
        };
        for (prefix, offset) in [
            ("t/metadata", "t/metadata/v"),
            ("t/metadata", "t/metadata/v12.metadata.json"),
            ("t/metadata", "t/metadata/0"),
            ("t", "t/metadata/v"),
            ("t/missing", "t/missing/v"),
        ] {
            let prefix = path_of(dir.path(), prefix);
            let offset = path_of(dir.path(), offset);
            let want = listed(&theirs, prefix.clone(), offset.clone());
            let got = listed(&ours, prefix, offset);
            assert_eq!(got, want);
        }
        let all = listed(
            &ours,
            path_of(dir.path(), "t/metadata"),
            path_of(dir.path(), "t/metadata/v"),
        );
        let names: Vec<&str> = all.iter().filter_map(|o| o.location.filename()).collect();
        assert_eq!(
            names,
            [
                "v1.metadata.json",
                "v12.metadata.json",
                "v3 odd%name.json",
                "version-hint.text",
                "vlink.json"
            ]
        );
    }

    /// A name with no location (not UTF-8) fails the listing, as it fails object_store's: a
    /// version file the listing cannot name is never passed over in silence.
    #[tokio::test]
    async fn a_name_without_a_location_fails_the_listing_as_object_stores_does() {
        use futures::TryStreamExt;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("t/metadata");
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(meta.join("v1.metadata.json"), b"1").unwrap();
        std::fs::write(meta.join(std::ffi::OsStr::from_bytes(b"v2\xff.json")), b"2").unwrap();
        let prefix = path_of(dir.path(), "t/metadata");
        let offset = path_of(dir.path(), "t/metadata/v");
        let ours = LocalFiles::new();
        let theirs = LocalFileSystem::new();
        for (which, store) in [
            ("ours", &ours as &dyn ObjectStore),
            ("object_store's", &theirs),
        ] {
            let listed = store
                .list_with_offset(Some(&prefix), &offset)
                .try_collect::<Vec<_>>()
                .await;
            assert!(listed.is_err(), "{which}: {listed:?}");
        }
    }

    /// A fresh put over an existing file replaces it, as any put does.
    #[tokio::test]
    async fn a_fresh_put_over_an_existing_file_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFiles::new();
        let path = path_of(dir.path(), "f.avro");
        store
            .put(&path, PutPayload::from_static(b"old bytes"))
            .await
            .unwrap();
        store
            .put_opts(&path, PutPayload::from_static(b"new"), fresh())
            .await
            .unwrap();
        let got = read(&store, &path).await;
        assert_eq!(&got[..], b"new");
    }

    /// A large fresh put and a create-if-absent take object_store's way: the create still
    /// refuses an existing file.
    #[tokio::test]
    async fn large_and_conditional_puts_are_object_stores() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFiles::new();
        let big = path_of(dir.path(), "big.parquet");
        let bytes = vec![7u8; IN_PLACE_BYTES + 1];
        store
            .put_opts(&big, PutPayload::from(bytes.clone()), fresh())
            .await
            .unwrap();
        let got = read(&store, &big).await;
        assert_eq!(got.len(), bytes.len());
        let meta = path_of(dir.path(), "v1.metadata.json");
        let create = || PutOptions::from(PutMode::Create);
        store
            .put_opts(&meta, PutPayload::from_static(b"1"), create())
            .await
            .unwrap();
        let again = store
            .put_opts(&meta, PutPayload::from_static(b"2"), create())
            .await;
        assert!(matches!(
            again,
            Err(object_store::Error::AlreadyExists { .. })
        ));
    }
}
