//! The I/O half of Postgres TLS: the SSLRequest and handshake in front of the source's own
//! start-up exchange (`sources/postgres/startup.rs`: walsender and copy sessions), and the rustls
//! connector that tokio-postgres connections use (`sources/postgres/setup.rs`: catalog queries,
//! heartbeats, `cdcd check`; the Iceberg SQL catalog's Postgres driver).
//!
//! Protocol (§55.2.10 "SSL Session Encryption"): on a fresh connection the client sends
//! SSLRequest; the server answers one byte, `S` (then the TLS handshake, then the StartupMessage
//! inside TLS) or `N` (carry on in plain text, or hang up). The answer is read straight off the
//! socket, with no buffer, so bytes a man in the middle appends after the `S` cannot end up
//! parsed as if they came through TLS (CVE-2021-23222's lesson).
//!
//! Why our own connector rather than `tokio-postgres-rustls`: it is 40 lines over tokio-rustls,
//! and this way the one `ClientConfig` of `tls/postgres/mod.rs` (its verifiers for verify-ca and require) and
//! its error texts serve tokio-postgres too; the crate would bring its own copy of that logic
//! and another dependency to keep in step with rustls. Channel binding is not offered
//! ([`TlsStream::channel_binding`] is none): SCRAM then runs without `-PLUS`, as it does on the
//! walsender, whose SCRAM client has no channel binding.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{TlsError, TlsSettings};

/// SSLRequest: length 8, then the code 80877103 (1234 << 16 | 5679).
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// A connection to a Postgres server, in plain text or inside TLS.
pub enum PgStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl PgStream {
    pub fn is_tls(&self) -> bool {
        matches!(self, PgStream::Tls(_))
    }

    /// Reads what is readable now without waiting (`WouldBlock` when nothing is), like
    /// [`TcpStream::try_read`]. For TLS: one poll with a no-op waker; a later `.await` polls
    /// again with a real one, so no wake-up is lost.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            PgStream::Plain(s) => s.try_read(buf),
            PgStream::Tls(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut read_buf = ReadBuf::new(buf);
                match Pin::new(s.as_mut()).poll_read(&mut cx, &mut read_buf) {
                    Poll::Ready(Ok(())) => Ok(read_buf.filled().len()),
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

/// Asks `tcp`'s server for TLS and, when it agrees, runs the handshake for `host`. `N` gives the
/// plain stream back when `settings.mode` allows plain text, else [`TlsError::Refused`].
pub async fn upgrade(
    mut tcp: TcpStream,
    host: &str,
    settings: &TlsSettings,
) -> Result<PgStream, StartError> {
    tcp.write_all(&SSL_REQUEST).await.map_err(StartError::Io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(StartError::Io)?;
    match answer[0] {
        b'S' => {}
        b'N' if settings.mode.plain_allowed() => return Ok(PgStream::Plain(tcp)),
        b'N' => return Err(StartError::Tls(super::tls_refused(host, settings.mode))),
        other => {
            return Err(StartError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the server answered the SSLRequest with byte {other:#04x}, not S or N"),
            )))
        }
    }
    let config = settings.client_config().map_err(StartError::Tls)?;
    let name = settings.server_name(host).map_err(StartError::Tls)?;
    let tls = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| StartError::Tls(settings.handshake_error(host, &e)))?;
    Ok(PgStream::Tls(Box::new(tls)))
}

/// Why [`upgrade`] failed: the socket, or TLS itself (with the user's fix in its text).
#[derive(Debug)]
pub enum StartError {
    Io(io::Error),
    Tls(TlsError),
}

impl AsyncRead for PgStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PgStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PgStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PgStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PgStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PgStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PgStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// tokio-postgres's TLS connector over [`TlsSettings::client_config`].
#[derive(Clone)]
pub struct Connector {
    config: Arc<ClientConfig>,
    settings: Arc<TlsSettings>,
}

impl Connector {
    pub fn new(settings: &TlsSettings) -> Result<Self, TlsError> {
        Ok(Connector {
            config: settings.client_config()?,
            settings: Arc::new(settings.clone()),
        })
    }
}

impl MakeTlsConnect<tokio_postgres::Socket> for Connector {
    type Stream = RustlsStream;
    type TlsConnect = Connect;
    type Error = TlsError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, TlsError> {
        Ok(Connect {
            config: self.config.clone(),
            settings: self.settings.clone(),
            name: self.settings.server_name(host)?,
            host: host.to_owned(),
        })
    }
}

/// One handshake, for one host.
pub struct Connect {
    config: Arc<ClientConfig>,
    settings: Arc<TlsSettings>,
    name: ServerName<'static>,
    host: String,
}

impl TlsConnect<tokio_postgres::Socket> for Connect {
    type Stream = RustlsStream;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream, TlsError>> + Send>>;

    fn connect(self, socket: tokio_postgres::Socket) -> Self::Future {
        Box::pin(async move {
            TlsConnector::from(self.config)
                .connect(self.name, socket)
                .await
                .map(|s| RustlsStream(Box::new(s)))
                .map_err(|e| self.settings.handshake_error(&self.host, &e))
        })
    }
}

/// A tokio-postgres connection's TLS stream.
pub struct RustlsStream(Box<TlsStream<tokio_postgres::Socket>>);

impl tokio_postgres::tls::TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().0.as_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().0.as_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().0.as_mut()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().0.as_mut()).poll_shutdown(cx)
    }
}
