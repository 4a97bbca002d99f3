//! S3 under faults, against the serial moto (the one whose conditional puts are atomic):
//! - racing create-if-absent puts of one metadata version: exactly one writer wins;
//! - a fault proxy (tests/support/faultproxy.py) in front of moto fails 10 % of requests (throttling,
//!   5xx, lost responses, dropped connections) and delays others while cdcd streams a workload; at
//!   the end the table equals the source, no snapshot references a missing file, and
//!   `cdcd cleanup` keeps every referenced file. For both sinks (Iceberg, LSM);
//! - LSM (issue 22): every `snapshot-N` create lands but its answer is lost, so object_store's
//!   retry finds the object its first attempt wrote: cdcd takes it as its own commit (no conflict,
//!   nothing written twice) and the checkpoint in it resumes a restart;
//! - LSM: the store holds every snapshot create for seconds: no snapshot appears, cdcd
//!   acknowledges nothing past what is committed, and once the store answers it catches up;
//! - LSM: a holder killed while its `snapshot-N` create is held in the network; the next holder
//!   commits `snapshot-N` itself, then the dead one's create arrives: it is refused (412), the
//!   object stays the new holder's, and the table equals the source.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::support::proxy::{ProxyProcess, FAULTPROXY};
use crate::support::s3::{create_bucket, moto, moto_test_env, s3_config, S3Pipeline, SinkKind};
use crate::support::{connect, exec, fresh_table, test_env, unique};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_conditional_create_has_exactly_one_winner() {
    let env = ground_or_skip!(test_env("s3_conditional_create_has_exactly_one_winner"));
    let endpoint = ground_or_skip!(moto("s3_conditional_create_has_exactly_one_winner", true));
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

/// The fault proxy in front of `upstream`, failing `fail` of the requests.
fn fault_proxy(python: &str, upstream: &str, fail: f64) -> ProxyProcess {
    fault_proxy_with(
        python,
        upstream,
        &["--fail", &fail.to_string(), "--seed", "7"],
    )
}

/// The fault proxy with `args` (faultproxy.py's options).
fn fault_proxy_with(python: &str, upstream: &str, args: &[&str]) -> ProxyProcess {
    ProxyProcess::start(python, FAULTPROXY, upstream, args, Stdio::inherit())
}

case_tests!(faulty_network:
    s3_survives_a_faulty_network(SinkKind::Iceberg),
    /// Issue 22: the same with the LSM (Paimon) sink, read back by pypaimon.
    s3_lsm_survives_a_faulty_network(SinkKind::Lsm),
);

async fn faulty_network(test: &str, sink: SinkKind) {
    let env = ground_or_skip!(test_env(test));
    let endpoint = ground_or_skip!(moto(test, true));
    let proxy = fault_proxy(&env.python, &endpoint, 0.10);
    let n = unique(match sink {
        SinkKind::Iceberg => "s3fault",
        SinkKind::Lsm => "s3faultl",
    });
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, v int4, t text);
             INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series(1, 2000) g;"
        )
    })
    .await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, sink);
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
    s.assert_no_missing_files(&n).await;
    // Nothing is old enough to be an orphan yet with the default grace; with grace 0 every
    // unreferenced file goes, and the table must still read back equal.
    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    eprintln!("cleanup: {}", out.lines().last().unwrap_or(""));
    s.assert_no_missing_files(&n).await;
    s.assert_equal(&n, 5, "duckdb").await;
}

/// A table of `rows` rows `(id, v, t)` for the LSM fault tests.
async fn lsm_table(client: &tokio_postgres::Client, n: &str, rows: u32) {
    exec(
        client,
        &format!(
            "DROP TABLE IF EXISTS {n};
             CREATE TABLE {n} (id int8 PRIMARY KEY, v int4, t text);
             INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series(1, {rows}) g;"
        ),
    )
    .await;
}

/// One round of inserts past `base`, updates and deletes.
async fn churn(client: &tokio_postgres::Client, n: &str, base: i64) {
    exec(
        client,
        &format!(
            "INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series({base}, {base} + 19) g;
             UPDATE {n} SET v = v + 1 WHERE id % 13 = {m};
             DELETE FROM {n} WHERE id % 29 = {m} AND id < {base};",
            m = base % 13
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_retried_snapshot_create_is_its_own_commit() {
    let test = "s3_lsm_retried_snapshot_create_is_its_own_commit";
    let env = ground_or_skip!(test_env(test));
    let endpoint = ground_or_skip!(moto(test, true));
    let proxy = fault_proxy_with(
        &env.python,
        &endpoint,
        &[
            "--fail",
            "0",
            "--delay",
            "0",
            "--lose-first-path",
            "/snapshot/snapshot-",
        ],
    );
    let n = unique("s3lostl");
    let client = connect(&env.pg_url).await;
    lsm_table(&client, &n, 1000).await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, SinkKind::Lsm);
    s.write_config(&crate::support::Settings::default(), &proxy.url);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    for round in 0..12i64 {
        churn(&client, &n, 10_000 + round * 100).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        s.p.assert_running();
    }
    s.assert_equal(&n, 120, "pypaimon").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    let out = s.p.output();
    // Every snapshot create (commits and compactions) was answered 500 after it landed: each
    // one, snapshot-1 to the newest, is recognised as ours exactly once.
    let newest = s
        .list(&n, "snapshot")
        .await
        .iter()
        .filter_map(|p| p.rsplit_once("/snapshot-")?.1.parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    let ours = out.matches("commit landed on an earlier attempt").count();
    assert!(
        newest >= 3 && ours == newest,
        "newest snapshot {newest}, {ours} recognised retries:\n{out}"
    );
    assert!(
        !out.contains("conflict") && !out.contains("ERROR"),
        "a retried create was taken for another writer's:\n{out}"
    );
    // The checkpoints in those snapshots resume a restart (straight to moto) without loss or
    // duplicates.
    drop(proxy);
    s.write_config(&crate::support::Settings::default(), &endpoint);
    s.p.start();
    churn(&client, &n, 50_000).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    s.assert_no_missing_files(&n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_stalled_snapshot_creates_hold_the_ack() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(true, "s3stalll"));
    let client = connect(&env.pg_url).await;
    lsm_table(&client, &n, 500).await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, SinkKind::Lsm);
    let flag = s.p.config.with_file_name("stall-snapshots");
    let flag_arg = flag.display().to_string();
    let proxy = fault_proxy_with(
        &env.python,
        &endpoint,
        &[
            "--fail",
            "0",
            "--delay",
            "0",
            "--stall-path",
            "/snapshot/snapshot-",
            "--stall-flag",
            &flag_arg,
        ],
    );
    s.write_config(&crate::support::Settings::default(), &proxy.url);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    churn(&client, &n, 10_000).await;
    s.assert_equal(&n, 120, "pypaimon").await;

    // From here every snapshot create hangs in the proxy (unanswered, like a stalled store);
    // a create already forwarded lands within the second.
    std::fs::write(&flag, b"").unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = s.list(&n, "snapshot").await;
    churn(&client, &n, 10_100).await;
    // At or past the end of that transaction's commit record: an acknowledgement up to here
    // would say it is durable, which it cannot be while no snapshot can be created.
    let mark = {
        let row = client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .unwrap();
        crate::support::parse_lsn(&row.get::<_, String>(0))
    };
    for round in 2..=8i64 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        churn(&client, &n, 10_000 + round * 100).await;
        s.p.assert_running();
        let acked = s.p.confirmed_flush_lsn(&client).await.unwrap_or(0);
        assert!(
            acked < mark,
            "cdcd acknowledged {acked:X}, past {mark:X}, while no snapshot could be created"
        );
    }
    let during = s.list(&n, "snapshot").await;
    assert_eq!(
        before.iter().filter(|p| p.contains("/snapshot-")).count(),
        during.iter().filter(|p| p.contains("/snapshot-")).count(),
        "a snapshot appeared while the store held every create: {before:?} -> {during:?}"
    );
    // The store answers again: the held creates land, and cdcd catches up and acknowledges.
    std::fs::remove_file(&flag).unwrap();
    churn(&client, &n, 20_000).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.p.confirmed_flush_lsn(&client).await.unwrap_or(0) <= mark {
        assert!(
            std::time::Instant::now() < deadline,
            "cdcd never acknowledged past {mark:X}:\n{}",
            s.p.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    drop(proxy);
    s.write_config(&crate::support::Settings::default(), &endpoint);
    s.assert_no_missing_files(&n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_late_snapshot_create_of_a_dead_holder_changes_nothing() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(true, "s3latel"));
    let client = connect(&env.pg_url).await;
    lsm_table(&client, &n, 500).await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, SinkKind::Lsm);
    s.extra_pipeline = "lease_ttl_ms = 4000\n".into();
    let flag = s.p.config.with_file_name("stall-snapshots");
    let log = s.p.config.with_file_name("proxy.log");
    let (flag_arg, log_arg) = (flag.display().to_string(), log.display().to_string());
    let proxy = fault_proxy_with(
        &env.python,
        &endpoint,
        &[
            "--fail",
            "0",
            "--delay",
            "0",
            "--stall-path",
            "/snapshot/snapshot-",
            "--stall-flag",
            &flag_arg,
            "--log",
            &log_arg,
        ],
    );
    s.write_config(&crate::support::Settings::default(), &proxy.url);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    churn(&client, &n, 10_000).await;
    s.assert_equal(&n, 120, "pypaimon").await;

    // The holder's next snapshot create is held in the network; the holder dies meanwhile.
    std::fs::write(&flag, b"").unwrap();
    churn(&client, &n, 10_100).await;
    let proxy_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let held_path = |text: &str, kind: &str| {
        text.lines()
            .filter_map(|l| l.split_once(&format!(" {kind} PUT "))?.1.split('?').next())
            .find(|p| p.contains("/snapshot/snapshot-"))
            .map(str::to_owned)
    };
    assert!(
        crate::support::s3::wait_until(Duration::from_secs(30), || held_path(
            &proxy_log(),
            "stall"
        )
        .is_some())
        .await,
        "no snapshot create was held:\n{}",
        proxy_log()
    );
    let held = held_path(&proxy_log(), "stall").unwrap_or_default();
    s.p.kill9();

    // The next holder, straight to moto, takes the lease over and commits that snapshot id.
    s.write_config(&crate::support::Settings::default(), &endpoint);
    s.p.start();
    churn(&client, &n, 10_200).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    let wh = s.warehouse();
    // The held path is `/<bucket>/<key>`; the store path is the key.
    let key = held
        .trim_start_matches('/')
        .split_once('/')
        .map(|(_, k)| k.to_owned())
        .unwrap_or_default();
    let path = Path::from(key.as_str());
    let read = || async {
        let got = wh.store().get(&path).await.unwrap().bytes().await.unwrap();
        serde_json::from_slice::<serde_json::Value>(&got).unwrap()
    };
    let ours = read().await;
    assert_eq!(
        ours["properties"]["cdcd.lease-epoch"], "2",
        "{key} is not the new holder's: {ours}"
    );

    // Now the dead holder's create arrives: refused, and nothing changes.
    std::fs::remove_file(&flag).unwrap();
    assert!(
        crate::support::s3::wait_until(Duration::from_secs(30), || held_path(
            &proxy_log(),
            "answer:412"
        )
        .is_some())
        .await,
        "the held create was not refused with 412:\n{}",
        proxy_log()
    );
    assert_eq!(read().await, ours, "the late create changed {key}");
    s.p.assert_running();
    churn(&client, &n, 10_300).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    drop(proxy);
    s.assert_no_missing_files(&n).await;
}
