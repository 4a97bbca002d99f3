//! Deletes, as Iceberg stores them: deletion vectors (format v3) of one data file
//! ([`deletion_vector`]), a commit's vectors merged with the live ones ([`commit_vectors`]), and
//! the Puffin files that hold them ([`puffin`]). Equality deletes (format v2) are plain Parquet
//! files of key columns, written by `files/writer.rs`.

pub(super) mod commit_vectors;
pub mod deletion_vector;
pub(crate) mod position_deletes;
pub mod puffin;
