//! The frontend/backend start-up exchange (protocol §55.2.1 "Start-up"): TLS if asked for, the
//! StartupMessage, then authentication until ReadyForQuery. Shared by the walsender session
//! (`replication.rs`) and the initial copy's sessions (`snapshot/session.rs`), which differ only in
//! the `replication` parameter and in what they do after.
//!
//! Transport: the source's `sslmode` (`crate::tls::postgres`): an SSLRequest and a rustls handshake
//! first (`tls/postgres/stream.rs`) unless the mode is `disable`, or `allow` (plain first, and a second
//! connection in TLS if the server refuses the plain one, as libpq does).
//! Auth: trust, cleartext, md5 and SCRAM-SHA-256. The password never appears in an error or a log
//! line; a refusal names the user and the method.

use pgwire_replication::auth::ScramClient;
use pgwire_replication::protocol::framing::{
    write_password_message, write_startup_message, MessageReader,
};
use pgwire_replication::protocol::messages::{auth, parse_auth_request};
use pgwire_replication::protocol::BackendMessage;
use pgwire_replication::PgWireError;
use tokio::io::BufReader;
use tokio::net::TcpStream;

use crate::tls::postgres::stream::{self as tls_stream, PgStream, StartError};
use crate::tls::postgres::{requires_tls_hint, SslMode};

use super::replication::session_options;
use super::replication::wire::{
    describe, len_i32, sasl_offers_scram, server_error, server_major_version,
};
use crate::config::PostgresConfig;
use crate::sources::SourceError;

/// Protocol 3.0 (`196608`), the only frontend/backend version Postgres speaks.
const PROTOCOL_VERSION: i32 = 196_608;

/// Bound on one backend message; a bigger one ends the session (the reader cannot resync).
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// Which kind of session to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// A walsender (`replication=database`): replication commands and simple SQL. Counts
    /// against `max_wal_senders`.
    Walsender,
    /// An ordinary backend.
    Plain,
}

/// An authenticated session, ready for a query.
pub struct Opened {
    /// Buffered so that many small frames cost one syscall; `BufReader` passes writes through.
    /// Nothing is buffered when [`open`] returns: the server sends nothing after ReadyForQuery
    /// until it is asked something.
    pub stream: BufReader<PgStream>,
    pub reader: MessageReader,
    /// Major version from the `server_version` ParameterStatus (0: not reported).
    pub server_major: u32,
}

/// Connects to `cfg`'s server and authenticates, with the standard session options
/// ([`session_options`]) followed by `extra_options` (`-c name=value …`).
pub async fn open(
    cfg: &PostgresConfig,
    kind: SessionKind,
    extra_options: &str,
) -> Result<Opened, SourceError> {
    let mode = cfg.tls.mode;
    match open_once(cfg, kind, extra_options, mode.tls_first()).await {
        Ok(opened) => Ok(opened),
        Err(Failed {
            refused: true,
            error,
        }) if mode == SslMode::Allow => {
            tracing::debug!(target = %cfg.display_target(), error = %error, "plain connection refused; retrying in TLS (sslmode=allow)");
            open_once(cfg, kind, extra_options, true)
                .await
                .map_err(|f| f.error)
        }
        Err(f) => Err(f.error),
    }
}

/// Why one connection attempt failed; `refused`: the server answered with an ErrorResponse.
struct Failed {
    error: SourceError,
    refused: bool,
}

impl From<SourceError> for Failed {
    fn from(error: SourceError) -> Self {
        Failed {
            error,
            refused: false,
        }
    }
}

async fn open_once(
    cfg: &PostgresConfig,
    kind: SessionKind,
    extra_options: &str,
    tls: bool,
) -> Result<Opened, Failed> {
    let target = cfg.display_target();
    let connect_err = |detail: String| SourceError::Connect {
        target: target.clone(),
        detail,
    };
    let tcp = TcpStream::connect((cfg.host.as_str(), cfg.port))
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    // Status updates and queries are small and latency matters more than batching.
    tcp.set_nodelay(true)
        .map_err(|e| connect_err(e.to_string()))?;
    let stream = if tls {
        tls_stream::upgrade(tcp, &cfg.host, &cfg.tls)
            .await
            .map_err(|e| match e {
                StartError::Io(e) => connect_err(format!("asking for TLS: {e}")),
                StartError::Tls(e) => connect_err(e.to_string()),
            })?
    } else {
        PgStream::Plain(tcp)
    };
    let mut options = session_options();
    if !extra_options.is_empty() {
        options.push(' ');
        options.push_str(extra_options);
    }
    let mut params = vec![
        ("user", cfg.user.as_str()),
        ("database", cfg.database.as_str()),
    ];
    if kind == SessionKind::Walsender {
        params.push(("replication", "database"));
    }
    params.extend([
        ("client_encoding", "UTF8"),
        ("application_name", "cdcd"),
        ("options", options.as_str()),
    ]);
    let mut session = Startup {
        stream: BufReader::with_capacity(128 * 1024, stream),
        reader: MessageReader::new().with_max_message_size(MAX_MESSAGE_BYTES),
        target: &target,
        server_major: 0,
        method: None,
        refused: false,
    };
    write_startup_message(&mut session.stream, PROTOCOL_VERSION, &params)
        .await
        .map_err(|e| connect_err(describe(&e)))?;
    if let Err(error) = session.authenticate(cfg).await {
        return Err(Failed {
            error,
            refused: session.refused,
        });
    }
    Ok(Opened {
        stream: session.stream,
        reader: session.reader,
        server_major: session.server_major,
    })
}

/// The PasswordMessage for md5 authentication (protocol §55.2.1 "AuthenticationMD5Password"):
/// `"md5"` and the hex of md5(hex(md5(password ‖ user)) ‖ salt).
fn md5_response(user: &str, password: &str, salt: [u8; 4]) -> String {
    use md5::{Digest, Md5};
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let inner = hex(&Md5::new()
        .chain_update(password)
        .chain_update(user)
        .finalize());
    let outer = Md5::new().chain_update(inner).chain_update(salt).finalize();
    format!("md5{}", hex(&outer))
}

/// A SCRAM exchange in progress: the client state, then the auth message and salted password
/// that verify the server's final message.
struct ScramState {
    client: ScramClient,
    proof: Option<(String, Vec<u8>)>,
}

struct Startup<'t> {
    stream: BufReader<PgStream>,
    reader: MessageReader,
    target: &'t str,
    server_major: u32,
    /// The password method the server asked for, named in a refusal.
    method: Option<&'static str>,
    /// The server answered with an ErrorResponse (`sslmode=allow` then tries TLS).
    refused: bool,
}

impl Startup<'_> {
    /// Runs the exchange until ReadyForQuery.
    async fn authenticate(&mut self, cfg: &PostgresConfig) -> Result<(), SourceError> {
        let mut scram: Option<ScramState> = None;
        loop {
            let msg = self.read().await?;
            match msg.tag {
                b'R' => {
                    let (code, data) =
                        parse_auth_request(&msg.payload).map_err(|e| self.lost(e))?;
                    self.answer(cfg, code, data, &mut scram).await?;
                }
                b'E' => {
                    self.refused = true;
                    return Err(self.refusal(cfg, &server_error(&msg.payload)));
                }
                b'Z' => return Ok(()),
                b'S' => {
                    if let Some(major) = server_major_version(&msg.payload) {
                        self.server_major = major;
                    }
                }
                // BackendKeyData, NoticeResponse.
                _ => {}
            }
        }
    }

    /// Answers one authentication request (`code`, with its `data`); `scram` carries a SCRAM
    /// exchange from one request to the next.
    async fn answer(
        &mut self,
        cfg: &PostgresConfig,
        code: i32,
        data: &[u8],
        scram: &mut Option<ScramState>,
    ) -> Result<(), SourceError> {
        match code {
            auth::OK => {}
            auth::CLEARTEXT_PASSWORD => {
                self.method = Some("password");
                let password = self.password(cfg)?;
                let mut payload = Vec::with_capacity(password.len() + 1);
                payload.extend_from_slice(password.as_bytes());
                payload.push(0);
                write_password_message(&mut self.stream, &payload)
                    .await
                    .map_err(|e| self.lost(e))?;
            }
            auth::MD5_PASSWORD => {
                self.method = Some("md5");
                let Ok(salt) = <[u8; 4]>::try_from(data) else {
                    return Err(self.auth_failed("md5 request without a 4-byte salt"));
                };
                let mut payload = md5_response(&cfg.user, self.password(cfg)?, salt).into_bytes();
                payload.push(0);
                write_password_message(&mut self.stream, &payload)
                    .await
                    .map_err(|e| self.lost(e))?;
            }
            auth::SASL => {
                if !sasl_offers_scram(data) {
                    return Err(self.auth_failed(
                        "the server offers no SASL mechanism cdcd supports (SCRAM-SHA-256)",
                    ));
                }
                self.method = Some("scram-sha-256");
                let client = ScramClient::new(&cfg.user);
                let first = client.client_first.as_bytes();
                let mut init = Vec::with_capacity(first.len() + 20);
                init.extend_from_slice(b"SCRAM-SHA-256\0");
                init.extend_from_slice(&len_i32(first.len()).to_be_bytes());
                init.extend_from_slice(first);
                write_password_message(&mut self.stream, &init)
                    .await
                    .map_err(|e| self.lost(e))?;
                *scram = Some(ScramState {
                    client,
                    proof: None,
                });
            }
            auth::SASL_CONTINUE => {
                let password = self.password(cfg)?.to_owned();
                let Some(ScramState { client, proof }) = scram.as_mut() else {
                    return Err(self.auth_failed("SASLContinue without SASL start"));
                };
                let server_first = String::from_utf8_lossy(data);
                let (client_final, auth_message, salted) = client
                    .client_final(&password, &server_first)
                    .map_err(|e| self.auth_failed(&describe(&e)))?;
                *proof = Some((auth_message, salted));
                write_password_message(&mut self.stream, client_final.as_bytes())
                    .await
                    .map_err(|e| self.lost(e))?;
            }
            auth::SASL_FINAL => {
                let Some(ScramState {
                    proof: Some((auth_message, salted)),
                    ..
                }) = scram.as_ref()
                else {
                    return Err(self.auth_failed("SASLFinal before SASLContinue"));
                };
                let server_final = String::from_utf8_lossy(data);
                ScramClient::verify_server_final(&server_final, salted, auth_message)
                    .map_err(|e| self.auth_failed(&describe(&e)))?;
            }
            other => {
                return Err(self.auth_failed(&format!(
                    "unsupported authentication request {other}: use trust, password, md5 or scram-sha-256"
                )));
            }
        }
        Ok(())
    }

    async fn read(&mut self) -> Result<BackendMessage, SourceError> {
        match self.reader.read(&mut self.stream).await {
            Ok(m) => Ok(m),
            Err(e) => Err(self.lost(e)),
        }
    }

    fn password<'c>(&self, cfg: &'c PostgresConfig) -> Result<&'c str, SourceError> {
        cfg.password.as_deref().ok_or_else(|| {
            self.auth_failed(
                "the server asks for a password but none is configured (source.password or the URL)",
            )
        })
    }

    /// The server's ErrorResponse during start-up, with the user and password method it refused
    /// and, for a plain connection that only `hostssl` lines would let in, what to set.
    fn refusal(&self, cfg: &PostgresConfig, server: &str) -> SourceError {
        let mut detail = server.to_owned();
        if let Some(method) = self.method {
            detail.push_str(&format!(" (user {:?}, method {method})", cfg.user));
        }
        if !self.stream.get_ref().is_tls() {
            if let Some(hint) = requires_tls_hint(server) {
                detail.push_str(&format!(": {hint}"));
            }
        }
        self.auth_failed(&detail)
    }

    fn auth_failed(&self, detail: &str) -> SourceError {
        SourceError::Connect {
            target: self.target.to_owned(),
            detail: format!("authentication: {detail}"),
        }
    }

    fn lost(&self, e: PgWireError) -> SourceError {
        SourceError::Connect {
            target: self.target.to_owned(),
            detail: format!("connection lost during start-up: {}", describe(&e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::super::replication::ReplicationConnection;
    use super::super::snapshot::session::test_config;
    use super::super::snapshot::CopySession;
    use super::md5_response;
    use crate::config::PostgresConfig;

    /// The value Postgres expects (computed independently with Python's hashlib).
    #[test]
    fn md5_response_matches_postgres() {
        assert_eq!(
            md5_response("cdcd_md5", "cdcd-md5-pw", [1, 2, 3, 4]),
            "md59213e6c830d13a21bebc6e4272df2cff"
        );
    }

    /// SCRAM-SHA-256 against the test bed, whose `pg_hba.conf` makes the role `cdcd_scram` (and
    /// only it) authenticate that way: a copy session and a walsender log in with the password,
    /// a wrong or missing password fails with an error that says so and does not hold it.
    #[tokio::test]
    async fn scram_sessions_on_a_real_server() {
        let test = "scram_sessions_on_a_real_server";
        let Some(url) = crate::test_ground::var(test, "CDCD_TEST_PG") else {
            return;
        };
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let forced: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_hba_file_rules \
                 WHERE 'cdcd_scram' = ANY(user_name) AND auth_method = 'scram-sha-256'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if forced == 0 {
            crate::test_ground::missing(
                test,
                "no scram-sha-256 line for cdcd_scram in pg_hba.conf (scripts/testbed.sh up adds it)",
            );
            return;
        }
        let secret = "scram-pw-4711-x";
        client
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE cdcd_scram LOGIN REPLICATION; \
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
                 SET password_encryption = 'scram-sha-256'; \
                 ALTER ROLE cdcd_scram LOGIN REPLICATION PASSWORD '{secret}';"
            ))
            .await
            .unwrap();
        let as_scram = |password: Option<&str>| {
            let mut cfg = test_config(&url);
            cfg.user = "cdcd_scram".into();
            cfg.password = password.map(str::to_owned);
            cfg
        };

        let good = as_scram(Some(secret));
        logs_in(&good).await;

        let wrong = "not-the-pw-0815";
        let Err(e) = CopySession::connect(&as_scram(Some(wrong))).await else {
            panic!("a wrong password was accepted");
        };
        let text = e.to_string();
        assert!(text.contains("authentication"), "{text}");
        assert!(!text.contains(wrong) && !text.contains(secret), "{text}");
        let Err(e) = ReplicationConnection::connect(&as_scram(None)).await else {
            panic!("no password was accepted");
        };
        assert!(e.to_string().contains("none is configured"), "{e}");
    }

    /// A copy session and a walsender log in with `cfg` and run a statement each.
    async fn logs_in(cfg: &PostgresConfig) {
        let mut session = CopySession::connect(cfg).await.unwrap();
        session.execute("SELECT 1").await.unwrap();
        session.close().await;
        let mut walsender = ReplicationConnection::connect(cfg).await.unwrap();
        walsender.identify_system().await.unwrap();
        walsender.finish().await.unwrap();
    }

    /// md5 against the TLS test bed (`scripts/testbed.sh`: role `cdcd_md5`, its password stored
    /// as an md5 hash, `host … md5`): a copy session and a walsender log in over plain TCP and
    /// over TLS; a wrong password fails naming the user and the method, not the password.
    #[tokio::test]
    async fn md5_sessions_on_a_real_server() {
        let Some(url) =
            crate::test_ground::var("md5_sessions_on_a_real_server", "CDCD_TEST_PG_TLS")
        else {
            return;
        };
        let as_md5 = |password: &str, sslmode: &str| {
            let mut u = url::Url::parse(&url).unwrap();
            u.set_query(Some(&format!("sslmode={sslmode}")));
            let mut cfg = test_config(u.as_str());
            cfg.user = "cdcd_md5".into();
            cfg.password = Some(password.to_owned());
            cfg
        };
        for sslmode in ["disable", "require"] {
            let good = as_md5("cdcd-md5-pw", sslmode);
            logs_in(&good).await;
        }
        let wrong = "not-the-md5-pw-77";
        let Err(e) = CopySession::connect(&as_md5(wrong, "prefer")).await else {
            panic!("a wrong password was accepted");
        };
        let text = e.to_string();
        assert!(
            text.contains("\"cdcd_md5\"") && text.contains("method md5"),
            "{text}"
        );
        assert!(
            !text.contains(wrong) && !text.contains("cdcd-md5-pw"),
            "{text}"
        );
    }
}
