//! `[source]` with `kind = "mysql"` (MySQL 8, MariaDB 10.x+): the keys as written
//! ([`RawMySql`], whose field docs are the user docs), their checks, and the settings the MySQL
//! source runs with ([`MySqlConfig`]). `crate::config` reads the file and picks this struct by
//! `kind`.

use std::fmt;

use serde::Deserialize;

use crate::changelog::Position;
use crate::config::context::{redact_url, Context, SourceUrl};
use crate::config::error::ConfigError;
use crate::config::snapshot_mode::SnapshotMode;
use crate::tls::mysql::{TlsSettings, PARAMETERS};

/// `[source]` with `kind = "mysql"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMySql {
    /// `mysql://user@host:port/db` (`mariadb://` too); TLS with the MySQL client's query
    /// parameters, e.g. `?ssl-mode=verify_identity&ssl-ca=/etc/cdcd/rds-ca.pem`.
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
    /// Initial copy: connections copying tables at once (default 4; MariaDB).
    #[serde(default)]
    pub snapshot_parallelism: Option<usize>,
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
    /// TLS, the MySQL client's `--ssl-mode`; each of these keys wins over the URL's `ssl-…`
    /// parameter of the same name. "disabled", "preferred" (the default: TLS when the server
    /// offers it), "required", "verify_ca" or "verify_identity".
    #[serde(default)]
    pub ssl_mode: Option<String>,
    /// The CA bundle (PEM) that verify_ca and verify_identity check against (default: the OS's
    /// roots). Set alone, it means ssl_mode = "verify_ca".
    #[serde(default)]
    pub ssl_ca: Option<String>,
    /// A client certificate (PEM) for accounts with `REQUIRE X509`, with `ssl_key`.
    #[serde(default)]
    pub ssl_cert: Option<String>,
    /// The client certificate's private key (PEM).
    #[serde(default)]
    pub ssl_key: Option<String>,
    /// Key columns for tables without a primary key, e.g. `{ "shop.events" = ["tenant_id",
    /// "event_id"] }`. The columns must be NOT NULL and unique in the data, and the server needs
    /// `binlog_row_image = FULL` (a MINIMAL before image may leave them out).
    #[serde(default)]
    pub key_columns: std::collections::BTreeMap<String, Vec<String>>,
    /// What a schema change of a captured table does: `evolve` the lake's table (default) or
    /// `stop` cdcd before the change's transaction; for every table, or per table.
    #[serde(default)]
    pub schema_change: crate::config::schema_change::RawSchemaChange,
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
    /// TLS for every connection to the server (`ssl-mode` and friends, URL or `[source]`).
    pub tls: TlsSettings,
    /// Where each TLS parameter came from, for `cdcd check` ("ssl-mode=required (URL)", …).
    pub tls_origins: Vec<String>,
    /// Target rows per chunk of the initial copy (≥ 1): the unit of resuming after a crash.
    pub snapshot_chunk_rows: u64,
    /// Connections copying tables at once (≥ 1; `mysql/parallel.rs`).
    pub snapshot_parallelism: usize,
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
            .field("tls", &self.tls.summary())
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
            self.password.clone(),
            ["mysql", "mariadb"],
            3306,
            "root",
        )?;
        let (tls, tls_origins) = self.tls(&url).map_err(|(key, e)| ctx.invalid(key, e))?;
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
            tls_origins,
            snapshot_chunk_rows: ctx.snapshot_chunk_rows(self.snapshot_chunk_rows)?,
            snapshot_parallelism: ctx.at_least_one(
                "source.snapshot_parallelism",
                self.snapshot_parallelism.unwrap_or(4),
            )?,
            start_position,
            key_columns,
        })
    }
}

impl RawMySql {
    /// The TLS settings: the URL's query parameters, then the keys of the same names over them;
    /// with a line per parameter saying where it came from. Errors carry the key.
    fn tls(&self, url: &url::Url) -> Result<(TlsSettings, Vec<String>), (&'static str, String)> {
        let mut tls = TlsSettings::default();
        let mut from_url = Vec::new();
        for (k, v) in url.query_pairs() {
            match tls.set(&k, &v) {
                // `sslmode` is the spelling cdcd accepted before; it is shown as ssl-mode.
                Ok(true) => from_url.push((k.replace("sslmode", "ssl-mode"), v.into_owned())),
                Ok(false) => {
                    return Err((
                        "source.url",
                        format!(
                            "query parameter {k:?}: only {} are understood",
                            PARAMETERS.join(", ")
                        ),
                    ))
                }
                Err(e) => return Err(("source.url", e)),
            }
        }
        let keys: [(&str, &'static str, Option<String>); 4] = [
            ("ssl-mode", "source.ssl_mode", self.ssl_mode.clone()),
            ("ssl-ca", "source.ssl_ca", self.ssl_ca.clone()),
            ("ssl-cert", "source.ssl_cert", self.ssl_cert.clone()),
            ("ssl-key", "source.ssl_key", self.ssl_key.clone()),
        ];
        let mut origins = Vec::new();
        for (name, key, value) in keys {
            let in_url = from_url
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str());
            match (value, in_url) {
                (Some(v), in_url) => {
                    tls.set(name, &v).map_err(|e| (key, e))?;
                    origins.push(match in_url {
                        Some(u) if u != v => format!("{name}={v} ({key}, over the URL's {u})"),
                        _ => format!("{name}={v} ({key})"),
                    });
                }
                (None, Some(u)) => origins.push(format!("{name}={u} (URL)")),
                (None, None) => {}
            }
        }
        let key = if self.ssl_cert.is_some() || self.ssl_key.is_some() {
            "source.ssl_cert"
        } else if self.ssl_ca.is_some() || self.ssl_mode.is_some() {
            "source.ssl_mode"
        } else {
            "source.url"
        };
        tls.validate().map_err(|e| (key, e))?;
        Ok((tls, origins))
    }
}

#[cfg(test)]
mod tests {
    use super::ZeroDate;
    use crate::config::{Config, SourceConfig};
    use crate::tls::mysql::SslMode;

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
        assert_eq!((my.port, my.server_id), (53316, 4242));
        assert_eq!(my.tls.effective_mode(), SslMode::Required);
        assert_eq!(my.password.as_deref(), Some("pw"));
        assert_eq!(my.zero_date, ZeroDate::Error);
        let missing = text.replace("server_id = 4242\n", "");
        let err = Config::from_toml(&missing, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("source.server_id"), "{err}");
    }

    /// Issue 22: the MySQL client's TLS parameters in the URL and as `[source]` keys, the key
    /// winning, and each parameter's origin kept for `cdcd check`.
    #[test]
    fn tls_from_url_and_keys() {
        let base = r#"
[pipeline]
name = "shop"
[source]
kind = "mysql"
url = "mysql://cdc:s3cret@db.example.com/shop?ssl-mode=REQUIRED"
tables = ["shop.*"]
server_id = 4242
"#;
        let my = |text: &str| match Config::from_toml(text, "p.toml").map(|c| c.source) {
            Ok(SourceConfig::MySql(my)) => Ok(my),
            Ok(_) => panic!("mysql source expected"),
            Err(e) => Err(e.to_string()),
        };
        let c = my(base).unwrap();
        assert_eq!(c.tls.effective_mode(), SslMode::Required);
        assert_eq!(c.tls_origins, ["ssl-mode=REQUIRED (URL)"]);
        let c = my(&base.replace("?ssl-mode=REQUIRED", "")).unwrap();
        assert_eq!(c.tls.effective_mode(), SslMode::Preferred);
        assert!(c.tls_origins.is_empty());
        let c = my(&base.replace("?ssl-mode=REQUIRED", "?sslmode=verify_identity")).unwrap();
        assert_eq!(c.tls.effective_mode(), SslMode::VerifyIdentity);
        assert_eq!(c.tls_origins, ["ssl-mode=verify_identity (URL)"]);

        let keys = base.replace(
            "server_id = 4242",
            "server_id = 4242\nssl_mode = \"verify_ca\"\nssl_ca = \"/etc/cdcd/ca.pem\"\nssl_cert = \"/c.pem\"\nssl_key = \"/k.pem\"",
        );
        let c = my(&keys).unwrap();
        assert_eq!(c.tls.effective_mode(), SslMode::VerifyCa);
        assert_eq!(
            c.tls.ca.as_deref(),
            Some(std::path::Path::new("/etc/cdcd/ca.pem"))
        );
        assert_eq!(
            c.tls_origins[0],
            "ssl-mode=verify_ca (source.ssl_mode, over the URL's REQUIRED)"
        );
        assert!(c
            .tls_origins
            .contains(&"ssl-key=/k.pem (source.ssl_key)".to_owned()));
        assert!(!format!("{c:?}").contains("s3cret"));

        let e = my(&base.replace("REQUIRED", "verify_full_please")).unwrap_err();
        assert!(
            e.contains("source.url") && e.contains("verify_identity"),
            "{e}"
        );
        let e = my(&base.replace("REQUIRED", "REQUIRED&connect_timeout=5")).unwrap_err();
        assert!(e.contains("connect_timeout") && e.contains("ssl-ca"), "{e}");
        let e = my(&base.replace("server_id = 4242", "server_id = 4242\nssl_ca = \"/ca.pem\""))
            .unwrap_err();
        assert!(
            e.contains("source.ssl_mode") && e.contains("verify_ca"),
            "{e}"
        );
        let e = my(&base.replace(
            "server_id = 4242",
            "server_id = 4242\nssl_cert = \"/c.pem\"",
        ))
        .unwrap_err();
        assert!(
            e.contains("source.ssl_cert") && e.contains("ssl-key"),
            "{e}"
        );
    }
}
