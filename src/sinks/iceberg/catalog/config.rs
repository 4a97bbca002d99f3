//! `[sink.catalog]` of the Iceberg sink: the keys as written ([`RawCatalog`], whose field docs are
//! the user docs) and the validated choice ([`CatalogConfig`]).
//!
//! The section is one struct rather than a serde enum tagged by `kind`: `kind` is optional
//! (filesystem), and a key of another kind must reach [`RawCatalog::validate`] to be refused by
//! name ("applies to kind = \"rest\" only") instead of serde's "unknown field".

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::context::{redact_url, Context};
use crate::config::error::ConfigError;
use crate::tls::postgres::{TlsSettings, PARAMETERS};

/// `[sink.catalog]`: where the Iceberg sink finds and commits its tables.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCatalog {
    /// "filesystem" (the default: metadata files + `version-hint.text`), "sql" (an Iceberg
    /// JDBC/SQL catalog on Postgres or SQLite) or "rest" (an Iceberg REST catalog).
    #[serde(default)]
    pub kind: CatalogKind,
    /// sql: `postgres://user[:password]@host:port/db` or `sqlite:///path/catalog.db`. Postgres
    /// TLS as libpq, in the query: `?sslmode=verify-full&sslrootcert=/ca.pem` (also `sslcert`,
    /// `sslkey`, `sslsni`); `sslmode` defaults to `prefer`. rest: the base URI
    /// (`http(s)://host:port[/path]`, without `/v1`).
    pub uri: Option<String>,
    /// sql: the `catalog_name` column (default "cdcd").
    pub name: Option<String>,
    /// rest: the warehouse identifier sent to `GET /v1/config` (optional).
    pub warehouse: Option<String>,
    /// rest: a bearer token (`CDCD_SINK__CATALOG__TOKEN` overrides).
    pub token: Option<String>,
    /// rest: OAuth2 client credentials `client_id:client_secret`, exchanged for tokens at
    /// `oauth2_server_uri` (`CDCD_SINK__CATALOG__CREDENTIAL` overrides).
    pub credential: Option<String>,
    /// rest: the OAuth2 token endpoint (default: the catalog's `v1/oauth/tokens`).
    pub oauth2_server_uri: Option<String>,
    /// rest: the OAuth2 scope (default "catalog").
    pub scope: Option<String>,
    /// rest: sign every request with AWS SigV4 (AWS Glue's and S3 Tables' REST endpoints), with
    /// the credentials an `s3://` warehouse would use (`[sink.s3]`, `AWS_*`, the profile, …).
    pub sigv4: Option<bool>,
    /// rest: the SigV4 service name (default "glue"; S3 Tables: "s3tables").
    pub signing_name: Option<String>,
    /// rest: the SigV4 region (default: `sink.s3.region`, else `AWS_REGION`, else "us-east-1").
    pub signing_region: Option<String>,
}

impl fmt::Debug for RawCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawCatalog")
            .field("kind", &self.kind)
            .field("uri", &self.uri.as_deref().map(redact_url))
            .field("name", &self.name)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("credential", &self.credential.as_ref().map(|_| "***"))
            .field("oauth2_server_uri", &self.oauth2_server_uri)
            .finish_non_exhaustive()
    }
}

/// `sink.catalog.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogKind {
    #[default]
    Filesystem,
    Sql,
    Rest,
}

/// The catalog the Iceberg sink runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CatalogConfig {
    /// Tables found by path: `metadata/v<N>.metadata.json` + `version-hint.text`.
    #[default]
    Filesystem,
    /// An Iceberg JDBC/SQL catalog (`catalog/sql.rs`).
    Sql { uri: SqlUri, name: String },
    /// An Iceberg REST catalog (`catalog/rest.rs`).
    Rest(RestConfig),
}

/// `kind = "rest"`: where the catalog is and how cdcd signs in. `Debug` never shows a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct RestConfig {
    /// The base URI, without a trailing `/`.
    pub uri: String,
    /// Sent to `GET /v1/config` as `?warehouse=`.
    pub warehouse: Option<String>,
    pub auth: RestAuth,
}

/// How cdcd authenticates to a REST catalog.
#[derive(Clone, PartialEq, Eq)]
pub enum RestAuth {
    /// No `Authorization` header.
    None,
    /// `Authorization: Bearer <token>`, as given.
    Token(String),
    /// OAuth2 client credentials (RFC 6749 §4.4) exchanged at `server_uri` for a bearer token,
    /// refreshed before it expires and after a 401.
    ClientCredentials {
        client_id: String,
        client_secret: String,
        /// `None`: the catalog's own `v1/oauth/tokens`.
        server_uri: Option<String>,
        scope: String,
    },
    /// Every request signed with AWS SigV4 for service `name` in `region` (`None`: from the S3
    /// settings and the environment, at start), with the credentials an `s3://` warehouse with
    /// `s3`'s settings would use (set by `crate::config` after `[sink.s3]` is read).
    SigV4 {
        name: String,
        region: Option<String>,
        /// Boxed: it is large and most configurations have no SigV4.
        s3: Box<crate::storage::s3::S3Config>,
    },
}

impl fmt::Debug for RestConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestConfig")
            .field("uri", &redact_url(&self.uri))
            .field("warehouse", &self.warehouse)
            .field("auth", &self.auth)
            .finish()
    }
}

impl fmt::Debug for RestAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestAuth::None => f.write_str("None"),
            RestAuth::Token(_) => f.write_str("Token(***)"),
            RestAuth::ClientCredentials {
                client_id,
                server_uri,
                scope,
                ..
            } => f
                .debug_struct("ClientCredentials")
                .field("client_id", client_id)
                .field("client_secret", &"***")
                .field("server_uri", server_uri)
                .field("scope", scope)
                .finish(),
            RestAuth::SigV4 { name, region, .. } => f
                .debug_struct("SigV4")
                .field("name", name)
                .field("region", region)
                .finish(),
        }
    }
}

impl CatalogConfig {
    /// Hands `[sink.s3]` to a SigV4-signing REST catalog, whose credentials come from the same
    /// settings and chain as an `s3://` warehouse's.
    pub fn with_s3(mut self, settings: &crate::storage::s3::S3Config) -> CatalogConfig {
        if let CatalogConfig::Rest(RestConfig {
            auth: RestAuth::SigV4 { s3, .. },
            ..
        }) = &mut self
        {
            **s3 = settings.clone();
        }
        self
    }
}

impl RestAuth {
    /// How `cdcd check` and `cdcd status` name it (no secret).
    pub fn summary(&self) -> String {
        match self {
            RestAuth::None => "no authentication".to_owned(),
            RestAuth::Token(_) => "bearer token".to_owned(),
            RestAuth::ClientCredentials { client_id, .. } => {
                format!("OAuth2 client credentials of {client_id:?}")
            }
            RestAuth::SigV4 { name, .. } => format!("AWS SigV4 for {name:?}"),
        }
    }
}

/// Where a SQL catalog's tables are. `Display` and `Debug` never show a password.
#[derive(Clone, PartialEq, Eq)]
pub enum SqlUri {
    /// `sqlite:///path`: the database file at `/path`.
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, and its TLS settings.
    Postgres(PostgresUri),
}

/// A Postgres catalog URI split in two: what tokio-postgres is given, and the libpq TLS
/// parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslsni`) that cdcd's own
/// connector (`crate::tls::postgres`) handles. They are taken out of the URI because
/// tokio-postgres knows only `sslmode` disable|prefer|require, and would refuse `verify-full`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUri {
    /// As written, for display (redacted there: it may carry a password).
    written: String,
    /// Without its query: what tokio-postgres parses.
    connect: String,
    pub tls: TlsSettings,
}

impl PostgresUri {
    /// Splits `text` (a `postgres://` or `postgresql://` URI); only the TLS parameters are
    /// understood in its query, as for `source.url`. Errors name no password.
    pub fn parse(text: &str) -> Result<PostgresUri, String> {
        let (connect, query) = match text.split_once('?') {
            Some((base, query)) => (base, query),
            None => (text, ""),
        };
        let mut tls = TlsSettings::default();
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match tls.set(&k, &v) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "query parameter {k:?}: only {} are understood",
                        PARAMETERS.join(", ")
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        tls.validate()?;
        if let Err(e) = connect.parse::<tokio_postgres::Config>() {
            return Err(format!(
                "{:?} is not a Postgres URI ({e})",
                redact_url(text)
            ));
        }
        Ok(PostgresUri {
            written: text.to_owned(),
            connect: connect.to_owned(),
            tls,
        })
    }

    /// The connection settings without TLS (the driver sets the mode and the connector).
    pub fn config(&self) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
        self.connect.parse()
    }
}

impl fmt::Display for PostgresUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.written))
    }
}

impl fmt::Debug for PostgresUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUri({self}, {})", self.tls.summary())
    }
}

impl fmt::Display for SqlUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqlUri::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            SqlUri::Postgres(uri) => uri.fmt(f),
        }
    }
}

impl fmt::Debug for SqlUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SqlUri({self})")
    }
}

impl SqlUri {
    /// Parses `sink.catalog.uri` (the error text names no password).
    pub fn parse(text: &str) -> Result<SqlUri, String> {
        let expected = "use postgres://user@host:port/db or sqlite:///path/catalog.db";
        if let Some(path) = text.strip_prefix("sqlite://") {
            if !path.starts_with('/') || path.len() < 2 {
                return Err(format!(
                    "{text:?}: a SQLite catalog needs an absolute path (sqlite:///path/catalog.db)"
                ));
            }
            return Ok(SqlUri::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return PostgresUri::parse(text)
                .map(SqlUri::Postgres)
                .map_err(|e| format!("{e}; {expected}"));
        }
        Err(format!("{:?}: {expected}", redact_url(text)))
    }
}

impl RawCatalog {
    /// Checks the keys of the chosen kind; a key of another kind is refused by name.
    pub fn validate(self, ctx: &Context<'_>) -> Result<CatalogConfig, ConfigError> {
        let rest_keys = [
            ("sink.catalog.warehouse", self.warehouse.is_some()),
            ("sink.catalog.token", self.token.is_some()),
            ("sink.catalog.credential", self.credential.is_some()),
            (
                "sink.catalog.oauth2_server_uri",
                self.oauth2_server_uri.is_some(),
            ),
            ("sink.catalog.scope", self.scope.is_some()),
            ("sink.catalog.sigv4", self.sigv4.is_some()),
            ("sink.catalog.signing_name", self.signing_name.is_some()),
            ("sink.catalog.signing_region", self.signing_region.is_some()),
        ];
        let refuse_rest_keys = |kind: &str| match rest_keys.iter().find(|(_, set)| *set) {
            Some((key, _)) => Err(ctx.invalid(
                key,
                format!("applies to kind = \"rest\" only, not {kind:?}"),
            )),
            None => Ok(()),
        };
        match self.kind {
            CatalogKind::Rest => self.validate_rest(ctx),
            CatalogKind::Filesystem => {
                refuse_rest_keys("filesystem")?;
                for (key, set) in [
                    ("sink.catalog.uri", self.uri.is_some()),
                    ("sink.catalog.name", self.name.is_some()),
                ] {
                    if set {
                        return Err(ctx.invalid(key, "applies to kind = \"sql\" only (the filesystem catalog finds tables by path)"));
                    }
                }
                Ok(CatalogConfig::Filesystem)
            }
            CatalogKind::Sql => {
                refuse_rest_keys("sql")?;
                let Some(text) = self.uri else {
                    return Err(ctx.invalid(
                        "sink.catalog.uri",
                        "missing: kind = \"sql\" needs uri = \"postgres://user@host:port/db\" or \"sqlite:///path/catalog.db\"",
                    ));
                };
                let uri = SqlUri::parse(&text).map_err(|e| ctx.invalid("sink.catalog.uri", e))?;
                let name = self.name.unwrap_or_else(|| "cdcd".to_owned());
                if name.is_empty() || name.len() > 255 {
                    return Err(ctx.invalid(
                        "sink.catalog.name",
                        format!("{name:?}: use 1 to 255 characters"),
                    ));
                }
                Ok(CatalogConfig::Sql { uri, name })
            }
        }
    }

    fn validate_rest(self, ctx: &Context<'_>) -> Result<CatalogConfig, ConfigError> {
        if self.name.is_some() {
            return Err(ctx.invalid(
                "sink.catalog.name",
                "applies to kind = \"sql\" only (a REST catalog is named by its uri and warehouse)",
            ));
        }
        let sigv4 = self.sigv4.unwrap_or(false);
        if !sigv4 && (self.signing_name.is_some() || self.signing_region.is_some()) {
            return Err(ctx.invalid(
                "sink.catalog.signing_name",
                "applies with sigv4 = true only",
            ));
        }
        let Some(uri) = self.uri else {
            return Err(ctx.invalid(
                "sink.catalog.uri",
                "missing: kind = \"rest\" needs uri = \"http://host:port\" (the catalog's base URI, without /v1)",
            ));
        };
        let uri = uri.trim_end_matches('/').to_owned();
        match url::Url::parse(&uri) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err(ctx.invalid(
                    "sink.catalog.uri",
                    format!("{:?} is not an http:// or https:// URI", redact_url(&uri)),
                ))
            }
        }
        if uri.ends_with("/v1") {
            return Err(ctx.invalid(
                "sink.catalog.uri",
                "leave /v1 out: cdcd adds it (uri = \"http://host:port\")",
            ));
        }
        if sigv4 {
            if self.token.is_some() || self.credential.is_some() || self.oauth2_server_uri.is_some()
            {
                return Err(ctx.invalid(
                    "sink.catalog.sigv4",
                    "signs with AWS credentials: leave token, credential and oauth2_server_uri out",
                ));
            }
            return Ok(CatalogConfig::Rest(RestConfig {
                uri,
                warehouse: self.warehouse,
                auth: RestAuth::SigV4 {
                    name: self.signing_name.unwrap_or_else(|| "glue".to_owned()),
                    region: self.signing_region,
                    s3: Box::default(),
                },
            }));
        }
        let auth = match (self.token, self.credential) {
            (Some(_), Some(_)) => {
                return Err(ctx.invalid(
                    "sink.catalog.credential",
                    "set token or credential, not both",
                ))
            }
            (Some(token), None) => {
                if self.oauth2_server_uri.is_some() || self.scope.is_some() {
                    return Err(ctx.invalid(
                        "sink.catalog.oauth2_server_uri",
                        "applies to credential = \"client_id:client_secret\" only",
                    ));
                }
                RestAuth::Token(token)
            }
            (None, Some(credential)) => {
                let Some((id, secret)) = credential.split_once(':') else {
                    return Err(
                        ctx.invalid("sink.catalog.credential", "use \"client_id:client_secret\"")
                    );
                };
                RestAuth::ClientCredentials {
                    client_id: id.to_owned(),
                    client_secret: secret.to_owned(),
                    server_uri: self.oauth2_server_uri,
                    scope: self.scope.unwrap_or_else(|| "catalog".to_owned()),
                }
            }
            (None, None) => {
                if self.oauth2_server_uri.is_some() || self.scope.is_some() {
                    return Err(ctx.invalid(
                        "sink.catalog.oauth2_server_uri",
                        "applies to credential = \"client_id:client_secret\" only",
                    ));
                }
                RestAuth::None
            }
        };
        Ok(CatalogConfig::Rest(RestConfig {
            uri,
            warehouse: self.warehouse,
            auth,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use crate::config::tests::{iceberg_sink, MINIMAL};
    use crate::config::{Config, SinkConfig};

    use super::*;

    fn with_catalog(section: &str) -> Result<Config, String> {
        let text = format!("{MINIMAL}\n[sink.catalog]\n{section}\n");
        Config::from_toml(&text, "p.toml").map_err(|e| e.to_string())
    }

    fn catalog(section: &str) -> CatalogConfig {
        match with_catalog(section).unwrap().sink {
            SinkConfig::Iceberg(ice) => ice.catalog,
            SinkConfig::Lsm(_) => panic!("iceberg"),
        }
    }

    #[test]
    fn filesystem_is_the_default() {
        assert_eq!(iceberg_sink(MINIMAL).catalog, CatalogConfig::Filesystem);
        assert_eq!(catalog("kind = \"filesystem\""), CatalogConfig::Filesystem);
    }

    #[test]
    fn sql_on_sqlite_and_postgres() {
        assert_eq!(
            catalog("kind = \"sql\"\nuri = \"sqlite:///var/lib/cdcd/catalog.db\""),
            CatalogConfig::Sql {
                uri: SqlUri::Sqlite("/var/lib/cdcd/catalog.db".into()),
                name: "cdcd".into()
            }
        );
        let CatalogConfig::Sql { uri, name } = catalog(
            "kind = \"sql\"\nuri = \"postgres://cat:s3cret@db:5432/lake\"\nname = \"prod\"",
        ) else {
            panic!("sql")
        };
        assert_eq!(name, "prod");
        assert_eq!(uri.to_string(), "postgres://cat:***@db:5432/lake");
        assert!(!format!("{uri:?}").contains("s3cret"));
    }

    fn postgres(uri: &str) -> Result<PostgresUri, String> {
        match SqlUri::parse(uri)? {
            SqlUri::Postgres(pg) => Ok(pg),
            SqlUri::Sqlite(_) => panic!("postgres"),
        }
    }

    #[test]
    fn postgres_tls_parameters_come_from_the_query() {
        use crate::tls::postgres::{RootCerts, SslMode};
        // libpq's default.
        let pg = postgres("postgres://cat:s3cret@db:5432/lake").unwrap();
        assert_eq!(pg.tls, TlsSettings::default());
        assert_eq!(pg.tls.mode, SslMode::Prefer);
        let pg = postgres(
            "postgresql://cat:s3cret@db.example.com/lake?sslmode=verify-full&sslrootcert=/etc/ssl/rds.pem&sslsni=0",
        )
        .unwrap();
        assert_eq!(pg.tls.mode, SslMode::VerifyFull);
        assert_eq!(
            pg.tls.root_cert,
            Some(RootCerts::File("/etc/ssl/rds.pem".into()))
        );
        assert!(!pg.tls.sni);
        // tokio-postgres sees no TLS parameter (it would refuse verify-full).
        let config = pg.config().unwrap();
        assert_eq!(config.get_dbname(), Some("lake"));
        let pg = postgres(
            "postgres://cat@db/lake?sslmode=require&sslrootcert=system&sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap();
        assert_eq!(pg.tls.root_cert, Some(RootCerts::System));
        assert_eq!(pg.tls.cert, Some("/c.pem".into()));
        assert_eq!(pg.tls.key, Some("/k.pem".into()));
        // Percent-encoded values are decoded, as libpq does.
        let pg = postgres("postgres://cat@db/lake?sslrootcert=%2Fa%20b%2Fca.pem").unwrap();
        assert_eq!(
            pg.tls.root_cert,
            Some(RootCerts::File("/a b/ca.pem".into()))
        );
    }

    #[test]
    fn postgres_query_errors_are_named_and_hide_the_password() {
        let e = postgres("postgres://cat:s3cret@db/lake?connect_timeout=5").unwrap_err();
        assert!(
            e.contains("\"connect_timeout\"")
                && e.contains("only sslmode, sslrootcert, sslcert, sslkey, sslsni are understood")
                && !e.contains("s3cret"),
            "{e}"
        );
        let e = postgres("postgres://cat:s3cret@db/lake?sslmode=verify").unwrap_err();
        assert!(e.contains("verify-full") && !e.contains("s3cret"), "{e}");
        let e = postgres("postgres://cat:s3cret@db/lake?sslcert=/c.pem").unwrap_err();
        assert!(e.contains("sslkey"), "{e}");
        let e = postgres("postgres://cat:s3cret@db/lake?sslsni=yes").unwrap_err();
        assert!(e.contains("sslsni"), "{e}");
        // Through the loader: the key is named.
        let e =
            with_catalog("kind = \"sql\"\nuri = \"postgres://cat:s3cret@db/lake?sslmode=verify\"")
                .unwrap_err();
        assert!(
            e.contains("sink.catalog.uri") && !e.contains("s3cret"),
            "{e}"
        );
        // The display keeps the parameters, never the password.
        let pg = postgres("postgres://cat:s3cret@db/lake?sslmode=verify-ca&sslrootcert=/ca.pem")
            .unwrap();
        let shown = format!("{pg} {pg:?}");
        assert!(
            shown.contains("sslmode=verify-ca") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn rest_with_a_token_or_client_credentials() {
        let CatalogConfig::Rest(rest) = catalog(
            "kind = \"rest\"\nuri = \"http://127.0.0.1:8181/\"\nwarehouse = \"lake\"\ntoken = \"t0ps3cret\"",
        ) else {
            panic!("rest")
        };
        assert_eq!(rest.uri, "http://127.0.0.1:8181");
        assert_eq!(rest.warehouse.as_deref(), Some("lake"));
        assert_eq!(rest.auth, RestAuth::Token("t0ps3cret".into()));
        assert!(!format!("{rest:?}").contains("t0ps3cret"));
        let CatalogConfig::Rest(rest) = catalog(
            "kind = \"rest\"\nuri = \"https://cat.example.com/api/catalog\"\ncredential = \"cdcd:s3cret\"\nscope = \"PRINCIPAL_ROLE:ALL\"",
        ) else {
            panic!("rest")
        };
        assert_eq!(
            rest.auth,
            RestAuth::ClientCredentials {
                client_id: "cdcd".into(),
                client_secret: "s3cret".into(),
                server_uri: None,
                scope: "PRINCIPAL_ROLE:ALL".into(),
            }
        );
        let shown = format!("{rest:?} {}", rest.auth.summary());
        assert!(
            !shown.contains("s3cret") && shown.contains("cdcd"),
            "{shown}"
        );
    }

    #[test]
    fn rest_with_sigv4() {
        let CatalogConfig::Rest(rest) = catalog(
            "kind = \"rest\"\nuri = \"https://glue.us-east-1.amazonaws.com/iceberg\"\nwarehouse = \"123456789012\"\nsigv4 = true",
        ) else {
            panic!("rest")
        };
        assert_eq!(
            rest.auth,
            RestAuth::SigV4 {
                name: "glue".into(),
                region: None,
                s3: Box::default(),
            }
        );
        let CatalogConfig::Rest(rest) = catalog(
            "kind = \"rest\"\nuri = \"https://s3tables.eu-west-1.amazonaws.com/iceberg\"\nsigv4 = true\nsigning_name = \"s3tables\"\nsigning_region = \"eu-west-1\"",
        ) else {
            panic!("rest")
        };
        assert_eq!(rest.auth.summary(), "AWS SigV4 for \"s3tables\"");
    }

    #[test]
    fn rest_errors_name_the_key() {
        for (section, key, words) in [
            ("kind = \"rest\"", "sink.catalog.uri", "missing"),
            (
                "kind = \"rest\"\nuri = \"ftp://h\"",
                "sink.catalog.uri",
                "http",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h:8181/v1\"",
                "sink.catalog.uri",
                "leave /v1 out",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h\"\ntoken = \"a\"\ncredential = \"b:c\"",
                "sink.catalog.credential",
                "not both",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h\"\ncredential = \"nocolon\"",
                "sink.catalog.credential",
                "client_id:client_secret",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h\"\nsigv4 = true\ntoken = \"t\"",
                "sink.catalog.sigv4",
                "leave token",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h\"\nsigning_name = \"glue\"",
                "sink.catalog.signing_name",
                "sigv4 = true",
            ),
            (
                "kind = \"rest\"\nuri = \"http://h\"\nname = \"x\"",
                "sink.catalog.name",
                "sql",
            ),
        ] {
            let e = with_catalog(section).unwrap_err();
            assert!(e.contains(key) && e.contains(words), "{section}: {e}");
        }
    }

    #[test]
    fn errors_name_the_key_and_hide_the_password() {
        let e = with_catalog("kind = \"sql\"").unwrap_err();
        assert!(e.contains("sink.catalog.uri"), "{e}");
        let e = with_catalog("kind = \"sql\"\nuri = \"mysql://u:s3cret@h/db\"").unwrap_err();
        assert!(
            e.contains("sink.catalog.uri") && !e.contains("s3cret"),
            "{e}"
        );
        let e = with_catalog("kind = \"sql\"\nuri = \"sqlite://relative.db\"").unwrap_err();
        assert!(e.contains("absolute path"), "{e}");
        let e = with_catalog("uri = \"sqlite:///c.db\"").unwrap_err();
        assert!(e.contains("sink.catalog.uri") && e.contains("sql"), "{e}");
        let e =
            with_catalog("kind = \"sql\"\nuri = \"sqlite:///c.db\"\ntoken = \"x\"").unwrap_err();
        assert!(e.contains("sink.catalog.token"), "{e}");
    }

    #[test]
    fn lsm_refuses_a_catalog() {
        let text = MINIMAL.replace("[sink]", "[sink]\nkind = \"lsm\"");
        let text = format!("{text}\n[sink.catalog]\nkind = \"sql\"\nuri = \"sqlite:///c.db\"\n");
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(e.contains("sink.catalog") && e.contains("Paimon"), "{e}");
    }
}
