//! Buffers of streamed in-progress transactions: each top-level xid's raw pgoutput payloads (with
//! the subtransaction xid that sent them) in memory up to a total byte bound, then in a spill file.
//!
//! Where it sits: `assembler/mod.rs` pushes every data message of a Stream Start … Stream Stop block here
//! and, on Stream Commit, replays the xid's payloads through the ordinary change path. Payloads
//! stay raw (`Bytes` slices of the received frame) because decoding borrows from them and because
//! an aborted transaction should cost nothing but its bytes.
//!
//! Spill format: records of `subxid: u32 BE`, `len: u32 BE`, `payload`. Once an xid spills, every
//! later payload of it is appended to its file, so the file alone holds the xid in order. A
//! subtransaction abort of a spilled xid is remembered and its records are skipped on replay.
//! Files are removed when the xid commits or aborts, and on drop.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::sources::SourceError;

/// Distinguishes spill files of one process (several assemblers may share a spill dir).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// All in-progress streamed transactions.
pub struct StreamBuffers {
    limit: usize,
    dir: PathBuf,
    in_memory: usize,
    xids: HashMap<u32, Buffered>,
}

/// One top-level xid's messages.
#[derive(Default)]
pub struct Buffered {
    entries: Vec<(u32, Bytes)>,
    bytes: usize,
    spill: Option<SpillFile>,
    aborted: HashSet<u32>,
}

impl StreamBuffers {
    /// `limit`: bytes of payload held in memory across all xids before the largest spills.
    pub fn new(limit: usize, dir: PathBuf) -> Self {
        StreamBuffers {
            limit,
            dir,
            in_memory: 0,
            xids: HashMap::new(),
        }
    }

    #[cfg(test)]
    /// Whether any streamed transaction is open (received but neither committed nor aborted).
    pub fn is_empty(&self) -> bool {
        self.xids.is_empty()
    }

    /// Payload bytes held in memory now.
    pub fn memory_bytes(&self) -> usize {
        self.in_memory
    }

    #[cfg(test)]
    /// Whether `xid` has been spilled to a file.
    pub fn is_spilled(&self, xid: u32) -> bool {
        self.xids.get(&xid).is_some_and(|b| b.spill.is_some())
    }

    /// Appends one payload of top-level `xid`, sent by (sub)transaction `subxid`.
    pub fn push(&mut self, xid: u32, subxid: u32, payload: Bytes) -> Result<(), SourceError> {
        let buf = self.xids.entry(xid).or_default();
        if let Some(spill) = &mut buf.spill {
            return spill.append(subxid, &payload);
        }
        buf.bytes += payload.len();
        self.in_memory += payload.len();
        buf.entries.push((subxid, payload));
        while self.in_memory > self.limit {
            if !self.spill_largest()? {
                break;
            }
        }
        Ok(())
    }

    /// Moves the largest in-memory xid to a spill file. False when nothing is left in memory.
    fn spill_largest(&mut self) -> Result<bool, SourceError> {
        let Some((&xid, _)) = self
            .xids
            .iter()
            .filter(|(_, b)| b.spill.is_none() && b.bytes > 0)
            .max_by_key(|(_, b)| b.bytes)
        else {
            return Ok(false);
        };
        let Some(buf) = self.xids.get_mut(&xid) else {
            return Ok(false);
        };
        let mut file = SpillFile::create(&self.dir, xid)?;
        for (subxid, payload) in buf.entries.drain(..) {
            file.append(subxid, &payload)?;
        }
        tracing::info!(xid, bytes = buf.bytes, path = %file.path.display(), "streamed transaction spilled to disk");
        self.in_memory -= buf.bytes;
        buf.bytes = 0;
        buf.entries = Vec::new();
        buf.spill = Some(file);
        Ok(true)
    }

    /// Stream Abort: `subxid == xid` drops the whole transaction, else only that
    /// subtransaction's messages.
    pub fn abort(&mut self, xid: u32, subxid: u32) {
        if xid == subxid {
            if let Some(buf) = self.xids.remove(&xid) {
                self.in_memory -= buf.bytes;
            }
            return;
        }
        let Some(buf) = self.xids.get_mut(&xid) else {
            return;
        };
        if buf.spill.is_some() {
            buf.aborted.insert(subxid);
            return;
        }
        let before = buf.bytes;
        buf.entries.retain(|(s, _)| *s != subxid);
        buf.bytes = buf.entries.iter().map(|(_, p)| p.len()).sum();
        self.in_memory -= before - buf.bytes;
    }

    /// Removes `xid` for replay (Stream Commit). `None`: nothing was streamed for it.
    pub fn take(&mut self, xid: u32) -> Option<Buffered> {
        let buf = self.xids.remove(&xid)?;
        self.in_memory -= buf.bytes;
        Some(buf)
    }
}

impl Buffered {
    /// Calls `f` with every payload in order, skipping aborted subtransactions. Removes the spill
    /// file afterwards (also on error, through drop).
    pub fn replay(
        self,
        mut f: impl FnMut(&[u8]) -> Result<(), SourceError>,
    ) -> Result<(), SourceError> {
        for (_, payload) in &self.entries {
            f(payload)?;
        }
        if let Some(spill) = self.spill {
            let mut reader = spill.reader()?;
            let mut buf = Vec::new();
            while let Some(subxid) = reader.next_record(&mut buf)? {
                if !self.aborted.contains(&subxid) {
                    f(&buf)?;
                }
            }
        }
        Ok(())
    }
}

/// A spill file being written; removed on drop.
struct SpillFile {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl SpillFile {
    fn create(dir: &Path, xid: u32) -> Result<Self, SourceError> {
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("cdcd-{}-{xid}-{n}.spill", std::process::id()));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| spill_error(&path, e))?;
        Ok(SpillFile {
            path,
            writer: Some(BufWriter::with_capacity(256 * 1024, file)),
        })
    }

    fn append(&mut self, subxid: u32, payload: &[u8]) -> Result<(), SourceError> {
        let len = u32::try_from(payload.len()).map_err(|_| {
            spill_error(
                &self.path,
                std::io::Error::new(ErrorKind::InvalidInput, "message over 4 GiB"),
            )
        })?;
        let Some(w) = self.writer.as_mut() else {
            return Err(spill_error(
                &self.path,
                std::io::Error::other("spill file already closed"),
            ));
        };
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&subxid.to_be_bytes());
        header[4..].copy_from_slice(&len.to_be_bytes());
        w.write_all(&header)
            .and_then(|_| w.write_all(payload))
            .map_err(|e| spill_error(&self.path, e))
    }

    /// Flushes the writer and reopens the file for reading. The file is still removed on drop of
    /// the returned reader.
    fn reader(mut self) -> Result<SpillReader, SourceError> {
        if let Some(mut w) = self.writer.take() {
            w.flush().map_err(|e| spill_error(&self.path, e))?;
        }
        let file = File::open(&self.path).map_err(|e| spill_error(&self.path, e))?;
        Ok(SpillReader {
            reader: BufReader::with_capacity(256 * 1024, file),
            _file: self,
        })
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.writer = None;
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove spill file");
            }
        }
    }
}

struct SpillReader {
    reader: BufReader<File>,
    _file: SpillFile,
}

impl SpillReader {
    /// Reads the next record into `buf`; returns its subxid, or `None` at the end.
    fn next_record(&mut self, buf: &mut Vec<u8>) -> Result<Option<u32>, SourceError> {
        let mut header = [0u8; 8];
        match self.reader.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(spill_error(&self._file.path, e)),
        }
        let [s0, s1, s2, s3, l0, l1, l2, l3] = header;
        let subxid = u32::from_be_bytes([s0, s1, s2, s3]);
        let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
        buf.clear();
        buf.resize(len, 0);
        self.reader
            .read_exact(buf)
            .map_err(|e| spill_error(&self._file.path, e))?;
        Ok(Some(subxid))
    }
}

fn spill_error(path: &Path, source: std::io::Error) -> SourceError {
    SourceError::Spill {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(buf: Buffered) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        buf.replay(|p| {
            out.push(p.to_vec());
            Ok(())
        })
        .unwrap();
        out
    }

    fn files(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn spills_past_the_bound_and_replays_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StreamBuffers::new(10, dir.path().to_path_buf());
        s.push(7, 7, Bytes::from_static(b"aaaa")).unwrap();
        s.push(8, 8, Bytes::from_static(b"x")).unwrap();
        s.push(7, 9, Bytes::from_static(b"bbbb")).unwrap();
        assert!(!s.is_spilled(7));
        s.push(7, 9, Bytes::from_static(b"cccc")).unwrap();
        assert!(s.is_spilled(7), "largest xid spills");
        assert_eq!(s.memory_bytes(), 1);
        s.push(7, 10, Bytes::from_static(b"dd")).unwrap();
        assert_eq!(files(dir.path()), 1);
        s.abort(7, 9);
        let buf = s.take(7).unwrap();
        assert_eq!(collect(buf), vec![b"aaaa".to_vec(), b"dd".to_vec()]);
        assert_eq!(files(dir.path()), 0, "spill file removed after replay");
        assert_eq!(collect(s.take(8).unwrap()), vec![b"x".to_vec()]);
    }

    #[test]
    fn abort_drops_memory_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StreamBuffers::new(4, dir.path().to_path_buf());
        s.push(1, 1, Bytes::from_static(b"12345")).unwrap();
        assert_eq!(files(dir.path()), 1);
        s.push(2, 3, Bytes::from_static(b"12")).unwrap();
        s.push(2, 2, Bytes::from_static(b"1")).unwrap();
        s.abort(2, 3);
        assert_eq!(s.memory_bytes(), 1);
        s.abort(1, 1);
        assert_eq!(files(dir.path()), 0);
        s.abort(2, 2);
        assert!(s.is_empty());
        assert_eq!(s.memory_bytes(), 0);
    }

    #[test]
    fn dropping_the_buffers_removes_spill_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StreamBuffers::new(1, dir.path().to_path_buf());
        s.push(1, 1, Bytes::from_static(b"12345")).unwrap();
        assert_eq!(files(dir.path()), 1);
        drop(s);
        assert_eq!(files(dir.path()), 0);
    }
}
