//! Iceberg v3 deletion vectors: the set of deleted row positions of ONE data file, and its
//! `deletion-vector-v1` blob encoding (Puffin spec, "deletion-vector-v1 blob type"; table spec,
//! "Deletion Vectors").
//!
//! Sits between the primary-key index and the Puffin writer: with `delete_mode =
//! "deletion-vectors"` (format v3) an update or delete of a row in a committed data file becomes a
//! position in that file's vector; the vector is serialized here, stored as a blob in a Puffin
//! file (`puffin/mod.rs`), and referenced from a delete manifest entry.
//!
//! Blob layout, all of it checked on read:
//!
//! ```text
//! u32 BE  length of (magic + vector)
//! D1 D3 39 64                               magic
//! u64 LE  number of 32-bit bitmaps          \
//! per bitmap: u32 LE key, 32-bit Roaring     > the "portable" 64-bit Roaring layout
//!             bitmap (standard format)      /  (RoaringFormatSpec, "Extension for 64-bit")
//! u32 BE  CRC-32 (ISO-HDLC, java.util.zip.CRC32) of magic + vector
//! ```
//!
//! The vector part is written by this module rather than by `RoaringTreemap::serialize_into`
//! only to normalize containers first; the layout is the same. roaring-rs writes the portable
//! layout (u64 LE count, then u32 LE key + standard bitmap per non-empty key). Iceberg-Java's
//! `RoaringPositionBitmap.serialize` writes a *dense* key range `0..=max_key`, empty bitmaps
//! included; both are valid (the spec asks only for ascending keys, Java's reader fills gaps), and
//! they are byte-identical whenever all positions are below 2^32, i.e. for every data file of
//! fewer than 4 billion rows. The sparse form is kept because the dense one costs 12 bytes per
//! unused key: a single position near [`MAX_POSITION`] would take 24 GiB. Reading accepts both.
//!
//! Before writing, every bitmap is normalized the way Java's `BitmapPositionDeleteIndex.serialize`
//! does it (`runLengthEncode()`): containers are first made array/bitmap as if freshly built, then
//! run-length encoded where that is smaller, with the same size rules as Java's `runOptimize`
//! (roaring-rs `optimize`). So a vector holding the same positions as one Java built by inserting
//! them serializes to the same bytes: `puffin/tests.rs` checks this on vectors Spark wrote (array,
//! bitmap and run containers, with and without the offset header).

use roaring::{RoaringBitmap, RoaringTreemap};

/// Puffin blob type of a deletion vector.
pub const DELETION_VECTOR_V1: &str = "deletion-vector-v1";

/// Magic bytes that open the vector (Iceberg-Java's `MAGIC_NUMBER` 1681511377, little-endian).
pub const MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];

/// Largest row position a vector may hold: Iceberg-Java's `RoaringPositionBitmap.MAX_POSITION`
/// (key `i32::MAX - 1`, low half `0x8000_0000`). The spec allows "positive 64-bit positions"; a
/// larger one would be unreadable by Java, so it is refused on insert.
pub const MAX_POSITION: u64 = ((i32::MAX as u64 - 1) << 32) | 0x8000_0000;

/// Largest bitmap key accepted on read (Java's `readKey`: `key <= Integer.MAX_VALUE - 1`).
const MAX_KEY: u32 = i32::MAX as u32 - 1;

/// Length prefix + magic + CRC: the smallest possible blob is these 12 bytes plus the vector.
const FRAME_BYTES: usize = 12;

/// Why a deletion vector could not be built, encoded or decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeletionVectorError {
    #[error("deletion vector blob is {len} bytes, shorter than the {FRAME_BYTES}-byte frame (length, magic, CRC)")]
    Truncated { len: usize },
    #[error("deletion vector blob declares {declared} bytes of magic + vector, but the blob of {blob_len} bytes holds {actual}")]
    LengthMismatch {
        declared: u32,
        actual: usize,
        blob_len: usize,
    },
    #[error("deletion vector blob starts with magic {found:02x?}, expected d1 d3 39 64")]
    BadMagic { found: [u8; 4] },
    #[error(
        "deletion vector blob CRC-32 is {stored:#010x}, but its content hashes to {computed:#010x}"
    )]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("deletion vector: bad 64-bit Roaring bitmap at vector byte {offset}: {reason}")]
    Bitmap { offset: usize, reason: String },
    #[error("row position {position} is above the deletion vector maximum {MAX_POSITION}")]
    PositionOutOfRange { position: u64 },
    #[error("deletion vector of {len} bytes does not fit the blob's 4-byte length field")]
    TooLarge { len: usize },
}

impl DeletionVectorError {
    /// Label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            DeletionVectorError::Truncated { .. }
            | DeletionVectorError::LengthMismatch { .. }
            | DeletionVectorError::BadMagic { .. }
            | DeletionVectorError::CrcMismatch { .. }
            | DeletionVectorError::Bitmap { .. } => "deletion_vector_corrupt",
            DeletionVectorError::PositionOutOfRange { .. }
            | DeletionVectorError::TooLarge { .. } => "deletion_vector_limit",
        }
    }
}

/// Deleted row positions (0-based, in file order) of one data file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeletionVector {
    positions: RoaringTreemap,
}

impl DeletionVector {
    /// An empty vector.
    pub fn new() -> DeletionVector {
        DeletionVector::default()
    }

    /// A vector holding `positions` (any order, duplicates allowed).
    pub fn from_positions(
        positions: impl IntoIterator<Item = u64>,
    ) -> Result<DeletionVector, DeletionVectorError> {
        let mut dv = DeletionVector::new();
        for p in positions {
            dv.insert(p)?;
        }
        Ok(dv)
    }

    /// Marks `position` deleted; `Ok(true)` if it was not already.
    pub fn insert(&mut self, position: u64) -> Result<bool, DeletionVectorError> {
        if position > MAX_POSITION {
            return Err(DeletionVectorError::PositionOutOfRange { position });
        }
        Ok(self.positions.insert(position))
    }

    /// Whether `position` is deleted.
    pub fn contains(&self, position: u64) -> bool {
        self.positions.contains(position)
    }

    /// Adds every position of `other` (a data file keeps one vector: a new delete on a file that
    /// already has one replaces it with the union).
    pub fn merge(&mut self, other: &DeletionVector) {
        self.positions |= &other.positions;
    }

    /// Number of deleted positions: the blob's `cardinality` property and the delete manifest
    /// entry's `record_count`.
    pub fn cardinality(&self) -> u64 {
        self.positions.len()
    }

    /// How many positions below `position` are deleted (where a row lands once the deleted rows
    /// before it are dropped: compaction's `moves.rs` and `redelete.rs`).
    pub fn deleted_before(&self, position: u64) -> u64 {
        match position.checked_sub(1) {
            Some(last) => self.positions.rank(last),
            None => 0,
        }
    }

    /// Whether every position `other` deletes is deleted here too.
    pub fn covers(&self, other: &DeletionVector) -> bool {
        other.positions.is_subset(&self.positions)
    }

    /// Whether no position is deleted.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Deleted positions in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.positions.iter()
    }

    /// The `deletion-vector-v1` blob bytes (see the module doc).
    pub fn serialize_blob(&self) -> Result<Vec<u8>, DeletionVectorError> {
        let mut out = Vec::new();
        self.serialize_blob_into(&mut out)?;
        Ok(out)
    }

    /// Appends the `deletion-vector-v1` blob to `out`, so that a Puffin writer can build its file
    /// in one buffer. On error `out` is left as it was.
    pub fn serialize_blob_into(&self, out: &mut Vec<u8>) -> Result<(), DeletionVectorError> {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(self.positions.bitmaps().count() as u64).to_le_bytes());
        for (key, bitmap) in self.positions.bitmaps() {
            out.extend_from_slice(&key.to_le_bytes());
            let mut normalized = bitmap.clone();
            normalized.remove_run_compression();
            normalized.optimize();
            // Writing into a Vec cannot fail; the arm keeps the contract of leaving `out` as it was.
            if let Err(e) = normalized.serialize_into(&mut *out) {
                out.truncate(start);
                return Err(DeletionVectorError::Bitmap {
                    offset: 0,
                    reason: e.to_string(),
                });
            }
        }
        let content = out.len() - start - 4;
        // Java reads the length as a signed int.
        let Ok(declared) = i32::try_from(content) else {
            out.truncate(start);
            return Err(DeletionVectorError::TooLarge { len: content });
        };
        out[start..start + 4].copy_from_slice(&declared.to_be_bytes());
        let crc = crc32fast::hash(&out[start + 4..]);
        out.extend_from_slice(&crc.to_be_bytes());
        Ok(())
    }

    /// Decodes a `deletion-vector-v1` blob, checking length, magic, CRC and the bitmap layout
    /// (ascending keys within Java's range, well-formed 32-bit bitmaps, no trailing bytes).
    pub fn deserialize_blob(blob: &[u8]) -> Result<DeletionVector, DeletionVectorError> {
        let too_short = || DeletionVectorError::Truncated { len: blob.len() };
        if blob.len() < FRAME_BYTES {
            return Err(too_short());
        }
        let (len_bytes, rest) = blob.split_first_chunk::<4>().ok_or_else(too_short)?;
        let (content, crc_bytes) = rest.split_last_chunk::<4>().ok_or_else(too_short)?;
        let declared = u32::from_be_bytes(*len_bytes);
        if usize::try_from(declared).ok() != Some(content.len()) {
            return Err(DeletionVectorError::LengthMismatch {
                declared,
                actual: content.len(),
                blob_len: blob.len(),
            });
        }
        let (magic, vector) = content.split_first_chunk::<4>().ok_or_else(too_short)?;
        if *magic != MAGIC {
            return Err(DeletionVectorError::BadMagic { found: *magic });
        }
        let stored = u32::from_be_bytes(*crc_bytes);
        let computed = crc32fast::hash(content);
        if stored != computed {
            return Err(DeletionVectorError::CrcMismatch { stored, computed });
        }
        Ok(DeletionVector {
            positions: read_portable_treemap(vector)?,
        })
    }
}

impl<'a> IntoIterator for &'a DeletionVector {
    type Item = u64;
    type IntoIter = roaring::treemap::Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.positions.iter()
    }
}

/// Reads the portable 64-bit layout strictly (`RoaringTreemap::deserialize_from` accepts
/// unsorted and duplicate keys and ignores trailing bytes; Java's reader does not).
fn read_portable_treemap(vector: &[u8]) -> Result<RoaringTreemap, DeletionVectorError> {
    let bad = |rest: &[u8], reason: String| DeletionVectorError::Bitmap {
        offset: vector.len() - rest.len(),
        reason,
    };
    let mut rest = vector;
    let Some((count, tail)) = rest.split_first_chunk::<8>() else {
        return Err(bad(rest, "missing the 8-byte bitmap count".into()));
    };
    let count = u64::from_le_bytes(*count);
    rest = tail;
    // Each bitmap takes at least 12 bytes (key + empty bitmap): a count that cannot fit is
    // rejected before looping on it.
    if count > (rest.len() / 12) as u64 {
        return Err(bad(
            rest,
            format!("bitmap count {count} does not fit in {} bytes", rest.len()),
        ));
    }
    let mut bitmaps: Vec<(u32, RoaringBitmap)> = Vec::new();
    let mut last_key: Option<u32> = None;
    for _ in 0..count {
        let Some((key, tail)) = rest.split_first_chunk::<4>() else {
            return Err(bad(rest, "truncated bitmap key".into()));
        };
        let key = u32::from_le_bytes(*key);
        if key > MAX_KEY {
            return Err(bad(rest, format!("key {key} is above {MAX_KEY}")));
        }
        if last_key.is_some_and(|last| key <= last) {
            return Err(bad(
                rest,
                format!("key {key} is not above the previous key"),
            ));
        }
        last_key = Some(key);
        rest = tail;
        let mut reader = rest;
        let bitmap = RoaringBitmap::deserialize_from(&mut reader)
            .map_err(|e| bad(rest, format!("32-bit bitmap of key {key}: {e}")))?;
        rest = reader;
        if !bitmap.is_empty() {
            bitmaps.push((key, bitmap));
        }
    }
    if !rest.is_empty() {
        return Err(bad(
            rest,
            format!("{} bytes after the last bitmap", rest.len()),
        ));
    }
    Ok(RoaringTreemap::from_bitmaps(bitmaps))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
