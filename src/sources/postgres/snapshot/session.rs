//! A copy session: an ordinary backend connection that runs the initial copy's statements and
//! reads `COPY … TO STDOUT` data straight off the socket.
//!
//! Why not tokio-postgres' `copy_out`: Postgres sends one CopyData message per row (protocol
//! §55.2.6 "COPY Operations"), and tokio-postgres hands each one over as its own `Bytes`, behind a
//! connection task that wakes the reader once per 8 KiB read. For rows of ~100 bytes that path
//! was ~12% of cdcd's CPU in a copy (`bench/pg_snapshot.py`, perf). Here the copy worker reads
//! 256 KiB at a time itself and copies each row's bytes once, into the buffer the decoder
//! parses.
//!
//! The session's formats come from the start-up options (`startup.rs`: the same
//! `TEXT_FORMAT_SETTINGS` as the walsender's), so text COPY matches pgoutput's text.

use pgwire_replication::protocol::framing::write_query;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::super::replication::wire::{describe, server_error};
use super::super::startup::{self, SessionKind, MAX_MESSAGE_BYTES};
use crate::config::PostgresConfig;
use crate::sources::SourceError;
use crate::tls::postgres::stream::PgStream;

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 256 * 1024;

/// A statement on a copy session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The server's ErrorResponse.
    #[error("{0}")]
    Server(String),
    #[error("connection to {target} lost: {detail}")]
    Lost { target: String, detail: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

/// One backend message in the receive buffer: its type byte and where its body lies.
#[derive(Debug, Clone, Copy)]
struct Frame {
    tag: u8,
    body: (usize, usize),
}

pub struct CopySession {
    stream: PgStream,
    /// Received bytes; `buf[start..end]` are not parsed yet.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    target: String,
}

impl CopySession {
    /// Connects and authenticates (an ordinary backend, not a walsender).
    pub async fn connect(cfg: &PostgresConfig) -> Result<Self, SourceError> {
        let target = cfg.display_target();
        let opened = startup::open(cfg, SessionKind::Plain, "").await?;
        if !opened.stream.buffer().is_empty() {
            return Err(SourceError::Protocol(format!(
                "{target} sent data after ReadyForQuery, unasked"
            )));
        }
        Ok(CopySession {
            stream: opened.stream.into_inner(),
            buf: vec![0; READ_BYTES],
            start: 0,
            end: 0,
            target,
        })
    }

    /// Runs `sql` (one or more statements, simple query protocol) and discards any rows.
    pub async fn execute(&mut self, sql: &str) -> Result<(), SessionError> {
        self.send(sql).await?;
        let mut error = None;
        loop {
            let frame = self.next_frame().await?;
            match frame.tag {
                b'E' => {
                    error.get_or_insert_with(|| server_error(self.body(frame)));
                }
                b'Z' => {
                    self.consume(frame);
                    return error.map_or(Ok(()), |e| Err(SessionError::Server(e)));
                }
                _ => {}
            }
            self.consume(frame);
        }
    }

    /// Starts `sql`, a `COPY … TO STDOUT`: returns once the server answered CopyOutResponse; read
    /// the data with [`read_copy`](Self::read_copy) until it says the copy ended.
    pub async fn copy_out(&mut self, sql: &str) -> Result<(), SessionError> {
        self.send(sql).await?;
        let mut error = None;
        loop {
            let frame = self.next_frame().await?;
            match frame.tag {
                b'H' => {
                    self.consume(frame);
                    return Ok(());
                }
                b'E' => {
                    error.get_or_insert_with(|| server_error(self.body(frame)));
                }
                b'Z' => {
                    self.consume(frame);
                    return Err(error.map_or_else(
                        || SessionError::Protocol("the statement started no COPY OUT".into()),
                        SessionError::Server,
                    ));
                }
                _ => {}
            }
            self.consume(frame);
        }
    }

    /// Appends the data of the CopyData messages received so far to `out`, waiting for one if
    /// none is here yet, and stops once it appended `max` bytes or more. Returns false once the
    /// copy has ended (its last data is in `out`) and the session is ready for the next
    /// statement; an error the server reports mid-copy is returned once it is.
    pub async fn read_copy(&mut self, out: &mut Vec<u8>, max: usize) -> Result<bool, SessionError> {
        let mut error: Option<String> = None;
        let before = out.len();
        loop {
            while let Some(frame) = self.buffered_frame()? {
                match frame.tag {
                    b'd' => out.extend_from_slice(self.body(frame)),
                    b'E' => {
                        error.get_or_insert_with(|| server_error(self.body(frame)));
                    }
                    b'Z' => {
                        self.consume(frame);
                        return error.map_or(Ok(false), |e| Err(SessionError::Server(e)));
                    }
                    // CopyDone, CommandComplete, NoticeResponse, ParameterStatus.
                    _ => {}
                }
                self.consume(frame);
                if out.len() - before >= max && error.is_none() {
                    return Ok(true);
                }
            }
            if error.is_none() && out.len() > before {
                // More may already be in the socket: take it without waiting.
                match self.read_now() {
                    Some(Ok(())) => continue,
                    Some(Err(e)) => return Err(e),
                    None => return Ok(true),
                }
            }
            self.fill().await?;
        }
    }

    /// Ends the session (Terminate); errors only mean the server has gone already.
    pub async fn close(mut self) {
        let _ = self.stream.write_all(&[b'X', 0, 0, 0, 4]).await;
        let _ = self.stream.shutdown().await;
    }

    async fn send(&mut self, sql: &str) -> Result<(), SessionError> {
        write_query(&mut self.stream, sql)
            .await
            .map_err(|e| self.lost(describe(&e)))
    }

    async fn next_frame(&mut self) -> Result<Frame, SessionError> {
        loop {
            if let Some(frame) = self.buffered_frame()? {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    /// The next whole message in the buffer, if one is there (protocol §55.7: a type byte, then
    /// an Int32 length that counts itself but not the type byte).
    fn buffered_frame(&self) -> Result<Option<Frame>, SessionError> {
        let Some((tag, len)) = self.header() else {
            return Ok(None);
        };
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| (4..=MAX_MESSAGE_BYTES).contains(&l))
            .ok_or_else(|| {
                SessionError::Protocol(format!(
                    "backend message '{}' has length {len}",
                    char::from(tag)
                ))
            })?;
        if self.end - self.start < 1 + len {
            return Ok(None);
        }
        Ok(Some(Frame {
            tag,
            body: (self.start + 5, self.start + 1 + len),
        }))
    }

    /// The type byte and declared length of the next message, once its header is buffered.
    fn header(&self) -> Option<(u8, i32)> {
        let h = self.buf.get(self.start..self.end)?.get(..5)?;
        Some((h[0], i32::from_be_bytes([h[1], h[2], h[3], h[4]])))
    }

    fn body(&self, frame: Frame) -> &[u8] {
        self.buf.get(frame.body.0..frame.body.1).unwrap_or_default()
    }

    fn consume(&mut self, frame: Frame) {
        self.start = frame.body.1;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Makes room for a read: moves the unparsed bytes to the front when the free tail is small,
    /// and grows the buffer when the message being received does not fit.
    fn make_room(&mut self) {
        let pending = self.end - self.start;
        let wanted = self
            .header()
            .map_or(0, |(_, len)| 1 + len.max(0) as usize)
            .max(pending + 1);
        if self.buf.len() - self.end < READ_BYTES / 4 || self.start + wanted > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = pending;
        }
        if wanted > self.buf.len() {
            self.buf.resize(wanted.min(MAX_MESSAGE_BYTES + 1), 0);
        }
    }

    async fn fill(&mut self) -> Result<(), SessionError> {
        self.make_room();
        let Some(tail) = self.buf.get_mut(self.end..) else {
            return Err(SessionError::Protocol("receive buffer out of range".into()));
        };
        let n = self
            .stream
            .read(tail)
            .await
            .map_err(|e| self.lost(e.to_string()))?;
        if n == 0 {
            return Err(self.lost("the server closed the connection".into()));
        }
        self.end += n;
        Ok(())
    }

    /// Reads what the socket holds now, without waiting: `None` when it holds nothing.
    fn read_now(&mut self) -> Option<Result<(), SessionError>> {
        self.make_room();
        let tail = self.buf.get_mut(self.end..)?;
        match self.stream.try_read(tail) {
            Ok(0) => Some(Err(self.lost("the server closed the connection".into()))),
            Ok(n) => {
                self.end += n;
                Some(Ok(()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => Some(Err(self.lost(e.to_string()))),
        }
    }

    fn lost(&self, detail: String) -> SessionError {
        SessionError::Lost {
            target: self.target.clone(),
            detail,
        }
    }
}

/// The source config of the test server at `url` (tests only).
#[cfg(test)]
pub(crate) fn test_config(url: &str) -> PostgresConfig {
    let toml = format!(
        "[pipeline]\nname = \"t\"\n[source]\nkind = \"postgres\"\nurl = \"{url}\"\n\
         tables = [\"public.t\"]\n[sink]\nwarehouse = \"/tmp/t\"\n"
    );
    let config = crate::config::Config::from_toml(&toml, "test.toml").unwrap();
    let crate::config::SourceConfig::Postgres(cfg) = config.source else {
        panic!("postgres source expected")
    };
    cfg
}

/// A session to the test server at `url` (tests only).
#[cfg(test)]
pub(crate) async fn test_session(url: &str) -> CopySession {
    CopySession::connect(&test_config(url)).await.unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a whole COPY into one buffer.
    async fn copy_all(session: &mut CopySession, sql: &str) -> Result<Vec<u8>, SessionError> {
        session.copy_out(sql).await?;
        let mut out = Vec::new();
        while session.read_copy(&mut out, 64 * 1024).await? {}
        Ok(out)
    }

    #[tokio::test]
    async fn statements_copies_and_errors_on_a_real_server() {
        let test = "statements_copies_and_errors_on_a_real_server";
        let Some(url) = crate::test_ground::var(test, "CDCD_TEST_PG") else {
            return;
        };
        let mut session = test_session(&url).await;
        session.execute("SET enable_indexscan = off").await.unwrap();

        // A failed statement leaves the session usable.
        let err = session.execute("SELECT 1/0").await.unwrap_err();
        assert!(err.to_string().contains("division by zero"), "{err}");
        let err = session
            .copy_out("COPY nope_no_table TO STDOUT")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("nope_no_table"), "{err}");
        let err = session.copy_out("SELECT 1").await.unwrap_err();
        assert!(matches!(err, SessionError::Protocol(_)), "{err}");

        // Text rows arrive whole and in order.
        let text = copy_all(
            &mut session,
            "COPY (SELECT g FROM generate_series(1, 100000) g) TO STDOUT",
        )
        .await
        .unwrap();
        let expected: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
        assert_eq!(text, expected.as_bytes());

        // Rows wider than the receive buffer grow it.
        let wide = copy_all(
            &mut session,
            "COPY (SELECT repeat('x', 600000) FROM generate_series(1, 3)) TO STDOUT",
        )
        .await
        .unwrap();
        assert_eq!(wide.len(), 3 * 600_001);

        // An error after rows were sent ends the copy with the server's message, and the
        // session takes the next statement.
        let err = copy_all(
            &mut session,
            "COPY (SELECT 1 / (50000 - g) FROM generate_series(1, 100000) g) TO STDOUT",
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("division by zero"), "{err}");
        let again = copy_all(&mut session, "COPY (SELECT 7) TO STDOUT")
            .await
            .unwrap();
        assert_eq!(again, b"7\n");
        session.close().await;
    }
}
