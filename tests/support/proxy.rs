//! The test bed's Python proxies as processes: `faultproxy.py` in front of S3 (faults, stalls, a
//! request log) and `restproxy.py` in front of a REST catalog. Each prints `listening <port>` once
//! it accepts connections; the handle is a drop guard that kills it.

use std::ffi::OsStr;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

pub const FAULTPROXY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/faultproxy.py");
pub const RESTPROXY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/restproxy.py");

/// A running proxy, killed on drop.
pub struct ProxyProcess {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl ProxyProcess {
    /// `python script upstream args…` with its stderr to `stderr`; returns once it listens.
    pub fn start<I, S>(python: &str, script: &str, upstream: &str, args: I, stderr: Stdio) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new(python)
            .arg(script)
            .arg(upstream)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {script}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{script} said {line:?}"));
        ProxyProcess {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
