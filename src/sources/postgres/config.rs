//! `[source]` with `kind = "postgres"`: the validated settings the Postgres source runs with.

use std::fmt;
use std::path::PathBuf;

use crate::config::{ConfigError, RawConfig, SnapshotMode, SourceUrl};

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
            .finish_non_exhaustive()
    }
}

impl RawConfig {
    pub(crate) fn postgres(
        &self,
        pipeline: &str,
        file: &str,
    ) -> Result<PostgresConfig, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let s = &self.source;
        let SourceUrl {
            url: _,
            host,
            port,
            user,
            password,
            database,
        } = self.source_url(file, ["postgres", "postgresql"], 5432, "postgres")?;
        if s.tables.is_empty() {
            return Err(bad(
                "source.tables",
                "is empty: list schema.table patterns such as \"public.orders\" or \"public.*\""
                    .into(),
            ));
        }
        for t in &s.tables {
            match t.split_once('.') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.') => {}
                _ => {
                    return Err(bad(
                        "source.tables",
                        format!(
                            "{t:?} is not schema.table (e.g. \"public.orders\" or \"public.*\")"
                        ),
                    ))
                }
            }
        }
        let default_name = format!("cdcd_{}", pipeline.replace('-', "_"));
        let slot = s.slot.clone().unwrap_or_else(|| default_name.clone());
        if !slot
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            || slot.is_empty()
            || slot.len() > 63
        {
            return Err(bad(
                "source.slot",
                format!("{slot:?}: Postgres slot names use only lower-case letters, digits and '_' (at most 63)"),
            ));
        }
        let publication = s.publication.clone().unwrap_or(default_name);
        if publication.is_empty() || publication.contains(['\'', '"', ',', ' ']) {
            return Err(bad(
                "source.publication",
                format!("{publication:?} is not a usable publication name"),
            ));
        }
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
        if s.server_id.is_some() {
            return Err(bad(
                "source.server_id",
                "applies to mysql sources only".into(),
            ));
        }
        if s.zero_date.is_some() {
            return Err(bad(
                "source.zero_date",
                "applies to mysql sources only".into(),
            ));
        }
        if s.start_position.is_some() {
            return Err(bad(
                "source.start_position",
                "applies to mysql sources only".into(),
            ));
        }
        let stream_memory_bytes = s.stream_memory_bytes.unwrap_or(64 << 20);
        if stream_memory_bytes == 0 {
            return Err(bad(
                "source.stream_memory_bytes",
                "must be at least 1".into(),
            ));
        }
        let heartbeat_interval = match s.heartbeat_interval_ms.unwrap_or(10_000) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        };
        let snapshot_parallelism = s.snapshot_parallelism.unwrap_or(4);
        if snapshot_parallelism == 0 {
            return Err(bad(
                "source.snapshot_parallelism",
                "must be at least 1".into(),
            ));
        }
        let snapshot_chunk_rows = s.snapshot_chunk_rows.unwrap_or(250_000);
        if snapshot_chunk_rows == 0 {
            return Err(bad(
                "source.snapshot_chunk_rows",
                "must be at least 1".into(),
            ));
        }
        Ok(PostgresConfig {
            heartbeat_interval,
            snapshot_parallelism,
            snapshot_chunk_rows,
            host,
            port,
            user,
            password,
            database,
            tables: s.tables.clone(),
            slot,
            publication,
            snapshot,
            stream_memory_bytes,
            spill_dir: self
                .pipeline
                .spill_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir),
        })
    }
}
