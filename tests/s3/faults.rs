//! S3 under faults, against the serial moto (the one whose conditional puts are atomic):
//! - racing create-if-absent puts of one metadata version: exactly one writer wins;
//! - a fault proxy (tests/support/faultproxy.py) in front of moto fails 10 % of requests (throttling,
//!   5xx, lost responses, dropped connections) and delays others while cdcd streams a workload; at
//!   the end the table equals the source, no snapshot references a missing file, and
//!   `cdcd cleanup` keeps every referenced file.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::s3::{create_bucket, moto, s3_config, S3Pipeline};
use crate::support::{connect, exec, test_env, unique};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_conditional_create_has_exactly_one_winner() {
    let Some(env) = test_env("s3_conditional_create_has_exactly_one_winner") else {
        return;
    };
    let Some(endpoint) = moto("s3_conditional_create_has_exactly_one_winner", true) else {
        return;
    };
    let bucket = crate::support::s3::bucket_name(&unique("race"));
    create_bucket(&env, &endpoint, &bucket);
    let wh = Arc::new(
        cdcd::storage::Warehouse::open(&format!("s3://{bucket}/wh"), &s3_config(&endpoint))
            .unwrap(),
    );
    for round in 1..=10u32 {
        let path = Path::from(format!("wh/ns/t/metadata/v{round}.metadata.json"));
        let mut tasks = Vec::new();
        for writer in 0..6u32 {
            let wh = wh.clone();
            let path = path.clone();
            tasks.push(tokio::spawn(async move {
                let body = format!("{{\"writer\": {writer}}}");
                let r = wh
                    .store()
                    .put_opts(
                        &path,
                        PutPayload::from(body.into_bytes()),
                        PutOptions::from(PutMode::Create),
                    )
                    .await;
                (writer, r)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            let (writer, r) = t.await.unwrap();
            match r {
                Ok(_) => winners.push(writer),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => panic!("round {round} writer {writer}: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let got = wh.store().get(&path).await.unwrap().bytes().await.unwrap();
        let expected = format!("{{\"writer\": {}}}", winners[0]);
        assert_eq!(String::from_utf8_lossy(&got), expected, "round {round}");
    }
}

/// The fault proxy, killed on drop.
struct Proxy {
    child: Child,
    pub url: String,
}

impl Proxy {
    fn start(python: &str, upstream: &str, fail: f64) -> Proxy {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/faultproxy.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(upstream)
            .args(["--fail", &fail.to_string(), "--seed", "7"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("faultproxy said {line:?}"));
        Proxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file any metadata version of the table references exists.
pub async fn assert_no_missing_files(s: &S3Pipeline, table: &str) {
    let wh = s.warehouse();
    let files = cdcd::sinks::iceberg::cleanup::referenced_files(&wh, &s.table_url(table))
        .await
        .unwrap();
    assert!(files.len() > 3, "{files:?}");
    for f in &files {
        wh.store()
            .head(&Path::from(f.as_str()))
            .await
            .unwrap_or_else(|e| panic!("referenced file {f} is missing: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_survives_a_faulty_network() {
    let Some(env) = test_env("s3_survives_a_faulty_network") else {
        return;
    };
    let Some(endpoint) = moto("s3_survives_a_faulty_network", true) else {
        return;
    };
    let proxy = Proxy::start(&env.python, &endpoint, 0.10);
    let n = unique("s3fault");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {n};
             CREATE TABLE {n} (id int8 PRIMARY KEY, v int4, t text);
             INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series(1, 2000) g;"
        ),
    )
    .await;
    let mut s = S3Pipeline::new(&env, &n, &[&n], &endpoint);
    s.p.on_cleanup(format!("DROP TABLE IF EXISTS {n}"));
    s.write_config(&crate::support::Settings::default(), &proxy.url);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    // ~20 s of streaming: many small commits, each one a dozen requests through the proxy.
    for round in 0..40i64 {
        let base = 10_000 + round * 100;
        exec(
            &client,
            &format!(
                "INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series({base}, {base} + 49) g;
                 UPDATE {n} SET v = v + 1 WHERE id % 40 = {m};
                 DELETE FROM {n} WHERE id IN (SELECT id FROM {n} ORDER BY random() LIMIT 5);",
                m = round % 40
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.p.assert_running();
    }
    // Read back through moto directly (the readers have no retry policy for the proxy's faults).
    s.assert_equal(&n, 180, "duckdb").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(120)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    drop(proxy);
    s.write_config(&crate::support::Settings::default(), &endpoint);
    assert_no_missing_files(&s, &n).await;
    // Nothing is old enough to be an orphan yet with the default grace; with grace 0 every
    // unreferenced file goes, and the table must still read back equal.
    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    eprintln!("cleanup: {}", out.lines().last().unwrap_or(""));
    assert_no_missing_files(&s, &n).await;
    s.assert_equal(&n, 5, "duckdb").await;
}
