//! Helpers for the S3 end-to-end tests (`tests/s3/`): a [`crate::support::Pipeline`] whose warehouse
//! is `s3://<bucket>/wh` on the test bed's moto (Iceberg or LSM tables), a bucket per test (named
//! with the pid, so parallel runs never share one), lakecheck over S3 (also for the MariaDB
//! pipelines, `support/mysql.rs`), and the object listing the fault tests check.
//!
//! moto comes from `scripts/testbed.sh` (`CDCD_TEST_S3`: threaded, `CDCD_TEST_S3_SERIAL`: one request
//! at a time, the one whose conditional puts are atomic). Without them the tests print a note and pass.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use cdcd::config::S3Config;
use cdcd::storage::Warehouse;

use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::support::{
    current_test, ground, output_ok, test_env, unique, Pipeline, Settings, TestEnv, LAKECHECK,
    NAMESPACE,
};

/// moto's address for this test, or `None` when the test skips without it ([`ground::var`]).
pub fn moto(test: &str, serial: bool) -> Option<String> {
    let var = if serial {
        "CDCD_TEST_S3_SERIAL"
    } else {
        "CDCD_TEST_S3"
    };
    ground::var(test, var)
}

/// The opening of most S3 tests: the test bed, moto's address ([`moto`]) and the running test's
/// unique name from `tag`; `None` when the test skips.
pub fn moto_test_env(serial: bool, tag: &str) -> Option<(TestEnv, String, String)> {
    let test = current_test();
    let env = test_env(&test)?;
    let endpoint = moto(&test, serial)?;
    Some((env, endpoint, unique(tag)))
}

/// A bucket name for `name` (S3: lowercase, digits, '-', 3..63).
pub fn bucket_name(name: &str) -> String {
    format!("cdcd-{}", name.replace('_', "-")).to_ascii_lowercase()
}

/// Creates `bucket` on `endpoint` with boto3 (object_store cannot create buckets).
pub fn create_bucket(env: &TestEnv, endpoint: &str, bucket: &str) {
    create_bucket_trusting(env, endpoint, None, bucket);
}

/// [`create_bucket`], trusting the CA file `ca` when the endpoint is https.
pub fn create_bucket_trusting(env: &TestEnv, endpoint: &str, ca: Option<&str>, bucket: &str) {
    let verify = ca.map_or("None".to_owned(), |c| format!("{c:?}"));
    let script = format!(
        "import boto3\nc = boto3.client('s3', endpoint_url={endpoint:?}, aws_access_key_id='test', \
         aws_secret_access_key='test', region_name='us-east-1', verify={verify})\n\
         try:\n    c.create_bucket(Bucket={bucket:?})\nexcept c.exceptions.BucketAlreadyOwnedByYou:\n    pass\n"
    );
    output_ok(std::process::Command::new(&env.python).args(["-c", &script]));
}

/// The `[sink.s3]` settings cdcd gets for `endpoint`.
pub fn s3_config(endpoint: &str) -> S3Config {
    S3Config {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
        allow_http: Some(true),
        ..S3Config::default()
    }
}

/// The `[sink.s3]` section pointing cdcd at `endpoint` (moto or the fault proxy).
pub fn sink_s3_section(endpoint: &str) -> String {
    format!(
        "\n[sink.s3]\nendpoint = {endpoint:?}\nregion = \"us-east-1\"\naccess_key_id = \"test\"\n\
         secret_access_key = \"test\"\nallow_http = true\n"
    )
}

/// A warehouse on moto: the endpoint cdcd and the readers use, and `s3://<bucket>/wh`.
#[derive(Debug, Clone)]
pub struct S3Target {
    pub endpoint: String,
    pub warehouse_url: String,
}

/// Which sink an S3 test writes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    Iceberg,
    /// LSM (Apache Paimon) tables with 2 buckets.
    Lsm,
}

/// Where lakecheck reads a replica on S3.
pub enum Lake<'a> {
    /// An Iceberg table directory `s3://…/<namespace>/<table>`, read by `reader`.
    Iceberg { table_url: &'a str, reader: &'a str },
    /// A Paimon warehouse `s3://…/wh` and `<namespace>.<table>`, read by pypaimon.
    Paimon { warehouse: &'a str, table: &'a str },
}

/// lakecheck of `source_table` on `source` against `lake`, read through `endpoint` (moto
/// itself: the readers have no retry policy for the fault proxy's faults), polling up to
/// `wait_secs`; returns the exit code and the output.
pub async fn lakecheck_s3(
    python: &str,
    endpoint: &str,
    source: &str,
    source_table: &str,
    lake: Lake<'_>,
    wait_secs: u32,
) -> (Option<i32>, String) {
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(LAKECHECK)
        .args(["--source", source])
        .args(["--source-table", source_table]);
    match lake {
        Lake::Iceberg { table_url, reader } => {
            cmd.args(["--iceberg", table_url, "--reader", reader]);
        }
        Lake::Paimon { warehouse, table } => {
            cmd.args(["--paimon", warehouse, "--paimon-table", table]);
        }
    }
    cmd.args(["--wait", &wait_secs.to_string()]);
    run_s3_reader(cmd, endpoint).await
}

/// Runs `cmd`, a reader of an S3 warehouse, with moto's test credentials and `endpoint`; returns
/// its exit code and its output.
pub async fn run_s3_reader(
    mut cmd: tokio::process::Command,
    endpoint: &str,
) -> (Option<i32>, String) {
    let out = cmd
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let text = crate::support::stderr_then_stdout(&out);
    (out.status.code(), text)
}

/// An S3 pipeline: the common one with its config rewritten to an `s3://` warehouse.
pub struct S3Pipeline {
    pub p: Pipeline,
    pub endpoint: String,
    pub bucket: String,
    pub warehouse_url: String,
    pub extra_pipeline: String,
    pub sink: SinkKind,
}

impl S3Pipeline {
    /// A pipeline of `tables` into a bucket of its own on `endpoint`; the tables are dropped
    /// from Postgres when it ends.
    pub fn new(env: &TestEnv, name: &str, tables: &[&str], endpoint: &str) -> S3Pipeline {
        S3Pipeline::with_sink(env, name, tables, endpoint, SinkKind::Iceberg)
    }

    /// Like [`S3Pipeline::new`], writing with `sink`.
    pub fn with_sink(
        env: &TestEnv,
        name: &str,
        tables: &[&str],
        endpoint: &str,
        sink: SinkKind,
    ) -> S3Pipeline {
        let mut p = match sink {
            SinkKind::Iceberg => Pipeline::new(env, name, tables, &Settings::default()),
            SinkKind::Lsm => Pipeline::new_lsm(env, name, tables, &Settings::default(), 2),
        };
        p.on_cleanup(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));
        let bucket = bucket_name(name);
        create_bucket(env, endpoint, &bucket);
        let s = S3Pipeline {
            p,
            endpoint: endpoint.to_owned(),
            bucket: bucket.clone(),
            warehouse_url: format!("s3://{bucket}/wh"),
            extra_pipeline: String::new(),
            sink,
        };
        s.write_config(&Settings::default(), endpoint);
        s
    }

    /// Writes the config with cdcd pointed at `endpoint` (the fault proxy, or moto itself).
    pub fn write_config(&self, settings: &Settings, endpoint: &str) {
        self.p.write_config(settings);
        let text = std::fs::read_to_string(&self.p.config).unwrap();
        let wh_line = format!("warehouse = {:?}", self.p.warehouse.display().to_string());
        assert!(text.contains(&wh_line), "{text}");
        let mut text = text.replace(&wh_line, &format!("warehouse = {:?}", self.warehouse_url));
        // [pipeline] keys go right after the name line.
        let name_line = format!("name = {:?}\n", self.p.name);
        text = text.replacen(
            &name_line,
            &format!("{name_line}{}", self.extra_pipeline),
            1,
        );
        text.push_str(&sink_s3_section(endpoint));
        std::fs::write(&self.p.config, text).unwrap();
    }

    /// `s3://<bucket>/wh/<namespace>/<table>` (Iceberg) or `…/wh/<namespace>.db/<table>` (LSM).
    pub fn table_url(&self, table: &str) -> String {
        match self.sink {
            SinkKind::Iceberg => format!("{}/{NAMESPACE}/{table}", self.warehouse_url),
            SinkKind::Lsm => format!("{}/{NAMESPACE}.db/{table}", self.warehouse_url),
        }
    }

    /// Store paths of the files the table's snapshots reference (cdcd's own reading of them).
    pub async fn referenced_files(&self, table: &str) -> std::collections::HashSet<String> {
        let wh = self.warehouse();
        let url = self.table_url(table);
        match self.sink {
            SinkKind::Iceberg => cdcd::sinks::iceberg::cleanup::referenced_files(&wh, &url).await,
            SinkKind::Lsm => cdcd::sinks::lsm::cleanup::referenced_files(&wh, &url).await,
        }
        .unwrap()
    }

    /// Every file some snapshot of the table references exists.
    pub async fn assert_no_missing_files(&self, table: &str) {
        let wh = self.warehouse();
        let files = self.referenced_files(table).await;
        assert!(files.len() > 3, "{files:?}");
        for f in &files {
            wh.store()
                .head(&Path::from(f.as_str()))
                .await
                .unwrap_or_else(|e| panic!("referenced file {f} is missing: {e}"));
        }
    }

    /// The store paths of the table's objects under `dir` (e.g. `snapshot`), sorted.
    pub async fn list(&self, table: &str, dir: &str) -> Vec<String> {
        use futures::TryStreamExt;
        let wh = self.warehouse();
        let prefix = wh
            .path(&format!("{}/{dir}", self.table_url(table)))
            .unwrap();
        let mut out: Vec<String> = wh
            .store()
            .list(Some(&prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        out.sort();
        out
    }

    /// The warehouse as cdcd's own store sees it (listing, reading back).
    pub fn warehouse(&self) -> Warehouse {
        Warehouse::open(&self.warehouse_url, &s3_config(&self.endpoint)).unwrap()
    }

    /// lakecheck over S3 with `reader` (LSM tables: pypaimon); panics with its output unless
    /// equal.
    pub async fn assert_equal(&mut self, table: &str, wait_secs: u32, reader: &str) {
        let table_url = self.table_url(table);
        let paimon_table = format!("{NAMESPACE}.{table}");
        let (lake, reader) = match self.sink {
            SinkKind::Iceberg => (
                Lake::Iceberg {
                    table_url: &table_url,
                    reader,
                },
                reader,
            ),
            SinkKind::Lsm => (
                Lake::Paimon {
                    warehouse: &self.warehouse_url,
                    table: &paimon_table,
                },
                "pypaimon",
            ),
        };
        let (code, text) = lakecheck_s3(
            &self.p.env.python,
            &self.endpoint,
            &self.p.env.pg_url,
            &format!("public.{table}"),
            lake,
            wait_secs,
        )
        .await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck ({reader}) public.{table} over S3 differs:\n{text}\n--- cdcd:\n{}",
            self.p.output()
        );
        eprintln!(
            "lakecheck ({reader}) public.{table}: {}",
            text.lines().last().unwrap_or("")
        );
    }

    /// Runs `cdcd cleanup` with `args`; returns (exit code, output).
    pub fn cleanup(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = std::process::Command::new(crate::support::cdcd_bin())
            .arg("cleanup")
            .arg("--config")
            .arg(&self.p.config)
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), crate::support::stdout_then_stderr(&out))
    }
}

/// Polls `cond` every 200 ms for at most `timeout`.
pub async fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cond()
}
