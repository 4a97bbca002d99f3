//! systemd notification (`Type=notify` with `WatchdogSec=`): `READY=1` once the pipeline has
//! started, `WATCHDOG=1` at half the watchdog period while the pipeline loop turns, `STOPPING=1`
//! when shutdown begins.
//!
//! Where it sits: a task beside the pipeline (`daemon::run`), reading [`Health`].
//!
//! Why no crate: the protocol is one datagram per message to the `AF_UNIX` socket named by
//! `$NOTIFY_SOCKET`, where a leading `@` means Linux's abstract namespace (sd_notify(3),
//! "NOTES"). `$WATCHDOG_USEC` is the period, and `$WATCHDOG_PID`, when set, names the process
//! that must send (sd_watchdog_enabled(3)). Without `$NOTIFY_SOCKET` everything here is a no-op.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::health::Health;

/// A connection to systemd's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier for `$NOTIFY_SOCKET`, or `None` when not run by systemd (or the variable is
    /// unusable, which is logged).
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let path = path.to_string_lossy();
        match Notifier::new(&path) {
            Ok(n) => Some(n),
            Err(e) => {
                warn!(socket = %path, error = %e, "NOTIFY_SOCKET is set but unusable; not notifying systemd");
                None
            }
        }
    }

    /// A notifier for the socket `path` (`@name` for an abstract socket).
    pub fn new(path: &str) -> io::Result<Notifier> {
        Ok(Notifier {
            socket: UnixDatagram::unbound()?,
            addr: socket_addr(path)?,
        })
    }

    /// Sends one message such as `READY=1`. The socket is a local datagram socket: the send does
    /// not wait for a reader.
    pub fn send(&self, message: &str) -> io::Result<()> {
        self.socket
            .send_to_addr(message.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

/// The socket address for `$NOTIFY_SOCKET`: a path, or `@name` for the abstract namespace.
pub fn socket_addr(path: &str) -> io::Result<SocketAddr> {
    if let Some(name) = path.strip_prefix('@') {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use std::os::linux::net::SocketAddrExt;
            return SocketAddr::from_abstract_name(name.as_bytes());
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = name;
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract sockets exist only on Linux",
            ));
        }
    }
    SocketAddr::from_pathname(path)
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, if it is set for this process.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, my_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(my_pid) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

fn send(notifier: &Notifier, message: &str) {
    match notifier.send(message) {
        Ok(()) => debug!(message, "notified systemd"),
        Err(e) => warn!(message, error = %e, "cannot notify systemd"),
    }
}

/// Sends `READY=1` once `health` has started or waits as a lease standby, `WATCHDOG=1` at half the watchdog period while the
/// pipeline loop turns (a hung loop stops the petting and systemd restarts cdcd), and
/// `STOPPING=1` at `shutdown`. Returns at shutdown; at once when not run by systemd.
pub async fn supervise(health: &'static Health, shutdown: CancellationToken) {
    let Some(notifier) = Notifier::from_env() else {
        return;
    };
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    let interval = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id());
    // Nothing sent yet → READY=1 sent as a standby → READY=1 sent for a running pipeline.
    let (mut ready, mut running) = (false, false);
    // Without a watchdog, the tick only paces the wait for READY.
    let period = interval.unwrap_or(Duration::from_secs(3600));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                send(&notifier, "STOPPING=1");
                return;
            }
            standby = health.wait_up(), if !ready => {
                ready = true;
                running = !standby;
                // A standby is a started service too: without READY=1 systemd would fail it
                // at TimeoutStartSec while it waits, legitimately, for the lease.
                if standby {
                    send(&notifier, "READY=1\nSTATUS=standby: waiting for the pipeline's lease");
                } else {
                    send(&notifier, "READY=1");
                }
            }
            _ = health.wait_started(), if ready && !running => {
                running = true;
                send(&notifier, "STATUS=running: holds the pipeline's lease");
            }
            _ = tick.tick(), if interval.is_some() => {
                // A loop silent for a whole watchdog period is hung; let systemd act.
                if health.alive(period * 2) {
                    send(&notifier, "WATCHDOG=1");
                } else {
                    warn!("pipeline loop stalled: not petting the systemd watchdog");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_and_respects_pid() {
        assert_eq!(
            watchdog_interval(Some("2000000"), None, 7),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            watchdog_interval(Some("2000000"), Some("7"), 7),
            Some(Duration::from_secs(1))
        );
        assert_eq!(watchdog_interval(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn sends_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap()).unwrap();
        n.send("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sends_to_an_abstract_socket() {
        let name = format!("@cdcd-notify-test-{}", std::process::id());
        let server = UnixDatagram::bind_addr(&socket_addr(&name).unwrap()).unwrap();
        let n = Notifier::new(&name).unwrap();
        n.send("WATCHDOG=1").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }
}
