//! Helpers for the S3 end-to-end tests (`tests/s3/`): a [`crate::support::Pipeline`] whose warehouse
//! is `s3://<bucket>/wh` on the test bed's moto, a bucket per test (named with the pid, so parallel
//! runs never share one), lakecheck over S3, and the object listing the fault tests check.
//!
//! moto comes from `scripts/testbed.sh` (`CDCD_TEST_S3`: threaded, `CDCD_TEST_S3_SERIAL`: one request
//! at a time, the one whose conditional puts are atomic). Without them the tests print a note and pass.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use cdcd::config::S3Config;
use cdcd::storage::Warehouse;

use crate::support::{Pipeline, Settings, TestEnv, LAKECHECK, NAMESPACE};

/// moto's address for this test, or `None` (after printing why).
pub fn moto(test: &str, serial: bool) -> Option<String> {
    let var = if serial {
        "CDCD_TEST_S3_SERIAL"
    } else {
        "CDCD_TEST_S3"
    };
    match std::env::var(var) {
        Ok(v) => Some(v),
        Err(_) => {
            eprintln!("skipping {test}: {var} is unset (scripts/testbed.sh up; eval \"$(scripts/testbed.sh env)\")");
            None
        }
    }
}

/// A bucket name for `name` (S3: lowercase, digits, '-', 3..63).
pub fn bucket_name(name: &str) -> String {
    format!("cdcd-{}", name.replace('_', "-")).to_ascii_lowercase()
}

/// Creates `bucket` on `endpoint` with boto3 (object_store cannot create buckets).
pub fn create_bucket(env: &TestEnv, endpoint: &str, bucket: &str) {
    let script = format!(
        "import boto3\nc = boto3.client('s3', endpoint_url={endpoint:?}, aws_access_key_id='test', \
         aws_secret_access_key='test', region_name='us-east-1')\n\
         try:\n    c.create_bucket(Bucket={bucket:?})\nexcept c.exceptions.BucketAlreadyOwnedByYou:\n    pass\n"
    );
    let out = std::process::Command::new(&env.python)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "create bucket {bucket}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// An S3 pipeline: the common one with its config rewritten to an `s3://` warehouse.
pub struct S3Pipeline {
    pub p: Pipeline,
    pub endpoint: String,
    pub bucket: String,
    pub warehouse_url: String,
    pub extra_pipeline: String,
}

impl S3Pipeline {
    pub fn new(env: &TestEnv, name: &str, tables: &[&str], endpoint: &str) -> S3Pipeline {
        let p = Pipeline::new(env, name, tables, &Settings::default());
        let bucket = bucket_name(name);
        create_bucket(env, endpoint, &bucket);
        let s = S3Pipeline {
            p,
            endpoint: endpoint.to_owned(),
            bucket: bucket.clone(),
            warehouse_url: format!("s3://{bucket}/wh"),
            extra_pipeline: String::new(),
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
        text.push_str(&format!(
            "\n[sink.s3]\nendpoint = {endpoint:?}\nregion = \"us-east-1\"\naccess_key_id = \"test\"\n\
             secret_access_key = \"test\"\nallow_http = true\n"
        ));
        std::fs::write(&self.p.config, text).unwrap();
    }

    /// `s3://<bucket>/wh/<namespace>/<table>`.
    pub fn table_url(&self, table: &str) -> String {
        format!("{}/{NAMESPACE}/{table}", self.warehouse_url)
    }

    /// The warehouse as cdcd's own store sees it (listing, reading back).
    pub fn warehouse(&self) -> Warehouse {
        Warehouse::open(&self.warehouse_url, &s3_config(&self.endpoint)).unwrap()
    }

    /// lakecheck over S3 with `reader`; panics with its output unless equal.
    pub async fn assert_equal(&mut self, table: &str, wait_secs: u32, reader: &str) {
        let out = tokio::process::Command::new(&self.p.env.python)
            .arg(LAKECHECK)
            .args(["--source", &self.p.env.pg_url])
            .args(["--source-table", &format!("public.{table}")])
            .args(["--iceberg", &self.table_url(table)])
            .args(["--wait", &wait_secs.to_string()])
            .args(["--reader", reader])
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(
            out.status.code(),
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
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
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
