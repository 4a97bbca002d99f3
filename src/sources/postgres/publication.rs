//! Which tables `source.tables` captures and the publication that carries them: glob patterns
//! resolved against the catalog, the publication created or extended (tables added to an
//! existing pipeline are added to it), and `cdcd check`'s publication problems.
//!
//! Where it sits: `PostgresSource::prepare` and `cdcd check` call these over a regular
//! connection before replication starts (`setup.rs` has the connection and the server checks).

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::Client;

use super::catalog::qualified;
use super::key;
use super::replication::quote_ident;
use super::setup::{db_error, server, CheckProblem};
use crate::changelog::{KeyOrigin, TableId, TableKey};
use crate::sources::SourceError;
/// Resolves `schema.table` patterns (`*` matches any run of characters in either part) against
/// ordinary and partitioned tables outside system schemas, with each table's key
/// (`key.rs`). Partitions are left out: a partitioned table is captured through its root
/// (`publish_via_partition_root`). Errors on a pattern that matches nothing, a table without a
/// usable key, or a `key_columns` entry that cannot be used.
pub async fn resolve_tables(
    client: &Client,
    patterns: &[String],
    key_columns: &BTreeMap<TableId, Vec<String>>,
) -> Result<Vec<TableKey>, SourceError> {
    let (tables, problems) = resolve_report(client, patterns, key_columns).await?;
    match problems.into_iter().next() {
        None => Ok(tables),
        Some(p) => Err(SourceError::Config(p.to_string())),
    }
}

/// [`resolve_tables`] for `cdcd check`: the tables that can be replicated, and every problem.
pub(super) async fn resolve_report(
    client: &Client,
    patterns: &[String],
    key_columns: &BTreeMap<TableId, Vec<String>>,
) -> Result<(Vec<TableKey>, Vec<CheckProblem>), SourceError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
               AND n.nspname NOT IN ('pg_catalog', 'information_schema')
               AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%'
             ORDER BY 1, 2",
            &[],
        )
        .await
        .map_err(|e| server("listing tables", &e))?;
    let candidates: Vec<TableId> = rows
        .iter()
        .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let mut problems = Vec::new();
    let mut matched = BTreeSet::new();
    for pattern in patterns {
        let Some((ps, pt)) = pattern.split_once('.') else {
            problems.push(CheckProblem::new(
                format!("source.tables: {pattern:?} is not schema.table"),
                "write it as \"schema.table\" (e.g. \"public.orders\" or \"public.*\")",
            ));
            continue;
        };
        let mut any = false;
        for id in &candidates {
            if glob_match(ps, &id.namespace) && glob_match(pt, &id.name) {
                any = true;
                matched.insert(id.clone());
            }
        }
        if !any {
            problems.push(CheckProblem::new(
                format!("source.tables: {pattern:?} matches no table"),
                "check the schema and table names, or remove the pattern",
            ));
        }
    }
    for t in key_columns.keys().filter(|t| !matched.contains(*t)) {
        problems.push(CheckProblem::new(
            format!("source.key_columns names {t}, which source.tables does not capture"),
            format!("add {t} to source.tables or remove it from source.key_columns"),
        ));
    }
    let mut keys = Vec::new();
    for t in matched {
        let Some(facts) = key::facts(client, &t).await? else {
            continue;
        };
        match key::resolve(&t, &facts, key_columns.get(&t).map(Vec::as_slice)) {
            Ok(k) => keys.push(k),
            Err(p) => problems.push(p),
        }
    }
    Ok((keys, problems))
}

/// `*` matches any run of characters (possibly empty); everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative wildcard matching with backtracking to the last star.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if Some(&c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

/// The publication that carries the keyless tables: `<publication>_inserts`.
pub fn inserts_publication(publication: &str) -> String {
    format!("{publication}_inserts")
}

/// What one of cdcd's publications publishes (see `key.rs` for why keyless tables are apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publishes {
    /// Every operation: the tables with a key.
    Everything,
    /// Inserts and truncates only: the keyless tables, whose UPDATE and DELETE Postgres would
    /// refuse if a publication published them (PG docs §31.1.1).
    InsertsOnly,
}

impl Publishes {
    fn option(self) -> &'static str {
        match self {
            Publishes::Everything => "insert, update, delete, truncate",
            Publishes::InsertsOnly => "insert, truncate",
        }
    }
}

/// The publications replication reads for `keys` (`publication_names`), and the tables each must
/// publish: the keyed tables through `publication`, the keyless ones through
/// [`inserts_publication`]. The second is named only when there are keyless tables; the first
/// always, unless it does not exist and every table is keyless.
fn plan_publications(
    publication: &str,
    keys: &[TableKey],
    main_exists: bool,
) -> Vec<(String, Publishes, Vec<TableId>)> {
    let (keyless, keyed): (Vec<&TableKey>, Vec<&TableKey>) =
        keys.iter().partition(|k| k.origin == KeyOrigin::Keyless);
    let ids = |ks: Vec<&TableKey>| ks.into_iter().map(|k| k.table.clone()).collect::<Vec<_>>();
    let mut out = Vec::new();
    if keyless.is_empty() || !keyed.is_empty() || main_exists {
        out.push((publication.to_owned(), Publishes::Everything, ids(keyed)));
    }
    if !keyless.is_empty() {
        out.push((
            inserts_publication(publication),
            Publishes::InsertsOnly,
            ids(keyless),
        ));
    }
    out
}

/// [`plan_publications`] for `keys`, given whether `publication` exists already.
async fn planned_publications(
    client: &Client,
    publication: &str,
    keys: &[TableKey],
) -> Result<Vec<(String, Publishes, Vec<TableId>)>, SourceError> {
    let main_exists = read_publication(client, publication).await?.is_some();
    Ok(plan_publications(publication, keys, main_exists))
}

/// Creates or verifies cdcd's publications for `keys` ([`plan_publications`]) and returns their
/// names for `publication_names`.
pub async fn ensure_publications(
    client: &Client,
    publication: &str,
    keys: &[TableKey],
) -> Result<Vec<String>, SourceError> {
    if let Some(p) = full_row_in_inserts(client, publication, keys).await? {
        return Err(SourceError::Config(p.to_string()));
    }
    let keyless = keyless_tables(keys);
    let mut names = Vec::new();
    for (name, publishes, tables) in planned_publications(client, publication, keys).await? {
        ensure_publication(client, &name, &tables, publishes, &keyless).await?;
        names.push(name);
    }
    Ok(names)
}

/// For `cdcd check`: what is wrong with cdcd's existing publications for `keys` (missing ones are
/// created at start, so they are no problem).
pub async fn check_publications(
    client: &Client,
    publication: &str,
    keys: &[TableKey],
) -> Result<Vec<CheckProblem>, SourceError> {
    let mut problems: Vec<CheckProblem> = full_row_in_inserts(client, publication, keys)
        .await?
        .into_iter()
        .collect();
    let keyless = keyless_tables(keys);
    for (name, publishes, tables) in planned_publications(client, publication, keys).await? {
        if let Some(row) = read_publication(client, &name).await? {
            problems.extend(
                publication_problem(client, &name, &tables, publishes, &keyless, &row).await?,
            );
        }
    }
    Ok(problems)
}

/// A table under REPLICA IDENTITY FULL without a key (a multiset, published with its updates
/// and deletes) that is still in the inserts-only publication: it was replicated insert-only
/// before its identity changed, so its updates and deletes since then never reached cdcd and the
/// replica cannot be continued; stopping beats applying later deletes to a replica that misses
/// earlier ones.
async fn full_row_in_inserts(
    client: &Client,
    publication: &str,
    keys: &[TableKey],
) -> Result<Option<CheckProblem>, SourceError> {
    let inserts = inserts_publication(publication);
    if !keys.iter().any(|k| k.origin == KeyOrigin::FullRow)
        || read_publication(client, &inserts).await?.is_none()
    {
        return Ok(None);
    }
    let published = published_tables(client, &inserts).await?;
    let Some(k) = keys
        .iter()
        .find(|k| k.origin == KeyOrigin::FullRow && published.contains(&k.table))
    else {
        return Ok(None);
    };
    Ok(Some(CheckProblem::new(
        format!(
            "table {} now has REPLICA IDENTITY FULL but was replicated insert-only (it is in publication {inserts}): its updates and deletes until now were not published, so its replica cannot be continued as a multiset",
            k.table
        ),
        format!(
            "run ALTER TABLE {} REPLICA IDENTITY DEFAULT to keep replicating it insert-only, or copy it anew: remove it from source.tables, drop its replica table, run ALTER PUBLICATION {} DROP TABLE {}, and add it back (with a new pipeline if the slot stays)",
            qualified(&k.table),
            quote_ident(&inserts),
            qualified(&k.table)
        ),
    )))
}

fn keyless_tables(keys: &[TableKey]) -> Vec<TableId> {
    keys.iter()
        .filter(|k| k.origin == KeyOrigin::Keyless)
        .map(|k| k.table.clone())
        .collect()
}

/// Creates the publication for `tables` if it is missing; if it exists, verifies it publishes
/// every table and the operations `publishes` names (and, publishing everything, none of the
/// `keyless` tables), and otherwise errors with the exact statement to run.
pub async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableId],
    publishes: Publishes,
    keyless: &[TableId],
) -> Result<(), SourceError> {
    let pub_ident = quote_ident(publication);
    let Some(row) = read_publication(client, publication).await? else {
        if tables.is_empty() {
            return Err(SourceError::Config(format!(
                "publication {publication}: no tables to publish"
            )));
        }
        let list: Vec<String> = tables.iter().map(qualified).collect();
        // Partitions' changes are published as their root table's, which is what cdcd captures.
        let sql = format!(
            "CREATE PUBLICATION {pub_ident} FOR TABLE {} WITH (publish = '{}', publish_via_partition_root = true)",
            list.join(", "),
            publishes.option()
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| server(&format!("creating publication {publication}"), &e))?;
        tracing::info!(publication, tables = tables.len(), "created publication");
        return Ok(());
    };
    let all_tables: bool = row.get(0);
    if !all_tables {
        add_missing_tables(client, publication, tables).await;
    }
    match publication_problem(client, publication, tables, publishes, keyless, &row).await? {
        None => Ok(()),
        Some(p) => Err(SourceError::Config(p.to_string())),
    }
}

/// A table added to `source.tables` joins the existing publication, so that it can be copied
/// alone and then streamed. Best effort: without ownership of the publication the ALTER fails and
/// [`publication_problem`] reports the statement to run.
async fn add_missing_tables(client: &Client, publication: &str, tables: &[TableId]) {
    let published: BTreeSet<TableId> = match client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
    {
        Ok(rows) => rows
            .iter()
            .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect(),
        Err(_) => return,
    };
    let missing: Vec<String> = tables
        .iter()
        .filter(|t| !published.contains(*t))
        .map(qualified)
        .collect();
    if missing.is_empty() {
        return;
    }
    let sql = format!(
        "ALTER PUBLICATION {} ADD TABLE {}",
        quote_ident(publication),
        missing.join(", ")
    );
    match client.batch_execute(&sql).await {
        Ok(()) => {
            tracing::info!(publication, tables = %missing.join(", "), "added tables to the publication")
        }
        Err(e) => {
            tracing::warn!(publication, error = %db_error(&e), "could not add tables to the publication")
        }
    }
}

/// The tables publication `publication` publishes.
async fn published_tables(
    client: &Client,
    publication: &str,
) -> Result<BTreeSet<TableId>, SourceError> {
    Ok(client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| server(&format!("reading tables of publication {publication}"), &e))?
        .iter()
        .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect())
}

async fn read_publication(
    client: &Client,
    publication: &str,
) -> Result<Option<tokio_postgres::Row>, SourceError> {
    client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
             FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| server(&format!("reading publication {publication}"), &e))
}

/// Whether the existing publication (`row` from [`read_publication`]) publishes every table and
/// the operations `publishes` names the way cdcd reads them, and none of the `keyless` tables
/// with their updates and deletes; if not, the statement that fixes it.
async fn publication_problem(
    client: &Client,
    publication: &str,
    tables: &[TableId],
    publishes: Publishes,
    keyless: &[TableId],
    row: &tokio_postgres::Row,
) -> Result<Option<CheckProblem>, SourceError> {
    let pub_ident = quote_ident(publication);
    let all_tables: bool = row.get(0);
    // insert, update, delete, truncate
    let ops = [row.get::<_, bool>(1), row.get(2), row.get(3), row.get(4)];
    let via_root: bool = row.get(5);
    let wanted = match publishes {
        Publishes::Everything => [true; 4],
        Publishes::InsertsOnly => [true, false, false, true],
    };
    if ops != wanted {
        let what = match publishes {
            Publishes::Everything => "every operation",
            Publishes::InsertsOnly => {
                "exactly inserts and truncates (it carries the keyless tables)"
            }
        };
        return Ok(Some(CheckProblem::new(
            format!("publication {publication} does not publish {what}"),
            format!(
                "run ALTER PUBLICATION {pub_ident} SET (publish = '{}')",
                publishes.option()
            ),
        )));
    }
    let published = published_tables(client, publication).await?;
    if publishes == Publishes::Everything {
        if let Some(t) = keyless
            .iter()
            .find(|t| all_tables || published.contains(*t))
        {
            let fix = if all_tables {
                format!("recreate {pub_ident} FOR TABLE with the tables that have a key (cdcd publishes keyless ones through {}), or give {t} a key", inserts_publication(publication))
            } else {
                format!(
                    "run ALTER PUBLICATION {pub_ident} DROP TABLE {} (cdcd publishes it through {})",
                    qualified(t),
                    inserts_publication(publication)
                )
            };
            return Ok(Some(CheckProblem::new(
                format!("publication {publication} publishes updates and deletes of {t}, which has no key: Postgres refuses the application's UPDATE and DELETE on it"),
                fix,
            )));
        }
    }
    let missing: Vec<String> = tables
        .iter()
        .filter(|t| !all_tables && !published.contains(*t))
        .map(qualified)
        .collect();
    if !missing.is_empty() {
        return Ok(Some(CheckProblem::new(
            format!(
                "publication {publication} does not publish {}",
                missing.join(", ")
            ),
            format!(
                "run ALTER PUBLICATION {pub_ident} ADD TABLE {}",
                missing.join(", ")
            ),
        )));
    }
    if !via_root {
        let partitioned = partitioned_tables(client, tables).await?;
        if let Some(t) = partitioned.first() {
            return Ok(Some(CheckProblem::new(
                format!("publication {publication} publishes partitioned table {t} per partition"),
                format!(
                    "run ALTER PUBLICATION {pub_ident} SET (publish_via_partition_root = true)"
                ),
            )));
        }
    }
    Ok(None)
}

async fn partitioned_tables(
    client: &Client,
    tables: &[TableId],
) -> Result<Vec<TableId>, SourceError> {
    let mut out = Vec::new();
    for t in tables {
        let row = client
            .query_opt(
                "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p'",
                &[&t.namespace, &t.name],
            )
            .await
            .map_err(|e| server(&format!("reading {t}"), &e))?;
        if row.is_some() {
            out.push(t.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", "orders"));
        assert!(glob_match("*", ""));
        assert!(glob_match("ord*", "orders"));
        assert!(glob_match("*ers", "orders"));
        assert!(glob_match("o*d*s", "orders"));
        assert!(glob_match("orders", "orders"));
        assert!(!glob_match("orders", "orders2"));
        assert!(!glob_match("ord*x", "orders"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
    }
}
