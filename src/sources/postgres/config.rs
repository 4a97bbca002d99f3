//! `[source]` with `kind = "postgres"`: the keys as written ([`RawPostgres`], whose field docs are
//! the user docs), their checks, and the settings the Postgres source runs with
//! ([`PostgresConfig`]). `crate::config` reads the file and picks this struct by `kind`.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::tls::{TlsSettings, PARAMETERS};
use crate::config::{redact_url, ConfigError, Context, SnapshotMode, SourceUrl};

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
    /// TLS for every connection to the server (`sslmode` and friends, from the URL).
    pub tls: TlsSettings,
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
            self.password,
            ["postgres", "postgresql"],
            5432,
            "postgres",
        )?;
        let mut tls = TlsSettings::default();
        for (k, v) in url.query_pairs() {
            match tls.set(&k, &v) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ctx.invalid(
                        "source.url",
                        format!(
                            "query parameter {k:?}: only {} are understood",
                            PARAMETERS.join(", ")
                        ),
                    ))
                }
                Err(e) => return Err(ctx.invalid("source.url", e)),
            }
        }
        tls.validate().map_err(|e| ctx.invalid("source.url", e))?;
        ctx.source_tables(&self.tables, "schema", "public")?;
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
            tls,
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

#[cfg(test)]
mod tests {
    use crate::config::tests::MINIMAL;
    use crate::config::{Config, SourceConfig};

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
}
