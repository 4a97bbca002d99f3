//! Shared by the tests of how cdcd reaches a store (`tls.rs`, `addressing.rs`, `profile.rs`): a
//! Postgres → Iceberg pipeline on an `s3://` warehouse whose `[sink.s3]` section the test writes
//! itself, a bucket made with boto3 (trusting a CA when the endpoint is https), lakecheck with the
//! reader's own settings, and the fault proxy as a logging pass-through.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Stdio;

use crate::support::proxy::{ProxyProcess, FAULTPROXY};
use crate::support::s3::run_s3_reader;
use crate::support::{Pipeline, Settings, TestEnv, LAKECHECK, NAMESPACE};

/// A pipeline replicating `table` into `s3://<bucket>/wh` with `[sink.s3]` = `section`; the table
/// is dropped from Postgres when it ends.
pub struct S3Custom {
    pub p: Pipeline,
    pub bucket: String,
    pub warehouse_url: String,
}

impl S3Custom {
    pub fn new(env: &TestEnv, name: &str, table: &str, bucket: &str, section: &str) -> S3Custom {
        let mut p = Pipeline::new(env, name, &[table], &Settings::default());
        p.on_cleanup(format!("DROP TABLE IF EXISTS {table}"));
        let s = S3Custom {
            p,
            bucket: bucket.to_owned(),
            warehouse_url: format!("s3://{bucket}/wh"),
        };
        s.set_section(section);
        s
    }

    /// Rewrites the config with `[sink.s3]` = `section` (keys, one per line).
    pub fn set_section(&self, section: &str) {
        self.p.write_config(&Settings::default());
        let text = std::fs::read_to_string(&self.p.config).unwrap();
        let wh_line = format!("warehouse = {:?}", self.p.warehouse.display().to_string());
        assert!(text.contains(&wh_line), "{text}");
        let text = text.replace(&wh_line, &format!("warehouse = {:?}", self.warehouse_url));
        std::fs::write(&self.p.config, format!("{text}\n[sink.s3]\n{section}\n")).unwrap();
    }

    /// lakecheck of `public.<table>` read through `endpoint` by `reader`, with `env` added (the
    /// CA bundle); returns the exit code and the output.
    pub async fn lakecheck(
        &self,
        table: &str,
        endpoint: &str,
        reader: &str,
        env: &[(&str, &str)],
        wait_secs: u32,
    ) -> (Option<i32>, String) {
        let mut cmd = tokio::process::Command::new(&self.p.env.python);
        cmd.arg(LAKECHECK)
            .args(["--source", &self.p.env.pg_url])
            .args(["--source-table", &format!("public.{table}")])
            .args([
                "--iceberg",
                &format!("{}/{NAMESPACE}/{table}", self.warehouse_url),
            ])
            .args(["--wait", &wait_secs.to_string(), "--reader", reader])
            .envs(env.iter().copied());
        run_s3_reader(cmd, endpoint).await
    }

    /// Panics unless lakecheck finds the table equal.
    pub async fn assert_equal(
        &self,
        table: &str,
        endpoint: &str,
        reader: &str,
        env: &[(&str, &str)],
    ) {
        let (code, text) = self.lakecheck(table, endpoint, reader, env, 90).await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck ({reader}) public.{table} differs:\n{text}\n--- cdcd:\n{}",
            self.p.output()
        );
        eprintln!(
            "lakecheck ({reader}) public.{table}: {}",
            text.lines().last().unwrap_or("")
        );
    }
}

/// The fault proxy with no faults, logging each request's host and access key id; killed on drop.
pub struct LoggingProxy {
    _process: ProxyProcess,
    pub url: String,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoggingProxy {
    pub fn start(python: &str, upstream: &str) -> LoggingProxy {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.log");
        let args = ["--fail", "0", "--delay", "0", "--log-auth", "--log"];
        let args = args.iter().map(OsStr::new).chain([log.as_os_str()]);
        let process = ProxyProcess::start(python, FAULTPROXY, upstream, args, Stdio::null());
        LoggingProxy {
            url: process.url.clone(),
            _process: process,
            log,
            _dir: dir,
        }
    }

    /// Forgets the requests logged so far.
    pub fn clear(&self) {
        std::fs::write(&self.log, "").unwrap();
    }

    /// The `req` lines so far: (method, path or absolute URL, host, key id).
    pub fn requests(&self) -> Vec<(String, String, String, String)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                match f.as_slice() {
                    [_, "req", method, path, host, key] => Some((
                        method.to_string(),
                        path.to_string(),
                        host.strip_prefix("host=")?.to_owned(),
                        key.strip_prefix("key=")?.to_owned(),
                    )),
                    _ => None,
                }
            })
            .collect()
    }
}
