//! What every connector's `validate()` is handed ([`Context`]: the file, the pipeline name, and the
//! checks two connectors share: table patterns, chunk sizes, the warehouse), and the parsing of
//! `source.url` both sources use ([`SourceUrl`]).

use std::path::Path;

use super::error::ConfigError;

/// What a connector's `validate` needs besides its own section.
pub struct Context<'a> {
    /// The file, for messages.
    pub file: &'a str,
    /// The validated `pipeline.name` (default slot and publication names).
    pub pipeline: &'a str,
    /// `pipeline.spill_dir` as written.
    pub spill_dir: Option<&'a Path>,
}

impl Context<'_> {
    /// The error for `key` in this file.
    pub fn invalid(&self, key: &'static str, detail: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key,
            detail: detail.into(),
        }
    }

    /// `value`, refusing 0 for `key`.
    pub fn at_least_one<T: Default + PartialEq>(
        &self,
        key: &'static str,
        value: T,
    ) -> Result<T, ConfigError> {
        if value == T::default() {
            return Err(self.invalid(key, "must be at least 1"));
        }
        Ok(value)
    }

    /// `source.snapshot_chunk_rows` (either source): target rows per chunk of the initial copy,
    /// the unit of resuming after a crash; default 250000.
    pub fn snapshot_chunk_rows(&self, value: Option<u64>) -> Result<u64, ConfigError> {
        self.at_least_one("source.snapshot_chunk_rows", value.unwrap_or(250_000))
    }

    /// `table` as one `<container>.table` (no wildcards) under `key`; `or` names what else the
    /// key takes, for the message.
    pub fn one_table(
        &self,
        key: &'static str,
        table: &str,
        container: &str,
        or: &str,
    ) -> Result<crate::changelog::TableId, ConfigError> {
        match table.split_once('.') {
            Some((a, b))
                if !a.is_empty() && !b.is_empty() && !b.contains('.') && !table.contains('*') =>
            {
                Ok(crate::changelog::TableId::new(a, b))
            }
            _ => Err(self.invalid(
                key,
                format!("{table:?} is not {container}.table (one table, no wildcards){or}"),
            )),
        }
    }

    /// Checks `source.key_columns` (either source): each entry names one table as
    /// `<container>.table` (no wildcards) and a non-empty list of distinct column names. Whether
    /// the table is captured and the columns exist and are NOT NULL is checked against the server
    /// (`cdcd check`, start-up).
    pub fn key_columns(
        &self,
        raw: std::collections::BTreeMap<String, Vec<String>>,
        container: &str,
    ) -> Result<std::collections::BTreeMap<crate::changelog::TableId, Vec<String>>, ConfigError>
    {
        let mut out = std::collections::BTreeMap::new();
        for (table, columns) in raw {
            let id = self.one_table("source.key_columns", &table, container, "")?;
            if columns.is_empty() {
                return Err(self.invalid(
                    "source.key_columns",
                    format!("{table:?}: list at least one column"),
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(dup) = columns.iter().find(|c| !seen.insert(c.as_str())) {
                return Err(self.invalid(
                    "source.key_columns",
                    format!("{table:?}: column {dup:?} is listed twice"),
                ));
            }
            out.insert(id, columns);
        }
        Ok(out)
    }

    /// Checks `source.tables`: a non-empty list of `<container>.table` patterns, where
    /// `container` is "schema" (Postgres) or "db" (MySQL) and `example` a container name for the
    /// message.
    pub fn source_tables(
        &self,
        tables: &[String],
        container: &str,
        example: &str,
    ) -> Result<(), ConfigError> {
        if tables.is_empty() {
            return Err(self.invalid(
                "source.tables",
                format!(
                    "is empty: list {container}.table patterns such as \"{example}.orders\" or \
                     \"{example}.*\""
                ),
            ));
        }
        for t in tables {
            match t.split_once('.') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.') => {}
                _ => {
                    return Err(self.invalid(
                        "source.tables",
                        format!(
                            "{t:?} is not {container}.table (e.g. \"{example}.orders\" or \
                             \"{example}.*\")"
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Checks `sink.warehouse` and `sink.namespace` (either sink): the warehouse normalized (see
    /// [`normalize_warehouse`]), and the namespace if set.
    pub fn sink_location(
        &self,
        warehouse: &str,
        namespace: Option<String>,
    ) -> Result<(String, Option<String>), ConfigError> {
        let warehouse =
            normalize_warehouse(warehouse).map_err(|d| self.invalid("sink.warehouse", d))?;
        if let Some(ns) = &namespace {
            if ns.is_empty() || ns.contains(['/', '.', '\\']) {
                return Err(self.invalid(
                    "sink.namespace",
                    format!("{ns:?} must be non-empty without '/' or '.'"),
                ));
            }
        }
        Ok((warehouse, namespace))
    }
}

/// What both sources take from `source.url` (`<scheme>://user[:password]@host:port/db`).
pub struct SourceUrl {
    pub url: url::Url,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// `source.password` when set (it wins), else the URL's.
    pub password: Option<String>,
    pub database: String,
}

impl SourceUrl {
    /// Parses `source.url` with one of `schemes` (the first is the one messages show).
    pub fn parse(
        ctx: &Context<'_>,
        text: &str,
        password: Option<String>,
        schemes: [&str; 2],
        default_port: u16,
        default_user: &str,
    ) -> Result<SourceUrl, ConfigError> {
        let bad = |detail: String| ctx.invalid("source.url", detail);
        let expected = format!("expected {}://user@host:port/db", schemes[0]);
        let url = url::Url::parse(text).map_err(|e| {
            bad(format!(
                "{:?} is not a URL ({e}); {expected}",
                redact_url(text)
            ))
        })?;
        if !schemes.contains(&url.scheme()) {
            return Err(bad(format!("scheme {:?}: {expected}", url.scheme())));
        }
        let database = url.path().trim_start_matches('/').to_owned();
        if database.is_empty() {
            return Err(bad(format!("names no database: {expected}")));
        }
        Ok(SourceUrl {
            host: url.host_str().unwrap_or("localhost").to_owned(),
            port: url.port().unwrap_or(default_port),
            user: match url.username() {
                "" => default_user.to_owned(),
                u => percent_decode(u),
            },
            password: password.or_else(|| url.password().map(percent_decode)),
            database,
            url,
        })
    }
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
}

/// `sink.warehouse` when unset (either sink).
pub(crate) fn default_warehouse() -> String {
    "./warehouse".into()
}

/// A warehouse URL in canonical form: `file:///absolute/path` (a bare path is made absolute) or
/// `s3://bucket/prefix`.
pub fn normalize_warehouse(w: &str) -> Result<String, String> {
    let w = w.trim().trim_end_matches('/');
    if w.is_empty() {
        return Err("is empty".into());
    }
    if let Some(rest) = w.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(format!(
                "{w:?}: a file URL needs an absolute path (file:///…)"
            ));
        }
        return Ok(format!("file://{rest}"));
    }
    if w.starts_with("s3://") {
        return Ok(w.to_owned());
    }
    if w.contains("://") {
        return Err(format!(
            "{w:?}: use file:///path, a local path, or s3://bucket/prefix"
        ));
    }
    let path = Path::new(w);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve {w:?}: {e}"))?
            .join(path)
    };
    let text = abs.display().to_string();
    let text = text.trim_end_matches('/').replace("/./", "/");
    Ok(format!("file://{text}"))
}

/// The URL with any password replaced by `***`, for messages.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "<unparsable url>".into(),
    }
}
