//! `[source]` with `kind = "mysql"` (MySQL 8, MariaDB 10.x+): the keys as written
//! ([`RawMySql`], whose field docs are the user docs), their checks, and the settings the MySQL
//! source runs with ([`MySqlConfig`]). `crate::config` reads the file and picks this struct by
//! `kind`.

use std::fmt;

use serde::Deserialize;

use crate::changelog::Position;
use crate::config::{redact_url, ConfigError, Context, SnapshotMode, SourceUrl};

/// `[source]` with `kind = "mysql"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMySql {
    /// `mysql://user@host:port/db` (`mariadb://` too); `?ssl-mode=required` or
    /// `verify_identity` for TLS.
    pub url: String,
    /// Optional; may be in the URL instead.
    #[serde(default)]
    pub password: Option<String>,
    /// `db.table` patterns; `*` matches any run of characters.
    pub tables: Vec<String>,
    /// The replica id cdcd registers with; required, and different from every server's and
    /// replica's.
    #[serde(default)]
    pub server_id: Option<u32>,
    /// "initial" (copy existing rows first, the default) or "never".
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// Initial copy: target rows per chunk, the unit of resuming after a crash (default 250000).
    #[serde(default)]
    pub snapshot_chunk_rows: Option<u64>,
    /// How zero dates (`0000-00-00`, and dates with a zero month or day) are written: "null"
    /// (default) or "error" (stop the pipeline, naming the table and column).
    #[serde(default)]
    pub zero_date: ZeroDate,
    /// With `snapshot = "never"`: where a pipeline whose tables have no checkpoint yet starts
    /// streaming (a MariaDB GTID list `0-1-42`, a MySQL GTID set `uuid:1-42`, or
    /// `binlog.000003:4711`), instead of the server's current position. A committed checkpoint
    /// always wins. Used to replay a known binlog range (bench/mysql_e2e.py).
    #[serde(default)]
    pub start_position: Option<String>,
    /// Key columns for tables without a primary key, e.g. `{ "shop.events" = ["tenant_id",
    /// "event_id"] }`. The columns must be NOT NULL and unique in the data, and the server needs
    /// `binlog_row_image = FULL` (a MINIMAL before image may leave them out).
    #[serde(default)]
    pub key_columns: std::collections::BTreeMap<String, Vec<String>>,
}

impl fmt::Debug for RawMySql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawMySql")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tables", &self.tables)
            .field("server_id", &self.server_id)
            .finish_non_exhaustive()
    }
}

/// What a MySQL zero date (`0000-00-00`, or a zero month or day) becomes (`source.zero_date`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZeroDate {
    /// NULL (what most MySQL connectors do with `zeroDateTimeBehavior=convertToNull`).
    #[default]
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
    pub start_position: Option<Position>,
    /// `source.key_columns`: user-chosen keys of tables without a primary key.
    pub key_columns: std::collections::BTreeMap<crate::changelog::TableId, Vec<String>>,
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

impl RawMySql {
    /// Checks every key and builds the settings.
    pub fn validate(self, ctx: &Context<'_>) -> Result<MySqlConfig, ConfigError> {
        let SourceUrl {
            url,
            host,
            port,
            user,
            password,
            database,
        } = SourceUrl::parse(
            ctx,
            &self.url,
            self.password,
            ["mysql", "mariadb"],
            3306,
            "root",
        )?;
        let mut tls = None;
        for (k, v) in url.query_pairs() {
            match (k.as_ref(), v.to_ascii_lowercase().as_str()) {
                ("ssl-mode" | "sslmode", "disabled" | "disable" | "preferred" | "prefer") => {}
                ("ssl-mode" | "sslmode", "required" | "require") => tls = Some(false),
                ("ssl-mode" | "sslmode", "verify_ca" | "verify_identity" | "verify-full") => {
                    tls = Some(true)
                }
                (other, v) => {
                    return Err(ctx.invalid(
                        "source.url",
                        format!("query parameter {other}={v:?}: only ssl-mode=disabled|required|verify_identity is understood"),
                    ))
                }
            }
        }
        ctx.source_tables(&self.tables, "db", "shop")?;
        let key_columns = ctx.key_columns(self.key_columns, "db")?;
        let server_id = match self.server_id {
            Some(0) => {
                return Err(ctx.invalid(
                    "source.server_id",
                    "0 is not a valid replica id; pick a number no server or replica uses",
                ))
            }
            Some(id) => id,
            None => return Err(ctx.invalid(
                "source.server_id",
                "is required for mysql: a replica id no server or other replica uses, e.g. 4242",
            )),
        };
        let start_position = match self.start_position.as_deref() {
            None => None,
            Some(_) if self.snapshot != SnapshotMode::Never => {
                return Err(ctx.invalid(
                    "source.start_position",
                    "needs snapshot = \"never\" (an initial copy starts at its own snapshot)",
                ))
            }
            Some(text) => match text.parse::<Position>() {
                Ok(p @ Position::Postgres(_)) => {
                    return Err(ctx.invalid(
                        "source.start_position",
                        format!("{p} is a Postgres LSN, not a binlog position"),
                    ))
                }
                Ok(p) => Some(p),
                Err(e) => return Err(ctx.invalid("source.start_position", e.to_string())),
            },
        };
        Ok(MySqlConfig {
            host,
            port,
            user,
            password,
            database,
            tables: self.tables,
            server_id,
            snapshot: self.snapshot,
            zero_date: self.zero_date,
            tls,
            snapshot_chunk_rows: ctx.snapshot_chunk_rows(self.snapshot_chunk_rows)?,
            start_position,
            key_columns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ZeroDate;
    use crate::config::{Config, SourceConfig};

    #[test]
    fn mysql_source_validates() {
        let text = r#"
[pipeline]
name = "shop"
[source]
kind = "mysql"
url = "mysql://cdc:pw@127.0.0.1:53316/shop?ssl-mode=required"
tables = ["shop.*"]
server_id = 4242
zero_date = "error"
"#;
        let c = Config::from_toml(text, "p.toml").unwrap();
        let SourceConfig::MySql(my) = &c.source else {
            panic!("mysql source expected")
        };
        assert_eq!((my.port, my.server_id, my.tls), (53316, 4242, Some(false)));
        assert_eq!(my.password.as_deref(), Some("pw"));
        assert_eq!(my.zero_date, ZeroDate::Error);
        let missing = text.replace("server_id = 4242\n", "");
        let err = Config::from_toml(&missing, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("source.server_id"), "{err}");
    }
}
