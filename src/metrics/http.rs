//! A tiny HTTP/1.1 responder for `/metrics`, `/healthz` and `/readyz` on `[metrics] listen`.
//!
//! Where it sits: a task beside the pipeline, started by `daemon::run`; it reads the Prometheus
//! handle and [`Health`] and writes nothing anywhere else.
//!
//! Why not hyper: three fixed GET routes answered with `Connection: close` need no HTTP stack.
//! Parsing is the pure [`route`] on the request head (RFC 9112 §3: `method SP target SP version`);
//! the socket code only gathers bytes up to the blank line, bounded in size and time, so a slow or
//! hostile client costs one small buffer for a few seconds.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::health::{Health, Readiness};

/// Longest request head accepted; the routes take no headers that matter.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// A client gets this long to send its request head and read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The exporter's histograms need periodic upkeep (metrics-exporter-prometheus docs,
/// "Upkeep and maintenance").
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Metrics,
    Healthz,
    Readyz,
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// The route of a request head, and whether it is a `HEAD` (answer without a body).
pub fn route(head: &[u8]) -> (Route, bool) {
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let Some(line) = head
        .get(..line_end)
        .and_then(|l| std::str::from_utf8(l).ok())
    else {
        return (Route::BadRequest, false);
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return (Route::BadRequest, false);
    };
    if !version.starts_with("HTTP/1.") {
        return (Route::BadRequest, false);
    }
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return (Route::MethodNotAllowed, false);
    }
    let path = target.split('?').next().unwrap_or(target);
    let route = match path {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Healthz,
        "/readyz" => Route::Readyz,
        _ => Route::NotFound,
    };
    (route, head_only)
}

/// A complete `Connection: close` response.
pub fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// The response to `route`.
pub fn answer(
    route: Route,
    head_only: bool,
    prometheus: &PrometheusHandle,
    health: &Health,
) -> Vec<u8> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match route {
        Route::Metrics => response(
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &prometheus.render(),
            head_only,
        ),
        // The process answers: it is alive. Whether it does useful work is /readyz.
        Route::Healthz => response("200 OK", TEXT, "ok\n", head_only),
        Route::Readyz => match health.readiness() {
            Readiness::Ready => response("200 OK", TEXT, "ready\n", head_only),
            Readiness::NotReady(why) => response(
                "503 Service Unavailable",
                TEXT,
                &format!("not ready: {why}\n"),
                head_only,
            ),
        },
        Route::NotFound => response(
            "404 Not Found",
            TEXT,
            "not found: try /metrics, /healthz or /readyz\n",
            head_only,
        ),
        Route::MethodNotAllowed => {
            response("405 Method Not Allowed", TEXT, "only GET and HEAD\n", false)
        }
        Route::BadRequest => response("400 Bad Request", TEXT, "bad request\n", false),
    }
}

/// Serves until `shutdown`. Each connection is one request, answered in its own task.
pub async fn serve(
    listener: TcpListener,
    prometheus: PrometheusHandle,
    health: &'static Health,
    shutdown: CancellationToken,
) {
    let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = upkeep.tick() => prometheus.run_upkeep(),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let prometheus = prometheus.clone();
                    tokio::spawn(async move {
                        let work = handle(stream, &prometheus, health);
                        match tokio::time::timeout(CLIENT_TIMEOUT, work).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => debug!(%peer, error = %e, "metrics client"),
                            Err(_) => debug!(%peer, "metrics client too slow"),
                        }
                    });
                }
                // Out of file descriptors and the like: wait a little rather than spin.
                Err(e) => {
                    warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn handle(
    mut stream: TcpStream,
    prometheus: &PrometheusHandle,
    health: &Health,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.len() > MAX_HEAD_BYTES {
            break;
        }
    }
    let (route, head_only) = if head.len() > MAX_HEAD_BYTES {
        (Route::BadRequest, false)
    } else {
        route(&head)
    };
    stream
        .write_all(&answer(route, head_only, prometheus, health))
        .await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            (Route::Metrics, false)
        );
        assert_eq!(
            route(b"HEAD /healthz HTTP/1.0\r\n\r\n"),
            (Route::Healthz, true)
        );
        assert_eq!(
            route(b"GET /readyz?verbose=1 HTTP/1.1\r\n\r\n"),
            (Route::Readyz, false)
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), (Route::NotFound, false));
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            (Route::MethodNotAllowed, false)
        );
        assert_eq!(route(b"GET /metrics\r\n\r\n"), (Route::BadRequest, false));
        assert_eq!(
            route(b"GET /metrics SPDY/3\r\n\r\n"),
            (Route::BadRequest, false)
        );
        assert_eq!(route(b"\xff\xfe"), (Route::BadRequest, false));
        assert_eq!(route(b""), (Route::BadRequest, false));
    }

    #[test]
    fn responses_carry_length_and_close() {
        let r = String::from_utf8(response("200 OK", "text/plain", "ok\n", false)).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(r.contains("Content-Length: 3\r\n"));
        assert!(r.contains("Connection: close\r\n"));
        assert!(r.ends_with("\r\n\r\nok\n"));
        let h = String::from_utf8(response("200 OK", "text/plain", "ok\n", true)).unwrap();
        assert!(h.ends_with("\r\n\r\n") && h.contains("Content-Length: 3"));
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("cdcd_test_total").increment(3);
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let health: &'static Health = Box::leak(Box::new(Health::new()));
        let server = tokio::spawn(serve(listener, handle, health, stop.clone()));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let m = get("/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("cdcd_test_total 3"), "{m}");
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let r = get("/readyz").await;
        assert!(
            r.starts_with("HTTP/1.1 503") && r.contains("starting"),
            "{r}"
        );
        health.set_started();
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        stop.cancel();
        server.await.unwrap();
    }
}
