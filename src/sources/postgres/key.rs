//! Which columns identify a captured table's rows: the primary key, else the
//! `REPLICA IDENTITY USING INDEX` index, else `source.key_columns`, else none.
//!
//! Where it sits: `publication.rs` resolves a key for every table `source.tables` matches, for
//! `cdcd check`, `cdcd status` and start-up alike; the assembler and the initial copy build each
//! table's schema from it.
//!
//! Why the replica identity decides what is allowed (PG docs §31.1.1 "Replica Identity",
//! `ALTER TABLE … REPLICA IDENTITY`): pgoutput sends the old image of an updated or deleted row
//! only as the identity says. DEFAULT sends the old primary key (nothing when there is none),
//! USING INDEX the old values of that index's columns, FULL the whole old row (detoasted), and
//! NOTHING nothing; and Postgres refuses UPDATE and DELETE on a table that publishes them without
//! an identity. So a `key_columns` key can be found in an update's or delete's old image only
//! under FULL: any other identity is refused here with the statement that fixes it, instead of
//! applying a change to the wrong row or failing the user's application. For the same reason a
//! primary-key table under NOTHING, or under USING INDEX on other columns (an update changing the
//! primary key would arrive without its old value), is refused, at start as in `cdcd check`.
//! The pure [`resolve`] is
//! tested without a server; [`facts`] is its one catalog query.

use tokio_postgres::Client;

use super::catalog::qualified;
use super::replication::quote_ident;
use super::setup::{server, CheckProblem};
use crate::changelog::{KeyOrigin, TableId, TableKey};
use crate::sources::SourceError;

/// What the catalog says about one table's possible keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyFacts {
    /// `pg_class.relreplident`: `d`efault, `n`othing, `f`ull or `i`ndex.
    pub replident: char,
    /// Primary-key column names in key order (empty: none).
    pub primary_key: Vec<String>,
    /// The replica identity index and its columns in index order, under `USING INDEX`.
    pub identity_index: Option<(String, Vec<String>)>,
    /// The replicated columns (no dropped or generated ones) with `attnotnull`.
    pub columns: Vec<(String, bool)>,
}

/// `pg_class.relreplident` of a table with a primary key, and whether its identity index (under
/// USING INDEX) covers exactly the primary key's columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub relreplident: char,
    pub index_is_primary: bool,
}

/// The problem with a table's replica identity, if any.
pub fn identity_problem(table: &TableId, identity: &Identity) -> Option<CheckProblem> {
    let fix = format!(
        "run ALTER TABLE {} REPLICA IDENTITY DEFAULT",
        qualified(table)
    );
    match identity.relreplident {
        'n' => Some(CheckProblem {
            problem: format!(
                "table {table} has REPLICA IDENTITY NOTHING: Postgres refuses its updates and deletes once published, and cdcd could not apply them"
            ),
            fix,
        }),
        'i' if !identity.index_is_primary => Some(CheckProblem {
            problem: format!(
                "table {table} has REPLICA IDENTITY USING INDEX on an index other than the primary key: updates and deletes would not carry the old primary key"
            ),
            fix,
        }),
        _ => None,
    }
}

/// The key of `table` from `facts` and the user's `key_columns` entry for it, or the problem
/// that keeps it from being replicated exactly. See the module doc.
pub fn resolve(
    table: &TableId,
    facts: &KeyFacts,
    wanted: Option<&[String]>,
) -> Result<TableKey, CheckProblem> {
    let key = |columns: Vec<String>, origin: KeyOrigin| TableKey {
        table: table.clone(),
        columns,
        origin,
    };
    let conflicts = |found: &[String], what: &str| {
        CheckProblem::new(
            format!(
                "source.key_columns gives {table} the key ({}), but its {what} ({}) identifies its rows",
                wanted.unwrap_or_default().join(", "),
                found.join(", ")
            ),
            format!("remove {table} from source.key_columns"),
        )
    };
    if !facts.primary_key.is_empty() {
        let identity = Identity {
            relreplident: facts.replident,
            index_is_primary: facts
                .identity_index
                .as_ref()
                .is_some_and(|(_, columns)| *columns == facts.primary_key),
        };
        if let Some(problem) = identity_problem(table, &identity) {
            return Err(problem);
        }
        return match wanted {
            Some(w) if w != facts.primary_key.as_slice() => {
                Err(conflicts(&facts.primary_key, "primary key"))
            }
            _ => Ok(key(facts.primary_key.clone(), KeyOrigin::PrimaryKey)),
        };
    }
    if let (Some((index, columns)), 'i') = (&facts.identity_index, facts.replident) {
        return match wanted {
            Some(w) if w != columns.as_slice() => Err(conflicts(
                columns,
                &format!("replica identity index {index}"),
            )),
            _ => Ok(key(
                columns.clone(),
                KeyOrigin::IdentityIndex(index.clone()),
            )),
        };
    }
    let Some(wanted) = wanted else {
        // FULL sends the whole old row with every update and delete: the row is its own identity.
        let origin = if facts.replident == 'f' {
            KeyOrigin::FullRow
        } else {
            KeyOrigin::Keyless
        };
        return Ok(key(Vec::new(), origin));
    };
    override_columns_usable(table, facts, wanted)?;
    Ok(key(wanted.to_vec(), KeyOrigin::Override))
}

/// Checks a `source.key_columns` entry for a table without a primary key or replica identity
/// index: its columns exist and are NOT NULL, and the table sends the whole old row (FULL).
fn override_columns_usable(
    table: &TableId,
    facts: &KeyFacts,
    wanted: &[String],
) -> Result<(), CheckProblem> {
    for c in wanted {
        match facts.columns.iter().find(|(name, _)| name == c) {
            None => {
                return Err(CheckProblem::new(
                    format!("source.key_columns: {table} has no column {c}"),
                    format!(
                        "name columns of {table} ({})",
                        facts
                            .columns
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            }
            Some((_, false)) => {
                return Err(CheckProblem::new(
                    format!("source.key_columns: column {c} of {table} is nullable, and a key column must be NOT NULL"),
                    format!(
                        "run ALTER TABLE {} ALTER COLUMN {} SET NOT NULL, or choose other columns",
                        qualified(table),
                        quote_ident(c)
                    ),
                ))
            }
            Some((_, true)) => {}
        }
    }
    if facts.replident != 'f' {
        let identity = match facts.replident {
            'n' => "NOTHING",
            'i' => "USING INDEX",
            _ => "DEFAULT",
        };
        return Err(CheckProblem::new(
            format!(
                "table {table} has REPLICA IDENTITY {identity} and no primary key: Postgres sends no old row with its updates and deletes (and refuses them once published), so the rows source.key_columns names cannot be found"
            ),
            format!(
                "run ALTER TABLE {} REPLICA IDENTITY FULL, or create a unique index on ({}) and run ALTER TABLE {} REPLICA IDENTITY USING INDEX <that index>",
                qualified(table),
                wanted.join(", "),
                qualified(table)
            ),
        ));
    }
    Ok(())
}

/// [`KeyFacts`] of `table` from the catalog; `None` if there is no such table.
pub async fn facts(client: &Client, table: &TableId) -> Result<Option<KeyFacts>, SourceError> {
    let row = client
        .query_opt(
            "SELECT c.relreplident::text,
                    COALESCE((SELECT array_agg(a.attname::text ORDER BY k.ord)
                              FROM pg_index i
                              CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                              JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                              WHERE i.indrelid = c.oid AND i.indisprimary), '{}'::text[]),
                    (SELECT ic.relname::text FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                     WHERE i.indrelid = c.oid AND i.indisreplident),
                    COALESCE((SELECT array_agg(a.attname::text ORDER BY k.ord)
                              FROM pg_index i
                              CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                              JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                              WHERE i.indrelid = c.oid AND i.indisreplident), '{}'::text[]),
                    COALESCE((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                AND a.attgenerated = ''), '{}'::text[]),
                    COALESCE((SELECT array_agg(a.attnotnull ORDER BY a.attnum) FROM pg_attribute a
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                AND a.attgenerated = ''), '{}'::bool[])
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("reading the keys of {table}"), &e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let replident: String = row.get(0);
    let index: Option<String> = row.get(2);
    let names: Vec<String> = row.get(4);
    let not_null: Vec<bool> = row.get(5);
    Ok(Some(KeyFacts {
        replident: replident.chars().next().unwrap_or('d'),
        primary_key: row.get(1),
        identity_index: index.map(|i| (i, row.get(3))),
        columns: names.into_iter().zip(not_null).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> TableId {
        TableId::new("public", "events")
    }

    #[test]
    fn replica_identity_lines() {
        let nothing = Identity {
            relreplident: 'n',
            index_is_primary: false,
        };
        let line = identity_problem(&t(), &nothing).unwrap().to_string();
        assert!(line.contains("REPLICA IDENTITY NOTHING"), "{line}");
        assert!(line.ends_with("REPLICA IDENTITY DEFAULT"), "{line}");
        let other_index = Identity {
            relreplident: 'i',
            index_is_primary: false,
        };
        assert!(identity_problem(&t(), &other_index).is_some());
        for ok in [('d', false), ('f', false), ('i', true)] {
            let id = Identity {
                relreplident: ok.0,
                index_is_primary: ok.1,
            };
            assert_eq!(identity_problem(&t(), &id), None, "{ok:?}");
        }
    }

    fn cols(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn facts(replident: char) -> KeyFacts {
        KeyFacts {
            replident,
            primary_key: Vec::new(),
            identity_index: None,
            columns: vec![
                ("tenant_id".into(), true),
                ("event_id".into(), true),
                ("note".into(), false),
            ],
        }
    }

    #[test]
    fn primary_key_comes_first() {
        let f = KeyFacts {
            primary_key: cols(&["event_id"]),
            ..facts('d')
        };
        let k = resolve(&t(), &f, None).unwrap();
        assert_eq!(
            (k.columns, k.origin),
            (cols(&["event_id"]), KeyOrigin::PrimaryKey)
        );
        // An override equal to the primary key is harmless; another one is refused.
        assert!(resolve(&t(), &f, Some(&cols(&["event_id"]))).is_ok());
        let p = resolve(&t(), &f, Some(&cols(&["tenant_id"]))).unwrap_err();
        assert!(p.problem.contains("primary key (event_id)"), "{p}");
        assert!(
            p.fix
                .contains("remove public.events from source.key_columns"),
            "{p}"
        );
    }

    #[test]
    fn replica_identity_index_without_primary_key() {
        let f = KeyFacts {
            identity_index: Some(("events_uq".into(), cols(&["tenant_id", "event_id"]))),
            ..facts('i')
        };
        let k = resolve(&t(), &f, None).unwrap();
        assert_eq!(k.origin, KeyOrigin::IdentityIndex("events_uq".into()));
        assert_eq!(k.columns, cols(&["tenant_id", "event_id"]));
        assert!(resolve(&t(), &f, Some(&cols(&["event_id"]))).is_err());
    }

    #[test]
    fn override_needs_full_identity_and_not_null_columns() {
        let wanted = cols(&["tenant_id", "event_id"]);
        let k = resolve(&t(), &facts('f'), Some(&wanted)).unwrap();
        assert_eq!((k.columns, k.origin), (wanted.clone(), KeyOrigin::Override));
        for ident in ['d', 'n'] {
            let p = resolve(&t(), &facts(ident), Some(&wanted)).unwrap_err();
            assert!(
                p.fix
                    .starts_with(r#"run ALTER TABLE "public"."events" REPLICA IDENTITY FULL"#),
                "{p}"
            );
        }
        let p = resolve(&t(), &facts('f'), Some(&cols(&["note"]))).unwrap_err();
        assert!(p.problem.contains("nullable"), "{p}");
        assert!(p.fix.contains(r#"ALTER COLUMN "note" SET NOT NULL"#), "{p}");
        let p = resolve(&t(), &facts('f'), Some(&cols(&["nope"]))).unwrap_err();
        assert!(p.problem.contains("has no column nope"), "{p}");
    }

    #[test]
    fn nothing_identifies_a_plain_table() {
        let k = resolve(&t(), &facts('d'), None).unwrap();
        assert_eq!(k.origin, KeyOrigin::Keyless);
        assert!(k.columns.is_empty());
        // FULL alone gives no key either: the whole row is the identity, a multiset (issue 23).
        let full = resolve(&t(), &facts('f'), None).unwrap();
        assert_eq!(full.origin, KeyOrigin::FullRow);
        assert!(full.columns.is_empty());
    }
}
