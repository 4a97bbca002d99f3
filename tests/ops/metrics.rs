//! End to end, the operations contract (DESIGN "Metrics", issue 8): while a pipeline runs,
//! `/metrics` serves the DESIGN names, each with the `pipeline` label; `cdcd_source_lag_seconds`
//! falls to about 0 once cdcd has caught up and the source is idle (heartbeats); `/healthz` and
//! `/readyz` answer 200; JSON logs are one object per line and carry no password; the
//! maintenance metrics of both sinks (issue 19, "Visible"); the lag stays at 0 while the source is
//! quiet, between heartbeats too (issue 34, "Also seen").

use std::time::{Duration, Instant};

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};
use crate::support::{exec, fresh_table, test_env, test_env_and_name, unique, Pipeline, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nothing listens on right now (bound and released; a race with another bind is unlikely).
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `GET path` → (status line, body); `None` while nothing listens.
pub(crate) async fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: cdcd\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// The value of the first sample of `name` whose labels contain `labels` (e.g. `table="x"`).
pub(crate) fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    sample_labeled(metrics, name, &[labels])
}

/// The value of the first sample of `name` whose labels contain each of `labels`.
fn sample_labeled(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|l| labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Appends `[metrics] listen` on a free port to the config at `config`; returns the port.
pub(crate) fn serve_metrics(config: &std::path::Path) -> u16 {
    let port = free_port();
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(
        config,
        format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    port
}

/// Adds `heartbeat_interval_ms` to `[source]`, `[metrics] listen` on `port`.
fn add_ops_config(p: &Pipeline, port: u16, heartbeat_ms: u64) {
    let text = std::fs::read_to_string(&p.config).unwrap();
    let text = text.replacen(
        "[source]\n",
        &format!("[source]\nheartbeat_interval_ms = {heartbeat_ms}\n"),
        1,
    );
    let text = format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&p.config, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_and_lag_falls_to_zero() {
    let (env, name) = ground_or_skip!(test_env_and_name("opsm"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int8 PRIMARY KEY, v text);
             INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 100) g;"
        )
    })
    .await;
    let secret = format!("opsekrit-{}", std::process::id());
    let settings = Settings {
        password: Some(secret.clone()),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    let port = free_port();
    add_ops_config(&p, port, 500);
    p.env_vars.push(("CDCD_LOG_FORMAT".into(), "json".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    // The changes below must be streamed, not copied: a slot can be active before its copy ends.
    let copied = Instant::now() + Duration::from_secs(120);
    while !p.output().contains("initial copy finished") {
        assert!(
            Instant::now() < copied,
            "the initial copy did not finish:\n{}",
            p.output()
        );
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    exec(
        &client,
        &format!(
            "INSERT INTO {t} SELECT g, 'n' || g FROM generate_series(101, 600) g;
             UPDATE {t} SET v = 'u' WHERE id % 7 = 0;
             DELETE FROM {t} WHERE id % 11 = 0;"
        ),
    )
    .await;
    p.assert_equal(&t, 60).await;

    let (status, _) = get(port, "/healthz").await.expect("no /healthz");
    assert!(status.contains("200"), "/healthz: {status}");

    // Caught up and idle: heartbeats every 500 ms keep the lag near 0.
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        p.assert_running();
        let (status, body) = get(port, "/metrics").await.expect("no /metrics");
        assert!(status.contains("200"), "/metrics: {status}");
        let lag = sample(&body, "cdcd_source_lag_seconds", "");
        let heartbeats = sample(&body, "cdcd_heartbeats_total", "").unwrap_or(0.0);
        if lag.is_some_and(|l| l < 3.0) && heartbeats >= 2.0 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "lag did not fall below 3 s within 60 s of catching up:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pipeline = format!("pipeline=\"{name}\"");
    let table = format!("table=\"public.{t}\"");
    for name in [
        "cdcd_source_lag_seconds",
        "cdcd_source_lag_bytes",
        "cdcd_replication_slot_retained_bytes",
        "cdcd_transactions_total",
        "cdcd_buffered_rows",
        "cdcd_heartbeats_total",
    ] {
        assert!(
            sample(&metrics, name, &pipeline).is_some(),
            "{name} with {pipeline} missing:\n{metrics}"
        );
    }
    for name in [
        "cdcd_commits_total",
        "cdcd_last_commit_timestamp_seconds",
        "cdcd_snapshot_rows_total",
    ] {
        let labels = format!("{pipeline},{table}");
        let labels_rev = format!("{table},{pipeline}");
        assert!(
            sample(&metrics, name, &labels).is_some()
                || sample(&metrics, name, &labels_rev).is_some()
                || metrics
                    .lines()
                    .any(|l| l.starts_with(name) && l.contains(&pipeline) && l.contains(&table)),
            "{name} for {t} missing:\n{metrics}"
        );
    }
    let inserted = metrics
        .lines()
        .filter(|l| l.starts_with("cdcd_changes_total{"))
        .filter(|l| l.contains(&table) && l.contains("op=\"insert\"") && l.contains(&pipeline))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    // 100 copied rows and 500 inserted ones.
    assert!(
        inserted.is_some_and(|n| n >= 500.0),
        "changes_total insert:\n{metrics}"
    );
    assert!(
        metrics.contains("cdcd_commit_duration_seconds_bucket{"),
        "commit duration histogram missing:\n{metrics}"
    );
    let snapshot = metrics
        .lines()
        .find(|l| l.starts_with("cdcd_snapshot_rows_total{") && l.contains(&table))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(
        snapshot.is_some_and(|n| n >= 100.0),
        "snapshot rows:\n{metrics}"
    );
    assert!(
        metrics
            .lines()
            .filter(|l| l.starts_with("cdcd_"))
            .all(|l| l.contains(&pipeline)),
        "a series without the pipeline label:\n{metrics}"
    );
    // One series per name and label set (a series recorded with and without an explicit
    // `pipeline` label would collide), and it counted the streamed transactions.
    let transactions: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("cdcd_transactions_total"))
        .collect();
    assert_eq!(transactions.len(), 1, "{transactions:?}");
    let tx = sample(&metrics, "cdcd_transactions_total", &pipeline).unwrap();
    assert!(tx >= 1.0, "cdcd_transactions_total = {tx}");
    // The table's primary-key index holds its 600 keys in a memtable or a run.
    let index_part = |part: &str| {
        let labels = [pipeline.as_str(), &format!("part=\"{part}\"")];
        sample_labeled(&metrics, "cdcd_index_memory_bytes", &labels)
    };
    let parts = ["memtables", "run_metas", "block_cache"].map(index_part);
    assert!(parts.iter().all(Option::is_some), "{parts:?}:\n{metrics}");
    assert!(
        parts[0].unwrap_or(0.0) + parts[1].unwrap_or(0.0) > 0.0,
        "the index holds nothing: {parts:?}"
    );
    let lag_bytes = sample(&metrics, "cdcd_source_lag_bytes", "").unwrap();
    assert!(lag_bytes < 1e6, "lag bytes {lag_bytes} after catching up");

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(port, "/readyz").await.expect("no /readyz");
        if status.contains("200") {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz: {status} {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit after SIGTERM: {st}");
    let out = p.output();
    assert!(!out.contains(&secret), "the password reached the logs");
    let json_lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("=====")).collect();
    assert!(!json_lines.is_empty());
    for line in json_lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("timestamp").is_some(),
            "{line}"
        );
    }
}

/// Issue 19, "Visible": both sinks' maintenance shows on `/metrics`, per table: runs by kind
/// (`expire`, and `rewrite_data_files` on Iceberg or `compact` on the LSM sink), snapshots
/// expired, files deleted, files and bytes compaction rewrote, and the table's snapshots, live
/// files and manifests. Iceberg runs its cycle every 300 ms with a 1 ms snapshot age; the LSM
/// sink keeps two snapshots and compacts at two runs, in the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_metrics_are_served_for_both_sinks() {
    let env = ground_or_skip!(test_env("maintenance_metrics_are_served_for_both_sinks"));
    for lsm in [false, true] {
        let name = unique(if lsm { "opsmtl" } else { "opsmti" });
        let t = format!("{name}_t");
        let client = fresh_table(&env, &t, |t| {
            format!(
                "CREATE TABLE {t} (id int8 PRIMARY KEY, v int8);
                 INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 100) g;"
            )
        })
        .await;
        let sink_extra = if lsm {
            "snapshots_retained = 2\ncompaction_trigger = 2\n"
        } else {
            "\n[sink.table_properties]\n\
             \"history.expire.max-snapshot-age-ms\" = \"1\"\n\
             \"cdcd.expiry.delete-delay-ms\" = \"0\"\n\
             \"history.expire.min-snapshots-to-keep\" = \"2\"\n\
             \"write.target-file-size-bytes\" = \"1000000\"\n\
             \"cdcd.compaction.min-input-files\" = \"3\"\n"
        };
        let settings = Settings {
            commit_interval_ms: 50,
            sink_extra: sink_extra.into(),
            ..Settings::default()
        };
        let mut p = if lsm {
            Pipeline::new_lsm(&env, &name, &[&t], &settings, 1)
        } else {
            Pipeline::new(&env, &name, &[&t], &settings)
        };
        p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
        let port = free_port();
        add_ops_config(&p, port, 500);
        if !lsm {
            p.env_vars
                .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()));
        }
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;

        let table = format!("table=\"public.{t}\"");
        let compaction = if lsm {
            "kind=\"compact\""
        } else {
            "kind=\"rewrite_data_files\""
        };
        let wanted: [(&str, Vec<&str>); 10] = [
            (
                "cdcd_maintenance_runs_total",
                vec![&table, "kind=\"expire\""],
            ),
            ("cdcd_maintenance_runs_total", vec![&table, compaction]),
            ("cdcd_maintenance_snapshots_expired_total", vec![&table]),
            ("cdcd_maintenance_files_deleted_total", vec![&table]),
            ("cdcd_maintenance_files_rewritten_total", vec![&table]),
            ("cdcd_maintenance_bytes_rewritten_total", vec![&table]),
            ("cdcd_table_snapshots", vec![&table]),
            ("cdcd_table_live_files", vec![&table]),
            ("cdcd_table_manifests", vec![&table]),
            ("cdcd_commits_total", vec![&table]),
        ];
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut k = 0;
        loop {
            p.assert_running();
            let (_, body) = get(port, "/metrics").await.expect("no /metrics");
            let absent: Vec<&str> = wanted
                .iter()
                .filter(|(name, labels)| {
                    !sample_labeled(&body, name, labels).is_some_and(|v| v > 0.0)
                })
                .map(|(name, _)| *name)
                .collect();
            if absent.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "lsm = {lsm}: {absent:?} missing or 0 for {t}:\n{body}"
            );
            exec(
                &client,
                &format!("UPDATE {t} SET v = v + 1 WHERE id % 10 = {}", k % 10),
            )
            .await;
            k += 1;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        p.assert_equal(&t, 60).await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
    }
}

/// Issue 34, "Also seen": `cdcd_source_lag_seconds` is the age of the oldest change cdcd has not
/// committed, so once everything the source sent is committed it is 0 however long the source
/// stays quiet. MariaDB sends a heartbeat every 5 s; the old lag (now − the newest committed
/// commit or heartbeat time) climbed 1 s per second between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_stays_at_zero_while_a_mysql_source_is_quiet() {
    let (env, name) = ground_or_skip!(my_env_and_name("opsmylag"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT);
         INSERT INTO t SELECT seq, seq FROM seq_1_to_100",
    )
    .await;
    let port = serve_metrics(&p.config);
    p.start();
    p.assert_equal("t", 120).await;
    my_exec(
        &mut c,
        "INSERT INTO t SELECT seq + 100, seq FROM seq_1_to_100",
    )
    .await;
    p.assert_equal("t", 60).await;

    // Committed and quiet: every sample over 12 s (two heartbeat periods and more) is about 0.
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(12) {
        let (_, body) = get(port, "/metrics").await.expect("no /metrics");
        if let Some(lag) = sample(&body, "cdcd_source_lag_seconds", "") {
            samples.push(lag);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(samples.len() >= 10, "lag samples: {samples:?}");
    assert!(
        samples.iter().all(|&lag| lag < 1.0),
        "lag while the source is quiet and everything is committed: {samples:?}"
    );
    p.stop(Duration::from_secs(60)).await;
}
