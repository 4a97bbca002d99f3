//! Position delete files (format v2): Parquet files of `(file_path, pos)` rows, each deleting
//! row `pos` of data file `file_path` (Iceberg spec, "Position Delete Files"). Read by the
//! lookup of keyed rows, multiset deletes and compaction; written by `files/writer.rs`.

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;

use crate::sinks::iceberg::files::decode::decode;
use crate::sinks::iceberg::files::manifest::read;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The (data file, position) pairs the position delete file at `path` deletes.
pub(crate) async fn read_pairs(
    warehouse: &Warehouse,
    path: &str,
) -> Result<Vec<(String, u64)>, SinkError> {
    let mut out = Vec::new();
    for batch in decode(&read(warehouse, path).await?, path, None)? {
        let (Some(files), Some(pos)) = (
            batch
                .column_by_name("file_path")
                .and_then(|c| c.as_string_opt::<i32>()),
            batch
                .column_by_name("pos")
                .and_then(|c| c.as_primitive_opt::<Int64Type>()),
        ) else {
            return Err(SinkError::Corrupt {
                path: path.to_owned(),
                detail: "position delete file without file_path/pos".into(),
            });
        };
        for (file, p) in files.iter().zip(pos.iter()) {
            if let (Some(file), Some(p)) = (file, p) {
                let Ok(at) = u64::try_from(p) else {
                    return Err(SinkError::Corrupt {
                        path: path.to_owned(),
                        detail: format!("negative position {p} of {file}"),
                    });
                };
                out.push((file.to_owned(), at));
            }
        }
    }
    Ok(out)
}
