//! Stand-in for the deletion-vector codec (`deletion_vector.rs`, `puffin.rs` on branch `h/dv`):
//! the same names and shapes, so the v3 commit path can be written and tested before it lands.
//! Deleted when `h/dv` is merged.
//!
//! Formats (Iceberg spec, "Deletion Vectors"; Puffin spec, "deletion-vector-v1"): a blob is a
//! 4-byte big-endian length of magic + vector, the magic `D1 D3 39 64`, the vector as a 64-bit
//! Roaring bitmap in the portable format, and a big-endian CRC-32 of magic + vector. A Puffin file
//! is `PFA1`, the blobs, then the footer `PFA1` + JSON + payload size (u32 LE) + flags + `PFA1`.

// Temporary stand-in: some of the expected API is not used by the sink.
#![allow(dead_code)]

use roaring::RoaringTreemap;

const DV_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
const PUFFIN_MAGIC: [u8; 4] = *b"PFA1";

#[derive(Debug, thiserror::Error)]
pub enum DvError {
    #[error("deletion vector blob: {0}")]
    Blob(String),
    #[error("puffin file: {0}")]
    Puffin(String),
}

/// The deleted positions of one data file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeletionVector(RoaringTreemap);

impl DeletionVector {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, pos: u64) -> bool {
        self.0.insert(pos)
    }
    pub fn contains(&self, pos: u64) -> bool {
        self.0.contains(pos)
    }
    pub fn merge(&mut self, other: &DeletionVector) {
        self.0 |= &other.0;
    }
    pub fn cardinality(&self) -> u64 {
        self.0.len()
    }
    pub fn serialize_blob(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(4 + self.0.serialized_size());
        body.extend_from_slice(&DV_MAGIC);
        // Writing into a Vec cannot fail.
        let _ = self.0.serialize_into(&mut body);
        let mut out = Vec::with_capacity(body.len() + 8);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        out
    }
    pub fn deserialize_blob(bytes: &[u8]) -> Result<Self, DvError> {
        let bad = |m: &str| DvError::Blob(m.to_owned());
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(|| bad("too short"))?;
        let len = u32::from_be_bytes(*len) as usize;
        let body = rest.get(..len).ok_or_else(|| bad("truncated"))?;
        let crc = rest
            .get(len..len + 4)
            .and_then(|c| c.first_chunk::<4>())
            .ok_or_else(|| bad("no checksum"))?;
        if crc32fast::hash(body) != u32::from_be_bytes(*crc) {
            return Err(bad("checksum mismatch"));
        }
        let vector = body.strip_prefix(&DV_MAGIC).ok_or_else(|| bad("bad magic"))?;
        RoaringTreemap::deserialize_from(vector)
            .map(DeletionVector)
            .map_err(|e| bad(&e.to_string()))
    }
}

/// Builds one Puffin file of deletion-vector blobs.
pub struct PuffinWriter {
    bytes: Vec<u8>,
    blobs: Vec<serde_json::Value>,
}

impl Default for PuffinWriter {
    fn default() -> Self {
        PuffinWriter {
            bytes: PUFFIN_MAGIC.to_vec(),
            blobs: Vec::new(),
        }
    }
}

impl PuffinWriter {
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends `dv` for `referenced_data_file`; returns the blob's (offset, length).
    pub fn add_deletion_vector(
        &mut self,
        referenced_data_file: &str,
        dv: &DeletionVector,
    ) -> (u64, u64) {
        let blob = dv.serialize_blob();
        let offset = self.bytes.len() as u64;
        self.bytes.extend_from_slice(&blob);
        // Puffin spec: DV blobs have no fields, and snapshot-id / sequence-number -1.
        self.blobs.push(serde_json::json!({
            "type": "deletion-vector-v1",
            "fields": [],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": offset,
            "length": blob.len(),
            "properties": {
                "referenced-data-file": referenced_data_file,
                "cardinality": dv.cardinality().to_string(),
            },
        }));
        (offset, blob.len() as u64)
    }
    pub fn finish(mut self) -> Vec<u8> {
        let footer = serde_json::json!({
            "blobs": self.blobs,
            "properties": { "created-by": concat!("cdcd ", env!("CARGO_PKG_VERSION")) },
        })
        .to_string();
        self.bytes.extend_from_slice(&PUFFIN_MAGIC);
        self.bytes.extend_from_slice(footer.as_bytes());
        self.bytes
            .extend_from_slice(&(footer.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&[0, 0, 0, 0]);
        self.bytes.extend_from_slice(&PUFFIN_MAGIC);
        self.bytes
    }
}
