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

use std::fmt;
use std::io::{ErrorKind, Write};

use async_trait::async_trait;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, PutResult, Result};

use super::layer::{Layer, Layered};

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
                Err(source) => {
                    return Err(object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: Box::new(source),
                    })
                }
            }
        }
        self.inner.put_opts(path, payload, opts).await
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
