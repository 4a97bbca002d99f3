//! Where a row is: the snapshot's live files and vectors cached between commits (`live.rs`), the
//! current rows that complete partial updates (`lookup.rs`), the primary-key index and its
//! background slot (`index.rs`, `index/slot.rs`) with the locator that turns keys into file
//! positions (`locator.rs`), multiset rows without a key (`multiset.rs`), and the upsert window's
//! droppable partial updates (`window.rs`).

pub(crate) mod index;
pub(crate) mod live;
pub(crate) mod locator;
pub(crate) mod lookup;
pub(crate) mod multiset;
pub(crate) mod window;

use arrow_row::{RowConverter, SortField};
use arrow_schema::{ArrowError, Schema};

/// The row encoding of `schema`'s columns, in order: how rows are compared and hashed by value.
pub(crate) fn row_converter(schema: &Schema) -> Result<RowConverter, ArrowError> {
    RowConverter::new(
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
}

/// The names of `schema`'s columns, in order (the columns to decode of a file).
pub(crate) fn column_names(schema: &Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}
