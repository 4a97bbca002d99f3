//! The files a commit writes and reads: data and v2 delete files from a plan (`writer.rs`), their
//! Parquet encoding (`encode.rs`; a compaction's outputs uploaded as they are written,
//! `upload.rs`), Avro manifests and a snapshot's live files (`manifest.rs`), Parquet read back
//! (`decode.rs`), and the table metadata, newest first (`metadata.rs`).

pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod manifest;
pub(crate) mod metadata;
pub(crate) mod upload;
pub(crate) mod writer;
