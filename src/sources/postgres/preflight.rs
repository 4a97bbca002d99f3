//! The `cdcd check` lines beyond `setup.rs`'s settings and privileges and `key.rs`'s keys and
//! replica identities: whether a missing publication can be created, the heartbeat's privilege,
//! and an invalidated slot.
//!
//! Where it sits: only `cdcd check` runs these ([`super::PostgresSource::check`]); start-up
//! meets the same conditions as errors, later and one at a time.
//!
//! Why each: a missing publication is created at start, which needs `CREATE`
//! on the database and ownership of the tables (PG docs, CREATE PUBLICATION). The line builders
//! are pure functions, tested without a server.

use tokio_postgres::Client;

use super::catalog::qualified;
use super::monitor;
use super::replication::quote_ident;
use super::setup::CheckProblem;
use crate::changelog::{TableId, TableKey};
use crate::config::PostgresConfig;
use crate::sources::SourceError;

/// The problem when the publication is missing and the user cannot create it.
pub fn publication_problem(
    publication: &str,
    user: &str,
    database: &str,
    can_create: bool,
    not_owned: &[TableId],
) -> Option<CheckProblem> {
    if can_create && not_owned.is_empty() {
        return None;
    }
    let tables: Vec<String> = not_owned.iter().map(qualified).collect();
    let why = if !can_create {
        format!("lacks CREATE on database {database}")
    } else {
        format!("does not own {}", tables.join(", "))
    };
    Some(CheckProblem {
        problem: format!(
            "publication {publication} does not exist and user {user} cannot create it ({why})"
        ),
        fix: format!(
            "have a table owner or superuser run CREATE PUBLICATION {} FOR TABLE … (see migrations/postgres/), or run GRANT CREATE ON DATABASE {} TO {} and make {} the tables' owner",
            quote_ident(publication),
            quote_ident(database),
            quote_ident(user),
            quote_ident(user)
        ),
    })
}

/// The problem when heartbeats are on and the user may not write them.
pub fn heartbeat_problem(user: &str, allowed: bool) -> Option<CheckProblem> {
    (!allowed).then(|| CheckProblem {
        problem: format!("user {user} may not run pg_logical_emit_message, so cdcd cannot write heartbeats"),
        fix: format!(
            "run GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO {}, or set source.heartbeat_interval_ms = 0",
            quote_ident(user)
        ),
    })
}

/// Every problem these checks find for the resolved tables (their keys and replica identities
/// were judged by `key.rs`).
pub async fn check(
    client: &Client,
    cfg: &PostgresConfig,
    keys: &[TableKey],
) -> Result<Vec<CheckProblem>, SourceError> {
    let mut problems = Vec::new();
    let err = |context: String| {
        move |e: tokio_postgres::Error| SourceError::Server {
            context,
            detail: e
                .as_db_error()
                .map_or_else(|| e.to_string(), |db| db.message().to_owned()),
        }
    };
    let mut not_owned = Vec::new();
    for key in keys {
        let t = &key.table;
        let row = client
            .query_one(
                "SELECT pg_has_role(c.relowner, 'USAGE')
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.namespace, &t.name],
            )
            .await
            .map_err(err(format!("reading the owner of {t}")))?;
        if !row.get::<_, bool>(0) {
            not_owned.push(t.clone());
        }
    }
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
                    has_database_privilege(current_database(), 'CREATE'),
                    has_function_privilege('pg_logical_emit_message(boolean, text, text)', 'EXECUTE'),
                    (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
            &[&cfg.publication],
        )
        .await
        .map_err(err("reading privileges".to_owned()))?;
    let (publication_exists, can_create, can_beat, superuser): (bool, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if !publication_exists && !superuser {
        problems.extend(publication_problem(
            &cfg.publication,
            &cfg.user,
            &cfg.database,
            can_create,
            &not_owned,
        ));
    }
    if cfg.heartbeat_interval.is_some() {
        problems.extend(heartbeat_problem(&cfg.user, can_beat));
    }
    if let Some(stats) = monitor::slot_stats(client, &cfg.slot).await? {
        problems.extend(monitor::wal_status_problem(
            &cfg.slot,
            stats.wal_status.as_deref(),
        ));
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> TableId {
        TableId::new("public", "orders")
    }

    #[test]
    fn publication_lines() {
        assert_eq!(publication_problem("p", "u", "d", true, &[]), None);
        let line = publication_problem("p", "cdc", "shop", false, &[])
            .unwrap()
            .to_string();
        assert!(line.contains("lacks CREATE on database shop"), "{line}");
        assert!(line.contains("GRANT CREATE ON DATABASE"), "{line}");
        let line = publication_problem("p", "cdc", "shop", true, &[t()])
            .unwrap()
            .to_string();
        assert!(line.contains("does not own"), "{line}");
    }

    #[test]
    fn heartbeat_line() {
        assert_eq!(heartbeat_problem("u", true), None);
        let line = heartbeat_problem("cdc", false).unwrap().to_string();
        assert!(line.contains("heartbeat_interval_ms = 0"), "{line}");
    }
}
