//! Puffin files holding deletion vectors: build one in memory ([`PuffinWriter`]) and parse one
//! ([`PuffinReader`]) (Iceberg Puffin spec, "File structure", "Footer structure",
//! "deletion-vector-v1 blob type").
//!
//! Sits after `deletion_vector/mod.rs` in the v3 commit path: the vectors of one commit go into one
//! Puffin file, and each blob's `(offset, length)` becomes the `content_offset` /
//! `content_size_in_bytes` of its delete manifest entry, whose `referenced_data_file` equals the
//! blob's `referenced-data-file` property (table spec, "Deletion Vectors"). Pure: the caller
//! stores and fetches the bytes, and adds the Puffin file's path to errors.
//!
//! ```text
//! PFA1  blob₁ … blobₙ  PFA1 FooterPayload(JSON) PayloadSize(i32 LE) Flags(4 bytes) PFA1
//! ```
//!
//! Why not iceberg-rust's `puffin` module: its writer and reader need a `FileIO` and async I/O,
//! and the blob metadata fields are crate-private; here the file is a `Vec<u8>` the commit path
//! uploads create-if-absent, as it does manifests. A test checks that iceberg's reader reads what
//! this writer produces. The footer JSON follows Iceberg-Java's `FileMetadataParser` (compact,
//! same keys in the same order, `fields: [2147483645]` for `_pos`, `snapshot-id` and
//! `sequence-number` -1): given the same `created-by`, a file equals Java's byte for byte
//! (tested on the Iceberg-Java fixture in `puffin/tests.rs`).

use std::collections::HashSet;
use std::fmt;

use bytes::Bytes;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::deletion_vector::{DeletionVector, DeletionVectorError, DELETION_VECTOR_V1};

/// Magic at the start of the file and at both ends of the footer ("Puffin Fratercula arctica, v1").
pub const MAGIC: [u8; 4] = *b"PFA1";

/// Blob property: location of the data file a deletion vector applies to, equal to that file's
/// `file_path` in its manifest entry.
pub const REFERENCED_DATA_FILE: &str = "referenced-data-file";

/// Blob property: number of deleted positions, in decimal.
pub const CARDINALITY: &str = "cardinality";

/// File property naming the writer (Puffin spec, "Common properties").
pub const CREATED_BY: &str = "created-by";

/// The field id Iceberg-Java lists in a deletion vector's `fields`: the reserved `_pos` metadata
/// column (`MetadataColumns.ROW_POSITION`, `Integer.MAX_VALUE - 2`).
pub const ROW_POSITION_FIELD_ID: i32 = i32::MAX - 2;

/// Flags byte 0, bit 0: the footer payload is LZ4-compressed.
const FLAG_FOOTER_COMPRESSED: u8 = 0x01;

/// Footer bytes around the payload: magic before it; size, flags, magic after it.
const FOOTER_FIXED_BYTES: usize = 4 + 4 + 4 + 4;

/// Blob metadata in the footer (Puffin spec, "BlobMetadata").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlobMetadata {
    #[serde(rename = "type")]
    pub blob_type: String,
    pub fields: Vec<i32>,
    pub snapshot_id: i64,
    pub sequence_number: i64,
    pub offset: u64,
    pub length: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_codec: Option<String>,
    #[serde(default, skip_serializing_if = "Properties::is_empty")]
    pub properties: Properties,
}

/// The footer payload (Puffin spec, "FileMetadata").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    pub blobs: Vec<BlobMetadata>,
    #[serde(default, skip_serializing_if = "Properties::is_empty")]
    pub properties: Properties,
}

/// A JSON object of string properties that keeps its order, so that a footer is written in the
/// order Iceberg-Java writes it (`referenced-data-file`, then `cardinality`) and a file can be
/// compared with Java's byte for byte. Order carries no meaning in the spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties(Vec<(String, String)>);

impl Properties {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, in place if present, else at the end.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// Whether there is no property.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Properties in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Properties;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of string properties")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Properties, A::Error> {
                let mut out = Properties::default();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

/// Where one deletion vector landed in a Puffin file: what its delete manifest entry must say
/// (`file_path` = the Puffin file, `file_format` = PUFFIN, `record_count` = `cardinality`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionVectorBlob {
    pub referenced_data_file: String,
    pub content_offset: u64,
    pub content_size_in_bytes: u64,
    pub cardinality: u64,
}

/// Why a Puffin file could not be written or read. Offsets are file offsets; the caller adds the
/// file's path.
#[derive(Debug, thiserror::Error)]
pub enum PuffinError {
    #[error("Puffin file of {len} bytes is too short for a header and footer")]
    Truncated { len: usize },
    #[error("Puffin magic expected at byte {offset}, found {found:02x?}")]
    BadMagic { offset: u64, found: [u8; 4] },
    #[error("Puffin footer payload size {size} does not fit a file of {file_len} bytes")]
    FooterSize { size: i32, file_len: usize },
    #[error("Puffin footer payload is compressed (flags {flags:02x?}); only uncompressed footers are read")]
    CompressedFooter { flags: [u8; 4] },
    #[error("Puffin footer payload is not valid FileMetadata JSON: {0}")]
    FooterJson(#[from] serde_json::Error),
    #[error("Puffin blob at {offset}+{length} lies outside the blob area [4, {blobs_end})")]
    BlobOutOfRange {
        offset: u64,
        length: u64,
        blobs_end: u64,
    },
    #[error("Puffin blob at {offset} is a {found:?}, expected {DELETION_VECTOR_V1:?}")]
    NotADeletionVector { offset: u64, found: String },
    #[error("deletion vector blob at {offset} is compressed with {codec:?}; deletion-vector-v1 must not be")]
    CompressedDeletionVector { offset: u64, codec: String },
    #[error("deletion vector blob at {offset}: property {name:?} {problem}")]
    Property {
        offset: u64,
        name: &'static str,
        problem: String,
    },
    #[error("deletion vector of {referenced_data_file} at {offset}: property cardinality {declared} but the vector holds {actual}")]
    CardinalityMismatch {
        referenced_data_file: String,
        offset: u64,
        declared: u64,
        actual: u64,
    },
    #[error("second deletion vector for {referenced_data_file} in one Puffin file")]
    DuplicateDataFile { referenced_data_file: String },
    #[error("deletion vector of {referenced_data_file} at {offset}: {source}")]
    DeletionVector {
        referenced_data_file: String,
        offset: u64,
        #[source]
        source: DeletionVectorError,
    },
    #[error("Puffin footer payload of {len} bytes exceeds the 4-byte size field")]
    FooterTooLarge { len: usize },
}

impl PuffinError {
    /// Label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            PuffinError::DuplicateDataFile { .. } | PuffinError::FooterTooLarge { .. } => {
                "puffin_write"
            }
            PuffinError::DeletionVector { source, .. } => source.kind(),
            _ => "puffin_corrupt",
        }
    }
}

/// Builds one Puffin file of deletion vectors in memory.
///
/// Blobs are appended as they are added, so the returned offsets are final; [`finish`] appends
/// the footer. At most one vector per data file (the table spec allows one per data file and
/// snapshot).
///
/// [`finish`]: PuffinWriter::finish
#[derive(Debug)]
pub struct PuffinWriter {
    buf: Vec<u8>,
    blobs: Vec<BlobMetadata>,
    data_files: HashSet<String>,
    properties: Properties,
}

impl Default for PuffinWriter {
    fn default() -> Self {
        PuffinWriter::new()
    }
}

impl PuffinWriter {
    /// An empty file, `created-by` = `cdcd <version>`.
    pub fn new() -> PuffinWriter {
        let mut properties = Properties::default();
        properties.insert(CREATED_BY, concat!("cdcd ", env!("CARGO_PKG_VERSION")));
        PuffinWriter {
            buf: MAGIC.to_vec(),
            blobs: Vec::new(),
            data_files: HashSet::new(),
            properties,
        }
    }

    /// Appends `dv` as the deletion vector of `referenced_data_file` (its exact `file_path` in
    /// table metadata) and says where it landed.
    pub fn add_deletion_vector(
        &mut self,
        referenced_data_file: &str,
        dv: &DeletionVector,
    ) -> Result<DeletionVectorBlob, PuffinError> {
        if self.data_files.contains(referenced_data_file) {
            return Err(PuffinError::DuplicateDataFile {
                referenced_data_file: referenced_data_file.to_owned(),
            });
        }
        let offset = self.buf.len() as u64;
        dv.serialize_blob_into(&mut self.buf)
            .map_err(|source| PuffinError::DeletionVector {
                referenced_data_file: referenced_data_file.to_owned(),
                offset,
                source,
            })?;
        let length = self.buf.len() as u64 - offset;
        let cardinality = dv.cardinality();
        let mut properties = Properties::default();
        properties.insert(REFERENCED_DATA_FILE, referenced_data_file);
        properties.insert(CARDINALITY, cardinality.to_string());
        // snapshot-id and sequence-number are not known before the commit: -1 (Puffin spec).
        self.blobs.push(BlobMetadata {
            blob_type: DELETION_VECTOR_V1.to_owned(),
            fields: vec![ROW_POSITION_FIELD_ID],
            snapshot_id: -1,
            sequence_number: -1,
            offset,
            length,
            compression_codec: None,
            properties,
        });
        self.data_files.insert(referenced_data_file.to_owned());
        Ok(DeletionVectorBlob {
            referenced_data_file: referenced_data_file.to_owned(),
            content_offset: offset,
            content_size_in_bytes: length,
            cardinality,
        })
    }

    /// Replaces the file's `created-by` property (default `cdcd <version>`).
    pub fn with_created_by(mut self, created_by: &str) -> PuffinWriter {
        self.properties.insert(CREATED_BY, created_by);
        self
    }

    /// Number of blobs added so far.
    pub fn blob_count(&self) -> usize {
        self.blobs.len()
    }

    /// The file's bytes: header, blobs, footer. Its length is the delete file's
    /// `file_size_in_bytes`.
    pub fn finish(self) -> Result<Vec<u8>, PuffinError> {
        let PuffinWriter {
            mut buf,
            blobs,
            properties,
            ..
        } = self;
        let payload = serde_json::to_vec(&FileMetadata { blobs, properties })?;
        let size = i32::try_from(payload.len())
            .map_err(|_| PuffinError::FooterTooLarge { len: payload.len() })?;
        buf.reserve(payload.len() + FOOTER_FIXED_BYTES);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&payload);
        buf.extend_from_slice(&size.to_le_bytes());
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&MAGIC);
        Ok(buf)
    }
}

/// A parsed Puffin file: its footer, and its blobs on demand.
#[derive(Debug, Clone)]
pub struct PuffinReader {
    file: Bytes,
    metadata: FileMetadata,
    /// First byte of the footer: blobs lie in `[4, blobs_end)`.
    blobs_end: u64,
}

impl PuffinReader {
    /// Parses the footer of a whole file, checking the three magics, the payload size and flags,
    /// and that every blob lies between the header and the footer.
    pub fn new(file: Bytes) -> Result<PuffinReader, PuffinError> {
        let len = file.len();
        if len < MAGIC.len() + FOOTER_FIXED_BYTES {
            return Err(PuffinError::Truncated { len });
        }
        let chunk_at = |offset: usize| -> Result<[u8; 4], PuffinError> {
            file.get(offset..)
                .and_then(|s| s.first_chunk::<4>())
                .copied()
                .ok_or(PuffinError::Truncated { len })
        };
        let magic_at = |offset: usize| -> Result<(), PuffinError> {
            let found = chunk_at(offset)?;
            if found == MAGIC {
                Ok(())
            } else {
                Err(PuffinError::BadMagic {
                    offset: offset as u64,
                    found,
                })
            }
        };
        magic_at(0)?;
        magic_at(len - 4)?;
        let size = i32::from_le_bytes(chunk_at(len - 12)?);
        let flags = chunk_at(len - 8)?;
        if flags[0] & FLAG_FOOTER_COMPRESSED != 0 {
            return Err(PuffinError::CompressedFooter { flags });
        }
        // Footer = magic + payload + 12; it must start at or after the header magic.
        let footer_start = usize::try_from(size)
            .ok()
            .and_then(|s| len.checked_sub(s + FOOTER_FIXED_BYTES))
            .filter(|start| *start >= MAGIC.len())
            .ok_or(PuffinError::FooterSize {
                size,
                file_len: len,
            })?;
        magic_at(footer_start)?;
        let payload = file
            .get(footer_start + 4..len - 12)
            .ok_or(PuffinError::Truncated { len })?;
        let metadata: FileMetadata = serde_json::from_slice(payload)?;
        let blobs_end = footer_start as u64;
        for b in &metadata.blobs {
            blob_range(b.offset, b.length, blobs_end)?;
        }
        Ok(PuffinReader {
            file,
            metadata,
            blobs_end,
        })
    }

    /// The footer payload.
    pub fn metadata(&self) -> &FileMetadata {
        &self.metadata
    }

    /// The footer's blob list, in file order.
    pub fn blobs(&self) -> &[BlobMetadata] {
        &self.metadata.blobs
    }

    /// The raw bytes at `(offset, length)`, e.g. a delete manifest entry's `content_offset` /
    /// `content_size_in_bytes`; must lie in the blob area.
    pub fn read_blob(&self, offset: u64, length: u64) -> Result<Bytes, PuffinError> {
        let (start, end) = blob_range(offset, length, self.blobs_end)?;
        Ok(self.file.slice(start..end))
    }

    /// Decodes a `deletion-vector-v1` blob, checking type, compression, both required
    /// properties, and that `cardinality` equals the vector's.
    pub fn read_deletion_vector(
        &self,
        blob: &BlobMetadata,
    ) -> Result<(String, DeletionVector), PuffinError> {
        let offset = blob.offset;
        if blob.blob_type != DELETION_VECTOR_V1 {
            return Err(PuffinError::NotADeletionVector {
                offset,
                found: blob.blob_type.clone(),
            });
        }
        if let Some(codec) = &blob.compression_codec {
            return Err(PuffinError::CompressedDeletionVector {
                offset,
                codec: codec.clone(),
            });
        }
        let property = |name: &'static str| {
            blob.properties
                .get(name)
                .ok_or_else(|| PuffinError::Property {
                    offset,
                    name,
                    problem: "is missing".to_owned(),
                })
        };
        let data_file = property(REFERENCED_DATA_FILE)?.to_owned();
        let declared_text = property(CARDINALITY)?;
        let declared: u64 = declared_text.parse().map_err(|_| PuffinError::Property {
            offset,
            name: CARDINALITY,
            problem: format!("is {declared_text:?}, not a count"),
        })?;
        let bytes = self.read_blob(offset, blob.length)?;
        let dv = DeletionVector::deserialize_blob(&bytes).map_err(|source| {
            PuffinError::DeletionVector {
                referenced_data_file: data_file.clone(),
                offset,
                source,
            }
        })?;
        if dv.cardinality() != declared {
            return Err(PuffinError::CardinalityMismatch {
                referenced_data_file: data_file,
                offset,
                declared,
                actual: dv.cardinality(),
            });
        }
        Ok((data_file, dv))
    }

    /// The deletion vector of `referenced_data_file`, if this file holds one.
    pub fn deletion_vector_for(
        &self,
        referenced_data_file: &str,
    ) -> Result<Option<DeletionVector>, PuffinError> {
        let blob = self.metadata.blobs.iter().find(|b| {
            b.blob_type == DELETION_VECTOR_V1
                && b.properties.get(REFERENCED_DATA_FILE) == Some(referenced_data_file)
        });
        match blob {
            Some(b) => Ok(Some(self.read_deletion_vector(b)?.1)),
            None => Ok(None),
        }
    }
}

/// `(offset, length)` as a byte range inside the blob area `[4, blobs_end)`.
fn blob_range(offset: u64, length: u64, blobs_end: u64) -> Result<(usize, usize), PuffinError> {
    let out_of_range = || PuffinError::BlobOutOfRange {
        offset,
        length,
        blobs_end,
    };
    let end = offset.checked_add(length).ok_or_else(out_of_range)?;
    if offset < MAGIC.len() as u64 || end > blobs_end {
        return Err(out_of_range());
    }
    let start = usize::try_from(offset).map_err(|_| out_of_range())?;
    let end = usize::try_from(end).map_err(|_| out_of_range())?;
    Ok((start, end))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
