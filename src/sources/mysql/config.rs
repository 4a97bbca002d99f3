//! `[source]` with `kind = "mysql"`: the validated settings the MySQL/MariaDB source runs with.

use std::fmt;

use crate::config::{ConfigError, RawConfig, SnapshotMode, SourceUrl};

/// What a MySQL zero date (`0000-00-00`, or a zero month or day) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroDate {
    /// NULL (what most MySQL connectors do with `zeroDateTimeBehavior=convertToNull`).
    Null,
    /// Stop the pipeline with an error naming the table and column.
    Error,
}

/// Validated MySQL/MariaDB source settings.
#[derive(Clone)]
pub struct MySqlConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
    pub tables: Vec<String>,
    /// The replica id cdcd registers with (must differ from every server and replica).
    pub server_id: u32,
    pub snapshot: SnapshotMode,
    pub zero_date: ZeroDate,
    /// TLS: `None` off; `Some(verify)` on, verifying the server's certificate and name when true.
    pub tls: Option<bool>,
    /// Target rows per chunk of the initial copy (≥ 1): the unit of resuming after a crash.
    pub snapshot_chunk_rows: u64,
    /// `source.start_position`: where to stream from when no table has a checkpoint.
    pub start_position: Option<crate::changelog::Position>,
}

impl MySqlConfig {
    /// `mysql://user@host:port/db` without the password, for messages.
    pub fn display_target(&self) -> String {
        format!(
            "mysql://{}@{}:{}/{}",
            self.user, self.host, self.port, self.database
        )
    }
}

impl fmt::Debug for MySqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlConfig")
            .field("target", &self.display_target())
            .field("tables", &self.tables)
            .field("server_id", &self.server_id)
            .field("snapshot", &self.snapshot)
            .field("zero_date", &self.zero_date)
            .finish_non_exhaustive()
    }
}

impl RawConfig {
    pub(crate) fn mysql(&self, file: &str) -> Result<MySqlConfig, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let s = &self.source;
        let SourceUrl {
            url,
            host,
            port,
            user,
            password,
            database,
        } = self.source_url(file, ["mysql", "mariadb"], 3306, "root")?;
        let mut tls = None;
        for (k, v) in url.query_pairs() {
            match (k.as_ref(), v.to_ascii_lowercase().as_str()) {
                ("ssl-mode" | "sslmode", "disabled" | "disable" | "preferred" | "prefer") => {}
                ("ssl-mode" | "sslmode", "required" | "require") => tls = Some(false),
                ("ssl-mode" | "sslmode", "verify_ca" | "verify_identity" | "verify-full") => {
                    tls = Some(true)
                }
                (other, v) => {
                    return Err(bad(
                        "source.url",
                        format!("query parameter {other}={v:?}: only ssl-mode=disabled|required|verify_identity is understood"),
                    ))
                }
            }
        }
        if s.tables.is_empty() {
            return Err(bad(
                "source.tables",
                "is empty: list db.table patterns such as \"shop.orders\" or \"shop.*\"".into(),
            ));
        }
        for t in &s.tables {
            match t.split_once('.') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.') => {}
                _ => {
                    return Err(bad(
                        "source.tables",
                        format!("{t:?} is not db.table (e.g. \"shop.orders\" or \"shop.*\")"),
                    ))
                }
            }
        }
        let server_id = match s.server_id {
            Some(0) => {
                return Err(bad(
                    "source.server_id",
                    "0 is not a valid replica id; pick a number no server or replica uses".into(),
                ))
            }
            Some(id) => id,
            None => return Err(bad(
                "source.server_id",
                "is required for mysql: a replica id no server or other replica uses, e.g. 4242"
                    .into(),
            )),
        };
        let snapshot = match s.snapshot.as_deref() {
            None | Some("initial") => SnapshotMode::Initial,
            Some("never") => SnapshotMode::Never,
            Some(other) => {
                return Err(bad(
                    "source.snapshot",
                    format!("{other:?}: use \"initial\" or \"never\""),
                ))
            }
        };
        let zero_date = match s.zero_date.as_deref() {
            None | Some("null") => ZeroDate::Null,
            Some("error") => ZeroDate::Error,
            Some(other) => {
                return Err(bad(
                    "source.zero_date",
                    format!("{other:?}: use \"null\" or \"error\""),
                ))
            }
        };
        let start_position = match s.start_position.as_deref() {
            None => None,
            Some(_) if snapshot != SnapshotMode::Never => {
                return Err(bad(
                    "source.start_position",
                    "needs snapshot = \"never\" (an initial copy starts at its own snapshot)"
                        .into(),
                ))
            }
            Some(text) => match text.parse::<crate::changelog::Position>() {
                Ok(p @ crate::changelog::Position::Postgres(_)) => {
                    return Err(bad(
                        "source.start_position",
                        format!("{p} is a Postgres LSN, not a binlog position"),
                    ))
                }
                Ok(p) => Some(p),
                Err(e) => return Err(bad("source.start_position", e.to_string())),
            },
        };
        for (key, set) in [
            ("source.slot", s.slot.is_some()),
            ("source.publication", s.publication.is_some()),
            (
                "source.stream_memory_bytes",
                s.stream_memory_bytes.is_some(),
            ),
        ] {
            if set {
                return Err(bad(key, "applies to postgres sources only".into()));
            }
        }
        Ok(MySqlConfig {
            host,
            port,
            user,
            password,
            database,
            tables: s.tables.clone(),
            server_id,
            snapshot,
            zero_date,
            tls,
            snapshot_chunk_rows: mysql_chunk_rows(s.snapshot_chunk_rows)
                .map_err(|d| bad("source.snapshot_chunk_rows", d))?,
            start_position,
        })
    }
}

/// `source.snapshot_chunk_rows` for MySQL (default 250000, at least 1).
fn mysql_chunk_rows(value: Option<u64>) -> Result<u64, String> {
    match value.unwrap_or(250_000) {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}
