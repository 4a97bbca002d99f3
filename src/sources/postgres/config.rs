//! `[source]` with `kind = "postgres"`: the keys as written ([`RawPostgres`], whose field docs are
//! the user docs), their checks, and the settings the Postgres source runs with
//! ([`PostgresConfig`]). `crate::config` reads the file and picks this struct by `kind`.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::context::{redact_url, Context, SourceUrl};
use crate::config::error::ConfigError;
use crate::config::snapshot_mode::SnapshotMode;
use crate::tls::postgres::{TlsSettings, PARAMETERS};

/// `[source]` with `kind = "postgres"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// `postgres://user@host:port/db`.
    pub url: String,
    /// Optional; may be in the URL instead.
    #[serde(default)]
    pub password: Option<String>,
    /// `schema.table` patterns; `*` matches any run of characters.
    pub tables: Vec<String>,
    /// Replication slot (default `cdcd_<pipeline>`); created if missing.
    #[serde(default)]
    pub slot: Option<String>,
    /// Publication (default `cdcd_<pipeline>`); created if missing.
    #[serde(default)]
    pub publication: Option<String>,
    /// "initial" (copy existing rows first, the default) or "never".
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// Memory bound (bytes) for one streamed transaction before it spills to disk (default 64 MiB).
    #[serde(default)]
    pub stream_memory_bytes: Option<usize>,
    /// Write a heartbeat (`pg_logical_emit_message`) and read the slot's lag this often
    /// (milliseconds, default 10000; 0 turns heartbeats off, the slot is still watched every
    /// 10 s). Lets an idle or filtered slot advance and keeps `cdcd_source_lag_seconds` near 0
    /// when idle.
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Initial copy: connections copying chunks in parallel (default 4).
    #[serde(default)]
    pub snapshot_parallelism: Option<usize>,
    /// Initial copy: target rows per chunk, the unit of resuming after a crash and of
    /// parallelism (default 250000).
    #[serde(default)]
    pub snapshot_chunk_rows: Option<u64>,
    /// TLS, libpq's parameter of the same name; each of these keys wins over the URL's query
    /// parameter. "disable", "allow", "prefer" (the default), "require", "verify-ca" or
    /// "verify-full".
    #[serde(default)]
    pub sslmode: Option<String>,
    /// The CA bundle (PEM) that verify-ca and verify-full check against, or "system" (the
    /// default: the OS's roots). With `sslmode = "require"`, a file makes it verify-ca (libpq).
    #[serde(default)]
    pub sslrootcert: Option<String>,
    /// A client certificate (PEM) for `cert` authentication, with `sslkey`.
    #[serde(default)]
    pub sslcert: Option<String>,
    /// The client certificate's private key (PEM).
    #[serde(default)]
    pub sslkey: Option<String>,
    /// Send the host name as TLS SNI (default true).
    #[serde(default)]
    pub sslsni: Option<bool>,
    /// Key columns for tables without a primary key or replica identity index, e.g.
    /// `{ "public.events" = ["tenant_id", "event_id"] }`. The columns must be NOT NULL and unique
    /// in the data, and the table needs REPLICA IDENTITY FULL.
    #[serde(default)]
    pub key_columns: std::collections::BTreeMap<String, Vec<String>>,
    /// What a schema change of a captured table does: `evolve` the lake's table (default) or
    /// `stop` cdcd before the change's transaction; for every table, or per table.
    #[serde(default)]
    pub schema_change: crate::config::schema_change::RawSchemaChange,
}

impl fmt::Debug for RawPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawPostgres")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

/// Validated Postgres source settings.
#[derive(Clone)]
pub struct PostgresConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
    pub tables: Vec<String>,
    pub slot: String,
    pub publication: String,
    pub snapshot: SnapshotMode,
    pub stream_memory_bytes: usize,
    pub spill_dir: PathBuf,
    /// Heartbeat and slot-watch period; `None`: no heartbeats (`source.heartbeat_interval_ms = 0`).
    pub heartbeat_interval: Option<std::time::Duration>,
    /// Connections copying chunks of the initial copy in parallel (≥ 1).
    pub snapshot_parallelism: usize,
    /// Target rows per chunk of the initial copy (≥ 1).
    pub snapshot_chunk_rows: u64,
    /// TLS for every connection to the server (`sslmode` and friends, URL or `[source]`).
    pub tls: TlsSettings,
    /// Where each TLS parameter came from, for `cdcd check` ("sslmode=require (URL)", …).
    pub tls_origins: Vec<String>,
    /// `source.key_columns`: user-chosen keys of tables without a primary key.
    pub key_columns: std::collections::BTreeMap<crate::changelog::TableId, Vec<String>>,
}

impl PostgresConfig {
    /// `host:port/database` as user@… without the password, for messages.
    pub fn display_target(&self) -> String {
        format!(
            "postgres://{}@{}:{}/{}",
            self.user, self.host, self.port, self.database
        )
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("target", &self.display_target())
            .field("tables", &self.tables)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("snapshot", &self.snapshot)
            .field("tls", &self.tls.summary())
            .finish_non_exhaustive()
    }
}

impl RawPostgres {
    /// Checks every key and builds the settings.
    pub fn validate(self, ctx: &Context<'_>) -> Result<PostgresConfig, ConfigError> {
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
            ["postgres", "postgresql"],
            5432,
            "postgres",
        )?;
        let (tls, tls_origins) = self.tls(&url).map_err(|(key, e)| ctx.invalid(key, e))?;
        ctx.source_tables(&self.tables, "schema", "public")?;
        let key_columns = ctx.key_columns(self.key_columns, "schema")?;
        let default_name = format!("cdcd_{}", ctx.pipeline.replace('-', "_"));
        let slot = self.slot.unwrap_or_else(|| default_name.clone());
        if !slot
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            || slot.is_empty()
            || slot.len() > 63
        {
            return Err(ctx.invalid(
                "source.slot",
                format!("{slot:?}: Postgres slot names use only lower-case letters, digits and '_' (at most 63)"),
            ));
        }
        let publication = self.publication.unwrap_or(default_name);
        if publication.is_empty() || publication.contains(['\'', '"', ',', ' ']) {
            return Err(ctx.invalid(
                "source.publication",
                format!("{publication:?} is not a usable publication name"),
            ));
        }
        let stream_memory_bytes = ctx.at_least_one(
            "source.stream_memory_bytes",
            self.stream_memory_bytes.unwrap_or(64 << 20),
        )?;
        let heartbeat_interval = match self.heartbeat_interval_ms.unwrap_or(10_000) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        };
        let snapshot_parallelism = ctx.at_least_one(
            "source.snapshot_parallelism",
            self.snapshot_parallelism.unwrap_or(4),
        )?;
        Ok(PostgresConfig {
            key_columns,
            tls,
            tls_origins,
            heartbeat_interval,
            snapshot_parallelism,
            snapshot_chunk_rows: ctx.snapshot_chunk_rows(self.snapshot_chunk_rows)?,
            host,
            port,
            user,
            password,
            database,
            tables: self.tables,
            slot,
            publication,
            snapshot: self.snapshot,
            stream_memory_bytes,
            spill_dir: ctx
                .spill_dir
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
        })
    }
}

impl RawPostgres {
    /// The TLS settings: the URL's query parameters, then the keys of the same names over them;
    /// with a line per parameter saying where it came from. Errors carry the key.
    fn tls(&self, url: &url::Url) -> Result<(TlsSettings, Vec<String>), (&'static str, String)> {
        let mut tls = TlsSettings::default();
        let mut from_url = Vec::new();
        for (k, v) in url.query_pairs() {
            match tls.set(&k, &v) {
                Ok(true) => from_url.push((k.into_owned(), v.into_owned())),
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
        let sni = self.sslsni.map(|b| if b { "1" } else { "0" }.to_owned());
        let keys: [(&str, &'static str, Option<String>); 5] = [
            ("sslmode", "source.sslmode", self.sslmode.clone()),
            (
                "sslrootcert",
                "source.sslrootcert",
                self.sslrootcert.clone(),
            ),
            ("sslcert", "source.sslcert", self.sslcert.clone()),
            ("sslkey", "source.sslkey", self.sslkey.clone()),
            ("sslsni", "source.sslsni", sni),
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
        let key = if self.sslcert.is_some() || self.sslkey.is_some() {
            "source.sslcert"
        } else {
            "source.url"
        };
        tls.validate().map_err(|e| (key, e))?;
        Ok((tls, origins))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::MINIMAL;
    use crate::config::{Config, SourceConfig};

    /// Issue 22: libpq's TLS parameters in the URL and as `[source]` keys, the key winning, and
    /// each parameter's origin kept for `cdcd check`.
    #[test]
    fn tls_from_url_and_keys() {
        use crate::tls::postgres::{RootCerts, SslMode};
        let pg = |text: &str| match Config::from_toml(text, "p.toml").map(|c| c.source) {
            Ok(SourceConfig::Postgres(pg)) => Ok(pg),
            Ok(_) => panic!("postgres source expected"),
            Err(e) => Err(e.to_string()),
        };
        let c = pg(MINIMAL).unwrap();
        assert_eq!(c.tls.mode, SslMode::Prefer);
        assert!(c.tls_origins.is_empty());

        let url = MINIMAL.replace(
            "/cdc\"",
            "/cdc?sslmode=require&sslrootcert=/etc/cdcd/rds-ca.pem\"",
        );
        let c = pg(&url).unwrap();
        assert_eq!(c.tls.mode, SslMode::Require);
        assert_eq!(c.tls.effective_mode(), SslMode::VerifyCa);
        assert_eq!(c.database, "cdc");
        assert_eq!(
            c.tls_origins,
            [
                "sslmode=require (URL)",
                "sslrootcert=/etc/cdcd/rds-ca.pem (URL)"
            ]
        );

        let keys = url.replace(
            "[source]",
            "[source]\nsslmode = \"verify-full\"\nsslsni = false\nsslcert = \"/c.pem\"\nsslkey = \"/k.pem\"",
        );
        let c = pg(&keys).unwrap();
        assert_eq!(c.tls.mode, SslMode::VerifyFull);
        assert_eq!(
            c.tls.root_cert,
            Some(RootCerts::File("/etc/cdcd/rds-ca.pem".into()))
        );
        assert!(!c.tls.sni);
        assert_eq!(
            c.tls_origins[0],
            "sslmode=verify-full (source.sslmode, over the URL's require)"
        );
        assert!(c
            .tls_origins
            .contains(&"sslkey=/k.pem (source.sslkey)".to_owned()));
        assert!(!format!("{c:?}").contains("s3cret"));

        let e = pg(&MINIMAL.replace("/cdc\"", "/cdc?sslmode=verify_full\"")).unwrap_err();
        assert!(e.contains("source.url") && e.contains("verify-full"), "{e}");
        let e = pg(&MINIMAL.replace("/cdc\"", "/cdc?connect_timeout=5\"")).unwrap_err();
        assert!(
            e.contains("connect_timeout") && e.contains("sslmode"),
            "{e}"
        );
        let e = pg(&MINIMAL.replace("[source]", "[source]\nsslmode = \"on\"")).unwrap_err();
        assert!(e.contains("source.sslmode"), "{e}");
        let e = pg(&MINIMAL.replace("[source]", "[source]\nsslcert = \"/c.pem\"")).unwrap_err();
        assert!(e.contains("source.sslcert") && e.contains("sslkey"), "{e}");
    }

    #[test]
    fn heartbeat_interval_defaults_and_turns_off() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres")
        };
        assert_eq!(
            pg.heartbeat_interval,
            Some(std::time::Duration::from_secs(10))
        );
        let off = MINIMAL.replace("[source]", "[source]\nheartbeat_interval_ms = 0");
        let c = Config::from_toml(&off, "p.toml").unwrap();
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres")
        };
        assert_eq!(pg.heartbeat_interval, None);
    }

    /// Issue 23: `source.key_columns` names one table each (no wildcards) and distinct columns.
    #[test]
    fn key_columns_are_checked() {
        let with = |v: &str| {
            Config::from_toml(
                &MINIMAL.replace("[source]", &format!("[source]\nkey_columns = {v}")),
                "p.toml",
            )
            .map(|c| c.source)
            .map_err(|e| e.to_string())
        };
        let Ok(SourceConfig::Postgres(pg)) =
            with(r#"{ "public.events" = ["tenant_id", "event_id"] }"#)
        else {
            panic!("postgres source expected")
        };
        let t = crate::changelog::TableId::new("public", "events");
        assert_eq!(pg.key_columns[&t], ["tenant_id", "event_id"]);
        for (bad, says) in [
            (r#"{ "events" = ["a"] }"#, "is not schema.table"),
            (r#"{ "public.*" = ["a"] }"#, "no wildcards"),
            (r#"{ "public.e" = [] }"#, "at least one column"),
            (r#"{ "public.e" = ["a", "a"] }"#, "listed twice"),
        ] {
            let e = with(bad).unwrap_err();
            assert!(
                e.contains("source.key_columns") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }
}
