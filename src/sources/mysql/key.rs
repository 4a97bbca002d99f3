//! Which columns identify a captured table's rows: the primary key, else `source.key_columns`,
//! else none (pure).
//!
//! Where it sits: `setup::load_table` resolves the key of every table it reads from
//! `information_schema`, for the stream, the initial copy, `cdcd check` and `cdcd status`.
//!
//! Why a `key_columns` key needs the FULL row image: the before image of an update or delete is
//! what locates the row, and under `binlog_row_image = MINIMAL` or `NOBLOB` MySQL logs in it only
//! the columns of the primary key, or of the unique NOT NULL index it promotes to one when there
//! is none (MySQL `TABLE::mark_columns_per_binlog_row_image`). A user's key need not be that
//! index, so `cdcd check` asks for FULL and the assembler stops on a before image that lacks a
//! key column rather than guess the row.

use crate::changelog::{KeyOrigin, TableId, TableKey};
use crate::sources::CheckProblem;

/// The key of `table` from its primary key (`primary_key`, in key order), its columns
/// (name, nullable) and the user's `key_columns` entry, or the problem with that entry.
pub fn resolve(
    table: &TableId,
    primary_key: &[String],
    columns: &[(String, bool)],
    wanted: Option<&[String]>,
) -> Result<TableKey, CheckProblem> {
    let key = |columns: Vec<String>, origin: KeyOrigin| TableKey {
        table: table.clone(),
        columns,
        origin,
    };
    if !primary_key.is_empty() {
        return match wanted {
            Some(w) if w != primary_key => Err(CheckProblem::new(
                format!(
                    "source.key_columns gives {table} the key ({}), but its primary key ({}) identifies its rows",
                    w.join(", "),
                    primary_key.join(", ")
                ),
                format!("remove {table} from source.key_columns"),
            )),
            _ => Ok(key(primary_key.to_vec(), KeyOrigin::PrimaryKey)),
        };
    }
    // The binlog carries every update and delete of a keyless table: with the FULL row image
    // each is applied to one row equal to its before image (a multiset, issue 23).
    let Some(wanted) = wanted else {
        return Ok(key(Vec::new(), KeyOrigin::FullRow));
    };
    for c in wanted {
        match columns.iter().find(|(name, _)| name == c) {
            None => {
                return Err(CheckProblem::new(
                    format!("source.key_columns: {table} has no column {c}"),
                    format!(
                        "name columns of {table} ({})",
                        columns
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            }
            Some((_, true)) => {
                return Err(CheckProblem::new(
                    format!("source.key_columns: column {c} of {table} is nullable, and a key column must be NOT NULL"),
                    format!(
                        "ALTER TABLE `{}`.`{}` MODIFY `{c}` … NOT NULL, or choose other columns",
                        table.namespace, table.name
                    ),
                ))
            }
            Some((_, false)) => {}
        }
    }
    Ok(key(wanted.to_vec(), KeyOrigin::Override))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<(String, bool)> {
        vec![
            ("tenant_id".into(), false),
            ("event_id".into(), false),
            ("note".into(), true),
        ]
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn primary_key_then_override_then_none() {
        let t = TableId::new("shop", "events");
        let pk = resolve(&t, &names(&["event_id"]), &cols(), None).unwrap();
        assert_eq!(pk.origin, KeyOrigin::PrimaryKey);
        let conflict = resolve(&t, &names(&["event_id"]), &cols(), Some(&names(&["note"])));
        assert!(conflict.unwrap_err().fix.contains("remove shop.events"));
        let wanted = names(&["tenant_id", "event_id"]);
        let k = resolve(&t, &[], &cols(), Some(&wanted)).unwrap();
        assert_eq!((k.columns, k.origin), (wanted, KeyOrigin::Override));
        let nullable = resolve(&t, &[], &cols(), Some(&names(&["note"]))).unwrap_err();
        assert!(nullable.problem.contains("nullable"), "{nullable}");
        let missing = resolve(&t, &[], &cols(), Some(&names(&["x"]))).unwrap_err();
        assert!(missing.problem.contains("no column x"), "{missing}");
        assert_eq!(
            resolve(&t, &[], &cols(), None).unwrap().origin,
            KeyOrigin::FullRow
        );
    }
}
